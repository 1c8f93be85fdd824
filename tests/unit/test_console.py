"""The console while `grpo-ray train` runs: a progress bar on a terminal, a line per step in job logs."""

import io

from grpo_ray.tracking import ConsoleReporter, _duration


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_plain_lines_carry_step_reward_the_last_accuracy_and_eta():
    out = io.StringIO()
    console = ConsoleReporter(4, stream=out)
    console.step(1, {"reward/mean": 0.25, "eval/accuracy": 0.5, "timing/step": 2.0, "batch/staleness": 1.0})
    console.step(2, {"reward/mean": 0.5, "timing/step": 4.0})
    lines = out.getvalue().splitlines()
    # Accuracy is only measured every eval_every steps: the last value stays on the line.
    # ETA: mean step time x steps left; (2 s) x 3 = 6 s, then (2+4)/2 = 3 s x 2 = 6 s.
    # Not pipelined: no staleness shown even though the metric is there.
    assert lines[0] == "step 1/4  reward 0.25  acc 0.5  s/step 2  eta 6s"
    assert lines[1] == "step 2/4  reward 0.5  acc 0.5  s/step 4  eta 6s"


def test_a_pipelined_run_shows_staleness_and_loss():
    out = io.StringIO()
    console = ConsoleReporter(100, stream=out, pipelined=True)
    console.step(10, {"reward/mean": 0.125, "loss/total": -0.0312, "timing/step": 1.5, "batch/staleness": 1.0})
    # 1.5 s x 90 steps left = 135 s = 2m15s.
    assert out.getvalue() == "step 10/100  reward 0.125  loss -0.0312  s/step 1.5  stale 1  eta 2m15s\n"


def test_a_pipelined_step_says_what_overlapped_its_update():
    out = io.StringIO()
    console = ConsoleReporter(100, stream=out, pipelined=True)
    # One batch started ahead generated beside the update and had not finished when it did.
    console.step(
        10,
        {
            "timing/step": 1.5,
            "batch/staleness": 1.0,
            "pipeline/ahead_during_update": 1.0,
            "pipeline/ahead_generated_by_update_end": 0.0,
        },
    )
    assert out.getvalue() == "step 10/100  s/step 1.5  stale 1  ahead 0/1 done  eta 2m15s\n"


def test_an_agents_step_names_its_failed_tool_calls_and_each_kind_of_environment_failure():
    out = io.StringIO()
    console = ConsoleReporter(5, stream=out)
    metrics = {"timing/step": 1.0, "episode/turns": 1.5, "episode/tool_calls": 0.25, "episode/failed": 0.0}
    console.step(1, {**metrics, "episode/tool_errors": 0.0, "env_failures/reset_timeouts": 0.0})
    # Step 4 stopped the run: one reset timed out, its process took the 31 other episodes with it.
    failed = {"episode/failed": 1.0, "env_failures/reset_timeouts": 1.0, "env_failures/lost_with_process": 31.0}
    console.step(4, {**metrics, "episode/tool_errors": 0.25, **failed})
    lines = out.getvalue().splitlines()
    assert lines[0] == "step 1/5  s/step 1  turns 1.5  calls 0.25  eta 4s"  # nothing failed: nothing said
    assert lines[1] == (
        "step 4/5  s/step 1  turns 1.5  calls 0.25  tool-errors 0.25  env-failed 1  reset-timeouts 1  "
        "lost-with-process 31  eta 1s"
    )


def test_pauses_between_steps_are_named():
    out = io.StringIO()
    console = ConsoleReporter(4, stream=out)
    console.phase("step 2: evaluating 64 held-out prompts")
    console.phase(None)  # back to training: nothing to say
    assert out.getvalue() == "step 2: evaluating 64 held-out prompts\n"


def test_durations_read_at_a_glance():
    assert [_duration(s) for s in (0.4, 59, 60, 725, 3599, 3600, 11220)] == [
        "0s",
        "59s",
        "1m00s",
        "12m05s",
        "59m59s",
        "1h00m",
        "3h07m",
    ]


def test_a_terminal_gets_a_bar_with_accuracy_step_time_and_eta():
    out = Terminal()
    console = ConsoleReporter(4, stream=out)
    console.step(1, {"reward/mean": 0.25, "eval/accuracy": 0.5, "timing/step": 10.0})
    console.phase("step 1: writing checkpoint")
    assert "step 1: writing checkpoint" in out.getvalue().splitlines()[-1].split("\r")[-1]
    console.step(2, {"reward/mean": 0.5, "timing/step": 20.0})
    console.close()
    last = out.getvalue().split("\r")[-1]
    # (10 + 20) / 2 = 15 s x 2 steps left = 30 s.
    assert "2/4" in last and "acc 0.5" in last and "reward 0.5" in last and "s/step 20" in last and "eta 30s" in last
    assert "writing checkpoint" not in last  # the pause is over once a step lands

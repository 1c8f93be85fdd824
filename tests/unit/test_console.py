"""The console while `grpo-ray train` runs: a progress bar on a terminal, a line per step in job logs."""

import io

from grpo_ray.tracking import ConsoleReporter


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_plain_lines_carry_step_reward_the_last_accuracy_and_eta():
    out = io.StringIO()
    console = ConsoleReporter(4, stream=out)
    console.step(1, {"reward/mean": 0.25, "eval/accuracy": 0.5, "timing/step": 2.0})
    console.step(2, {"reward/mean": 0.5, "timing/step": 4.0})
    lines = out.getvalue().splitlines()
    # Accuracy is only measured every eval_every steps: the last value stays on the line.
    assert lines[0] == "step 1/4  reward 0.25  acc 0.5  s/step 2  eta 6s"
    assert lines[1] == "step 2/4  reward 0.5  acc 0.5  s/step 4  eta 6s"  # mean 3 s x 2 steps left


def test_a_terminal_gets_a_bar_with_accuracy_and_eta():
    out = Terminal()
    console = ConsoleReporter(4, stream=out)
    console.step(1, {"reward/mean": 0.25, "eval/accuracy": 0.5, "timing/step": 0.01})
    console.step(2, {"reward/mean": 0.5, "timing/step": 0.01})
    console.close()
    text = out.getvalue()
    assert "2/4" in text and "acc=0.5" in text and "reward=0.5" in text
    assert "<" in text  # tqdm's elapsed<remaining: the ETA

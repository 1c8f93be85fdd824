"""A broken environment says what and where (docs/agents.md, "When the environment fails"): one real
run of the tiny-tools model on a local Ray with the hf engine, whose calculator breaks three ways
in turn. Its first resets raise (the held-out evaluation at step 0: every sample fails, and no
NumPy warning reaches the console); its tool raises on every call (a warning after step 3); then
its reset hangs (step 4 stops the run past environment.max_failure_rate, naming reset and
environment.step_timeout_s, its failures counted by kind in MLflow and on the console first)."""

import io
import warnings
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from grpo_ray.config import load_config, total_steps
from grpo_ray.tracking import ConsoleReporter, default_tracking_uri
from grpo_ray.training.errors import EnvironmentFailureError
from grpo_ray.training.loop import train

ROOT = Path(__file__).resolve().parents[2]
EPISODES_PER_STEP = 4 * 8  # train.prompts_per_step x rollout.samples_per_prompt
EVAL_EPISODES = 4  # data.eval_limit x train.eval_samples

BROKEN_CALCULATOR = f'''
import itertools
import time

RESETS = itertools.count(1)  # this environment process's resets, in the order they run


class Calculator:
    """examples/agents/calculator.py, broken."""

    def reset(self, **row):
        n = next(RESETS)
        if n <= {EVAL_EPISODES}:  # the held-out evaluation before step 1
            raise RuntimeError("no puzzle today")
        if n > {EVAL_EPISODES + 3 * EPISODES_PER_STEP}:  # step 4 on
            time.sleep(600)

    def multiply(self, a: int, b: int) -> int:
        """Multiply two whole numbers.

        Args:
            a: the first factor
            b: the second factor
        """
        raise ConnectionError("the calculator service is down")
'''


def history(client, run_id, key):
    return {m.step: m.value for m in client.get_metric_history(run_id, key)}


def test_a_broken_environment_is_named_counted_and_stops_the_run_with_its_figures_logged(tmp_path):
    (tmp_path / "calculator.py").write_text(BROKEN_CALCULATOR)
    cfg = load_config(
        ROOT / "configs" / "tiny-tools.yaml",
        [
            f"output_dir={tmp_path / 'run'}",
            f"environment.spec={tmp_path / 'calculator.py'}:Calculator",
            "environment.step_timeout_s=1",
            # Step 4's 32 failed episodes are 25% of the window's 128: past 0.2, the run stops there.
            "environment.max_failure_rate=0.2",
            "train.steps=6",
            "train.prompts_per_step=4",
            "learner.micro_batch_size=32",
            "train.eval_every=0",
            "train.checkpoint_every=0",
            "data.eval_limit=4",
            "train.eval_samples=1",
        ],
    )
    out = io.StringIO()
    with warnings.catch_warnings(record=True) as caught, pytest.raises(EnvironmentFailureError) as stopped:
        warnings.simplefilter("always")
        train(cfg, console=ConsoleReporter(total_steps(cfg), stream=out))
    message = str(stopped.value)
    assert message == (
        "environment: 32 of 128 episodes failed over the last 4 steps, more than environment.max_failure_rate 0.2 "
        "(reset timeouts 1, lost with process 31); the first: Calculator.reset timed out after 1 s: raise "
        "environment.step_timeout_s, or make reset return sooner"
    )
    ours = [w for w in caught if "grpo_ray" in w.filename and issubclass(w.category, RuntimeWarning)]
    assert not ours, f"a NumPy warning from our code: {ours[0].message} ({ours[0].filename}:{ours[0].lineno})"

    lines = out.getvalue().splitlines()
    assert "step 0: held-out accuracy 0.000" in lines  # every held-out sample failed, counted as wrong
    # ... and the console says so, with the first reset's own error, before the 0.000.
    [unscored] = [line for line in lines if "held-out samples failed" in line]
    assert (
        unscored.startswith("step 0: ")
        and "count as wrong; the first: Calculator.reset failed: RuntimeError: no puzzle today" in unscored
    ), unscored
    # The tool: said once, after step 3's episodes (before its step line), with the tool's own error.
    [notice] = [i for i, line in enumerate(lines) if line.startswith("warning:")]
    assert lines[notice].startswith("warning: every one of the ") and lines[notice + 1].startswith("step 3/6")
    assert (
        "in 3 steps failed; the first: Calculator.multiply raised ConnectionError: the calculator service is"
        in (lines[notice])
    )
    raised_at = 1 + next(i for i, line in enumerate(BROKEN_CALCULATOR.split("\n")) if "raise ConnectionError" in line)
    assert f"(calculator.py:{raised_at} in multiply)" in lines[notice] and lines[notice].endswith("fix the tool")
    assert all("tool-errors" in lines[notice + k] for k in (-1, 1))  # steps 2 and 3 name their failed calls
    # Step 4 never finished, yet its line says what stopped it.
    assert lines[-1].startswith("step 4/6") and "env-failed 1  reset-timeouts 1  lost-with-process 31" in lines[-1]

    client = MlflowClient(default_tracking_uri(Path(cfg.output_dir)))
    [run] = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert run.info.status == "FAILED"
    run_id = run.info.run_id
    assert history(client, run_id, "env_failures/reset_timeouts") == {1: 0.0, 2: 0.0, 3: 0.0, 4: 1.0}
    assert history(client, run_id, "env_failures/lost_with_process")[4] == 31.0
    assert history(client, run_id, "episode/failed")[4] == 1.0
    tool_errors, tool_calls = (
        history(client, run_id, "episode/tool_errors"),
        history(client, run_id, "episode/tool_calls"),
    )
    assert all(tool_errors[s] == tool_calls[s] for s in (1, 2, 3)) and sum(tool_calls.values()) > 0

"""SandboxedScorer: reward functions in killable subprocesses; every failure is a None, counted.

Each scorer start costs about a second (a fresh interpreter imports grpo_ray.rewards), so tests
share scorers where the function under test cannot disturb the others, and build their own where
it kills or replaces children.
"""

import doctest
import importlib
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from grpo_ray.rewards import RewardSpecError, load_reward_function
from grpo_ray.rewards.sandbox import SandboxedScorer, SandboxResult

sandbox_module = importlib.import_module("grpo_ray.rewards.sandbox")

try:
    import psutil
except ImportError:  # pragma: no cover - psutil ships with Ray
    psutil = None

REWARDS = """
import math
import os
import time


def ordered(completions, prompts, answers, level, **_):
    return [float(c) + 100 * l for c, l in zip(completions, level)]


def sleepy(completions, prompts, answers, **_):
    if "hang" in completions:
        time.sleep(10**6)
    return [1.0] * len(completions)


def boom(completions, prompts, answers, **_):
    raise ValueError("boom")


def crash(completions, prompts, answers, **_):
    os.abort()


def wrong_length(completions, prompts, answers, **_):
    return [1.0] * (len(completions) + 1)


def nan(completions, prompts, answers, **_):
    return [math.nan] * len(completions)


def none_for_empty(completions, prompts, answers, **_):
    return [None if c == "" else 1.0 for c in completions]


def hog(completions, prompts, answers, **_):
    block = bytearray(2 * 1024**3)  # 2 GiB, beyond a 500 MB address-space limit
    return [float(len(block) > 0)] * len(completions)
"""


@pytest.fixture(scope="module")
def rewards_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("rewards") / "rewards.py"
    path.write_text(REWARDS)
    return path


def specs(rewards_file, *names):
    return [(f"{rewards_file}:{name}", {}) for name in names]


def call(scorer, function, completions, answers=None, **row_fields):
    n = len(completions)
    return scorer.score(function, completions, [""] * n, answers or [""] * n, row_fields)


def is_alive(pid: int) -> bool:
    if psutil is None:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True
    try:
        process = psutil.Process(pid)
        # A killed child shows as a zombie while its watchdog thread is still exiting; it is
        # dead (its pipe closed, its exit code ready) once that thread is gone too.
        return not (process.status() == psutil.STATUS_ZOMBIE and process.num_threads() == 1)
    except psutil.NoSuchProcess:
        return False


def wait_until_dead(pids, within_s: float) -> list[int]:
    deadline = time.monotonic() + within_s
    while any(map(is_alive, pids)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return [pid for pid in pids if is_alive(pid)]


@pytest.fixture(scope="module")
def shared(rewards_file):
    """Two children; only functions that leave their child alive."""
    functions = specs(rewards_file, "ordered", "boom", "wrong_length", "nan", "none_for_empty")
    with SandboxedScorer(functions + [("math", {})], num_processes=2, timeout_s=30) as scorer:
        yield scorer


# ---- scores and their order --------------------------------------------------------------------


def test_batch_split_across_two_children_keeps_input_order(shared, rewards_file):
    # 5 rows split 2 + 3; each score is the completion plus 100 * its row field "level".
    completions = ["0", "1", "2", "3", "4"]
    result = call(shared, f"{rewards_file}:ordered", completions, level=[1, 0, 2, 0, 3])
    assert result == SandboxResult([100.0, 1.0, 202.0, 3.0, 304.0], None)
    assert shared.restarts == 0


def test_score_many_scores_every_function_by_index_or_spec(shared, rewards_file):
    results = shared.score_many(["1", "2"], ["", ""], ["42", "42"], {"level": [0, 1]}, [0, "math"])
    assert results == [
        SandboxResult([1.0, 102.0], None),
        SandboxResult([0.0, 0.0], None),  # no \boxed answer: wrong, not failed
    ]


def test_builtin_math_reward_runs_in_the_sandbox(shared):
    result = call(shared, "math", ["so \\boxed{42}", "\\boxed{41}"], answers=["42", "42"])
    assert result == SandboxResult([1.0, 0.0], None)


def test_an_empty_batch_scores_nothing(shared):
    assert call(shared, 0, [], level=[]) == SandboxResult([], None)


def test_caller_errors_raise_instead_of_failing_rows(shared):
    with pytest.raises(ValueError, match="lengths"):
        shared.score(0, ["1", "2"], [""], ["", ""], {"level": [0, 0]})
    with pytest.raises(KeyError, match="unknown"):
        call(shared, "no_such_reward", ["1"])
    with pytest.raises(IndexError):
        call(shared, 99, ["1"])


# ---- failures inside the function: the child survives --------------------------------------------


def test_exception_fails_every_row_with_its_message(shared, rewards_file):
    restarts = shared.restarts
    result = call(shared, f"{rewards_file}:boom", ["a", "b", "c"])
    assert result.scores == [None, None, None]
    assert result.error == "ValueError: boom"
    assert shared.restarts == restarts  # an exception is not a crash


@pytest.mark.parametrize(
    ("name", "message"),
    [("wrong_length", "returned 2 scores for 1 completions"), ("nan", "score 0 is nan")],
)
def test_invalid_results_fail_the_rows(shared, rewards_file, name, message):
    # Checked in the child by score_completions: 2 rows split into chunks of 1, each invalid.
    result = call(shared, f"{rewards_file}:{name}", ["a", "b"])
    assert result.scores == [None, None]
    assert "RewardResultError" in result.error and message in result.error


def test_none_marks_only_that_row_and_is_not_an_error(shared, rewards_file):
    result = call(shared, f"{rewards_file}:none_for_empty", ["a", "", "c"])
    assert result == SandboxResult([1.0, None, 1.0], None)


# ---- timeouts and crashes: the child is replaced -----------------------------------------------


def test_timeout_kills_and_replaces_and_fails_only_the_hung_chunk(rewards_file):
    functions = specs(rewards_file, "ordered", "sleepy")
    with SandboxedScorer(functions, num_processes=2, timeout_s=1) as scorer:
        first_pids = scorer.pids
        start = time.monotonic()
        result = call(scorer, 1, ["hang", "hang", "hang"])  # both chunks hang
        elapsed = time.monotonic() - start
        assert result.scores == [None, None, None]
        assert result.error == "timed out after 1 s"
        assert elapsed < 3, elapsed
        assert scorer.restarts == 2 and not set(scorer.pids) & set(first_pids)
        assert wait_until_dead(first_pids, within_s=1) == []

        # The replacements work; their start-up does not count against the next call's timeout.
        assert call(scorer, 0, ["1", "2"], level=[0, 0]) == SandboxResult([1.0, 2.0], None)

        # Rows [0, 2) hang, rows [2, 4) are fine: only the hung chunk fails.
        result = call(scorer, 1, ["ok", "hang", "ok", "ok"])
        assert result == SandboxResult([None, None, 1.0, 1.0], "timed out after 1 s")
        assert scorer.restarts == 3


def test_abort_is_reported_as_a_death_and_the_next_call_works(rewards_file):
    with SandboxedScorer(specs(rewards_file, "ordered", "crash"), num_processes=1) as scorer:
        result = call(scorer, 0, ["3", "2", "1"], level=[0, 1, 0])
        assert result == SandboxResult([3.0, 102.0, 1.0], None)
        result = call(scorer, 1, ["a", "b"])
        assert result.scores == [None, None]
        assert result.error == "worker process died (exit code -6, SIGABRT)"
        assert scorer.restarts == 1
        assert call(scorer, 0, ["5"], level=[0]) == SandboxResult([5.0], None)

        # A child killed from outside while idle is replaced before use: nothing fails.
        (pid,) = scorer.pids
        os.kill(pid, signal.SIGKILL)
        assert wait_until_dead([pid], within_s=2) == []
        assert call(scorer, 0, ["6"], level=[0]) == SandboxResult([6.0], None)
        assert scorer.restarts == 2


def test_memory_limit_fails_the_call_and_the_next_call_works(rewards_file):
    with SandboxedScorer(specs(rewards_file, "ordered", "hog"), num_processes=1, memory_limit_mb=500) as scorer:
        result = call(scorer, 1, ["a"])
        assert result.scores == [None]
        assert "MemoryError" in result.error or "died" in result.error
        assert call(scorer, 0, ["7"], level=[0]) == SandboxResult([7.0], None)


# ---- construction and shutdown -------------------------------------------------------------------


def test_bad_spec_raises_at_construction_with_the_registry_message(tmp_path):
    broken = tmp_path / "broken.py"
    broken.write_text("import no_such_module_here\n")
    for spec in ("no_such_builtin", f"{broken}:fn"):
        with pytest.raises(RewardSpecError) as in_process:
            load_reward_function(spec)
        with pytest.raises(RewardSpecError) as sandboxed:
            SandboxedScorer([(spec, {})])
        assert str(sandboxed.value) == str(in_process.value)


def test_close_kills_and_reaps_every_child(rewards_file):
    scorer = SandboxedScorer(specs(rewards_file, "ordered"), num_processes=2)
    pids = scorer.pids
    assert len(pids) == 2 and all(map(is_alive, pids))
    scorer.close()
    assert not any(map(is_alive, pids))
    scorer.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        call(scorer, 0, ["1"], level=[0])


def test_children_die_when_the_parent_is_killed(rewards_file, tmp_path):
    # The parent starts two children and hangs one of them: the idle child must notice EOF on its
    # pipe, the busy one must notice through its watchdog thread (within about a second).
    script = tmp_path / "parent.py"
    script.write_text(
        textwrap.dedent(
            f"""
            from grpo_ray.rewards.sandbox import SandboxedScorer

            if __name__ == "__main__":
                spec = {str(rewards_file) + ":sleepy"!r}
                scorer = SandboxedScorer([(spec, {{}})], num_processes=2)
                print(*scorer.pids, flush=True)
                scorer.score(0, ["hang"], [""], [""], {{}})
            """
        )
    )
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        pids = [int(pid) for pid in parent.stdout.readline().split()]
        assert len(pids) == 2
        time.sleep(0.3)  # let the hanging request reach its child
    finally:
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        parent.stdout.close()
    assert wait_until_dead(pids, within_s=5) == []


def test_module_docstring_example_runs():
    failures, _ = doctest.testmod(sandbox_module)
    assert failures == 0

"""The reward pool as actors: rows split across K workers, misbehaving functions isolated."""

import numpy as np
import pytest

from grpo_ray.actors.reward import RewardFunctionSetting, RewardIsolation, RewardWorker
from grpo_ray.actors.slices import pack_slice
from grpo_ray.cluster.dispatch import collect_scores, pool_tasks
from grpo_ray.training.rows import failure_counts
from grpo_ray.types import Completion, Prompt

USER_REWARDS = """
import os, time

def flaky(completions, prompts, answers, **_):
    # Hangs on a batch that holds "hang", aborts the process on "abort", raises on "raise".
    if any("hang" in c for c in completions):
        time.sleep(10**6)
    if any("abort" in c for c in completions):
        os.abort()
    if any("raise" in c for c in completions):
        raise RuntimeError("user function raised")
    return [float(len(c)) for c in completions]
"""


def make_slice(texts, answers):
    prompt = Prompt(uid=0, text="q", token_ids=(1, 2), answer="")
    rows = [
        (i, Prompt(uid=i, text="q", token_ids=(1, 2), answer=a), Completion((3,), (-0.1,), t, "stop"))
        for i, (t, a) in enumerate(zip(texts, answers))
    ]
    del prompt
    return pack_slice(rows, pad_id=0, policy_version=0)


def test_two_workers_split_rows_and_agree_with_one(local_ray):
    ray = local_ray
    texts = [f"\\boxed{{{i}}}" for i in range(40)]
    answers = [str(i if i % 3 else i + 1) for i in range(40)]  # every third answer differs
    batch_ref = ray.put(make_slice(texts, answers))
    functions = [RewardFunctionSetting("math", 1.0, {}), RewardFunctionSetting("exact_match", 0.5, {})]
    remote = ray.remote(num_cpus=0.25)(RewardWorker)
    one = [remote.remote(functions, RewardIsolation("subprocess", 1, 30.0))]
    two = [remote.remote(functions, RewardIsolation("subprocess", 1, 30.0)) for _ in range(2)]
    # The run's own path: the slice's rows split across the workers, their parts concatenated.
    single = collect_scores((pool_tasks(one, batch_ref, 40), None), 0.0)
    split = collect_scores((pool_tasks(two, batch_ref, 40), None), 0.0)
    expected_math = np.array([0.0 if i % 3 == 0 else 1.0 for i in range(40)])
    np.testing.assert_array_equal(single.per_function["math"], expected_math)
    np.testing.assert_array_equal(split.rewards, single.rewards)
    np.testing.assert_array_equal(split.group_ids, np.arange(40))
    for actor in one + two:
        ray.kill(actor)


@pytest.mark.parametrize(
    "bad, expected",
    [("hang", "timed out"), ("abort", "died"), ("raise", "user function raised")],
)
def test_misbehaving_user_function_fails_its_rows_and_the_pool_recovers(local_ray, tmp_path, bad, expected):
    ray = local_ray
    path = tmp_path / "user_rewards.py"
    path.write_text(USER_REWARDS)
    spec = f"{path}:flaky"
    worker = ray.remote(num_cpus=0.25)(RewardWorker).remote(
        [RewardFunctionSetting(spec, 1.0, {})], RewardIsolation("subprocess", 1, 2.0)
    )
    failed = ray.get(worker.score.remote(make_slice(["ok", bad, "fine"], ["", "", ""])))
    # The batch call fails; the scorer (rewards/scorer.py, as `grpo-ray rewards score`) retries row by
    # row, so only the bad row fails: "ok" and "fine" score their lengths.
    np.testing.assert_array_equal(np.isnan(failed.rewards), [False, True, False])
    np.testing.assert_array_equal(failed.rewards[[0, 2]], [2.0, 4.0])
    assert failed.failures == {spec: 1} and expected in failed.first_errors[spec]
    failures, total, errors = failure_counts([failed])
    assert (failures, total) == ({spec: 1}, 3) and expected in errors[spec]
    # The next batch scores normally: the child was replaced, the actor lives on.
    recovered = ray.get(worker.score.remote(make_slice(["ok", "fine"], ["", ""])))
    np.testing.assert_array_equal(recovered.rewards, [2.0, 4.0])
    # A hang or an abort kills the child twice: in the batch call and in the bad row's own call.
    assert ray.get(worker.restarts.remote()) == (0 if bad == "raise" else 2)
    ray.kill(worker)

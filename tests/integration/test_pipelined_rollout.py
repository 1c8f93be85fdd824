"""Pipelined rollout (rollout.max_staleness: 1) on the tiny recipe, with real Ray actors.

The next step's batch is generated while the learner updates, so it was sampled by weights one
update old: the step says so (batch/staleness, batch/policy_version), the learner reweights every
row of it (update/stale_rows), and a checkpoint is never crossed, so a run resumed from one
continues exactly as the run that wrote it. A rollout worker killed while it samples a batch ahead
is replaced, and its share is sampled again by the weights that sampled the rest of the batch.

The runs distil from a teacher (issue 54): the tiny model as it starts, so a batch sampled by the
first weights, scored against the log-probs that sampled it, has nothing to learn from the teacher.
"""

import shutil
import threading
import time
from pathlib import Path

import psutil
import pytest
from mlflow.tracking import MlflowClient

from grpo_ray.config import load_config
from grpo_ray.training.loop import train
from grpo_ray.training.run import current_phase

from .conftest import assert_same_weights, kill_child_titled

TINY = Path(__file__).resolve().parents[2] / "configs" / "tiny.yaml"
SETTINGS = [
    "train.steps=6",
    "train.checkpoint_every=3",
    "train.eval_every=0",
    "data.eval_limit=20",
    "rollout.max_staleness=1",
    "weight_sync.probe_every=1",
    "weight_sync.measure_raw_broadcast=true",
    "distillation.teachers=[{name: t, model_path: tiny}]",
]
COMPARED = (
    "batch/prompt_digest",
    "reward/mean",
    "loss/policy",
    "actor/entropy",
    "batch/staleness",
    "distill/t/reverse_kl",
    "distill/t/teacher_logprob",
)


def per_step(tracking_uri: str, run_id: str, key: str) -> dict[int, float]:
    """The last value logged at each step."""
    history = MlflowClient(tracking_uri).get_metric_history(run_id, key)
    return {m.step: m.value for m in sorted(history, key=lambda m: m.timestamp)}


@pytest.fixture(scope="module")
def pipelined(tmp_path_factory):
    out = tmp_path_factory.mktemp("pipelined")
    return out, train(load_config(TINY, [f"output_dir={out}", *SETTINGS]))


def test_the_next_batch_is_sampled_one_update_behind_except_after_a_checkpoint(pipelined):
    _, result = pipelined
    staleness = per_step(result.tracking_uri, result.run_id, "batch/staleness")
    # Step 1 has nothing before it; steps 4 is drawn after step 3's checkpoint, as a resume draws it.
    assert staleness == {1: 0.0, 2: 1.0, 3: 1.0, 4: 0.0, 5: 1.0, 6: 1.0}
    versions = per_step(result.tracking_uri, result.run_id, "batch/policy_version")
    assert versions == {1: 0.0, 2: 0.0, 3: 1.0, 4: 3.0, 5: 3.0, 6: 4.0}
    # The learner saw the same thing row by row: every row of a stale batch was reweighted.
    stale_rows = per_step(result.tracking_uri, result.run_id, "update/stale_rows")
    assert stale_rows == {step: value for step, value in staleness.items()}
    # What overlapped each update: the next step's batch, generating beside it, except before the
    # checkpoint at step 3 and at the end (nothing is started ahead past either).
    ahead = per_step(result.tracking_uri, result.run_id, "pipeline/ahead_during_update")
    assert ahead == {1: 1.0, 2: 1.0, 3: 0.0, 4: 1.0, 5: 1.0, 6: 0.0}
    generated = per_step(result.tracking_uri, result.run_id, "pipeline/ahead_generated_by_update_end")
    assert all(0 <= generated[step] <= ahead[step] for step in ahead)
    # The weights still reached the rollout engine after every update (probe every sync).
    probe = per_step(result.tracking_uri, result.run_id, "sync/probe_max_abs_diff")
    assert len(probe) == 6 and max(probe.values()) < 1e-3


def test_the_teacher_scores_each_batch_against_the_weights_that_sampled_it(pipelined):
    _, result = pipelined
    versions = per_step(result.tracking_uri, result.run_id, "batch/policy_version")
    kl = per_step(result.tracking_uri, result.run_id, "distill/t/reverse_kl")
    rows = per_step(result.tracking_uri, result.run_id, "distill/t/rows")
    # Every row of every step taught (32 prompts x 8), as many as the learner trained on.
    assert rows == {step: 256.0 for step in range(1, 7)}
    # The teacher is the first weights: the batches they sampled (steps 1 and 2; step 2's during
    # step 1's update, while the learner already held the next weights) show no gap, measured
    # against the rows' own rollout log-probs; every later batch, sampled by trained weights, does.
    assert {step for step, version in versions.items() if version == 0} == {1, 2}
    assert all((abs(kl[step]) < 1e-5) == (versions[step] == 0) for step in versions), (kl, versions)
    assert min(abs(kl[step]) for step in (3, 4, 5, 6)) > 1e-4, kl


def test_sync_bandwidth_is_logged_next_to_a_raw_broadcast_of_the_same_bytes(pipelined):
    _, result = pipelined
    raw = per_step(result.tracking_uri, result.run_id, "sync/raw_broadcast_gbps")
    sync = per_step(result.tracking_uri, result.run_id, "sync/gbytes_per_s")
    assert list(raw) == [0] and raw[0] > 0  # the hand-off's yardstick: a plain copy on the learner's device
    assert len(sync) == 6 and min(sync.values()) > 0


def test_a_resumed_pipelined_run_continues_exactly(pipelined, tmp_path):
    out, result = pipelined
    # The run as it stood after its step-3 checkpoint: the same MLflow store, the last checkpoint gone.
    copy = tmp_path / "resumed"
    shutil.copytree(out, copy)
    shutil.rmtree(copy / "checkpoints" / "step_000006")
    shutil.rmtree(copy / "model")
    resumed = train(load_config(TINY, [f"output_dir={copy}", *SETTINGS]))
    assert resumed.run_id == result.run_id
    for key in COMPARED:
        original = per_step(result.tracking_uri, result.run_id, key)
        again = per_step(resumed.tracking_uri, resumed.run_id, key)
        assert {s: again[s] for s in (4, 5, 6)} == {s: original[s] for s in (4, 5, 6)}, key
    # And it ends on the same weights, bit for bit.
    assert_same_weights(out / "model", copy / "model")


def test_the_run_ends_at_the_first_evaluation_that_reaches_stop_at_accuracy(tmp_path):
    # The tiny model starts near 20% held-out accuracy: the first evaluation after step 0 reaches 5%.
    settings = [
        f"output_dir={tmp_path}",
        "train.steps=6",
        "train.eval_every=2",
        "data.eval_limit=20",
        "rollout.max_staleness=1",
        "train.stop_at_accuracy=0.05",
    ]
    result = train(load_config(TINY, settings))
    assert result.steps == 2 and result.eval_accuracy[2] >= 0.05
    assert result.model_dir is not None and (Path(result.model_dir) / "config.json").exists()
    # The run is finished: the same command again trains nothing.
    again = train(load_config(TINY, settings))
    assert again.steps == 2


def kill_while_sampling_ahead(killed: list[int], done: threading.Event) -> None:
    """SIGKILL the rollout worker while it generates during an update: the batch started ahead."""
    while not done.is_set() and not killed:
        if current_phase() == "update":
            if (pid := kill_child_titled(psutil.Process(), "ray::RolloutWorker.generate")) is not None:
                killed.append(pid)
                return
        time.sleep(0.0005)


def test_a_share_lost_ahead_is_sampled_again_by_the_weights_that_sampled_the_batch(pipelined, tmp_path, capsys):
    _, result = pipelined
    killed, done = [], threading.Event()
    killer = threading.Thread(target=kill_while_sampling_ahead, args=(killed, done), daemon=True)
    killer.start()
    try:
        hurt = train(load_config(TINY, [f"output_dir={tmp_path}", *SETTINGS]))
    finally:
        done.set()
        killer.join()
    out = capsys.readouterr().out
    assert killed, "the rollout worker was never seen generating during an update"
    assert "died and was replaced" in out and "sampled by weights version" in out and "sampled by them again" in out, (
        out[-3000:]
    )
    assert sum(per_step(hurt.tracking_uri, hurt.run_id, "faults/rollout_replaced").values()) == 1.0
    # One update older than the weights the workers held then, and still the unhurt run, step by step.
    for key in COMPARED:
        assert per_step(hurt.tracking_uri, hurt.run_id, key) == per_step(result.tracking_uri, result.run_id, key), key

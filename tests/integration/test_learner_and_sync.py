"""Real learner and rollout actors on a local Ray: data-parallel exactness and weight sync.

The batch is generated once by a plain (in-process) RolloutWorker, so every test feeds the
learners the very same tokens.
"""

import numpy as np
import pytest

from grpo_ray.actors.reward import RewardFunctionSetting, RewardWorker
from grpo_ray.actors.rollout import RolloutWorker
from grpo_ray.cluster.placement import reserve, wait_ready
from grpo_ray.cluster.roles import setup_learners, start_learners, start_rollouts
from grpo_ray.cluster.settings import rollout_settings
from grpo_ray.cluster.weight_broadcast import WeightBroadcaster, WeightSyncError
from grpo_ray.config import RoleResources, config_from_dict, plan_batches
from grpo_ray.data.loaders import load_rows
from grpo_ray.data.prompts import tokenize_prompts
from grpo_ray.training.rows import StepRows
from grpo_ray.training.update import group_advantages
from grpo_ray.models.loading import load_tokenizer
from grpo_ray.training.inputs import make_probe
from grpo_ray.types import LearnerShard, SamplingSettings


PROMPTS, SAMPLES = 8, 4  # 32 completions per step


def make_cfg(**sections):
    base = {
        "model": {"path": "tiny"},
        "data": {"max_prompt_tokens": 32},
        "rollout": {"samples_per_prompt": SAMPLES, "max_new_tokens": 5, "num_cpus": 0.5},
        "learner": {"micro_batch_size": 8, "lr": 1e-3, "num_cpus": 0.5},
        "train": {"prompts_per_step": PROMPTS},
    }
    for name, values in sections.items():
        base.setdefault(name, {}).update(values)
    return config_from_dict(base)


@pytest.fixture(scope="module")
def step_batch():
    """One step's slice, its scores and advantages, made in this process."""
    cfg = make_cfg()
    tokenizer = load_tokenizer("tiny")
    rows, _ = load_rows("tiny:train")
    prompts = tokenize_prompts(rows[:PROMPTS], tokenizer, 32, True).prompts
    worker = RolloutWorker(rollout_settings(cfg, 0))
    sampling = SamplingSettings(samples_per_prompt=SAMPLES, max_new_tokens=5, temperature=1.0, seed=1)
    batch = worker.generate(prompts, 0, sampling, 1)
    scored = RewardWorker([RewardFunctionSetting("exact_match", 1.0, {})]).score(batch)
    rows = StepRows.from_scored([scored], [scored.rewards], [np.ones(scored.rewards.shape)])
    advantages = group_advantages(rows, cfg.algorithm.advantage, cfg.algorithm.normalize_by_std)
    assert np.abs(advantages).sum() > 0, "the batch must carry a learning signal"
    return batch, scored, advantages, make_probe(prompts, tokenizer)


def shard_for(batch, advantages, rows, step=1):
    return LearnerShard(
        step=step,
        advantages=[advantages[rows]],
        row_weights=[np.ones(len(rows), dtype=np.float32)],
        global_tokens=float(batch.completion_mask.sum()),
        global_sequences=int((batch.completion_lengths > 0).sum()),
        temperature=1.0,
        norm_length=5.0,  # rollout.max_new_tokens above
    )


def start_learner_group(ray, cfg):
    plan = plan_batches(cfg)
    resources = RoleResources("learner", cfg.learner.num_workers, cfg.learner.num_cpus, 0)
    placement = reserve([resources], 60)
    learners = start_learners(cfg, plan, placement, resources)
    wait_ready({f"learner-{i}": a for i, a in enumerate(learners)})
    setup_learners(learners)
    return placement, learners


def max_diff(a: dict, b: dict) -> float:
    """The largest difference of any parameter between two snapshots."""
    return max(float(np.abs(a[n] - b[n]).max()) for n in a)


def one_update(ray, batch, advantages, algorithm: dict | None = None, **learner) -> tuple[dict, dict, dict]:
    """(parameters before, after, the rank's metrics) of one train_step of the whole batch on a single
    rank with these learner (and algorithm) settings."""
    placement, learners = start_learner_group(ray, make_cfg(learner=learner, algorithm=algorithm or {}))
    before = ray.get(learners[0].parameters_snapshot.remote())
    stats = ray.get(learners[0].train_step.remote(shard_for(batch, advantages, np.arange(batch.num_rows)), batch))
    after = ray.get(learners[0].parameters_snapshot.remote())
    ray.kill(learners[0])
    placement.remove()
    return before, after, stats.metrics


def update_by_world(ray, batch, advantages, learner: dict, rank_rows=None) -> tuple[dict, dict[int, dict]]:
    """(parameters before, {1 or 2 ranks: rank 0's parameters after one update of the whole batch}).
    Rank r of `world` trains on rows rank_rows[world][r], by default [r*n/world, (r+1)*n/world); the
    normalisers stay those of the whole step. Two ranks must end with identical parameters."""
    results = {}
    for world in (1, 2):
        placement, learners = start_learner_group(ray, make_cfg(learner={"num_workers": world, **learner}))
        # Every rank takes part: under ZeRO-3 gathering the full parameters is a collective.
        before = ray.get([lr.parameters_snapshot.remote() for lr in learners])[0]
        parts = rank_rows[world] if rank_rows else np.array_split(np.arange(batch.num_rows), world)
        ray.get(
            [
                lr.train_step.remote(shard_for(batch, advantages, rows), batch.select(rows))
                for lr, rows in zip(learners, parts)
            ]
        )
        snapshots = ray.get([lr.parameters_snapshot.remote() for lr in learners])
        results[world] = snapshots[0]
        if world == 2:
            # Both ranks hold (or, under ZeRO-3, gather) identical full parameters after the step.
            for name in snapshots[0]:
                np.testing.assert_array_equal(snapshots[0][name], snapshots[1][name], err_msg=name)
        for actor in learners:
            ray.kill(actor)
        placement.remove()
    return before, results


@pytest.mark.parametrize("zero_stage", [2, 3])
def test_two_rank_update_equals_one_rank(local_ray, step_batch, zero_stage):
    batch, _, advantages, _ = step_batch
    before, results = update_by_world(local_ray, batch, advantages, {"zero_stage": zero_stage})
    assert max_diff(before, results[1]) > 1e-4, (
        "the update must change the parameters for the comparison to mean anything"
    )
    worst = max_diff(results[1], results[2])
    assert worst < 1e-5, f"2-rank ZeRO-{zero_stage} differs from 1 rank by {worst:.2e}"


def test_gradient_checkpointing_gives_the_same_update(local_ray, step_batch):
    batch, _, advantages, _ = step_batch
    # Both without shared prompts (checkpointing keeps no cache to share): the same sums in the same order.
    before, plain, _ = one_update(local_ray, batch, advantages, share_prompts=False)
    _, recomputed, _ = one_update(local_ray, batch, advantages, share_prompts=False, gradient_checkpointing=True)
    assert max_diff(recomputed, before) > 1e-4
    worst = max_diff(recomputed, plain)
    assert worst < 1e-6, f"recomputed activations changed the update by {worst:.2e}"


def test_shared_prompts_give_the_same_update(local_ray, step_batch):
    batch, _, advantages, _ = step_batch
    before, plain, _ = one_update(local_ray, batch, advantages, share_prompts=False)
    _, shared, _ = one_update(local_ray, batch, advantages, share_prompts=True)
    # Adam's first step moves every weight by ~lr (1e-3) in its gradient's sign: a wrong gradient
    # flips signs (2e-3 apart); float rounding only moves weights whose gradient is ~0 (seen: 1e-5).
    assert max_diff(shared, before) > 5e-4
    worst = max_diff(shared, plain)
    assert worst < 1e-4, f"sharing the prompts' forward changed the update by {worst:.2e}"


def test_chunked_logprobs_give_the_same_update(local_ray, step_batch):
    batch, _, advantages, _ = step_batch
    # 3 positions a chunk: several chunks per micro-batch, one cut mid-row. An entropy bonus, so the
    # entropy's gradient goes through the chunked backward too.
    (before, full, full_metrics), (_, chunked, chunked_metrics) = (
        one_update(local_ray, batch, advantages, algorithm={"entropy_coef": 0.01}, logprob_chunk_tokens=chunk)
        for chunk in (0, 3)
    )
    assert max_diff(full, before) > 5e-4
    # As for shared prompts: a wrong gradient flips Adam's ~lr steps; rounding moves near-zero ones.
    worst = max_diff(chunked, full)
    assert worst < 1e-4, f"chunking the LM head changed the update by {worst:.2e}"
    assert abs(chunked_metrics["actor/entropy"] - full_metrics["actor/entropy"]) <= 1e-5 * full_metrics["actor/entropy"]


def test_packing_and_token_budget_micro_batches_give_the_same_update(local_ray, step_batch):
    batch, _, advantages, _ = step_batch
    # Rows are ~20 tokens: 60 padded tokens hold ~3 rows a micro-batch, 100 packed ~5 (8 and 4 micro-
    # batches against row-count's 4 of 8), grouped by length instead of batch order.
    before, rows, _ = one_update(local_ray, batch, advantages, share_prompts=False)
    assert max_diff(rows, before) > 5e-4
    for learner in (
        {"max_tokens_per_micro_batch": 60},
        {"packing": True},
        {"packing": True, "max_tokens_per_micro_batch": 100},
    ):
        _, other, _ = one_update(local_ray, batch, advantages, **learner)
        # As for shared prompts: a wrong gradient flips Adam's ~lr steps; rounding moves near-zero ones.
        worst = max_diff(other, rows)
        assert worst < 1e-4, f"{learner} changed the update by {worst:.2e}"


def test_two_ranks_with_unequal_token_budget_plans_equal_one_rank(local_ray, step_batch):
    """Rank 1 gets 3 rows to rank 0's 29: it runs out of rows and pads with empty micro-batches, so
    both ranks reduce gradients the same number of times, and the step equals one rank's."""
    batch, _, advantages, _ = step_batch
    learner = {"packing": True, "max_tokens_per_micro_batch": 80, "zero_stage": 2}
    rank_rows = {1: [np.arange(batch.num_rows)], 2: [np.arange(29), np.arange(29, batch.num_rows)]}
    before, results = update_by_world(local_ray, batch, advantages, learner, rank_rows)
    assert max_diff(results[1], before) > 1e-4
    worst = max_diff(results[1], results[2])
    assert worst < 1e-5, f"2 ranks with unequal plans differ from 1 rank by {worst:.2e}"


# The vllm engine's side of this is test_vllm_engine.py (every shard of a TP-2 engine, every sync).
# Learner and engine share this host: by default the hand-off (shared memory), else gloo's broadcast.
@pytest.mark.parametrize("backend, same_device", [("hf", "handoff"), ("hf", "broadcast")])
def test_rollout_logprobs_equal_learner_after_sync(local_ray, step_batch, backend, same_device):
    ray = local_ray
    batch, _, advantages, probe = step_batch
    cfg = make_cfg(rollout={"backend": backend, "vllm": {"cpu_kv_cache_gb": 0.25}})
    plan = plan_batches(cfg)
    learner_res = RoleResources("learner", 1, 0.5, 0)
    rollout_res = RoleResources("rollout", 1, 0.5, 0)
    placement = reserve([learner_res, rollout_res], 60)
    learners = start_learners(cfg, plan, placement, learner_res)
    rollouts = start_rollouts(cfg, placement, rollout_res)
    wait_ready({"learner-0": learners[0], "rollout-0": rollouts[0]})
    setup_learners(learners)
    # The probe's baseline is scored here, while learner and engine hold the starting weights.
    sync = WeightBroadcaster(learners, rollouts, bucket_mb=0.5, timeout_s=120, same_device=same_device, probe=probe)
    if same_device == "handoff":
        assert (sync.handoff_ranks, sync.broadcast_ranks, sync.notes) == (1, 0, [])
        assert "by hand-off" in sync.route_line and len(sync.buckets) > 2  # both slots refilled
    else:
        assert (sync.handoff_ranks, sync.broadcast_ranks) == (0, 1)
        assert (sync.backend, sync.backend_reason) == ("gloo", "a process of the group has no GPU")
    try:
        ray.get(learners[0].train_step.remote(shard_for(batch, advantages, np.arange(batch.num_rows)), batch))
        args = (batch.input_ids, batch.attention_mask, 1.0)
        mask = batch.completion_mask
        stale_gap = np.abs(ray.get(rollouts[0].score.remote(*args)) - ray.get(learners[0].score.remote(*args))) * mask
        assert stale_gap.max() > 1e-3, "before the sync the engine must still hold the old weights"

        result = sync.sync(version=1, probe=probe, probe_tolerance=1e-4)
        assert result.num_bytes > 0 and result.probe_max_abs_diff <= 1e-4
        assert result.probe.undecided == 0, "one update at lr 1e-4 moves the probe far past the kernels' noise"
        gap = np.abs(ray.get(rollouts[0].score.remote(*args)) - ray.get(learners[0].score.remote(*args))) * mask
        assert gap.max() < 1e-4, f"{backend}: engine and learner log-probs differ by {gap.max():.2e} after the sync"

        # Sampled completions carry the sampler's log-probs: equal to the learner's on the same tokens.
        sampled = ray.get(rollouts[0].generate.remote([_prompt_of(batch)], 0, SamplingSettings(4, 5, 1.0, seed=3), 1))
        learner_view = ray.get(learners[0].score.remote(sampled.input_ids, sampled.attention_mask, 1.0))
        sample_gap = np.abs(learner_view - sampled.rollout_logprobs) * sampled.completion_mask
        assert sample_gap.max() < 1e-4, f"{backend}: sampling log-probs differ by {sample_gap.max():.2e}"

        # An engine that stops loading what it receives: the digests match, the probe names it, at
        # a tolerance above the kernels' noise and at one below it.
        ray.get(rollouts[0].keep_old_weights.remote())
        ray.get(learners[0].train_step.remote(shard_for(batch, advantages, np.arange(batch.num_rows)), batch))
        for version, tolerance in ((2, 1e-4), (3, 1e-9)):
            with pytest.raises(
                WeightSyncError,
                match=r"^rollout-0: its engine did not load the sent weights: .* "
                r"from those of version 1 ",
            ):
                sync.sync(version=version, probe=probe, probe_tolerance=tolerance)
    finally:
        for actor in learners + rollouts:
            ray.kill(actor)
        placement.remove()


def _prompt_of(batch):
    from grpo_ray.types import Prompt

    prompt_len = int(batch.attention_mask[0].sum() - batch.completion_mask[0].sum())
    return Prompt(
        uid=0,
        text=batch.prompts[0],
        token_ids=tuple(int(t) for t in batch.input_ids[0, :prompt_len]),
        answer=batch.answers[0],
    )


def test_masked_rows_leave_the_policy_unchanged(local_ray, step_batch):
    ray = local_ray
    batch, _, advantages, _ = step_batch
    placement, learners = start_learner_group(ray, make_cfg())
    before = ray.get(learners[0].parameters_snapshot.remote())
    rows = np.arange(batch.num_rows)
    shard = shard_for(batch, advantages, rows)
    masked = LearnerShard(**{**shard.__dict__, "row_weights": [np.zeros(batch.num_rows, dtype=np.float32)]})
    ray.get(learners[0].train_step.remote(masked, batch))
    after = ray.get(learners[0].parameters_snapshot.remote())
    # Every row out of the loss: zero gradients, and AdamW (no weight decay) takes a zero step.
    assert max(float(np.abs(after[n] - before[n]).max()) for n in before) == 0.0
    ray.kill(learners[0])
    placement.remove()


def test_second_pass_uses_rollout_logprobs_as_pi_old(local_ray, step_batch):
    ray = local_ray
    batch, _, advantages, _ = step_batch
    rows = np.arange(batch.num_rows)
    ratios = {}
    for mu in (1, 2):
        cfg = make_cfg(algorithm={"epochs_per_batch": mu, "tis_cap": 2.0})
        placement, learners = start_learner_group(ray, cfg)
        stats = ray.get(learners[0].train_step.remote(shard_for(batch, advantages, rows), batch))
        ratios[mu] = stats.metrics["actor/ratio_mean"]
        ray.kill(learners[0])
        placement.remove()
    # One pass: pi_old is the current policy, the ratio is exactly 1. Two passes: after the first
    # update the policy has moved away from the rollout-time log-probs.
    assert ratios[1] == 1.0
    assert abs(ratios[2] - 1.0) > 1e-4


@pytest.mark.parametrize("zero_stage", [0, 2])
def test_a_nan_loss_skips_the_update_and_a_checkpoint_restores_model_and_optimizer(
    local_ray, step_batch, tmp_path, zero_stage
):
    ray = local_ray
    batch, _, advantages, _ = step_batch
    rows = np.arange(batch.num_rows)
    good = shard_for(batch, advantages, rows)
    poisoned = LearnerShard(**{**good.__dict__, "advantages": [np.full(batch.num_rows, np.nan, dtype=np.float32)]})
    placement, learners = start_learner_group(ray, make_cfg(learner={"zero_stage": zero_stage}))
    learner = learners[0]
    try:
        ray.get(learner.train_step.remote(good, batch))  # optimizer state to save
        before = ray.get(learner.parameters_snapshot.remote())
        stats = ray.get(learner.train_step.remote(poisoned, batch))
        assert stats.metrics["update/skipped"] == 1.0
        after = ray.get(learner.parameters_snapshot.remote())
        assert all(np.array_equal(before[n], after[n]) for n in before), (
            "a NaN loss must leave the weights as they were"
        )

        ray.get(learner.save_checkpoint.remote(str(tmp_path / "learner")))
        stats = ray.get(learner.train_step.remote(good, batch))
        assert stats.metrics["update/skipped"] == 0.0
        expected = ray.get(learner.parameters_snapshot.remote())
        assert max(float(np.abs(expected[n] - before[n]).max()) for n in before) > 1e-5
        # Back to the checkpoint: the same step from there lands on the same weights (Adam's moments restored too).
        ray.get(learner.load_checkpoint.remote(str(tmp_path / "learner")))
        assert all(np.array_equal(before[n], v) for n, v in ray.get(learner.parameters_snapshot.remote()).items())
        ray.get(learner.train_step.remote(good, batch))
        again = ray.get(learner.parameters_snapshot.remote())
        assert all(np.array_equal(expected[n], again[n]) for n in expected)
    finally:
        ray.kill(learner)
        placement.remove()


@pytest.mark.parametrize("kind", ["4bit", "8bit"])
def test_quantized_base_trains_only_the_adapter(local_ray, step_batch, kind):
    """QLoRA / 8-bit: one real update over a bitsandbytes base (its CPU backend here): the policy's
    log-probs move, every base weight stays as loaded (so the adapter moved), and a sync plans the
    adapter alone."""
    pytest.importorskip("bitsandbytes")  # the optional [quant] extra
    batch, _, advantages, _ = step_batch
    cfg = make_cfg(model={"quantization": kind, "lora": {"enabled": True, "rank": 4, "alpha": 8.0}})
    placement, learners = start_learner_group(local_ray, cfg)
    try:
        learner = learners[0]
        before = local_ray.get(learner.parameters_snapshot.remote())
        scored_before = local_ray.get(learner.score.remote(batch.input_ids, batch.attention_mask))
        local_ray.get(learner.train_step.remote(shard_for(batch, advantages, np.arange(batch.num_rows)), batch))
        after = local_ray.get(learner.parameters_snapshot.remote())
        scored_after = local_ray.get(learner.score.remote(batch.input_ids, batch.attention_mask))
        specs, _ = local_ray.get(learner.weight_plan.remote(1 << 20, True))
    finally:
        local_ray.kill(learners[0])
        placement.remove()
    assert before.keys() == after.keys() and before
    worst = max(float(np.abs(after[n] - before[n]).max()) for n in before)
    assert worst == 0.0, f"the quantised base moved by {worst:.2e}; it must stay frozen"
    moved = float(np.abs(scored_after - scored_before).max())
    assert moved > 1e-5, f"the adapter's update must change the policy (log-probs moved {moved:.2e})"
    names = [spec.name for spec in specs]
    assert names and all("lora_" in name for name in names), names

"""Learner switches of issue 21 on real DeepSpeed learners in a local Ray: the LR schedule, ZeRO
optimizer/parameter offload (DeepSpeed's CPU Adam) and bf16.

DeepSpeed's CPU Adam compiles a C++ op on first use (about 45 s on an idle machine, 7m44s while
three other agents loaded this one): it is built into the checkout's .cache/torch_extensions
(git-ignored) and reused by every later run. Tests marked `cpu_adam` need it.
"""

import numpy as np
import pytest

from grpo_ray.cluster.placement import reserve
from grpo_ray.cluster.roles import setup_learners, start_learners
from grpo_ray.config import RoleResources, plan_batches

from .test_learner_and_sync import (  # noqa: F401 - step_batch: a fixture
    make_cfg,
    max_diff,
    one_update,
    shard_for,
    start_learner_group,
    step_batch,
    update_by_world,
)

LR = 1e-3  # make_cfg's learner.lr


def test_the_schedule_sets_the_lr_the_optimizer_uses(local_ray, step_batch):
    batch, _, advantages, _ = step_batch
    # Linear warmup over 2 steps: step 1 trains at LR * 1/2 = 5e-4, exactly as a constant 5e-4 does.
    # (Step 1 for both: at a later step the batch's rows would count as sampled by older weights.)
    before, warm, metrics = one_update(local_ray, batch, advantages, lr_schedule="linear", warmup_steps=2)
    _, half, plain = one_update(local_ray, batch, advantages, lr=LR / 2)
    assert metrics["actor/lr"] == LR / 2 and plain["actor/lr"] == LR / 2
    assert max_diff(before, warm) > 1e-4, "the update must move the parameters"
    assert max_diff(warm, half) == 0.0


def assert_two_ranks_equal_one(before: dict, by_world: dict[int, dict], learner: dict) -> None:
    assert max_diff(before, by_world[1]) > 1e-4
    # The same bound as test_learner_and_sync's 2-rank test without offload.
    worst = max_diff(by_world[1], by_world[2])
    print(f"{learner}: 2 ranks vs 1 {worst:.3e}")
    assert worst < 1e-5, f"2-rank offload differs from 1 rank by {worst:.2e}"


@pytest.mark.cpu_adam
def test_optimizer_offload_gives_the_update_of_torch_adamw_and_two_ranks_equal_one(local_ray, step_batch):
    batch, _, advantages, _ = step_batch
    learner = {"zero_stage": 2, "offload_optimizer": "cpu"}
    before, plain, _ = one_update(local_ray, batch, advantages, zero_stage=2)
    # The 1-rank offloaded update is the one compared with torch AdamW (one group less to start).
    _, by_world = update_by_world(local_ray, batch, advantages, learner)
    offloaded = by_world[1]
    moved = max_diff(before, plain)
    worst = max_diff(plain, offloaded)
    print(f"moved {moved:.3e}, offload vs plain {worst:.3e}")
    assert moved > 1e-4
    # One Adam step moves each weight by lr * m / (sqrt(v) + eps) = lr * g / (|g| + eps) ~ lr: the two
    # implementations (C++ SIMD vs torch) differ only in float32 rounding of that update (a few ulp
    # of 1e-3, ~1e-10) and of the weight it is added to: the largest weights here are the norms'
    # ~1.0, whose ulp is 1.19e-7. Measured: 1.19e-7 (one ulp). The bound allows four.
    assert worst < 4 * 1.2e-7, f"CPU Adam offload differs from torch AdamW by {worst:.2e}"
    assert_two_ranks_equal_one(before, by_world, learner)


@pytest.mark.cpu_adam
def test_two_rank_update_equals_one_rank_with_optimizer_and_parameter_offload(local_ray, step_batch):
    # ZeRO-2 with optimizer offload: in the test above.
    batch, _, advantages, _ = step_batch
    learner = {"zero_stage": 3, "offload_optimizer": "cpu", "offload_params": "cpu"}
    assert_two_ranks_equal_one(*update_by_world(local_ray, batch, advantages, learner), learner)


def test_bf16_trains_and_the_sync_sends_bf16(local_ray, step_batch):
    """bf16 runs on CPU (fp16 does not: see grpo_ray/actors/deepspeed_setup.py). The sync plan's
    dtype is the module's, the dtype the rollout engine serves (model.dtype on every role)."""
    ray = local_ray
    batch, _, advantages, _ = step_batch
    placement, learners = start_learner_group(ray, make_cfg(model={"dtype": "bfloat16"}, learner={"zero_stage": 2}))
    before = ray.get(learners[0].parameters_snapshot.remote())
    stats = ray.get(learners[0].train_step.remote(shard_for(batch, advantages, np.arange(batch.num_rows)), batch))
    after = ray.get(learners[0].parameters_snapshot.remote())
    specs, _ = ray.get(learners[0].weight_plan.remote(1 << 20))
    ray.kill(learners[0])
    placement.remove()
    assert stats.metrics["update/skipped"] == 0.0 and np.isfinite(stats.metrics["loss/total"])
    assert max_diff(before, after) > 1e-4
    assert {spec.dtype for spec in specs} == {"bfloat16"}


def _cpu_has_fp16() -> bool:
    import torch

    try:
        return bool(torch.ops.mkldnn._is_mkldnn_fp16_supported())
    except Exception:  # noqa: BLE001 - torch builds without the op: no fp16 either
        return False


@pytest.mark.skipif(_cpu_has_fp16(), reason="this CPU trains fp16 (AVX512-FP16/AMX-FP16): nothing is refused")
def test_fp16_on_a_cpu_without_fp16_is_refused_in_one_line_naming_the_field(local_ray):
    # DeepSpeed's CPU accelerator refuses fp16 ("Type fp16 is not supported on your device") on
    # CPUs without AVX512-FP16/AMX-FP16, this one included: the learner says what to change.
    cfg = make_cfg(model={"dtype": "float16"}, learner={"zero_stage": 2})
    resources = RoleResources("learner", 1, cfg.learner.num_cpus, 0)
    placement = reserve([resources], 60)
    learners = start_learners(cfg, plan_batches(cfg), placement, resources)
    try:
        with pytest.raises(
            Exception, match=r"model\.dtype: float16: DeepSpeed cannot train fp16 on this learner's device"
        ) as err:
            setup_learners(learners)
    finally:
        for actor in learners:
            local_ray.kill(actor)
        placement.remove()
    assert "use bfloat16 or float32, or give the learners GPUs (learner.num_gpus)" in str(err.value)

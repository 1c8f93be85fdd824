"""LoRA on a CUDA learner in bfloat16 (issue 35: LoRA's update must cost no more than full
fine-tuning's): the base weights stay frozen and bfloat16, the adapters are cast once to the
compute dtype (no float32 adapter matmul beside a bf16 base on every forward), and a step moves
the adapters only. Where the time goes: benchmarks/learner_long_tail.py --lora 16 --profile 15.

Run on a GPU machine with `pytest -m gpu`. Skipped without CUDA.
"""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from ..conftest import tiny_learner_settings
from .test_cuda_paths import ROWS, _batch, whole_batch_shard

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


@pytest.mark.parametrize("zero_stage", [0, 2])
def test_a_bf16_lora_learner_keeps_its_base_frozen_and_its_adapters_in_the_compute_dtype(zero_stage):
    # Each learner in a process of its own: DeepSpeed keeps one process group a process.
    done = subprocess.run(
        [sys.executable, "-m", "tests.gpu.test_lora_cuda", str(zero_stage)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "lora checks passed" in done.stdout


def _check(zero_stage: int) -> None:
    from grpo_ray.actors.learner import LearnerWorker
    from grpo_ray.transport.broadcast import free_port

    settings = tiny_learner_settings(
        dtype="bfloat16",
        zero_stage=zero_stage,
        micro_batch_size=ROWS,
        lora_enabled=True,
        lora_rank=16,
        lora_alpha=32.0,
        lora_target_modules=("q_proj", "k_proj", "v_proj", "o_proj"),
    )
    learner = LearnerWorker(settings, rank=0, world_size=1)
    learner.setup("127.0.0.1", free_port())
    named = dict(learner.module.named_parameters())
    trainable = {name for name, p in named.items() if p.requires_grad}
    assert trainable and all("lora_" in name for name in trainable)
    assert {p.dtype for p in named.values()} == {torch.bfloat16}, "adapters and base in the compute dtype"
    assert {p.device.type for p in named.values()} == {"cuda"}
    base_before = {name: p.detach().clone() for name, p in named.items() if name not in trainable}
    adapters_before = {name: named[name].detach().float().clone() for name in trainable}

    batch = _batch(learner.module.config.vocab_size)
    shard = whole_batch_shard(batch, np.linspace(-1, 1, ROWS).astype(np.float32))
    learner.train_step(shard, batch)
    named = dict(learner.module.named_parameters())
    assert all(torch.equal(named[name], before) for name, before in base_before.items()), "a base weight moved"
    assert any((named[name].float() - before).abs().max() > 0 for name, before in adapters_before.items())
    assert {named[name].dtype for name in trainable} == {torch.bfloat16}, "the step re-cast an adapter"
    print("lora checks passed")


if __name__ == "__main__":
    _check(int(sys.argv[1]))

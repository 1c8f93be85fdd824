"""The weight probe's drill on a GPU (the probe issue's GPU point): a vLLM engine and a learner in
bf16 sharing one GPU, the default tolerance. Through small updates (lr 1e-6 and up) a healthy engine
is never called stale; an engine that keeps its old weights is caught by name after a large update
at once, and after small ones once they add up past the kernels' noise (the figures are printed: on
a GPU whether they do within 40 syncs is what this test measures, not what it assumes).

Run on a GPU machine with vLLM, Ray and DeepSpeed installed, with `pytest -m gpu -s`.
"""

import pytest
import torch

from ..integration.conftest import HAS_VLLM
from ..integration.test_learner_and_sync import step_batch  # noqa: F401 (a fixture)
from ..integration.test_weight_probe import drill, drill_cfg, start_pair
from .test_vllm_sleep import gpu_ray  # noqa: F401 (a fixture)

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.skipif(not HAS_VLLM, reason="needs vLLM"),
]


def test_the_probe_at_its_defaults_in_bf16_on_a_gpu_catches_a_stale_engine_and_no_healthy_one(gpu_ray, step_batch):  # noqa: F811
    cfg = drill_cfg(
        "bfloat16",
        1e-3,
        rollout={"backend": "vllm", "num_gpus": 0.5, "vllm": {"gpu_memory_utilization": 0.3}},
        learner={"num_gpus": 0.3},
    )
    placement, learners, rollouts = start_pair(cfg, learner_gpus=0.3, rollout_gpus=0.5)
    try:
        figures = drill(gpu_ray, learners, rollouts, step_batch, tolerance=1e-3)
        print(
            f"GPU bf16: start gap {figures['gap']:.2e}; decided among the small updates: "
            f"{sum(not p.undecided for p in figures['small'])} of {len(figures['small'])}; the drill under small "
            f"updates caught at step {figures['caught']}",
            flush=True,
        )
    finally:
        for actor in learners + rollouts:
            gpu_ray.kill(actor)
        placement.remove()

"""learner.offload_states_between_updates on a CUDA learner: the learners of
tests/unit/actors/test_state_offload.py (ZeRO-2, with and without the offload, three updates, a
checkpoint saved while the states are away and a resume from it) on the GPU, where the offload
must also free at least Adam's moments (8 B a trainable parameter in float32) of GPU memory.

Run on a GPU machine with `pytest -m gpu`. Skipped without CUDA.
"""

import pytest
import torch

from ..unit.actors.test_state_offload import check_offload_trains_as_without, run_learners

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def test_a_cuda_learner_frees_its_moments_between_updates_and_trains_as_one_that_keeps_them(tmp_path):
    results = run_learners(tmp_path)
    on, off = results["on"]["report"], results["off"]["report"]
    moments = 8 * on["trainable_parameters"]
    freed = [m["update/offloaded_gib"] * 2**30 for m in on["metrics"]]
    kept = off["cuda_allocated_after_step"] - on["cuda_allocated_after_step"]
    print(
        f"moments {moments / 2**20:.2f} MiB; offload freed {[f'{f / 2**20:.2f}' for f in freed]} MiB a step; "
        f"after the last step {kept / 2**20:.2f} MiB less than the learner that keeps them",
        flush=True,
    )
    assert all(f >= moments for f in freed), "an offload freed less than Adam's moments"
    assert kept >= moments
    # GPU kernels may sum in another order from one process to the next (atomics): close, not equal.
    check_offload_trains_as_without(results, exact=False)

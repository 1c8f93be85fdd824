"""The learners' torch.distributed world on a GPU (actors/deepspeed_setup.py: join_learner_world) is
bound to the learner's device: a barrier (every checkpoint has one) neither guesses the device
from the rank nor says so on the console (issue 46 point 7: NCCL's "Guessing device ID based on
global rank" at every checkpoint of the H100 run).

Run on a GPU machine with `pytest -m gpu`. Skipped without CUDA.
"""

import subprocess
import sys

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

# A learner's process of its own: the world is process-wide state.
JOIN = """
import torch, torch.distributed as dist
from grpo_ray.actors.deepspeed_setup import join_learner_world
from grpo_ray.transport.broadcast import free_port
join_learner_world(0, 1, "127.0.0.1", free_port())
dist.barrier()
print("bound", dist.distributed_c10d._get_default_group().bound_device_id, flush=True)
dist.destroy_process_group()
"""


def test_the_learners_world_is_bound_to_the_learners_gpu_and_its_barrier_guesses_nothing():
    done = subprocess.run([sys.executable, "-c", JOIN], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "bound cuda:0" in done.stdout, done.stdout + done.stderr[-2000:]
    assert "Guessing device ID" not in done.stdout + done.stderr

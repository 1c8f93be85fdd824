"""Test-wide settings: one torch thread, passive OpenMP, a project-local cache for the tiny model."""

import os
from pathlib import Path

# Before torch is imported by any test module (see cluster/session.py for why).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
# The tiny model is built once per checkout and shared by every test and actor.
os.environ.setdefault("GRPO_RAY_CACHE", str(Path(__file__).resolve().parents[1] / ".cache" / "grpo-ray"))

import torch  # noqa: E402

torch.set_num_threads(1)

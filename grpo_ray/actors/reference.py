"""ReferenceWorker: per-token log-probs of the frozen reference model, for the KL term.

Started only when algorithm.kl_coef > 0. The learner receives its output as an object reference
next to the slice it belongs to.
"""

from __future__ import annotations

import numpy as np
import torch

from grpo_ray.models.loading import load_causal_lm, sequence_logprobs
from grpo_ray.types import RolloutSlice


class ReferenceWorker:
    def __init__(self, model_path: str, dtype: str, micro_batch_size: int, torch_threads: int = 1):
        torch.set_num_threads(torch_threads)
        self.model = load_causal_lm(model_path, dtype).eval()
        self.micro_batch_size = micro_batch_size

    def ready(self) -> str:
        return "reference"

    @torch.no_grad()
    def logprobs(self, batch: RolloutSlice, temperature: float) -> np.ndarray:
        """[N, T] float32 reference log-probs, zero outside completion tokens."""
        parts = []
        for start in range(0, batch.num_rows, self.micro_batch_size):
            rows = slice(start, start + self.micro_batch_size)
            logprobs, _ = sequence_logprobs(
                self.model,
                torch.from_numpy(batch.input_ids[rows]),
                torch.from_numpy(batch.attention_mask[rows]),
                temperature,
            )
            parts.append(logprobs.numpy())
        return (np.concatenate(parts) * batch.completion_mask).astype(np.float32)

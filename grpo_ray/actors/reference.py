"""ReferenceWorker: log-probs of the reference model, for the KL term.

Started only when algorithm.kl_coef > 0. With the KL in the loss, the learner receives the
per-token log-probs as an object reference next to the slice they belong to; with the KL in the
reward, the driver receives one summed KL per completion. With reference.refresh_every, the
driver copies the policy's weights in every N steps (`load_weights`).
"""

from __future__ import annotations

import os

import numpy as np
import torch

from grpo_ray.algo.kl import sequence_kl
from grpo_ray.models.loading import compute_device, load_causal_lm, load_named_weights, tensor_of
from grpo_ray.models.shared_prompts import completion_logprobs
from grpo_ray.types import RolloutSlice


class ReferenceWorker:
    def __init__(self, model_path: str, dtype: str, micro_batch_size: int, torch_threads: int = 1, chunk_tokens: int = 0):
        """chunk_tokens: LM-head positions per chunk (learner.logprob_chunk_tokens); 0: full logits."""
        torch.set_num_threads(torch_threads)
        self.chunk_tokens = chunk_tokens
        self.model = load_causal_lm(model_path, dtype).to(compute_device()).eval()
        self.micro_batch_size = micro_batch_size

    def ready(self) -> str:
        return "reference"

    @torch.no_grad()
    def logprobs(self, batch: RolloutSlice, temperature: float) -> np.ndarray:
        """[N, T] float32 reference log-probs, zero outside completion tokens."""
        parts = []
        for start in range(0, batch.num_rows, self.micro_batch_size):
            rows = slice(start, start + self.micro_batch_size)
            logprobs, _ = completion_logprobs(
                self.model,
                tensor_of(batch.input_ids[rows]),
                tensor_of(batch.attention_mask[rows]),
                tensor_of(batch.completion_mask[rows]),
                temperature,
                chunk_tokens=self.chunk_tokens,
            )
            parts.append(logprobs.float().cpu().numpy())
        return (np.concatenate(parts) * batch.completion_mask).astype(np.float32)

    @torch.no_grad()
    def sequence_kl(self, batch: RolloutSlice, temperature: float, estimator: str) -> np.ndarray:
        """[N] float64 KL(rollout policy || reference) of each completion, summed over its tokens."""
        ref = torch.from_numpy(self.logprobs(batch, temperature))
        kl = sequence_kl(tensor_of(batch.rollout_logprobs), ref, tensor_of(batch.completion_mask), estimator)
        return kl.double().numpy()

    def save_weights(self, folder: str) -> None:
        """For checkpoints once the reference was refreshed from the policy (safetensors: no pickle)."""
        from safetensors.torch import save_model

        os.makedirs(folder, exist_ok=True)
        save_model(self.model, os.path.join(folder, "model.safetensors"))

    def load_saved_weights(self, folder: str) -> None:
        from safetensors.torch import load_model

        load_model(self.model, os.path.join(folder, "model.safetensors"))

    def load_weights(self, weights: dict[str, np.ndarray]) -> int:
        """Replace the reference weights with the policy's (names as the learner exports them)."""
        return load_named_weights(self.model, ((name, tensor_of(array)) for name, array in weights.items()))

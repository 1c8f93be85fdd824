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
from grpo_ray.algo.micro_batches import plan_micro_batches
from grpo_ray.models.liger_logprobs import chosen_logprob_kernel
from grpo_ray.models.loading import compute_device, load_causal_lm, load_named_weights, tensor_of
from grpo_ray.models.packing import micro_batch_logprobs
from grpo_ray.types import RolloutSlice


class ReferenceWorker:
    def __init__(
        self,
        model_path: str,
        dtype: str,
        micro_batch_size: int,
        torch_threads: int = 1,
        chunk_tokens: int = 0,
        packing: bool = False,
        max_tokens_per_micro_batch: int = 0,
        logprob_kernel: str = "torch",
    ):
        """chunk_tokens: LM-head positions per chunk (learner.logprob_chunk_tokens); 0: full logits.
        packing, max_tokens_per_micro_batch, logprob_kernel: the learner's (algo.micro_batches,
        models.packing, models.liger_logprobs)."""
        torch.set_num_threads(torch_threads)
        self.chunk_tokens = chunk_tokens
        self.model = load_causal_lm(model_path, dtype).to(compute_device()).eval()
        self.micro_batch_size = micro_batch_size
        self.packing = packing
        self.max_tokens_per_micro_batch = max_tokens_per_micro_batch
        self.logprob_kernel = chosen_logprob_kernel(logprob_kernel, self.model, say=True)

    def ready(self) -> str:
        return "reference"

    @torch.no_grad()
    def logprobs(self, batch: RolloutSlice, temperature: float) -> np.ndarray:
        """[N, T] float32 reference log-probs, zero outside completion tokens."""
        out = np.zeros(batch.input_ids.shape, dtype=np.float32)
        plan = plan_micro_batches(
            batch.attention_mask.sum(axis=1), self.micro_batch_size, self.max_tokens_per_micro_batch, self.packing
        )
        for rows in plan:
            logprobs, _ = micro_batch_logprobs(
                self.model,
                tensor_of(batch.input_ids[rows]),
                tensor_of(batch.attention_mask[rows]),
                tensor_of(batch.completion_mask[rows]),
                temperature,
                packing=self.packing,
                share_prompts=True,
                chunk_tokens=self.chunk_tokens,
                kernel=self.logprob_kernel,
            )
            out[rows] = logprobs.float().cpu().numpy()
        return (out * batch.completion_mask).astype(np.float32)

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

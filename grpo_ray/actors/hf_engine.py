"""The `hf` rollout backend: transformers `generate` with KV cache. Needs no vLLM.

Log-probs are those of the distribution the token was drawn from: `generate` hands back the
processed scores (temperature, top-k, top-p applied), and their log-softmax at the chosen token is
the sampling log-prob. Greedy decoding reports the raw model log-prob.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch

from grpo_ray.models.loading import load_causal_lm, load_named_weights, sequence_logprobs
from grpo_ray.types import Completion, SamplingSettings


class HFEngine:
    def __init__(self, model_path: str, tokenizer, dtype: str = "float32", config_overrides: dict | None = None):
        self.tokenizer = tokenizer
        self.model = load_causal_lm(model_path, dtype, config_overrides).eval()
        self.stop_ids = _stop_ids(tokenizer, self.model)

    @torch.no_grad()
    def generate(self, prompts: list[tuple[int, ...]], sampling: SamplingSettings) -> list[list[Completion]]:
        """samples_per_prompt completions for each prompt, in prompt order."""
        pad = self.tokenizer.pad_token_id
        width = max(len(p) for p in prompts)
        # Left padding: every prompt ends at the same column, so generation continues all rows at once.
        input_ids = torch.full((len(prompts), width), pad, dtype=torch.long)
        attention = torch.zeros((len(prompts), width), dtype=torch.long)
        for row, ids in enumerate(prompts):
            input_ids[row, width - len(ids) :] = torch.tensor(ids)
            attention[row, width - len(ids) :] = 1
        greedy = sampling.temperature == 0
        torch.manual_seed(sampling.seed)
        out = self.model.generate(
            input_ids=input_ids,
            attention_mask=attention,
            do_sample=not greedy,
            temperature=None if greedy else sampling.temperature,
            top_p=None if greedy or sampling.top_p >= 1 else sampling.top_p,
            top_k=None if greedy or sampling.top_k <= 0 else sampling.top_k,
            max_new_tokens=sampling.max_new_tokens,
            num_return_sequences=sampling.samples_per_prompt,
            eos_token_id=list(self.stop_ids),
            pad_token_id=pad,
            output_scores=True,
            return_dict_in_generate=True,
        )
        generated = out.sequences[:, width:]  # [P*G, L]
        scores = torch.stack(out.scores, dim=1).float()  # [P*G, L, V]
        logprobs = torch.log_softmax(scores, dim=-1).gather(-1, generated.unsqueeze(-1)).squeeze(-1)
        completions = [self._completion(generated[i], logprobs[i]) for i in range(generated.shape[0])]
        g = sampling.samples_per_prompt
        return [completions[i * g : (i + 1) * g] for i in range(len(prompts))]

    def _completion(self, tokens: torch.Tensor, logprobs: torch.Tensor) -> Completion:
        token_list = tokens.tolist()
        length = len(token_list)
        finish = "length"
        for position, token in enumerate(token_list):
            if token in self.stop_ids:
                length, finish = position + 1, "stop"
                break
        ids = tuple(token_list[:length])
        return Completion(
            token_ids=ids,
            logprobs=tuple(float(x) for x in logprobs[:length]),
            text=self.tokenizer.decode(ids, skip_special_tokens=True),
            finish_reason=finish,
        )

    @torch.no_grad()
    def score(self, input_ids: np.ndarray, attention_mask: np.ndarray, temperature: float) -> np.ndarray:
        """Log-probs [N, T] of given sequences (the weight-sync probe)."""
        logprobs, _ = sequence_logprobs(
            self.model, torch.from_numpy(input_ids), torch.from_numpy(attention_mask), temperature
        )
        return logprobs.numpy()

    def load_weights(self, weights: Iterator[tuple[str, torch.Tensor]]) -> None:
        load_named_weights(self.model, weights)


def _stop_ids(tokenizer, model) -> frozenset[int]:
    ids = {tokenizer.eos_token_id}
    config_eos = getattr(model.generation_config, "eos_token_id", None)
    if isinstance(config_eos, int):
        ids.add(config_eos)
    elif isinstance(config_eos, (list, tuple)):
        ids.update(config_eos)
    return frozenset(i for i in ids if i is not None)

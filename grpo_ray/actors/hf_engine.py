"""The `hf` rollout backend: transformers `generate` with KV cache. Needs no vLLM.

Log-probs are those of the distribution the token was drawn from (temperature, top-k and top-p
applied), recorded step by step by `SampledLogprobs`. Greedy decoding reports the raw model
log-prob. On a GPU (when Ray gave the actor one) the model and the generation run there.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
import torch
from transformers import (
    LogitsProcessor,
    LogitsProcessorList,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from grpo_ray.transport.broadcast import bucket_storage
from grpo_ray.models.loading import (
    apply_lora,
    compute_device,
    load_causal_lm,
    load_named_weights,
    sequence_logprobs,
    tensor_of,
)
from grpo_ray.models.sampling import draw_tokens
from grpo_ray.types import Completion, SamplingSettings, WeightSpec


class HFEngine:
    def __init__(
        self, model_path: str, tokenizer, dtype: str = "float32", config_overrides: dict | None = None, lora=None
    ):
        """lora (rank, alpha, target_modules): wrap the model in a fresh adapter, as the learner
        does; weight syncs then load only the adapter's matrices (peft names)."""
        self.tokenizer = tokenizer
        self.device = compute_device()
        self.model = load_causal_lm(model_path, dtype, config_overrides).to(self.device)
        if lora is not None:
            self.model = apply_lora(self.model, lora.rank, lora.alpha, 0.0, lora.target_modules)
        self.model.eval()
        self.stop_ids = _stop_ids(tokenizer, self.model)

    @torch.no_grad()
    def generate(self, prompts: list[tuple[int, ...]], sampling: SamplingSettings) -> list[list[Completion]]:
        """samples_per_prompt completions for each prompt, in prompt order."""
        pad = self.tokenizer.pad_token_id
        input_ids, attention = left_padded(prompts, pad)
        width = input_ids.shape[1]
        input_ids, attention = input_ids.to(self.device), attention.to(self.device)
        g = sampling.samples_per_prompt
        prompt_cache = None
        if g > 1 and width > 1:
            prompt_cache = self._prompt_cache(input_ids[:, :-1], attention[:, :-1], g)
        # Row i*G+j is sample j of prompt i (generate's greedy search takes no num_return_sequences).
        input_ids, attention = input_ids.repeat_interleave(g, dim=0), attention.repeat_interleave(g, dim=0)
        recorder = SampledLogprobs(sampling)
        sequences = self.model.generate(
            input_ids=input_ids,
            attention_mask=attention,
            past_key_values=prompt_cache,
            # The recorder draws the tokens (seeded, exact); greedy search then takes its choice.
            do_sample=False,
            # Greedy search applies no temperature/top-k/top-p warper (passing those flags only earns a
            # warning), but it does apply a model file's repetition penalty (Qwen's generation_config
            # sets one): neutral here, so the recorder, which applies the recipe's settings, is the
            # last to touch the scores.
            repetition_penalty=1.0,
            logits_processor=LogitsProcessorList([recorder]),
            max_new_tokens=sampling.max_new_tokens,
            eos_token_id=list(self.stop_ids),
            pad_token_id=pad,
        )
        generated = sequences[:, width:]  # [P*G, L]
        logprobs = recorder.drawn_logprobs(generated)
        generated, logprobs = generated.cpu(), logprobs.cpu()  # one copy, not one per token
        completions = self._completions(generated, logprobs)
        return [completions[i * g : (i + 1) * g] for i in range(len(prompts))]

    @torch.no_grad()
    def generate_turns(
        self, contexts: list[list[int]], seeds: list[int], sampling: SamplingSettings
    ) -> list[Completion]:
        """One completion of each context (an episode so far), row i drawn from its own generator
        seeded with seeds[i]: the same context and seed give the same turn whatever rows it is
        batched with. No KV cache is kept between turns: each turn recomputes its context."""
        pad = self.tokenizer.pad_token_id
        input_ids, attention = left_padded(contexts, pad)
        width = input_ids.shape[1]
        recorder = SampledLogprobs(sampling, row_seeds=list(seeds))
        sequences = self.model.generate(
            input_ids=input_ids.to(self.device),
            attention_mask=attention.to(self.device),
            do_sample=False,
            repetition_penalty=1.0,  # as in generate: the recorder's settings are the last word
            logits_processor=LogitsProcessorList([recorder]),
            max_new_tokens=sampling.max_new_tokens,
            eos_token_id=list(self.stop_ids),
            pad_token_id=pad,
        )
        generated = sequences[:, width:]
        logprobs = recorder.drawn_logprobs(generated)
        return self._completions(generated.cpu(), logprobs.cpu())

    def turns(self, sampling: SamplingSettings) -> TurnBatches:
        """Episode turns (actors/episodes.py), generated a batch at a time."""
        return TurnBatches(lambda contexts, seeds: self.generate_turns(contexts, seeds, sampling))

    def generate_stream(
        self, prompts: list[tuple[int, ...]], sampling: SamplingSettings, stop=None
    ) -> Iterator[tuple[int, list[Completion]]]:
        """(k, prompt k's completions) for every prompt: transformers generates the batch as one, so
        every group finishes at once (`stop` has nothing to abort)."""
        yield from enumerate(self.generate(prompts, sampling))

    def _prompt_cache(self, input_ids: torch.Tensor, attention: torch.Tensor, samples_per_prompt: int):
        """The KV cache of every prompt but its last token, computed once per prompt and repeated
        for its G samples (row i*G+j is sample j of prompt i, as num_return_sequences orders them).

        `generate` with num_return_sequences=G runs the prompt G times: with short completions that
        prefill was most of the work (tiny recipe, 32 prompts x 8 samples of 5 tokens: 59 of 101 ms).
        The last prompt token is left to `generate`, which needs one uncached token to start from.
        Positions count real tokens only, as `generate` numbers them under left padding.
        """
        positions = (attention.cumsum(-1) - 1).clamp(min=0)
        out = self.model(
            input_ids=input_ids, attention_mask=attention, position_ids=positions, use_cache=True, logits_to_keep=1
        )
        cache = out.past_key_values
        cache.batch_repeat_interleave(samples_per_prompt)
        return cache

    def _completions(self, generated: torch.Tensor, logprobs: torch.Tensor) -> list[Completion]:
        """Each row up to and including its first stop token ("stop"), or whole ("length").

        Whole-batch conversions and one batch_decode: a row at a time cost ~12 ms of a 55 ms
        tiny-recipe generation (256 rows)."""
        stops = torch.isin(generated, torch.tensor(sorted(self.stop_ids), dtype=generated.dtype))
        stopped = stops.any(dim=1)
        lengths = torch.where(stopped, stops.int().argmax(dim=1) + 1, generated.shape[1]).tolist()
        ids = [tuple(row[:n]) for row, n in zip(generated.tolist(), lengths)]
        texts = self.tokenizer.batch_decode(ids, skip_special_tokens=True)
        return [
            Completion(token_ids=row, logprobs=tuple(lps[:n]), text=text, finish_reason="stop" if stop else "length")
            for row, lps, n, text, stop in zip(ids, logprobs.tolist(), lengths, texts, stopped.tolist())
        ]

    @torch.no_grad()
    def score(self, input_ids: np.ndarray, attention_mask: np.ndarray, temperature: float) -> np.ndarray:
        """Log-probs [N, T] of given sequences (the weight-sync probe)."""
        logprobs, _ = sequence_logprobs(self.model, tensor_of(input_ids), tensor_of(attention_mask), temperature)
        return logprobs.float().cpu().numpy()

    def load_weights(self, weights: Iterator[tuple[str, torch.Tensor]]) -> None:
        load_named_weights(self.model, weights)

    def shutdown(self) -> None:
        """Nothing to stop: the model runs in this process (VllmEngine stops its processes here)."""

    def bucket_storage(
        self, specs: list[WeightSpec], buckets: list[list[int]], device: torch.device
    ) -> list[torch.Tensor] | None:
        """The model's weights moved into one flat tensor per sync bucket, so that syncs are
        received straight into them; None (syncs go through load_weights) when the weights live
        on another device than the broadcast's or the plan names a weight the model lacks."""
        params = dict(self.model.named_parameters(remove_duplicate=False))
        if self.device != device or any(spec.name not in params for spec in specs):
            return None
        with torch.no_grad():
            return bucket_storage(params, specs, buckets)


class TurnBatches:
    """Episode turns on an engine that generates a batch at a time (actors/episodes.py's `Turns`):
    the turns started since the last `finished` are generated then, as one batch, and all handed
    back; the environment's processes work on the other episodes' steps meanwhile."""

    def __init__(self, generate: Callable[[list[list[int]], list[int]], list[Completion]]):
        self.generate = generate
        self.waiting: list[tuple[int, list[int], int]] = []

    def start(self, key: int, context: list[int], seed: int) -> None:
        self.waiting.append((key, context, seed))

    def finished(self, timeout: float) -> list[tuple[int, Completion]]:
        if not self.waiting:
            return []
        batch, self.waiting = self.waiting, []
        turns = self.generate([context for _, context, _ in batch], [seed for _, _, seed in batch])
        return [(key, turn) for (key, _, _), turn in zip(batch, turns)]

    def close(self) -> None:
        self.waiting = []


class SampledLogprobs(LogitsProcessor):
    """Applies the recipe's temperature, top-k and top-p (Hugging Face's warper classes), draws
    each row's next token itself (models.sampling: an exact inverse-CDF draw from a seeded
    generator) and keeps its log-prob under exactly that distribution.

    generate runs greedy and is handed scores whose argmax is the drawn token: its own sampling
    would softmax the scores a second time and draw a random number per vocabulary entry.
    Only one step's [rows, vocab] scores are alive at a time. Keeping every step's scores instead
    (generate's output_scores) needs rows x steps x vocab floats: 159 GB for 512 rows of 512
    tokens over Qwen's 152K vocabulary.
    """

    def __init__(self, sampling: SamplingSettings, row_seeds: list[int] | None = None):
        self.warpers = []
        if sampling.temperature > 0:
            if sampling.temperature != 1.0:
                self.warpers.append(TemperatureLogitsWarper(sampling.temperature))
            if sampling.top_k > 0:
                self.warpers.append(TopKLogitsWarper(sampling.top_k))
            if sampling.top_p < 1.0:
                self.warpers.append(TopPLogitsWarper(sampling.top_p))
        self.greedy = sampling.temperature == 0
        self.seed = sampling.seed
        self.row_seeds = row_seeds  # one generator per row (generate_turns) instead of one for the batch
        self._generator: torch.Generator | list[torch.Generator] | None = None
        self._drawn: list[torch.Tensor] = []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        for warper in self.warpers:
            scores = warper(input_ids, scores)
        if not self.greedy and self._generator is None and self.row_seeds is not None:
            self._generator = [torch.Generator(device=scores.device).manual_seed(seed) for seed in self.row_seeds]
        elif not self.greedy and self._generator is None:
            self._generator = torch.Generator(device=scores.device).manual_seed(self.seed)
        tokens, logprobs = draw_tokens(scores, None if self.greedy else self._generator)
        self._drawn.append(logprobs)
        if self.greedy:
            return scores
        # The drawn token above every other, so generate's argmax picks it; in place: scores is
        # generate's float32 copy of this step's logits (or a warper's output), used for nothing after us.
        return scores.scatter_(-1, tokens[:, None], float("inf"))

    def drawn_logprobs(self, generated: torch.Tensor) -> torch.Tensor:
        """[rows, steps] log-probs of the generated tokens (call once, after generate). A row that
        finished early continues with pad tokens whose log-probs are those of the discarded draws."""
        if not self._drawn:
            return generated.new_zeros(generated.shape, dtype=torch.float32)
        return torch.stack(self._drawn, dim=1)


def left_padded(rows: list, pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids [N, W] and attention mask [N, W] of `rows` padded on the left to the longest, W:
    every row ends at the same column, so generation continues all rows at once."""
    width = max(len(ids) for ids in rows)
    input_ids = torch.full((len(rows), width), pad, dtype=torch.long)
    attention = torch.zeros((len(rows), width), dtype=torch.long)
    for row, ids in enumerate(rows):
        input_ids[row, width - len(ids) :] = torch.tensor(ids)
        attention[row, width - len(ids) :] = 1
    return input_ids, attention


def _stop_ids(tokenizer, model) -> frozenset[int]:
    ids = {tokenizer.eos_token_id}
    config_eos = getattr(model.generation_config, "eos_token_id", None)
    if isinstance(config_eos, int):
        ids.add(config_eos)
    elif isinstance(config_eos, (list, tuple)):
        ids.update(config_eos)
    return frozenset(i for i in ids if i is not None)

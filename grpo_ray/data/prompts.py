"""Tokenised prompts and the resumable, seeded stream of prompts a run consumes."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from grpo_ray.data.loaders import DataError, Row
from grpo_ray.types import Prompt


@dataclass(frozen=True)
class PromptSet:
    prompts: list[Prompt]
    dropped_too_long: int


def leading_special_tokens(tokenizer) -> tuple[int, ...]:
    """The special tokens the tokenizer puts before a text by default: (bos,) for Llama 2, Gemma and
    Mistral, () for Qwen2 and SmolLM2, whatever its post-processor says. Read from a text tokenised
    with and without them, so every tokenizer kind answers alike. A trailing token it adds (an EOS,
    for a few tokenizers) is not kept: a prompt is text the model continues, not a finished one."""
    plain = tokenizer("a", add_special_tokens=False)["input_ids"]
    full = tokenizer("a")["input_ids"]
    start = next((i for i in range(len(full) - len(plain) + 1) if full[i : i + len(plain)] == plain), 0)
    return tuple(int(t) for t in full[:start])


def text_prompt_ids(text: str, tokenizer, leading: tuple[int, ...]) -> list[int]:
    """A plain-text prompt as the model's own tokenizer makes it: `leading` (leading_special_tokens)
    then the text's tokens. A text that already begins with them (a user who typed "<bos>") gets
    them once: a second BOS is a context the model never saw either."""
    ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
    return ids if tuple(ids[: len(leading)]) == leading else [*leading, *ids]


def tokenize_prompts(rows: list[Row], tokenizer, max_prompt_tokens: int, apply_chat_template: bool) -> PromptSet:
    """Apply the chat template (the row's context messages, then its prompt as the user's), tokenise,
    drop prompts over the limit. Without a chat template a prompt is its text alone, after the
    special tokens the tokenizer adds by default (a BOS: Gemma writes nonsense without it), so a row
    with context messages is refused (the messages would be lost). A chat template writes its own
    BOS where it wants one (tokenised without the tokenizer's additions, by transformers), so a
    templated prompt is the template's tokens, unchanged."""
    prompts: list[Prompt] = []
    dropped = 0
    leading = () if apply_chat_template else leading_special_tokens(tokenizer)
    for row in rows:
        if apply_chat_template:
            ids = tokenizer.apply_chat_template(
                [*row.context, {"role": "user", "content": row.prompt}], add_generation_prompt=True, tokenize=True
            )
            # transformers 5 returns a BatchEncoding-like mapping from apply_chat_template.
            if hasattr(ids, "keys"):
                ids = ids["input_ids"]
        elif row.context:
            roles = ", ".join(m["role"] for m in row.context)
            raise DataError(
                f"data.apply_chat_template is false, but prompt {row.index} has messages before the user's "
                f"({roles}), which only a chat template can show the model; set data.apply_chat_template: true "
                "or give prompts as text"
            )
        else:
            ids = text_prompt_ids(row.prompt, tokenizer, leading)
        if len(ids) > max_prompt_tokens:
            dropped += 1
            continue
        prompts.append(
            Prompt(
                uid=row.index,
                text=row.prompt,
                token_ids=tuple(int(t) for t in ids),
                answer=row.answer,
                fields=row.fields,
                context=row.context,
            )
        )
    return PromptSet(prompts=prompts, dropped_too_long=dropped)


class PromptStream:
    """Endless epochs over the prompts, each epoch shuffled by (seed, epoch).

    The whole state is (epoch, position), so a resumed run sees the same prompts in the same order.
    """

    def __init__(self, prompts: list[Prompt], seed: int, epoch: int = 0, position: int = 0):
        if not prompts:
            raise ValueError("PromptStream needs at least one prompt")
        self._prompts = prompts
        self._seed = seed
        self.epoch = epoch
        self.position = position
        self._order = self._epoch_order(epoch)

    @property
    def prompts(self) -> list[Prompt]:
        """Every prompt the stream cycles through (in data order)."""
        return list(self._prompts)

    def _epoch_order(self, epoch: int) -> np.ndarray:
        return np.random.default_rng([self._seed, epoch]).permutation(len(self._prompts))

    def take(self, count: int) -> list[Prompt]:
        batch: list[Prompt] = []
        while len(batch) < count:
            if self.position == len(self._order):
                self.epoch += 1
                self.position = 0
                self._order = self._epoch_order(self.epoch)
            batch.append(self._prompts[self._order[self.position]])
            self.position += 1
        return batch

    def state(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position}

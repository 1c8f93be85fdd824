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


def tokenize_prompts(rows: list[Row], tokenizer, max_prompt_tokens: int, apply_chat_template: bool) -> PromptSet:
    """Apply the chat template (the row's context messages, then its prompt as the user's), tokenise,
    drop prompts over the limit. Without a chat template a prompt is its text alone, so a row with
    context messages is refused (the messages would be lost)."""
    prompts: list[Prompt] = []
    dropped = 0
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
            ids = tokenizer(row.prompt, add_special_tokens=False)["input_ids"]
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

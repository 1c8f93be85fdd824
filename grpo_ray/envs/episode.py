"""One episode's tokens, exact: the model's tokens exactly as it sampled them (trained on: mask 1,
with their sampling log-probs) and everything else, the environment's replies and the chat
template's markup around them, as context (mask 0: no loss, KL or entropy on them).

An episode is one training row: prompt + turn 1 + reply 1 + turn 2 + ... The model's tokens are
never re-tokenised from text (a decode/encode round trip can change them); the replies' tokens
come from the chat template: what it writes for the reply messages after a finished assistant
turn, measured on a fixed conversation (`reply_tokens`, grpo_ray/chat_template.py), so it holds whatever
the model wrote.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np


@dataclass
class EpisodeTokens:
    """The row an episode becomes, built turn by turn."""

    prompt: list[int]  # the first messages with the generation prompt
    ids: list[int] = field(default_factory=list)  # every token after the prompt
    mask: list[float] = field(default_factory=list)  # 1.0 on the model's tokens
    logprobs: list[float] = field(default_factory=list)  # sampling log-prob of the model's tokens, 0 elsewhere
    # The environment's reward earned by the steps before each model token's turn (0 elsewhere):
    # what per-turn credit takes off that turn's advantage (environment.reward_per_turn).
    earned: list[float] = field(default_factory=list)
    turns: int = 0

    @property
    def context(self) -> list[int]:
        """What the model's next turn continues: the whole episode so far."""
        return self.prompt + self.ids

    @property
    def length(self) -> int:
        """Tokens after the prompt (what the episode's token budget counts)."""
        return len(self.ids)

    def add_turn(self, token_ids: Sequence[int], logprobs: Sequence[float], earned_before: float = 0.0) -> None:
        if len(token_ids) != len(logprobs):
            raise ValueError(f"{len(token_ids)} tokens but {len(logprobs)} log-probs")
        self.ids += list(token_ids)
        self.mask += [1.0] * len(token_ids)
        self.logprobs += [float(x) for x in logprobs]
        self.earned += [float(earned_before)] * len(token_ids)
        self.turns += 1

    def add_reply(self, token_ids: Sequence[int]) -> None:
        self.ids += list(token_ids)
        self.mask += [0.0] * len(token_ids)
        self.logprobs += [0.0] * len(token_ids)
        self.earned += [0.0] * len(token_ids)

    def earned_array(self) -> np.ndarray:
        """[T] the reward earned before each token's turn, over the whole row (prompt included)."""
        return np.array([0.0] * len(self.prompt) + self.earned, dtype=np.float32)

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """[T] input ids, completion mask and rollout log-probs of the whole row (prompt included)."""
        pad = [0.0] * len(self.prompt)
        return (
            np.array(self.prompt + self.ids, dtype=np.int64),
            np.array(pad + self.mask, dtype=np.float32),
            np.array(pad + self.logprobs, dtype=np.float32),
        )

"""The learner's one forward of a micro-batch, and how far its update moved the sampled tokens.

Plain torch on the learner's DeepSpeed engine (actors/learner.py); the formulas are algo/'s.
"""

from __future__ import annotations

import numpy as np
import torch

from grpo_ray.actors.learner_batch import micro_batch
from grpo_ray.actors.learner_settings import LearnerSettings
from grpo_ray.algo.policy_move import update_move
from grpo_ray.models.packing import micro_batch_logprobs

# Rows of the first micro-batch scored again after the update (update/moved): the figure only has to
# tell a healthy step (SmolLM2-135M at its tuned lr: 0.07-0.11 nats) from a far one (1-2 nats), which
# 8 rows' completion tokens do. Spread over the micro-batch, they are of several prompts (more telling
# than one group's), which costs the prompts' forward too: SmolLM2-135M's 64-row step on 2 CPU cores
# (2026-11-29), 0.83 s of a 9.9 s update (8%); a step of 512 rows pays about an eighth of that share.
MOVE_ROWS = 8


def forward(
    engine, s: LearnerSettings, kernel: str, mb: dict[str, torch.Tensor], temperature: float, entropy: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """[N, T] log-probs of the micro-batch's tokens under the engine's weights, and their entropy
    (`entropy`, with the torch kernel: liger's fused head computes none, and config refuses
    entropy_coef with it)."""
    return micro_batch_logprobs(
        engine,
        mb["input_ids"],
        mb["attention_mask"],
        mb["completion_mask"],
        temperature,
        packing=s.packing,
        # Hugging Face keeps no KV cache under gradient checkpointing: nothing to share.
        share_prompts=s.share_prompts and not s.gradient_checkpointing,
        chunk_tokens=s.logprob_chunk_tokens,
        kernel=kernel,
        with_entropy=entropy and kernel == "torch",
        entropy_grad=s.entropy_coef != 0,
    )


def moved_by_update(
    engine,
    s: LearnerSettings,
    kernel: str,
    batch: dict[str, torch.Tensor],
    rows: np.ndarray,
    before: torch.Tensor,
    temperature: float,
) -> dict[str, float]:
    """algo/policy_move.update_move on up to MOVE_ROWS of the micro-batch `rows` (spread over it), scored
    again now, against `before`: their first-pass log-probs ([len(rows), T]), taken before the update.
    Every rank calls it once per step (ZeRO-3 gathers are collective), with no rows too."""
    picks = np.unique(np.linspace(0, len(rows) - 1, min(MOVE_ROWS, len(rows))).round().astype(np.int64))
    mb = micro_batch(batch, rows[picks], engine.device)  # no rows: one row at weight 0 (micro_batch)
    with torch.no_grad():
        after, _ = forward(engine, s, kernel, mb, temperature)
    # The micro-batch of fewer rows may be narrower (its padding columns trimmed); rows are right-padded.
    old = before[torch.from_numpy(picks).to(before.device), : after.shape[1]] if len(rows) else after
    mask = mb["completion_mask"] * mb["row_weights"][:, None]
    return update_move(after, old, mask, s.clip_low, s.clip_high)

"""Sampled completions packed as a RolloutSlice (types.py): right-padded [N, T] arrays, one row per
completion. Episodes are packed by actors/episodes.py (pack_episodes)."""

from __future__ import annotations

import numpy as np

from grpo_ray.algo.diversity import group_distinct_ratio
from grpo_ray.types import Completion, Prompt, RolloutSlice


def pack_slice(
    rows: list[tuple[int, Prompt, Completion]],
    pad_id: int,
    policy_version: int,
    diversity_by_group: dict[int, float] | None = None,
) -> RolloutSlice:
    """Right-padded [N, T] arrays from (group id, prompt, completion) rows; see types.py.

    diversity_by_group: each group's distinct-4-gram ratio (NaN: no 4-gram); None: measured on the rows given.
    """
    if diversity_by_group is None:
        texts: dict[int, list[str]] = {}
        for group, _, completion in rows:
            texts.setdefault(group, []).append(completion.text)
        diversity_by_group = {group: group_distinct_ratio(group_texts) for group, group_texts in texts.items()}
    width = max(len(p.token_ids) + len(c.token_ids) for _, p, c in rows)
    n = len(rows)
    input_ids = np.full((n, width), pad_id, dtype=np.int64)
    attention = np.zeros((n, width), dtype=np.int64)
    completion_mask = np.zeros((n, width), dtype=np.float32)
    logprobs = np.zeros((n, width), dtype=np.float32)
    for i, (_, prompt, completion) in enumerate(rows):
        p, c = len(prompt.token_ids), len(completion.token_ids)
        input_ids[i, :p] = prompt.token_ids
        input_ids[i, p : p + c] = completion.token_ids
        attention[i, : p + c] = 1
        completion_mask[i, p : p + c] = 1.0
        logprobs[i, p : p + c] = completion.logprobs
    field_names = sorted({name for _, prompt, _ in rows for name in prompt.fields})
    return RolloutSlice(
        group_ids=np.array([g for g, _, _ in rows], dtype=np.int64),
        prompt_uids=np.array([p.uid for _, p, _ in rows], dtype=np.int64),
        input_ids=input_ids,
        attention_mask=attention,
        completion_mask=completion_mask,
        rollout_logprobs=logprobs,
        prompts=[p.text for _, p, _ in rows],
        completions=[c.text for _, _, c in rows],
        answers=[p.answer for _, p, _ in rows],
        finish_reasons=[c.finish_reason for _, _, c in rows],
        row_fields={name: [p.fields.get(name) for _, p, _ in rows] for name in field_names},
        policy_versions=np.full(n, policy_version, dtype=np.int64),
        group_diversity=np.array([diversity_by_group[g] for g, _, _ in rows], dtype=np.float64),
    )

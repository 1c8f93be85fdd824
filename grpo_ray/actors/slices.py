"""Samples packed as RolloutSlices (types.py): right-padded [N, T] arrays, one row per sample.

A sample is an episode: a one-turn completion is an episode of one turn, and an episode of
several turns (actors/episodes.py) is the same kind of row with the environment's replies between
the model's turns (mask 0). Both samplers (actors/samplers.py) hand their groups here as `Sample`s;
`pack_groups` is the one packer.

    samples = [one_turn_sample(prompt, completion) for completion in group]
    slices = pack_groups([(k, samples)], prompts, group_offset, pad_id, version, num_slices=2)
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from grpo_ray.algo.diversity import group_distinct_ratio
from grpo_ray.types import Completion, Prompt, RolloutSlice


@dataclass(frozen=True)
class Sample:
    """One of a group's samples, as its row will read (prompt included, not padded)."""

    input_ids: np.ndarray  # [T] int64: the prompt and everything after it
    completion_mask: np.ndarray  # [T] float32: 1 on the model's tokens
    logprobs: np.ndarray  # [T] float32: their sampling log-probs, 0 elsewhere
    answer: str  # the model's last turn, what the reward functions score
    finish_reason: str  # "stop" | "length"
    fields: dict[str, object] = field(default_factory=dict)  # the row's own fields beside its prompt's
    earned: np.ndarray | None = None  # [T] float32: per-turn credit's reward before each token (episodes)
    messages: list[dict] | None = None  # the conversation (episodes), packed when asked


def one_turn_sample(prompt: Prompt, completion: Completion) -> Sample:
    """A completion as the episode of one turn it is: the prompt, then the model's tokens."""
    p, c = len(prompt.token_ids), len(completion.token_ids)
    mask = np.zeros(p + c, dtype=np.float32)
    mask[p:] = 1.0
    logprobs = np.zeros(p + c, dtype=np.float32)
    logprobs[p:] = completion.logprobs
    return Sample(
        input_ids=np.array(prompt.token_ids + tuple(completion.token_ids), dtype=np.int64),
        completion_mask=mask,
        logprobs=logprobs,
        answer=completion.text,
        finish_reason=completion.finish_reason,
    )


def pack_groups(
    groups: list[tuple[int, list[Sample]]],
    prompts: list[Prompt],
    group_offset: int,
    pad_id: int,
    policy_version: int,
    num_slices: int = 1,
    turn_credit: float = 0.0,
    keep_messages: bool = False,
) -> list[RolloutSlice]:
    """(k, prompt k's samples) as `num_slices` equal slices of their rows, in order (a slice may
    hold part of a group); group ids are `group_offset + k`. Each row's group diversity is measured
    here, where every group is whole. turn_credit > 0 (EpisodeSettings.turn_credit): each model
    token's `reward_before`, turn_credit x what its turn did not earn. keep_messages
    (SamplingSettings.keep_messages): each row's conversation goes along."""
    rows = [(group_offset + k, prompts[k], sample) for k, samples in groups for sample in samples]
    diversity = {group_offset + k: group_distinct_ratio([s.answer for s in samples]) for k, samples in groups}
    per_slice = len(rows) // num_slices
    return [
        pack_samples(
            rows[i * per_slice : (i + 1) * per_slice], pad_id, policy_version, diversity, turn_credit, keep_messages
        )
        for i in range(num_slices)
    ]


def pack_samples(
    rows: list[tuple[int, Prompt, Sample]],
    pad_id: int,
    policy_version: int,
    diversity: dict[int, float] | None = None,
    turn_credit: float = 0.0,
    keep_messages: bool = False,
) -> RolloutSlice:
    """Right-padded [N, T] arrays from (group id, prompt, sample) rows; see types.py.
    diversity: each group's distinct-4-gram ratio (NaN: no 4-gram); None: measured on the rows given.
    keep_messages: the rows' conversations go along, where they have one (a one-turn sample's
    prompt and completion say it all)."""
    if diversity is None:
        answers: dict[int, list[str]] = {}
        for group, _, sample in rows:
            answers.setdefault(group, []).append(sample.answer)
        diversity = {group: group_distinct_ratio(texts) for group, texts in answers.items()}
    width = max(len(sample.input_ids) for _, _, sample in rows)
    n = len(rows)
    input_ids = np.full((n, width), pad_id, dtype=np.int64)
    attention = np.zeros((n, width), dtype=np.int64)
    completion_mask = np.zeros((n, width), dtype=np.float32)
    logprobs = np.zeros((n, width), dtype=np.float32)
    before = np.zeros((n, width), dtype=np.float32) if turn_credit else None
    for i, (_, _, sample) in enumerate(rows):
        length = len(sample.input_ids)
        input_ids[i, :length], attention[i, :length] = sample.input_ids, 1
        completion_mask[i, :length], logprobs[i, :length] = sample.completion_mask, sample.logprobs
        if before is not None and sample.earned is not None:
            before[i, :length] = turn_credit * sample.earned
    fields = [{**prompt.fields, **sample.fields} for _, prompt, sample in rows]
    names = sorted({name for row in fields for name in row})
    return RolloutSlice(
        group_ids=np.array([g for g, _, _ in rows], dtype=np.int64),
        prompt_uids=np.array([p.uid for _, p, _ in rows], dtype=np.int64),
        input_ids=input_ids,
        attention_mask=attention,
        completion_mask=completion_mask,
        rollout_logprobs=logprobs,
        prompts=[p.text for _, p, _ in rows],
        completions=[s.answer for _, _, s in rows],
        answers=[p.answer for _, p, _ in rows],
        finish_reasons=[s.finish_reason for _, _, s in rows],
        row_fields={name: [row.get(name) for row in fields] for name in names},
        policy_versions=np.full(n, policy_version, dtype=np.int64),
        group_diversity=np.array([diversity[g] for g, _, _ in rows], dtype=np.float64),
        reward_before=before,
        messages=[s.messages for _, _, s in rows]
        if keep_messages and any(s.messages is not None for _, _, s in rows)
        else None,
    )


def pack_slice(
    rows: list[tuple[int, Prompt, Completion]],
    pad_id: int,
    policy_version: int,
    diversity_by_group: dict[int, float] | None = None,
) -> RolloutSlice:
    """(group id, prompt, completion) rows as one slice: their one-turn samples packed."""
    samples = [(group, prompt, one_turn_sample(prompt, completion)) for group, prompt, completion in rows]
    return pack_samples(samples, pad_id, policy_version, diversity_by_group)

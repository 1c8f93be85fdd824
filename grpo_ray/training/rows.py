"""A step's training batch as rows of its rollout slices: chosen, copied or replaced, then re-cut.

The driver decides which rows train on small per-row arrays (`StepRows`: rewards, group ids, where
each row lives); the token arrays stay in the object store until `assemble_slice` builds each
learner rank's slice from its plan (`SliceAssembly`), next to the data. Pure numpy: no Ray here.

    rows = StepRows.from_scored(scored, rewards, row_weights)          # every generated row
    rows = rows.select(kept)                                           # filters, substitution
    rows = rows.with_replacement(row, kept_response)                   # rollout rescue
    plans = rows.split(num_learner_ranks)                              # one SliceAssembly per rank
    batch = assemble_slice(plans[rank], [slices[i] for i in plans[rank].sources_used])

Comes from: the rollout service's ScoredBatch (`batch_rows`). Next hop: training/update.py cuts the
kept rows into each learner rank's payload.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace

import numpy as np

from grpo_ray.algo.overlong import shape_overlong_rewards
from grpo_ray.algo.reward_shaping import clip_rewards
from grpo_ray.types import RolloutSlice, ScoredBatch, ScoredSlice


@dataclass(frozen=True)
class KeptResponse:
    """A completion kept for rollout rescue; plain lists so that checkpoints can hold it as JSON."""

    token_ids: list[int]
    logprobs: list[float]  # sampler log-probs recorded when it was generated
    text: str
    finish_reason: str
    reward: float  # the (shaped) total reward it earned
    per_function: dict[str, float]
    policy_version: int = 0  # weights it was sampled with: a rescued row is that stale
    # An episode's whole tail after the prompt: 1 on the model's tokens, 0 on the environment's
    # replies between them (None: every token is the model's, a single answer).
    mask: list[float] | None = None
    earned: list[float] | None = None  # per-turn credit's reward before each token (RolloutSlice.reward_before)

    @property
    def generated_tokens(self) -> int:
        """The model's own tokens in it (its completion length)."""
        return len(self.token_ids) if self.mask is None else int(sum(self.mask))


def read_response(batch: RolloutSlice, row: int, reward: float, per_function: dict[str, float]) -> KeptResponse:
    """Row `row`'s completion as a KeptResponse: everything after its prompt (token ids, log-probs and,
    for an episode, the mask that tells the model's tokens from the environment's), cut out of the arrays."""
    mask = batch.completion_mask[row]
    model = np.flatnonzero(mask > 0)
    tail = slice(int(model[0]), int(batch.attention_mask[row].sum())) if len(model) else slice(0, 0)
    episode = bool((mask[tail] == 0).any())
    return KeptResponse(
        token_ids=[int(t) for t in batch.input_ids[row][tail]],
        logprobs=[float(x) for x in batch.rollout_logprobs[row][tail]],
        text=batch.completions[row],
        finish_reason=batch.finish_reasons[row],
        reward=float(reward),
        per_function={name: float(value) for name, value in per_function.items()},
        policy_version=int(batch.policy_versions[row]),
        mask=[float(m) for m in mask[tail]] if episode else None,
        earned=None if batch.reward_before is None else [float(x) for x in batch.reward_before[row][tail]],
    )


@dataclass(frozen=True)
class SliceAssembly:
    """One learner rank's slice: output row k is row `rows[k]` of slice `sources[k]` (positions in
    the step's list of slices), in group `group_ids[k]`, with its completion swapped for
    `replacements[k]` where present."""

    sources: np.ndarray  # [M] int64
    rows: np.ndarray  # [M] int64
    group_ids: np.ndarray  # [M] int64
    replacements: dict[int, KeptResponse] = field(default_factory=dict)

    @property
    def sources_used(self) -> list[int]:
        """The slice positions this plan reads, ascending: pass those slices to `assemble_slice`."""
        return sorted(set(self.sources.tolist()))

    def whole_slices(self, slice_rows: list[int]) -> list[int] | None:
        """The source positions when this plan is exactly those slices, whole and in order, with
        nothing replaced (then the slices can go to the learner as they are); else None. Group ids
        are not compared: learners never read them (advantages arrive computed)."""
        if self.replacements:
            return None
        used = list(dict.fromkeys(self.sources.tolist()))
        expected_sources = np.concatenate([np.full(slice_rows[s], s) for s in used])
        expected_rows = np.concatenate([np.arange(slice_rows[s]) for s in used])
        if expected_rows.shape != self.rows.shape:
            return None
        if np.array_equal(expected_sources, self.sources) and np.array_equal(expected_rows, self.rows):
            return used
        return None


def assemble_slice(plan: SliceAssembly, slices: list[RolloutSlice], pad_id: int) -> RolloutSlice:
    """Build the slice `plan` describes from the slices at `plan.sources_used` (in that order)."""
    position = {source: i for i, source in enumerate(plan.sources_used)}
    parts = []
    for source in plan.sources_used:
        picked = np.flatnonzero(plan.sources == source)
        parts.append((picked, slices[position[source]].select(plan.rows[picked])))
    order = np.argsort(np.concatenate([picked for picked, _ in parts]), kind="stable")
    merged = RolloutSlice.concat([part for _, part in parts], pad_id).select(order)
    merged = replace(merged, group_ids=plan.group_ids.astype(np.int64))
    for row, response in sorted(plan.replacements.items()):
        merged = _with_completion(merged, row, response, pad_id)
    return merged


def _with_completion(batch: RolloutSlice, row: int, response: KeptResponse, pad_id: int) -> RolloutSlice:
    """`batch` with row `row`'s completion replaced by `response` (its prompt kept)."""
    model = np.flatnonzero(batch.completion_mask[row] > 0)  # the prompt ends where the model's first token is
    prompt_length = int(model[0]) if len(model) else int(batch.attention_mask[row].sum())
    length = prompt_length + len(response.token_ids)
    width = max(batch.input_ids.shape[1], length)
    grow = width - batch.input_ids.shape[1]
    input_ids = np.pad(batch.input_ids, ((0, 0), (0, grow)), constant_values=pad_id)
    attention = np.pad(batch.attention_mask, ((0, 0), (0, grow)))
    completion_mask = np.pad(batch.completion_mask, ((0, 0), (0, grow)))
    logprobs = np.pad(batch.rollout_logprobs, ((0, 0), (0, grow)))
    input_ids[row, prompt_length:] = pad_id
    input_ids[row, prompt_length:length] = response.token_ids
    attention[row] = 0
    attention[row, :length] = 1
    completion_mask[row] = 0.0
    completion_mask[row, prompt_length:length] = 1.0 if response.mask is None else response.mask
    logprobs[row] = 0.0
    logprobs[row, prompt_length:length] = response.logprobs
    before = None
    if batch.reward_before is not None or response.earned is not None:
        before = np.pad(batch.token_rewards_before(), ((0, 0), (0, grow)))
        before[row] = 0.0
        if response.earned is not None:
            before[row, prompt_length:length] = response.earned
    swap = lambda values, new: [new if i == row else v for i, v in enumerate(values)]  # noqa: E731
    versions = batch.policy_versions.copy()
    versions[row] = response.policy_version
    return replace(
        batch,
        policy_versions=versions,
        input_ids=input_ids,
        attention_mask=attention,
        completion_mask=completion_mask,
        rollout_logprobs=logprobs,
        reward_before=before,
        completions=swap(batch.completions, response.text),
        finish_reasons=swap(batch.finish_reasons, response.finish_reason),
        messages=None if batch.messages is None else swap(batch.messages, None),  # a kept response has none
    )


@dataclass(frozen=True)
class StepRows:
    """The small per-row arrays of a step's batch: where each row lives and what it scored.

    Row i is row `rows[i]` of slice `sources[i]`. `rewards` are after the overlong treatment (what
    the advantages see); `row_weights` 0 keeps a row out of the loss.
    """

    sources: np.ndarray  # [N] int64
    rows: np.ndarray  # [N] int64
    group_ids: np.ndarray  # [N] int64
    prompt_uids: np.ndarray  # [N] int64
    rewards: np.ndarray  # [N] float64, NaN = failed
    per_function: dict[str, np.ndarray]  # name -> [N] float64
    row_weights: np.ndarray  # [N] float32
    completion_lengths: np.ndarray  # [N] int64
    truncated: np.ndarray  # [N] bool
    group_diversity: np.ndarray  # [N] float64
    replacements: dict[int, KeptResponse] = field(default_factory=dict)  # row -> its new completion
    episode_stats: dict[str, np.ndarray] = field(default_factory=dict)  # name -> [N] float64 (episodes only)

    def __len__(self) -> int:
        return int(self.rows.shape[0])

    def _per_row(self) -> dict[str, np.ndarray | dict[str, np.ndarray]]:
        """Every field that holds one entry per row, by name: the [N] arrays and the name -> [N]
        tables (per_function, episode_stats). `replacements` is none of them: its keys are row
        positions, which selecting and concatenating renumber."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "replacements"}

    @staticmethod
    def from_scored(
        scored: list[ScoredSlice], rewards: list[np.ndarray], row_weights: list[np.ndarray], first_source: int = 0
    ) -> StepRows:
        """Every row of the scored slices, slice after slice; slice k is source first_source + k."""
        return StepRows.concat(
            [
                StepRows(
                    sources=np.full(len(s.rewards), first_source + k, dtype=np.int64),
                    rows=np.arange(len(s.rewards), dtype=np.int64),
                    group_ids=np.asarray(s.group_ids, dtype=np.int64),
                    prompt_uids=np.asarray(s.prompt_uids, dtype=np.int64),
                    rewards=np.asarray(slice_rewards, dtype=np.float64),
                    per_function=s.per_function,
                    row_weights=np.asarray(weights, dtype=np.float32),
                    completion_lengths=np.asarray(s.completion_lengths, dtype=np.int64),
                    truncated=s.truncated,
                    group_diversity=s.group_diversity,
                    episode_stats=s.episode_stats,
                )
                for k, (s, slice_rewards, weights) in enumerate(zip(scored, rewards, row_weights, strict=True))
            ]
        )

    @staticmethod
    def concat(parts: list[StepRows]) -> StepRows:
        """The parts' rows one after another (a table's names are the first part's)."""

        def joined(columns: list) -> np.ndarray | dict[str, np.ndarray]:
            if isinstance(columns[0], dict):
                return {name: np.concatenate([c[name] for c in columns]) for name in columns[0]}
            return np.concatenate(columns)

        offsets = np.cumsum([0] + [len(p) for p in parts])
        columns = [p._per_row() for p in parts]
        return StepRows(
            **{name: joined([c[name] for c in columns]) for name in columns[0]},
            replacements={
                int(offset) + row: r for p, offset in zip(parts, offsets) for row, r in p.replacements.items()
            },
        )

    def select(self, index: np.ndarray) -> StepRows:
        """Rows `index` (repeats allowed), in that order; a replaced row keeps its replacement."""
        index = np.asarray(index, dtype=np.int64)

        def taken(column: np.ndarray | dict[str, np.ndarray]) -> np.ndarray | dict[str, np.ndarray]:
            if isinstance(column, dict):
                return {name: values[index] for name, values in column.items()}
            return column[index]

        return StepRows(
            **{name: taken(column) for name, column in self._per_row().items()},
            replacements={
                new: self.replacements[int(old)] for new, old in enumerate(index) if int(old) in self.replacements
            },
        )

    def with_group_ids(self, group_ids: np.ndarray) -> StepRows:
        return replace(self, group_ids=np.asarray(group_ids, dtype=np.int64))

    def with_rewards(self, rewards: np.ndarray) -> StepRows:
        return replace(self, rewards=np.asarray(rewards, dtype=np.float64))

    def with_weights(self, row_weights: np.ndarray) -> StepRows:
        return replace(self, row_weights=np.asarray(row_weights, dtype=np.float32))

    def with_replacement(self, row: int, response: KeptResponse) -> StepRows:
        """Row `row` now holds `response`: its reward, scores, length and truncation are the response's."""

        def put(array: np.ndarray, value) -> np.ndarray:
            out = array.copy()
            out[row] = value
            return out

        return replace(
            self,
            rewards=put(self.rewards, response.reward),
            per_function={
                name: put(values, response.per_function.get(name, np.nan)) for name, values in self.per_function.items()
            },
            row_weights=put(self.row_weights, 1.0),
            completion_lengths=put(self.completion_lengths, response.generated_tokens),
            truncated=put(self.truncated, response.finish_reason == "length"),
            replacements={**self.replacements, int(row): response},
        )

    def split(self, parts: int) -> list[SliceAssembly]:
        """Cut into `parts` contiguous, equal plans (one per learner rank); len must divide."""
        if len(self) % parts:
            raise ValueError(f"{len(self)} rows do not split into {parts} equal parts")
        size = len(self) // parts
        plans = []
        for part in range(parts):
            lo, hi = part * size, (part + 1) * size
            plans.append(
                SliceAssembly(
                    sources=self.sources[lo:hi],
                    rows=self.rows[lo:hi],
                    group_ids=self.group_ids[lo:hi],
                    replacements={row - lo: r for row, r in self.replacements.items() if lo <= row < hi},
                )
            )
        return plans


def read_responses(
    batch: RolloutSlice, rows: list[int], scores: list[tuple[float, dict[str, float]]]
) -> list[KeptResponse]:
    """Cut the given rows' completions out of a slice (run beside the slice, for the rescue buffer)."""
    return [read_response(batch, row, reward, per_function) for row, (reward, per_function) in zip(rows, scores)]


def assemble_slices(plan: SliceAssembly, pad_id: int, *slices: RolloutSlice) -> RolloutSlice:
    """assemble_slice with the slices as separate arguments (a task receives refs resolved only so)."""
    return assemble_slice(plan, list(slices), pad_id)


@dataclass(frozen=True)
class Overlong:
    """The overlong treatment: algorithm.overlong, overlong_buffer and overlong_penalty."""

    mode: str
    buffer: int
    penalty: float


def shape_rewards(
    scored: list[ScoredSlice], max_new_tokens: int, overlong: Overlong
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Per slice: rewards after the overlong treatment, and row loss weights (0 = out of the loss)."""
    shaped = [
        shape_overlong_rewards(
            s.rewards,
            s.completion_lengths,
            s.truncated,
            overlong.mode,
            max_new_tokens,
            overlong.buffer,
            overlong.penalty,
        )
        for s in scored
    ]
    return [r for r, _ in shaped], [w for _, w in shaped]


def batch_rows(batch: ScoredBatch, max_new_tokens: int, first_source: int, overlong: Overlong) -> StepRows:
    """A scored batch's rows, overlong treatment applied (the running shaping is the builder's); their
    sources index its refs from `first_source` on; they are the batch's `order` (ScoredBatch)."""
    rewards, weights = shape_rewards(batch.scored, max_new_tokens, overlong)
    rows = StepRows.from_scored(batch.scored, rewards, weights, first_source)
    return rows if batch.order is None else rows.select(batch.order)


def preview_rewards(
    scored: ScoredSlice, max_new_tokens: int, overlong: Overlong, clip: tuple[float, float] | None
) -> np.ndarray:
    """The rewards dynamic sampling judges a streamed chunk by, before the batch is whole: overlong
    treatment and clipping (reward.clip). Running normalisation is left out: an affine map with a
    positive scale, it keeps equal rewards equal and different ones different."""
    (rewards,), _ = shape_rewards([scored], max_new_tokens, overlong)
    return clip_rewards(rewards, *clip) if clip is not None else rewards


def failure_counts(scored: list[ScoredSlice]) -> tuple[dict[str, int], int, dict[str, str]]:
    """(failed rows per reward function, rows scored, each function's first error) over every slice
    or chunk a generation had scored: the one count of both the whole-share and the streamed path, so
    the failure monitor sees the same rate for the same batch, whatever its chunking and order. It
    counts what the functions ran on, kept rows or not, from the scorer's own counts: a NaN score
    also marks a function a row's source does not use (reward.by_source), which is no failure."""
    failures: dict[str, int] = {}
    first_errors: dict[str, str] = {}
    for part in scored:
        for name, count in part.failures.items():
            failures[name] = failures.get(name, 0) + count
        for name, error in part.first_errors.items():
            first_errors.setdefault(name, error)
    return failures, int(sum(len(s.rewards) for s in scored)), first_errors

"""The one reward scorer: the reward workers of a run and `grpo-ray rewards score` both use it.

    with RowScorer([("math", {}), ("format", {"pattern": "think"})]) as scorer:
        results = scorer.score(completions, prompts, answers, row_fields)  # [(scores [N], first error)]

Isolation "subprocess" (the default) runs the functions in a SandboxedScorer: a hard timeout per call,
a crash kills only a child process. "none" calls them in this process.

Failures are isolated per row. Every function is first called on the whole batch (in the sandbox,
chunks of rows in parallel); when a call fails (it raised, timed out, crashed), the rows it left
unscored are scored again one at a time, so one bad row fails alone instead of taking its batch
with it. After three timeouts in a row the rest stay failed: a function that hangs on every row
would otherwise cost rows x timeout_s. A failed row's score is None, never a silent 0.

Pure Python and the reward registry: no torch, no Ray.
"""

from __future__ import annotations

from collections.abc import Callable

from grpo_ray.rewards import load_reward_function, score_completions
from grpo_ray.rewards.registry import takes_completion_ids

# (scores [N], first error) of one function over a batch of N rows.
FunctionResult = tuple[list[float | None], str | None]
Batch = tuple[list[str], list[str], list[str], dict[str, list]]  # completions, prompts, answers, row fields
MAX_TIMEOUTS_IN_A_ROW = 3
NONE_RETURNED = "returned None (could not score)"


class RowScorer:
    def __init__(
        self,
        functions: list[tuple[str, dict]],
        isolation: str = "subprocess",
        timeout_s: float = 30.0,
        processes: int = 1,
        memory_limit_mb: int | None = None,
    ):
        self.sandbox = None
        if isolation == "subprocess":
            from grpo_ray.rewards.sandbox import SandboxedScorer

            self.sandbox = SandboxedScorer(
                functions, num_processes=processes, timeout_s=timeout_s, memory_limit_mb=memory_limit_mb
            )
        else:
            self.loaded = [load_reward_function(spec, options) for spec, options in functions]
        self.num_functions = len(functions)

    @property
    def wants_completion_ids(self) -> bool:
        """Whether a function takes TRL's completion_ids (the caller gathers them only then)."""
        if self.sandbox is not None:
            return self.sandbox.wants_completion_ids
        return any(takes_completion_ids(fn) for fn in self.loaded)

    @property
    def restarts(self) -> int:
        """Sandbox children replaced so far (after a crash or a timeout)."""
        return self.sandbox.restarts if self.sandbox is not None else 0

    def score(
        self,
        completions: list[str],
        prompts: list[str],
        answers: list[str],
        row_fields: dict[str, list],
        functions: list[int] | None = None,
    ) -> list[FunctionResult]:
        """(scores [N], first error) of each of `functions` (constructor indices; default all), in that order."""
        batch: Batch = (completions, prompts, answers, row_fields)
        indices = list(range(self.num_functions)) if functions is None else list(functions)
        if self.sandbox is not None:
            first = [(r.scores, r.error) for r in self.sandbox.score_many(*batch, functions=indices)]
        else:
            first = [self._call_in_process(index, *batch) for index in indices]
        return [self._isolate_failures(index, batch, scores, error) for index, (scores, error) in zip(indices, first)]

    def _isolate_failures(self, index: int, batch: Batch, scores: list, error: str | None) -> FunctionResult:
        """Score the rows a failed batch call left unscored one at a time."""
        if error is None:
            return scores, None if None not in scores else NONE_RETURNED
        completions, prompts, answers, row_fields = batch
        scores = list(scores)
        first_error, timeouts = None, 0
        for i in [i for i, score in enumerate(scores) if score is None]:
            if timeouts >= MAX_TIMEOUTS_IN_A_ROW:
                break  # leave the rest None: the batch's error stands for them
            one = {name: values[i : i + 1] for name, values in row_fields.items()}
            row_scores, row_error = self._call(index)(
                completions[i : i + 1], prompts[i : i + 1], answers[i : i + 1], one
            )
            scores[i] = row_scores[0]
            timeouts = timeouts + 1 if row_error and row_error.startswith("timed out") else 0
            if scores[i] is None and first_error is None:
                first_error = row_error or NONE_RETURNED
        return scores, first_error or (error if None in scores else None)

    def _call(self, index: int) -> Callable[..., FunctionResult]:
        if self.sandbox is not None:
            return lambda *batch: (lambda r: (r.scores, r.error))(self.sandbox.score(index, *batch))
        return lambda *batch: self._call_in_process(index, *batch)

    def _call_in_process(self, index: int, completions, prompts, answers, row_fields) -> FunctionResult:
        try:
            return score_completions(self.loaded[index], completions, prompts, answers, row_fields), None
        except Exception as err:  # any failure of the function fails its rows, never the caller
            lines = str(err).strip().splitlines()
            return [None] * len(completions), f"{type(err).__name__}: {lines[0] if lines else ''}".rstrip(": ")

    def close(self) -> None:
        if self.sandbox is not None:
            self.sandbox.close()

    def __enter__(self) -> RowScorer:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

"""Why a run stops on its own: each message is one line that says why and what to change."""

from __future__ import annotations


class RunStoppedError(RuntimeError):
    """The run cannot usefully go on; the message is one line that says why and what to change.
    metrics: the figures of the step it stopped in, when that step never finished (the loop logs
    them before the error ends the run: what stopped it is in MLflow and on the console)."""

    def __init__(self, message: str, metrics: dict[str, float] | None = None):
        super().__init__(message)
        self.metrics = dict(metrics or {})


class RewardFailureError(RunStoppedError):
    """A reward function failed on too many completions; the message names it and its first error."""


class EnvironmentFailureError(RunStoppedError):
    """Too many episodes failed in the environment (environment.max_failure_rate); the message names
    the failures by kind and the first one's method, error and the setting or code to change."""


class TeacherFailureError(RunStoppedError):
    """A teacher behind an HTTP endpoint failed on more of a step's rows than its max_failure_rate;
    the message names it, its url and its first error."""


class NothingToLearnError(RunStoppedError):
    """Too many batches in a row had no learning signal, or drop-easy left no training prompt."""


class NonFiniteUpdateError(RunStoppedError):
    """Too many updates in a row were skipped for a NaN or infinite loss or gradient."""


def skip_message(substitution: bool, prompts_per_step: int, count: int) -> str:
    """Why `count` skipped batches in a row stop the run (polaris.substitution or dynamic sampling)."""
    if substitution:
        why = (
            f"polaris.substitution: {count} batches in a row had at most {prompts_per_step // 3} "
            "informative groups (mean reward strictly between 0 and 1)"
        )
    else:
        why = f"algorithm.dynamic_sampling: {count} batches in a row had no group with a reward spread"
    return (
        why + "; the data is too easy or too hard for this model: filter it (data.difficulty_band) or raise "
        "train.max_skipped_batches"
    )

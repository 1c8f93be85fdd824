"""Why a run stops on its own: each message is one line that says why and what to change."""

from __future__ import annotations


class RunStoppedError(RuntimeError):
    """The run cannot usefully go on; the message is one line that says why and what to change."""


class RewardFailureError(RunStoppedError):
    """A reward function failed on too many completions; the message names it and its first error."""


class NothingToLearnError(RunStoppedError):
    """Too many batches in a row had no learning signal, or drop-easy left no training prompt."""


class NonFiniteUpdateError(RunStoppedError):
    """Too many updates in a row were skipped for a NaN or infinite loss or gradient."""

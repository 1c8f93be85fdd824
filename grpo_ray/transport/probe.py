"""Whether a rollout engine holds the weights just sent, read from a probe sequence's log-probs.

An engine and the learner never compute the same log-probs to the bit: their kernels differ (on an
H100, fp32 gaps of 4e-4 to 4e-3 that drift as training sharpens the weights; 0.016-0.022 in bf16
on a 0.5B model). So the probe asks a question the kernels' noise cannot answer wrongly: are the
engine's log-probs those of the weights just sent, or those of an earlier version the engine was
shown to hold (its *baseline*)? Both are measured as a mean |difference| over the probe's
completion tokens, and the question has an answer only when the learner's own log-probs moved
from the baseline to now by clearly more than the kernels' noise:

- moved = mean |learner now - learner at the baseline|  (the learner's measure: exact, no engine)
- noise = the engine-learner kernel gap: the largest mean |engine - learner| measured at a version
  the engine was shown to hold (at start-up, when both hold the starting weights, then at every
  verdict "loaded"), and never below weight_sync.probe_tolerance.
- moved <= SEPARATION x noise: **undecided**. The update moved the probe less than the kernels'
  noise can hide; the engine may hold either version and its log-probs would be the same to within
  that noise. The baseline stays where it is, so the next probes compare with a version further
  back until the updates add up. The digests are the proof that the bytes arrived.
- otherwise **loaded** when the engine is closer to the new weights' log-probs than to the
  baseline's, else **not loaded**. With moved > 4 noise, an engine holding either version is within
  noise of it and more than 3 noise from the other, so the verdict holds even if the kernel gap
  has doubled since it was measured.

What it cannot tell: an engine that holds weights within the kernels' noise of the sent ones (an
update too small to matter, or a load that went wrong by less than that) passes as loaded or
undecided; an engine that kept an older version is caught only once the updates since moved the
probe past the noise, which at a small learning rate in bf16 may take many syncs or never.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

# How many times the kernel gap the updates must have moved the probe before it decides (see above).
SEPARATION = 4.0

Verdict = Literal["loaded", "not loaded", "undecided"]


@dataclass(frozen=True)
class ProbeBaseline:
    """A version one engine was shown to hold, and what the probe knows of its kernels there."""

    version: int
    learner: np.ndarray  # [N, T] the learner's probe log-probs at that version
    kernel_gap: float  # the largest mean |engine - learner| seen at a version it was shown to hold


@dataclass(frozen=True)
class ProbeReading:
    verdict: Verdict
    max_gap: float  # max |engine - learner now| over the completion tokens (sync/probe_max_abs_diff)
    to_sent: float  # mean |engine - learner now|
    to_baseline: float  # mean |engine - learner at the baseline version|
    moved: float  # mean |learner now - learner at the baseline version|
    noise: float  # the kernel gap the verdict allowed for: max(tolerance, baseline's kernel gap)

    def explain(self, who: str, baseline_version: int) -> str:
        """One line: what was measured and what it means (a verdict that is not "loaded")."""
        figures = (
            f"its probe log-probs are {self.to_sent:.2e} from the learner's and {self.to_baseline:.2e} from "
            f"those of version {baseline_version} (mean over the completion tokens), and the updates since "
            f"version {baseline_version} moved the learner's {self.moved:.2e}"
        )
        if self.verdict == "undecided":
            return (
                f"{who}: the weight probe cannot tell yet whether its engine loaded the sent weights: {figures}, "
                f"within {SEPARATION:g}x the engine-learner kernel gap {self.noise:.2e}; the digests prove the bytes "
                "arrived, and the probe decides once the updates add up (sync/probe_undecided counts these)"
            )
        return (
            f"{who}: its engine did not load the sent weights: {figures}, more than {SEPARATION:g}x the "
            f"engine-learner kernel gap {self.noise:.2e}; the digests matched, so the bytes arrived and were not loaded"
        )

    def next_baseline(self, baseline: ProbeBaseline, version: int, learner: np.ndarray) -> ProbeBaseline:
        """The baseline the next probe of this engine compares with: now, once shown to hold it."""
        if self.verdict != "loaded":
            return baseline
        return ProbeBaseline(version, learner, max(baseline.kernel_gap, self.to_sent))


def mean_gap(a: np.ndarray, b: np.ndarray, mask: np.ndarray) -> float:
    """Mean |a - b| over the tokens where mask is 1 ([N, T] each)."""
    weights = mask.astype(np.float64)
    return float((np.abs(a.astype(np.float64) - b) * weights).sum() / max(weights.sum(), 1.0))


def start_baseline(engine: np.ndarray, learner: np.ndarray, mask: np.ndarray, version: int) -> ProbeBaseline:
    """At start-up, engine and learner hold the same starting weights: their gap is the kernels' alone."""
    return ProbeBaseline(version, learner, mean_gap(engine, learner, mask))


def read_probe(
    engine: np.ndarray, learner: np.ndarray, baseline: ProbeBaseline, mask: np.ndarray, tolerance: float
) -> ProbeReading:
    """engine, learner (now), mask: [N, T] log-probs and the completion-token mask of the probe;
    tolerance: the smallest kernel gap allowed for (weight_sync.probe_tolerance)."""
    to_sent = mean_gap(engine, learner, mask)
    to_baseline = mean_gap(engine, baseline.learner, mask)
    moved = mean_gap(learner, baseline.learner, mask)
    noise = max(tolerance, baseline.kernel_gap)
    if moved <= SEPARATION * noise:
        verdict: Verdict = "undecided"
    else:
        verdict = "loaded" if to_sent < to_baseline else "not loaded"
    max_gap = float((np.abs(engine.astype(np.float64) - learner) * mask).max())
    return ProbeReading(verdict, max_gap, to_sent, to_baseline, moved, noise)

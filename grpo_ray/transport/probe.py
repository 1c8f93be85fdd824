"""Whether a rollout engine holds the weights just sent, read from a probe sequence's log-probs.

An engine and the learner never compute the same log-probs to the bit: their kernels differ (on an
H100, fp32 gaps of 4e-4 to 4e-3 that drift as training sharpens the weights; 0.008-0.024 in bf16
on a 0.5B model), so a fixed tolerance either cries wolf on every GPU or is too loose to see
anything. What does tell loaded from not loaded is which weights the engine's log-probs are
closer to: an engine that kept the old weights reproduces the learner's log-probs of the previous
probed version to within kernel noise, and is as far from the new ones as the updates moved them.

The verdict: within `tolerance` of the learner's log-probs, loaded; beyond it, loaded only if the
engine's log-probs are closer (mean over the completion tokens) to the new weights' than to those
of the last probed version. With no earlier version to compare (none kept), the tolerance decides.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class ProbeReading:
    to_sent: float  # max |engine - learner now| over the completion tokens
    to_previous: float | None  # max |engine - learner at the last probed version|, if one was kept
    loaded: bool

    def explain(self, who: str, tolerance: float, previous_version: int | None) -> str:
        """One line: what was measured and what it means (for a reading that is not loaded)."""
        line = (f"{who}: probe log-probs differ from the learner's by {self.to_sent:.2e} "
                f"(> weight_sync.probe_tolerance {tolerance:g})")
        if self.to_previous is None:
            return (line + " at the first probe, with no earlier version to compare; its engine did not load the "
                    "sent weights, or its kernels differ from the learner's by more than that (raise the tolerance)")
        return (line + f" and are no closer to them than to the weights of version {previous_version} "
                f"({self.to_previous:.2e} from those); its engine did not load the sent weights")


def read_probe(engine: np.ndarray, learner: np.ndarray, previous: np.ndarray | None, mask: np.ndarray,
               tolerance: float) -> ProbeReading:
    """engine, learner, previous (the learner's at the last probed version, or None), mask: [N, T]
    log-probs and the completion-token mask of the probe."""
    weights = mask.astype(np.float64)
    count = max(float(weights.sum()), 1.0)
    gap_sent = np.abs(engine - learner) * weights
    to_sent = float(gap_sent.max())
    if previous is None:
        return ProbeReading(to_sent, None, to_sent <= tolerance)
    gap_previous = np.abs(engine - previous) * weights
    closer_to_sent = gap_sent.sum() / count < gap_previous.sum() / count
    return ProbeReading(to_sent, float(gap_previous.max()), to_sent <= tolerance or bool(closer_to_sent))

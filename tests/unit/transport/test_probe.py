"""The weight-sync probe's verdict on hand-made log-probs: loaded, not loaded, and undecided."""

import numpy as np
import pytest

from grpo_ray.transport.probe import SEPARATION, ProbeBaseline, mean_gap, read_probe, start_baseline

MASK = np.array([[0, 1, 1, 1], [0, 0, 1, 1]])  # five completion tokens; the prompt columns are masked out
OLD = np.array([[0.0, -1.0, -2.0, -3.0], [0.0, 0.0, -1.0, -0.5]])
# The update moved the five completion tokens by 0.5, 0.5, 1.0, 0.25, 0.25: a mean of 0.5.
NEW = np.array([[0.0, -1.5, -2.5, -2.0], [0.0, 0.0, -1.25, -0.25]])
NOISE = np.array(
    [[7.0, 2e-2, -2e-2, 2e-2], [-7.0, 9.0, 2e-2, -2e-2]]
)  # bf16-sized kernel noise: mean 0.02 where it counts


def baseline(gap: float = 0.02) -> ProbeBaseline:
    return ProbeBaseline(version=3, learner=OLD, kernel_gap=gap)


def test_mean_gap_counts_completion_tokens_only():
    assert mean_gap(NEW, OLD, MASK) == pytest.approx(0.5)
    assert mean_gap(NEW + NOISE, NEW, MASK) == pytest.approx(0.02)


def test_the_start_up_baseline_is_the_kernels_gap_at_the_starting_weights():
    start = start_baseline(OLD + NOISE, OLD, MASK, version=0)
    assert (start.version, start.kernel_gap) == (0, pytest.approx(0.02)) and start.learner is OLD


def test_an_engine_that_loaded_an_update_larger_than_the_noise_is_loaded_and_becomes_the_baseline():
    # moved 0.5 > 4 x 0.02: the engine is 0.02 from the new weights and ~0.5 from version 3's.
    reading = read_probe(NEW + NOISE, NEW, baseline(), MASK, tolerance=1e-3)
    assert reading.verdict == "loaded"
    assert reading.to_sent == pytest.approx(0.02) and reading.moved == pytest.approx(0.5)
    assert reading.max_gap == pytest.approx(0.02)  # the prompt columns' 7 and 9 are masked out
    following = reading.next_baseline(baseline(), version=4, learner=NEW)
    assert (following.version, following.learner is NEW, following.kernel_gap) == (4, True, pytest.approx(0.02))


def test_an_engine_that_kept_the_baseline_weights_is_not_loaded_and_named_with_the_figures():
    reading = read_probe(OLD + NOISE, NEW, baseline(), MASK, tolerance=1e-3)
    assert reading.verdict == "not loaded"
    # |OLD + noise - NEW|: 0.52, 0.48, 1.02, 0.27, 0.23 -> mean 0.504; 0.02 from version 3's.
    assert reading.to_sent == pytest.approx(0.504) and reading.to_baseline == pytest.approx(0.02)
    message = reading.explain("rollout-1", 3)
    assert message == (
        "rollout-1: its engine did not load the sent weights: its probe log-probs are 5.04e-01 from the learner's and "
        "2.00e-02 from those of version 3 (mean over the completion tokens), and the updates since version 3 moved the "
        "learner's 5.00e-01, more than 4x the engine-learner kernel gap 2.00e-02; the digests matched, so the bytes "
        "arrived and were not loaded"
    )
    assert reading.next_baseline(baseline(), version=4, learner=NEW) == baseline()


def test_an_update_smaller_than_the_noise_is_undecided_either_way():
    # The bf16 case: an update moves the probe 0.0001, the kernels differ by 0.02. Both
    # distances are 0.02 whichever weights the engine holds: the probe cannot tell, and says so.
    tiny = OLD + 1e-4 * MASK
    for engine in (tiny + NOISE, OLD + NOISE):
        reading = read_probe(engine, tiny, baseline(), MASK, tolerance=1e-3)
        assert reading.verdict == "undecided" and reading.moved == pytest.approx(1e-4)
        assert reading.next_baseline(baseline(), version=4, learner=tiny) == baseline(), "the baseline stays back"
    assert reading.explain("rollout-0", 3).startswith(
        "rollout-0: the weight probe cannot tell yet whether its engine loaded the sent weights: its probe log-probs "
        "are 2.00e-02 from the learner's"
    )
    assert "within 4x the engine-learner kernel gap 2.00e-02; the digests prove the bytes arrived" in reading.explain(
        "rollout-0", 3
    )


def test_small_updates_that_add_up_are_decided_against_the_baseline_kept_back():
    # Four updates of 0.03 each: undecided one by one (0.03 <= 0.08), decided at the third (0.09).
    # An engine that stopped loading after the baseline is caught; one that loaded is believed.
    start = baseline()
    for loaded in (True, False):
        current = start
        verdicts = []
        for k in range(1, 5):
            learner = OLD + 0.03 * k * MASK
            engine = (learner if loaded else OLD) + NOISE
            reading = read_probe(engine, learner, current, MASK, tolerance=1e-3)
            verdicts.append(reading.verdict)
            if reading.verdict == "not loaded":
                break
            current = reading.next_baseline(current, version=3 + k, learner=learner)
        assert verdicts == (
            ["undecided", "undecided", "loaded", "undecided"] if loaded else ["undecided", "undecided", "not loaded"]
        )


def test_the_tolerance_is_the_least_noise_allowed_for():
    # A start-up gap of 0 (same kernels) would let a 1e-6 update decide; the tolerance keeps it undecided.
    exact = ProbeBaseline(3, OLD, kernel_gap=0.0)
    nudged = OLD + 1e-6 * MASK
    assert read_probe(nudged, nudged, exact, MASK, tolerance=1e-3).verdict == "undecided"
    assert read_probe(nudged, nudged, exact, MASK, tolerance=1e-9).verdict == "loaded"
    assert read_probe(OLD, nudged, exact, MASK, tolerance=1e-9).verdict == "not loaded"
    assert read_probe(nudged, nudged, exact, MASK, tolerance=1e-3).noise == 1e-3


def test_a_kernel_gap_that_doubled_since_it_was_measured_is_no_false_alarm():
    # Measured 0.02 at the baseline; the weights sharpened and the kernels now differ by 0.04. The
    # update moved the probe just past 4 x 0.02: the loaded engine is still closer to the new weights.
    learner = OLD + 0.0801 * MASK
    reading = read_probe(learner + 2 * NOISE, learner, baseline(), MASK, tolerance=1e-3)
    assert reading.verdict == "loaded" and reading.to_sent == pytest.approx(0.04)
    assert reading.next_baseline(baseline(), 4, learner).kernel_gap == pytest.approx(0.04), "the larger gap is kept"
    assert read_probe(OLD + 2 * NOISE, learner, baseline(), MASK, tolerance=1e-3).verdict == "not loaded"


def test_the_separation_is_four_kernel_gaps():
    assert SEPARATION == 4.0
    at = OLD + 0.0799 * MASK  # just under 4 x 0.02: not yet
    assert read_probe(at + NOISE, at, baseline(), MASK, tolerance=1e-3).verdict == "undecided"

"""The weight-sync probe's verdict on hand-made log-probs: loaded, stale, and kernel drift."""

import numpy as np

from grpo_ray.transport.probe import read_probe

MASK = np.array([[0, 1, 1, 1]])
OLD = np.array([[0.0, -1.0, -2.0, -3.0]])
NEW = np.array([[0.0, -1.5, -2.5, -2.0]])  # the update moved the three completion tokens by 0.5, 0.5, 1.0


def test_within_the_tolerance_is_loaded_without_looking_further():
    reading = read_probe(NEW + 1e-4, NEW, OLD, MASK, tolerance=1e-3)
    assert reading.loaded and abs(reading.to_sent - 1e-4) < 1e-12


def test_gpu_kernel_drift_beyond_the_tolerance_is_not_a_false_alarm():
    # An H100 in fp32 drifted to 4.2e-3 from the learner (tolerance 1e-3); the previous weights are
    # 0.5-1.0 away: the engine holds the new ones.
    drift = np.array([[9.0, 4.2e-3, -3e-3, 1e-3]])  # the prompt column is masked out
    reading = read_probe(NEW + drift, NEW, OLD, MASK, tolerance=1e-3)
    assert reading.loaded and abs(reading.to_sent - 4.2e-3) < 1e-12
    assert abs(reading.to_previous - (1.0 + 1e-3)) < 1e-12  # -2.0 + 1e-3 against -3.0


def test_an_engine_that_kept_the_old_weights_is_caught_even_through_kernel_noise():
    noise = np.array([[0.0, 5e-3, -5e-3, 5e-3]])
    reading = read_probe(OLD + noise, NEW, OLD, MASK, tolerance=1e-3)
    assert not reading.loaded
    # |OLD + noise - NEW| on the completion: 0.505, 0.495, 0.995.
    assert abs(reading.to_sent - 0.995) < 1e-12 and abs(reading.to_previous - 5e-3) < 1e-12
    message = reading.explain("rollout-1", 1e-3, previous_version=10)
    assert message.startswith("rollout-1: probe log-probs differ from the learner's by 9.95e-01 (> weight_sync.probe_tolerance 0.001)")
    assert "than to the weights of version 10 (5.00e-03 from those); its engine did not load the sent weights" in message


def test_without_an_earlier_version_the_tolerance_decides():
    assert read_probe(NEW + 5e-4, NEW, None, MASK, tolerance=1e-3).loaded
    reading = read_probe(NEW + 2e-3, NEW, None, MASK, tolerance=1e-3)
    assert not reading.loaded and reading.to_previous is None
    assert "at the first probe, with no earlier version to compare" in reading.explain("rollout-0", 1e-3, None)

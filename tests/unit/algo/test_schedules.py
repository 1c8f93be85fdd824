"""Learning-rate schedules on hand-worked numbers (peak 1.0 and floor 0.1 keep the arithmetic readable)."""

import math

import pytest

from grpo_ray.algo.schedules import LrSegment, schedule_lr, segment_lr, warmup_from_ratio


def test_linear_warms_up_then_decays_towards_the_floor():
    # N = 10 steps, W = 2 warmup steps, peak 1.0, floor 0.1.
    lrs = [segment_lr(s, 10, 1.0, "linear", 2, 0.1) for s in range(1, 11)]
    # Warmup: s / W -> 0.5, 1.0 (the first step does not train at 0).
    assert lrs[:2] == [0.5, 1.0]
    # s = 3 is the first decay step: p = (3 - 1 - 2) / 8 = 0 -> the peak.
    assert lrs[2] == 1.0
    # s = 4: p = 1/8 -> 0.1 + 0.9 * 7/8 = 0.8875.  s = 10 (the last): p = 7/8 -> 0.1 + 0.9/8 = 0.2125.
    assert lrs[3] == pytest.approx(0.8875) and lrs[9] == pytest.approx(0.2125)
    # Strictly decreasing after the peak, never below the floor.
    assert all(a > b for a, b in zip(lrs[2:], lrs[3:])) and min(lrs) >= 0.1


def test_cosine_is_half_way_at_mid_decay():
    # N = 10, W = 2, peak 1.0, floor 0.0. s = 7: p = (7 - 1 - 2) / 8 = 0.5 -> (1 + cos(pi/2)) / 2 = 0.5.
    assert segment_lr(7, 10, 1.0, "cosine", 2, 0.0) == pytest.approx(0.5)
    # s = 10: p = 7/8 -> (1 + cos(7 pi / 8)) / 2 = (1 - 0.92388) / 2 = 0.038060.
    assert segment_lr(10, 10, 1.0, "cosine", 2, 0.0) == pytest.approx(0.0380602, abs=1e-7)
    # With a floor of 0.1 the same point is 0.1 + 0.9 * 0.038060 = 0.134254.
    assert segment_lr(10, 10, 1.0, "cosine", 2, 0.1) == pytest.approx(0.1 + 0.9 * (1 + math.cos(7 * math.pi / 8)) / 2)


def test_constant_is_the_peak_after_warmup_and_without_one():
    assert [segment_lr(s, 5, 2e-5, "constant", 0, 0.0) for s in range(1, 6)] == [2e-5] * 5
    # W = 4: 1/4, 2/4, 3/4 of the peak, then the peak.
    assert [segment_lr(s, 6, 4.0, "constant", 4, 0.0) for s in range(1, 7)] == [1.0, 2.0, 3.0, 4.0, 4.0, 4.0]


def test_warmup_longer_than_the_schedule_only_warms_up():
    # W = 8 > N = 4: steps 1..4 get 1/8 .. 4/8 of the peak.
    assert [segment_lr(s, 4, 8.0, "cosine", 8, 0.0) for s in range(1, 5)] == [1.0, 2.0, 3.0, 4.0]


def test_segments_pick_the_latest_one_started_and_count_from_its_start():
    first = LrSegment(first_step=1, steps=3, peak_lr=1.0, kind="linear", warmup_steps=0, min_lr=0.0)
    second = LrSegment(first_step=4, steps=2, peak_lr=0.5, kind="constant", warmup_steps=2, min_lr=0.0)
    # Steps 1..3 are the first segment: p = 0, 1/3, 2/3 -> 1, 2/3, 1/3.
    got = [schedule_lr(step, (first, second)) for step in range(1, 6)]
    assert got[:3] == pytest.approx([1.0, 2 / 3, 1 / 3])
    # Steps 4, 5 are the second's local steps 1, 2: warmup 0.25, then the peak 0.5.
    assert got[3:] == [0.25, 0.5]
    with pytest.raises(ValueError, match="no learning-rate segment covers step 0"):
        schedule_lr(0, (first, second))


def test_warmup_ratio_rounds_up():
    # 0.25 of 6 steps is 1.5 -> 2 (as Hugging Face's math.ceil); 0.1 of 100 is exactly 10.
    assert warmup_from_ratio(0.25, 6) == 2 and warmup_from_ratio(0.1, 100) == 10 and warmup_from_ratio(0.0, 9) == 0

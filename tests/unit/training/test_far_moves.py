"""training/far_moves.py: when a step's update moved the policy far past the clip, and how often it is said."""

import math

from grpo_ray.training.far_moves import FarMoveWatch, far_move_line


def test_a_move_past_three_times_the_clips_bound_names_the_learning_rate_and_what_to_do():
    # The bound at 0.2 / 0.2 is log 1.2 = 0.1823; far is over 3x that, 0.547 nats.
    assert far_move_line(3, 0.54, 0.2, 0.2, 2e-5) is None
    line = far_move_line(3, 0.56, 0.2, 0.2, 2e-5)
    assert line.startswith("warning: step 3: the update moved the sampled tokens' log-probs by 0.56 nats")
    # 0.56 / 0.1823 = 3.07x; lr / 3 = 6.7e-06, lr / 10 = 2.0e-06.
    assert "3x the 0.18 the clip allows (algorithm.clip_low 0.2, clip_high 0.2)" in line
    assert line.endswith("learner.lr 2e-05: lower it 3-10x (6.7e-06 to 2.0e-06)")
    # SmolLM2-135M's first step at lr 3e-4 moved 2.06 nats: 11x.
    assert "11x" in far_move_line(1, 2.06, 0.2, 0.2, 3e-4)


def test_a_step_that_measured_nothing_is_not_far():
    assert far_move_line(1, math.nan, 0.2, 0.2, 1e-5) is None


def test_a_far_move_is_said_once_then_only_when_twice_as_far_or_fifty_steps_on():
    watch = FarMoveWatch(clip_low=0.2, clip_high=0.2, lr=1e-4)
    said = {
        step: watch.line(step, {"update/moved": moved}) is not None
        for step, moved in [(1, 1.0), (2, 1.5), (3, 0.1), (4, 2.0), (30, 3.9), (53, 0.6), (54, 0.6), (55, 0.6)]
    }
    # Step 1 is the first; 2 is far but under 2x 1.0; 3 is not far; 4 is 2x step 1's; 30 is under 2x
    # step 4's 2.0, 26 steps on; 53 is 49 steps after step 4, 54 is 50: a new occurrence; 55 is not news.
    assert said == {1: True, 2: False, 3: False, 4: True, 30: False, 53: False, 54: True, 55: False}
    assert watch.line(56, {}) is None  # a step without the metric (no learner figure) says nothing

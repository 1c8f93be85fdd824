from grpo_ray.rewards.monitor import FailureMonitor


def test_rate_over_the_window_names_the_function_and_its_first_error():
    monitor = FailureMonitor(window_steps=3, max_rate=0.5)
    monitor.record({"math": 0, "format": 0}, 10, {})
    monitor.record({"math": 4, "format": 0}, 10, {"math": "ValueError: bad latex"})
    # math: 4 of 20 = 20% <= 50%.
    assert monitor.check() is None
    monitor.record({"math": 10, "format": 1}, 10, {"math": "TimeoutError: later"})
    # math: 14 of 30 = 47%: still under.
    assert monitor.check() is None
    monitor.record({"math": 10, "format": 0}, 10, {})
    # The first step leaves the window: math 24 of 30 = 80%.
    message = monitor.check()
    assert message.startswith("reward function 'math' failed on 80% of completions over the last 3 steps")
    assert "first error: ValueError: bad latex" in message and "\n" not in message


def test_a_function_failing_everything_stops_at_once():
    monitor = FailureMonitor(window_steps=10, max_rate=0.5)
    monitor.record({"user.py:fn": 8}, 8, {"user.py:fn": "ZeroDivisionError: division by zero"})
    assert "'user.py:fn' failed on 100%" in monitor.check()


def test_state_round_trip_keeps_the_window_and_first_errors():
    monitor = FailureMonitor(window_steps=2, max_rate=0.5)
    monitor.record({"math": 1}, 10, {"math": "ValueError: first"})
    monitor.record({"math": 9}, 10, {})
    restored = FailureMonitor(window_steps=2, max_rate=0.5)
    restored.load_state_dict(monitor.state_dict())
    # Same window: the next step pushes out the first one in both.
    for m in (monitor, restored):
        m.record({"math": 10}, 10, {})
    assert restored.rates() == monitor.rates() == {"math": 0.95}
    assert restored.check() == monitor.check() and "ValueError: first" in restored.check()

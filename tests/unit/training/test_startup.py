"""The start-up table (training/startup.py): phases from the launch, said in one line, kept in MLflow."""

import io
import json
import time

import pytest

from grpo_ray.tracking import ConsoleReporter, MlflowTracker
from grpo_ray.training.opening import report_startup
from grpo_ray.training.startup import StartupClock, process_start


def test_each_phase_is_the_time_since_the_one_before_from_the_launch():
    clock = StartupClock.started(time.time() - 5.0)  # launched 5 s ago: the launch phase ends now
    time.sleep(0.2)
    clock.mark("checks")
    (launch, first), (checks, second) = clock.phases
    assert (launch, checks) == ("launch", "checks")
    assert 5.0 <= first < 5.5 and 0.2 <= second < 0.7
    assert clock.total == pytest.approx(first + second)
    assert [row["phase"] for row in clock.rows()] == ["launch", "checks"]
    assert clock.rows()[1]["since_launch"] == pytest.approx(first + second, abs=1e-3)
    assert clock.metrics() == {"startup/launch": first, "startup/checks": second, "startup/total": first + second}


def test_a_run_started_from_python_has_no_launch_to_count():
    clock = StartupClock.started(None)
    assert clock.phases[0][0] == "launch" and clock.phases[0][1] < 0.05


def test_the_process_start_is_before_now():
    # pytest's own process: started before this test, and not before the machine did.
    assert time.time() - 24 * 3600 < process_start() < time.time()


def test_the_start_up_is_one_console_line_metrics_and_a_table(tmp_path):
    clock = StartupClock(launched=100.0, phases=[("launch", 6.25), ("checks", 2.0), ("ray", 5.5)])
    out = io.StringIO()
    tracker = MlflowTracker(f"sqlite:///{tmp_path / 'mlflow.db'}", "grpo-ray", None, tmp_path / "artifacts")
    report_startup(clock, 0, tracker, ConsoleReporter(10, stream=out))
    tracker.flush()
    assert out.getvalue().strip() == "start-up: 13.8 s to the first step (launch 6.2, checks 2.0, ray 5.5)"
    metrics = tracker.client.get_run(tracker.run_id).data.metrics
    assert {k: v for k, v in metrics.items() if k.startswith("startup/")} == {
        "startup/launch": 6.25,
        "startup/checks": 2.0,
        "startup/ray": 5.5,
        "startup/total": 13.75,
    }
    # A resumed run's start-up goes beside the first's, at the step it resumed from.
    report_startup(clock, 40, tracker, ConsoleReporter(10, stream=io.StringIO()))
    names = sorted(a.path for a in tracker.client.list_artifacts(tracker.run_id))
    assert names == ["startup-step-40.json", "startup.json"]
    path = tracker.client.download_artifacts(tracker.run_id, "startup.json", str(tmp_path))
    table = json.loads(open(path).read())
    assert table["columns"] == ["phase", "seconds", "since_launch"]
    assert table["data"] == [["launch", 6.25, 6.25], ["checks", 2.0, 8.25], ["ray", 5.5, 13.75]]

"""Step metrics -> Ray metric values, on a fake instrument; the Grafana dashboard queries only exported names."""

import json
import math
import re
from pathlib import Path

import pytest

from grpo_ray.cluster.ray_metrics import EXPORTED, EXPORTED_NAMES, RAY_PREFIX, Kind, StepGauges, prometheus_name

DASHBOARD = Path(__file__).resolve().parents[3] / "dashboards" / "grpo-ray.json"
# Ray's own metrics the dashboard may query; each is checked against Ray's own Grafana dashboard below.
RAY_OWN = {"ray_node_cpu_utilization", "ray_node_mem_used_host", "ray_node_mem_total_host", "ray_node_gpus_utilization"}


class FakeInstrument:
    def __init__(self, metric, tag_keys):
        self.metric, self.tag_keys, self.calls = metric, tag_keys, []

    def set(self, value, tags):
        assert set(tags) == set(self.tag_keys)
        self.calls.append(("set", value, tags))

    def inc(self, value, tags):
        assert set(tags) == set(self.tag_keys) and value > 0  # what Ray's Counter.inc enforces
        self.calls.append(("inc", value, tags))


def _step_metrics() -> dict[str, float]:
    return {
        "timing/rollout": 2.0,
        "timing/reward": 0.5,
        "timing/advantages": 0.01,
        "timing/update": 3.0,
        "timing/sync": 0.25,
        "timing/step": 6.0,
        "throughput/completion_tokens_per_s": 400.0,
        "throughput/learner_tokens_per_s": 900.0,
        "reward/mean": 0.375,
        "reward/failed": 2.0,
        "sync/seconds": 0.25,
        "sync/gbytes_per_s": 1.5,
        "actor/loss": 0.1,  # not exported
    }


def _recorded(gauges: StepGauges) -> dict[str, list]:
    return {name: instrument.calls for name, instrument in gauges.instruments.items()}


def test_one_step_sets_every_metric_from_its_key():
    gauges = StepGauges("run-1", make=FakeInstrument)
    gauges.record(7, _step_metrics(), completions=256)
    calls = _recorded(gauges)
    run = {"run": "run-1"}
    assert calls["grpo_ray_step"] == [("set", 7.0, run)]
    assert calls["grpo_ray_rollout_tokens_per_s"] == [("set", 400.0, run)]
    assert calls["grpo_ray_learner_tokens_per_s"] == [("set", 900.0, run)]
    assert calls["grpo_ray_completions_in_flight"] == [("set", 256.0, run)]
    assert calls["grpo_ray_completions"] == [("inc", 256.0, run)]
    assert calls["grpo_ray_reward_mean"] == [("set", 0.375, run)]
    assert calls["grpo_ray_reward_failures"] == [("set", 2.0, run)]
    assert calls["grpo_ray_step_seconds"] == [("set", 6.0, run)]
    assert calls["grpo_ray_weight_sync_seconds"] == [("set", 0.25, run)]
    assert calls["grpo_ray_weight_sync_gbytes_per_s"] == [("set", 1.5, run)]
    # Synchronous loop: the batch was sampled with the learner's weights.
    assert calls["grpo_ray_policy_staleness"] == [("set", 0.0, run)]
    # One series per phase the step timed (no reference model here, so no "reference").
    assert calls["grpo_ray_phase_seconds"] == [
        ("set", 2.0, {**run, "phase": "rollout"}),
        ("set", 0.5, {**run, "phase": "reward"}),
        ("set", 0.01, {**run, "phase": "advantages"}),
        ("set", 3.0, {**run, "phase": "update"}),
        ("set", 0.25, {**run, "phase": "sync"}),
    ]


def test_missing_and_non_finite_values_are_skipped():
    gauges = StepGauges("r", make=FakeInstrument)
    # Every reward failed: the mean is NaN; the step reports no completions count and 0 generated rows.
    gauges.record(1, {"reward/mean": math.nan, "reward/failed": 4.0, "timing/rollout": math.inf}, completions=0)
    calls = _recorded(gauges)
    assert calls["grpo_ray_reward_mean"] == []
    assert calls["grpo_ray_phase_seconds"] == []
    assert calls["grpo_ray_rollout_tokens_per_s"] == []
    assert calls["grpo_ray_completions"] == []  # a counter cannot be raised by 0
    assert calls["grpo_ray_completions_in_flight"] == [("set", 0.0, {"run": "r"})]
    assert calls["grpo_ray_reward_failures"] == [("set", 4.0, {"run": "r"})]


def test_keys_a_step_reports_win_over_the_defaults():
    gauges = StepGauges("r", make=FakeInstrument)
    gauges.record(3, {"batch/staleness": 2.0, "batch/completions": 64.0}, completions=256)
    calls = _recorded(gauges)
    assert calls["grpo_ray_policy_staleness"] == [("set", 2.0, {"run": "r"})]
    assert calls["grpo_ray_completions_in_flight"] == [("set", 64.0, {"run": "r"})]
    assert calls["grpo_ray_completions"] == [("inc", 64.0, {"run": "r"})]


def test_steps_within_a_second_reach_ray_together_at_the_next_hand_over():
    now = [100.0]
    gauges = StepGauges("r", make=FakeInstrument, every_s=1.0, clock=lambda: now[0])
    gauges.record(1, {"reward/mean": 0.25}, completions=256)  # the first step goes at once
    now[0] += 0.4
    gauges.record(2, {"reward/mean": 0.5}, completions=256)
    now[0] += 0.4
    gauges.record(3, {"reward/mean": 0.75}, completions=128)
    calls = _recorded(gauges)
    assert calls["grpo_ray_step"] == [("set", 1.0, {"run": "r"})]
    assert calls["grpo_ray_completions"] == [("inc", 256.0, {"run": "r"})]
    now[0] += 0.4  # 1.2 s after the first hand-over: steps 2-4 go now
    gauges.record(4, {"reward/mean": 1.0}, completions=64)
    assert calls["grpo_ray_step"] == [("set", 1.0, {"run": "r"}), ("set", 4.0, {"run": "r"})]
    assert calls["grpo_ray_reward_mean"][-1] == ("set", 1.0, {"run": "r"})
    # The counter moves by every completion in between: its rate stays right.
    assert calls["grpo_ray_completions"] == [("inc", 256.0, {"run": "r"}), ("inc", 448.0, {"run": "r"})]
    gauges.record(5, {"reward/mean": 0.0}, completions=32)
    gauges.flush()  # the run's end
    assert calls["grpo_ray_step"][-1] == ("set", 5.0, {"run": "r"})
    assert calls["grpo_ray_completions"][-1] == ("inc", 32.0, {"run": "r"})
    gauges.flush()  # nothing new: nothing sent
    assert len(calls["grpo_ray_completions"]) == 3


def test_names_are_prometheus_safe_and_unique():
    for metric in EXPORTED:
        assert re.fullmatch(r"[a-z_][a-z0-9_]*", metric.name), metric.name
    assert len(EXPORTED_NAMES) == len(EXPORTED)
    counter = next(m for m in EXPORTED if m.kind is Kind.COUNTER)
    assert prometheus_name(counter) == RAY_PREFIX + counter.name + "_total"


# -- the dashboard ---------------------------------------------------------------------------------

_PROMQL_WORDS = {
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "and",
    "or",
    "unless",
    "offset",
    "inf",
    "nan",
}


def promql_metric_names(expr: str) -> set[str]:
    """Metric names in a PromQL expression: identifiers that are not functions, keywords, labels or strings."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # string literals
    expr = re.sub(r"\{[^}]*\}", "", expr)  # label matchers
    expr = re.sub(r"\[[^\]]*\]", "", expr)  # range selectors
    expr = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", expr)  # label lists
    expr = re.sub(r"\$\w+|\$\{[^}]*\}", "", expr)  # dashboard variables
    expr = re.sub(r"\b\d+(?:\.\d*)?(?:e[+-]?\d+)?\b", "", expr)  # numbers (1e9)
    names = set()
    for match in re.finditer(r"[a-zA-Z_:][a-zA-Z0-9_:]*", expr):
        followed_by_call = re.match(r"\s*\(", expr[match.end() :])
        if not followed_by_call and match.group() not in _PROMQL_WORDS:
            names.add(match.group())
    return names


def dashboard_queries(dashboard: dict) -> list[str]:
    """Every PromQL expression of every panel (rows' nested panels too) and of the query variables."""
    exprs = []
    for panel in dashboard["panels"]:
        for inner in [panel, *panel.get("panels", [])]:
            exprs += [target["expr"] for target in inner.get("targets", [])]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            query = variable["query"]["query"] if isinstance(variable["query"], dict) else variable["query"]
            exprs += re.findall(r"label_values\(\s*([^,)]+)", query)  # its series selector
    return exprs


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        (
            'sum by (run) (rate(ray_grpo_ray_completions_total{run=~"$run"}[$__rate_interval]))',
            {"ray_grpo_ray_completions_total"},
        ),
        ('max by (run) (ray_a{x="y"} * 1e9) / on(instance) ray_b', {"ray_a", "ray_b"}),
        ("histogram_quantile(0.9, sum(rate(ray_c_bucket[5m])) by (le))", {"ray_c_bucket"}),
    ],
)
def test_promql_metric_names(expr, names):
    assert promql_metric_names(expr) == names


def test_dashboard_queries_only_exported_metrics_and_shows_each_of_them():
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["schemaVersion"] >= 36
    exprs = dashboard_queries(dashboard)
    queried = set().union(*(promql_metric_names(e) for e in exprs))
    unknown = queried - EXPORTED_NAMES - RAY_OWN
    assert not unknown, f"queried, but exported by neither grpo_ray nor Ray: {unknown}"
    panel_exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    panel_queries = set().union(*(promql_metric_names(e) for e in panel_exprs))
    assert EXPORTED_NAMES <= panel_queries, f"exported without a panel: {EXPORTED_NAMES - panel_queries}"
    assert queried & RAY_OWN, "the dashboard shows none of Ray's own metrics"
    # Every panel reads the dashboard's Prometheus data source variable.
    for panel in dashboard["panels"]:
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
    assert any(v["type"] == "datasource" and v["query"] == "prometheus" for v in dashboard["templating"]["list"])


def test_ray_own_metrics_are_ones_ray_exports():
    # Ray's own Grafana dashboard (shipped with the installed Ray) queries each of them.
    from ray.dashboard.modules.metrics.dashboards.default_dashboard_panels import default_dashboard_config

    ray_exprs = [t.expr for row in default_dashboard_config.rows for p in row.panels for t in p.targets]
    ray_names = set().union(*(promql_metric_names(e.replace("{{", "{").replace("}}", "}")) for e in ray_exprs))
    assert RAY_OWN <= ray_names, RAY_OWN - ray_names

"""The shipped Prometheus alert rules and Grafana dashboard (deploy/): promtool accepts the
rules and their unit tests pass, every query names only the run's metrics and parses, and in
a real Prometheus scraping a real Pushgateway the rules fire for a day the capacity policy
finds late, and the dashboard's queries draw every panel."""

from __future__ import annotations

import datetime as dt
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from prometheus_world import (
    MISSING,
    POLL_SECONDS,
    PROMETHEUS,
    PUSHGATEWAY,
    READY_SECONDS,
    alerts,
    api,
    query,
    start_prometheus,
    start_pushgateway,
)
from ui_stack import wait_for

from deploy import render_dashboard as dashboard
from inference.engine.metrics import BatchMetrics
from inference.engine.observer import ShardSeen
from policy.deadline import AHEAD, CANNOT_MAKE_IT
from policy.ready_by import NightFacts, deadline_decision, ready_by
from policy.tags import READY_BY_TAG
from resources.run_metrics import METRIC_NAMES, METRICS, MetricsSettings, RunMetrics

ROOT = Path(__file__).resolve().parents[1]
RULES = ROOT / "deploy" / "prometheus" / "nightshift-alerts.yml"
RULE_TESTS = ROOT / "deploy" / "prometheus" / "tests" / "nightshift-alerts.test.yml"
EXAMPLE_CONFIG = ROOT / "deploy" / "prometheus" / "prometheus.yml"
ALERTS = {
    "NightshiftWillMissReadyBy",
    "NightshiftQuarantineAboveLimit",
    "NightshiftDeviceIdle",
    "NightshiftNoProgress",
}
HISTOGRAM_SERIES = ("_bucket", "_sum", "_count")
ALLOWED = set(METRIC_NAMES) | {
    spec.name + suffix
    for spec in METRICS
    if spec.kind == "histogram"
    for suffix in HISTOGRAM_SERIES
}
# PromQL words that read like names and are not metrics.
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or",
            "unless", "bool", "offset", "le", "inf", "nan"}  # fmt: skip
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason=f"promtool missing: {MISSING}")
needs_servers = pytest.mark.skipif(PROMETHEUS is None or PUSHGATEWAY is None, reason=MISSING)

ASSET, PIPELINE = "fraud_scores", "fraud_scoring_job"
LATE, ON_TIME, RECORDED = "2026-03-02", "2026-03-03", "2026-03-04"


def _promtool(*args: str | Path, cwd: Path | None = None) -> str:
    done = subprocess.run(
        [PROMTOOL, *map(str, args)], capture_output=True, text=True, timeout=120, cwd=cwd
    )
    assert done.returncode == 0, f"promtool {args}: {done.stdout}{done.stderr}"
    return done.stdout + done.stderr


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects: its identifiers less label values,
    label lists, range durations, functions and keywords."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    expr = re.sub(r"\{[^}]*\}", "", expr)
    expr = re.sub(r"\[[^\]]*\]", "", expr)
    expr = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", expr)
    names = set(re.findall(r"\b([a-zA-Z_:][a-zA-Z0-9_:]*)\b(?!\s*\()", expr))
    return {n for n in names if n.lower() not in KEYWORDS}


def _rules() -> list[dict]:
    return [
        rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]
    ]


@needs_promtool
def test_the_shipped_rules_pass_promtool_and_their_unit_tests() -> None:
    assert "SUCCESS: 4 rules found" in _promtool("check", "rules", RULES)
    assert "SUCCESS" in _promtool("test", "rules", RULE_TESTS.name, cwd=RULE_TESTS.parent)
    assert "SUCCESS" in _promtool("check", "config", EXAMPLE_CONFIG, cwd=EXAMPLE_CONFIG.parent)


def test_every_alert_names_only_the_runs_metrics_and_says_what_to_do() -> None:
    rules = _rules()
    assert {rule["alert"] for rule in rules} == ALERTS
    for rule in rules:
        names = metric_names(rule["expr"])
        assert names and names <= ALLOWED, (rule["alert"], names - ALLOWED)
        assert rule["labels"]["severity"] in {"critical", "warning"}, rule["alert"]
        notes = rule["annotations"]
        for text in (notes["summary"], notes["description"]):
            assert "$labels.asset" in text and "$labels.partition" in text, rule["alert"]
        page, _, anchor = notes["runbook_url"].partition("#")
        headings = re.findall(r"^#+ (.+)$", (ROOT / page).read_text(), flags=re.MULTILINE)
        anchors = {re.sub(r"[^a-z0-9 -]", "", h.lower()).replace(" ", "-") for h in headings}
        assert anchor in anchors, (rule["alert"], notes["runbook_url"])
    quarantine = next(r for r in rules if r["alert"] == "NightshiftQuarantineAboveLimit")
    assert quarantine["annotations"]["limit"] == "1%" and "> 0.01" in quarantine["expr"]


def test_the_metric_name_reader_finds_what_a_query_selects() -> None:
    expr = (
        "histogram_quantile(0.95, sum by (le, asset) (rate(nightshift_batch_latency_seconds_bucket"
        '{asset=~"$asset"}[5m]))) / on (asset) group_left nightshift_rows_expected unless foo'
    )
    assert metric_names(expr) == {
        "nightshift_batch_latency_seconds_bucket", "nightshift_rows_expected", "foo"
    }  # fmt: skip


def test_the_dashboard_is_a_grafana_import_with_asset_and_partition_variables() -> None:
    board = dashboard.load()
    assert board["schemaVersion"] >= 39
    assert [i["name"] for i in board["__inputs"]] == ["DS_PROMETHEUS"]
    for panel in board["panels"]:
        assert panel["datasource"]["uid"] == "${DS_PROMETHEUS}", panel["title"]
        assert panel["description"] and panel["targets"], panel["title"]
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert set(variables) == {"asset", "partition"}
    for name, variable in variables.items():
        assert variable["definition"].startswith("label_values("), name
        assert variable["definition"].rstrip(")").endswith(name), name
        inner = variable["definition"][len("label_values(") :]
        assert metric_names(inner.rsplit(",", 1)[0]) <= ALLOWED, name
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))


def test_the_dashboard_shows_what_a_night_is_watched_by() -> None:
    exprs = [q.expr for q in dashboard.queries()]
    for wanted in (
        ("nightshift_rows_in_total", "nightshift_rows_expected"),
        ("nightshift_deadline_slack_seconds",),
        ("nightshift_ready_by_timestamp_seconds",),
        ("nightshift_rows_per_second",),
        ("nightshift_tokens_per_second",),
        ("histogram_quantile(0.95", "nightshift_batch_latency_seconds_bucket", "rate("),
        ("nightshift_device_busy_ratio",),
        ("nightshift_rows_quarantined_total", "nightshift_rows_in_total"),
        ("nightshift_cost_usd",),
    ):
        assert any(all(w in e for w in wanted) for e in exprs), wanted


@needs_promtool
def test_every_dashboard_query_names_only_the_runs_metrics_and_parses(tmp_path) -> None:
    found = dashboard.queries()
    values = {name: dashboard.ALL for name in dashboard.variables()}
    for q in found:
        names = metric_names(q.expr)
        assert names and names <= ALLOWED, (q.panel, names - ALLOWED)
    # promtool parses each expression as a recording rule's, with Prometheus's own parser.
    rules = [
        {"record": f"nightshift:dashboard_query_{i}", "expr": dashboard.expand(q.expr, values)}
        for i, q in enumerate(found)
    ]
    path = tmp_path / "dashboard-queries.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    assert f"SUCCESS: {len(rules)} rules found" in _promtool("check", "rules", path)


def test_a_dashboard_variable_without_a_value_is_named() -> None:
    with pytest.raises(ValueError, match=r"\$partition"):
        dashboard.expand('x{asset=~"$asset", partition=~"$partition"}', {"asset": ".*"})


# The live night: one Pushgateway, one Prometheus loading the shipped rules.


def _decision(rows_left: int, rows_per_second: float, now: float, date: str):
    """The capacity policy's decision for a day whose ready-by is an hour from ``now``."""
    at = dt.datetime.fromtimestamp(now + 3600, dt.UTC)
    ready = ready_by(ASSET, date, {READY_BY_TAG: at.isoformat()})
    facts = NightFacts(
        rows_left=rows_left,
        rows_total=rows_left,
        rows_per_second=rows_per_second,
        restart_overhead_s=None,
        first_started=now - 600,
        now=now,
        ready=ready,
        interruptions=0,
        on_demand_after=None,
    )
    decision, why = deadline_decision(facts)
    assert decision is not None, why
    return decision, ready.at.timestamp()


@pytest.fixture(scope="module")
def night(tmp_path_factory):
    """Three days pushed through the run's own metrics: one the policy finds late (an hour
    to its ready-by, hours of work left), one with slack, and one recorded with 5% of its
    rows quarantined; the first two move a shard at a time for a while."""
    if PROMETHEUS is None or PUSHGATEWAY is None:
        pytest.skip(MISSING)
    root = tmp_path_factory.mktemp("prometheus_world")
    with (
        start_pushgateway(root) as gateway,
        start_prometheus(root, rules=[RULES], scrape=[gateway]) as prometheus,
    ):
        # A gateway that loaded another run's groups would make every assertion below moot.
        assert query(prometheus, '{__name__=~"nightshift_.+"}') == []
        started = time.time()
        settings = MetricsSettings(pushgateway=gateway, push_seconds=0.0)
        with RunMetrics(settings, print) as run:
            spent = {"usd": 0.0}
            late = run.day(ASSET, LATE, PIPELINE, 1_000_000, cost=lambda: spent["usd"])
            on_time = run.day(ASSET, ON_TIME, PIPELINE, 100_000, cost=lambda: spent["usd"] / 4)
            recorded = run.day(ASSET, RECORDED, PIPELINE, 20_000)
            decisions = {
                LATE: _decision(1_000_000, 50.0, started, LATE),
                ON_TIME: _decision(100_000, 1000.0, started, ON_TIME),
                RECORDED: _decision(1_000_000, 50.0, started, RECORDED),
            }
            for day, observer in ((LATE, late), (ON_TIME, on_time), (RECORDED, recorded)):
                observer.decided(*decisions[day])
            recorded.finish(
                {"rows_in": 20_000, "rows_out": 19_000, "rows_quarantined": 1_000,
                 "cost_usd": 0.12, "rows_per_second": 900.0},
                BatchMetrics(), None,
            )  # fmt: skip
            batches = {LATE: BatchMetrics(), ON_TIME: BatchMetrics()}
            for shard in range(1, 31):
                for day, observer, rows in ((LATE, late, 4000), (ON_TIME, on_time, 3000)):
                    for call in range(4):
                        seconds = 0.02 + 0.01 * ((shard + call) % 5) + (0.2 if call == 3 else 0)
                        batches[day].record_batch(rows // 4, rows // 4, seconds)
                    observer.shard_done(ShardSeen(rows * shard, 0, shard, 2, 0, 0, batches[day]))
                spent["usd"] += 0.004
                time.sleep(0.5)
            yield {"prometheus": prometheus, "decisions": decisions, "started": started}


def _firing(prometheus: str, alert: str, partition: str) -> bool:
    return any(
        a["labels"]["alertname"] == alert
        and a["labels"].get("partition") == partition
        and a["state"] == "firing"
        for a in alerts(prometheus)
    )


@needs_servers
def test_the_will_miss_alert_fires_for_the_day_the_policy_finds_late(night) -> None:
    prometheus, decisions = night["prometheus"], night["decisions"]
    loaded = [rule for group in api(prometheus, "rules")["groups"] for rule in group["rules"]]
    assert {rule["name"] for rule in loaded} == ALERTS
    assert {rule["health"] for rule in loaded} == {"ok"}, loaded
    late, _ = decisions[LATE]
    assert late.rule == CANNOT_MAKE_IT and late.time_left_s < late.work_left_s
    assert decisions[ON_TIME][0].rule == AHEAD
    wait_for(
        lambda: _firing(prometheus, "NightshiftWillMissReadyBy", LATE),
        READY_SECONDS,
        f"NightshiftWillMissReadyBy firing for {ASSET} {LATE}",
        every=POLL_SECONDS,
    )
    wait_for(
        lambda: _firing(prometheus, "NightshiftQuarantineAboveLimit", RECORDED),
        READY_SECONDS,
        f"NightshiftQuarantineAboveLimit firing for {ASSET} {RECORDED}",
        every=POLL_SECONDS,
    )
    slack = query(prometheus, f'nightshift_deadline_slack_seconds{{partition="{LATE}"}}')
    assert float(slack[0]["value"][1]) == pytest.approx(late.time_left_s - late.work_left_s)
    held = alerts(prometheus)
    by_day = {(a["labels"]["alertname"], a["labels"].get("partition")) for a in held}
    # The day with slack and the recorded one are quiet; the late day moves, so no stall.
    assert ("NightshiftWillMissReadyBy", ON_TIME) not in by_day
    assert ("NightshiftWillMissReadyBy", RECORDED) not in by_day
    assert not [a for a in held if a["labels"]["alertname"] == "NightshiftNoProgress"]
    firing = next(
        a for a in held
        if a["labels"]["alertname"] == "NightshiftWillMissReadyBy" and a["state"] == "firing"
    )  # fmt: skip
    assert firing["labels"]["asset"] == ASSET and firing["labels"]["severity"] == "critical"
    assert f"{ASSET} {LATE}" in firing["annotations"]["summary"]


@needs_servers
def test_the_dashboard_draws_every_panel_from_the_night(night, tmp_path) -> None:
    out = tmp_path / "dashboard.png"
    drawn = dashboard.render(night["prometheus"], night["started"], time.time(), out)
    assert set(drawn) == {p["title"] for p in dashboard.panels()}
    assert all(count > 0 for count in drawn.values()), drawn
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # Where the docs' screenshot comes from (docs/monitoring.md).
    if target := os.environ.get("NIGHTSHIFT_DASHBOARD_PNG"):
        shutil.copyfile(out, target)

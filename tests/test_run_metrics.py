"""A run's Prometheus metrics delivered without a real Prometheus: nothing sent when nothing is
configured, each day pushed (PUT) to its own group, a dead Pushgateway not failing the day, and
the loopback /metrics server."""

from __future__ import annotations

import datetime as dt
import socket
import threading
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from dagster import DagsterInstance, materialize
from fraud_world import trained_fraud_world
from helpers import asset_metadata, cpu_inference
from prometheus_client.parser import text_string_to_metric_families
from ui_stack import free_port

from assets.fraud.assets import fraud_model, fraud_scores, transactions
from assets.fraud.demo_data import generate_day
from inference.engine.metrics import BatchMetrics
from inference.engine.observer import ShardSeen
from policy.tags import READY_BY_TAG
from resources.run_metrics import METRIC_NAMES, MetricsSettings, RunMetrics
from resources.storage import StorageResource

TRAIN_DAY, DAY, OTHER_DAY = "2026-03-01", "2026-03-02", "2026-03-03"


class Recorder(BaseHTTPRequestHandler):
    """A stand-in Pushgateway that keeps every request it gets."""

    requests: list[tuple[str, str, bytes]]

    def do_PUT(self) -> None:  # noqa: N802
        self._keep("PUT")

    def do_POST(self) -> None:  # noqa: N802
        self._keep("POST")

    def _keep(self, method: str) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.server.requests.append((method, self.path, body))  # type: ignore[attr-defined]
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def gateway() -> Iterator[ThreadingHTTPServer]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    server.requests = []  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def _samples(body: bytes) -> dict[tuple[str, tuple], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(body.decode())
        for s in family.samples
    }


def _value(samples: dict, name: str, **labels: str) -> float:
    found = [
        v for (n, ls), v in samples.items() if n == name and labels.items() <= dict(ls).items()
    ]
    assert len(found) == 1, (name, labels, found)
    return found[0]


@pytest.fixture
def world(tmp_path):
    world = trained_fraud_world(tmp_path / "data", TRAIN_DAY, scale=0.05)
    for day in (DAY, OTHER_DAY):
        generate_day(world["store"], day, scale=0.05)
    return world


def _score(world, instance, day: str, tags: dict | None = None, **inference) -> object:
    resources = {
        "storage": StorageResource(data_root=str(world["root"])),
        # Small shards, so the day has several and the loop pushes while it runs.
        "inference": cpu_inference(shard_rows=1000, metrics_push_seconds=0.01, **inference),
    }
    return materialize(
        [transactions, fraud_model, fraud_scores],
        selection=[transactions, fraud_scores],
        partition_key=day,
        resources=resources,
        instance=instance,
        tags=tags,
    )


def test_nothing_configured_sends_nothing_and_a_configured_gateway_gets_each_day(
    world, gateway
) -> None:
    url = f"http://127.0.0.1:{gateway.server_address[1]}"
    with DagsterInstance.ephemeral() as instance:
        assert _score(world, instance, DAY).success
        assert gateway.requests == []  # type: ignore[attr-defined]
        # A ready-by ahead: the capacity policy's view of the running day is pushed with it.
        ready = (dt.datetime.now(dt.UTC) + dt.timedelta(hours=2)).isoformat()
        result = _score(world, instance, OTHER_DAY, {READY_BY_TAG: ready}, metrics_pushgateway=url)
    assert result.success
    requests = gateway.requests  # type: ignore[attr-defined]
    group = f"/metrics/job/nightshift/asset/fraud_scores/partition/{OTHER_DAY}"
    # Live pushes while the day ran, then the final one: every one replaces the day's group.
    assert len(requests) >= 2
    assert {(method, path) for method, path, _ in requests} == {("PUT", group)}
    meta = asset_metadata(result, "fraud_scores", OTHER_DAY)
    final = _samples(requests[-1][2])
    day = {"asset": "fraud_scores", "partition": OTHER_DAY}
    assert _value(final, "nightshift_rows_out_total", **day) == meta["rows_out"]
    assert _value(final, "nightshift_rows_in_total", **day) == meta["rows_in"]
    assert _value(final, "nightshift_rows_quarantined_total", **day) == meta["rows_quarantined"]
    assert _value(final, "nightshift_cost_usd", **day) == meta["cost_usd"]
    assert _value(final, "nightshift_batch_size_rows_count", **day) == meta["batch_count"]
    # A live push came before every row was in.
    first = _samples(requests[0][2])
    assert _value(first, "nightshift_rows_in_total", **day) < meta["rows_in"]
    assert _value(first, "nightshift_rows_waiting", **day) > 0
    # The slack while it ran (the policy measured the day's own rate after its first shard),
    # withdrawn once the day is recorded: nothing is left to decide.
    slacks = [s for _, _, body in requests[:-1] for (n, _), s in _samples(body).items()
              if n == "nightshift_deadline_slack_seconds"]  # fmt: skip
    assert slacks and all(0 < s < 7200 for s in slacks)
    assert not any(n == "nightshift_deadline_slack_seconds" for n, _ in final)
    deadline = dt.datetime.fromisoformat(ready).timestamp()
    assert _value(final, "nightshift_ready_by_timestamp_seconds", **day) == deadline


def test_a_dead_pushgateway_does_not_fail_the_day(world) -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    with DagsterInstance.ephemeral() as instance:
        result = _score(world, instance, DAY, metrics_pushgateway=url)
        assert result.success
        warnings = [
            e.user_message
            for e in instance.all_logs(result.run_id)
            if e.level == 30 and "metrics push" in e.user_message
        ]
    assert len(warnings) == 1 and url in warnings[0], warnings
    assert asset_metadata(result, "fraud_scores", DAY)["rows_out"] > 0


def _seen(rows: int) -> ShardSeen:
    metrics = BatchMetrics()
    metrics.record_batch(rows, rows, 0.01)
    return ShardSeen(rows, 0, 1, 0, 0, 0, metrics)


def test_a_range_runs_days_push_to_their_own_groups(gateway) -> None:
    url = f"http://127.0.0.1:{gateway.server_address[1]}"
    with RunMetrics(MetricsSettings(pushgateway=url, push_seconds=3600), print) as run:
        first = run.day("fraud_scores", DAY, "fraud_scoring_job", 100)
        second = run.day("fraud_scores", OTHER_DAY, "fraud_scoring_job", 200)
        first.shard_done(_seen(40))
        second.shard_done(_seen(70))
        first.push()
        second.push()
    (_, path_a, body_a), (_, path_b, body_b) = gateway.requests  # type: ignore[attr-defined]
    assert path_a.endswith(f"/partition/{DAY}") and path_b.endswith(f"/partition/{OTHER_DAY}")
    for body, day, rows in ((body_a, DAY, 40), (body_b, OTHER_DAY, 70)):
        samples = _samples(body)
        assert {dict(labels)["partition"] for _, labels in samples} == {day}
        assert _value(samples, "nightshift_rows_in_total") == rows


def test_the_loopback_server_serves_every_day_while_the_run_is_open() -> None:
    port = free_port()
    with RunMetrics(MetricsSettings(port=port), print) as run:
        day = run.day("fraud_scores", DAY, "fraud_scoring_job", 100)
        day.shard_done(_seen(25))
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
            samples = _samples(reply.read())
    names = {name for name, _ in samples}
    assert _value(samples, "nightshift_rows_in_total", partition=DAY) == 25
    assert _value(samples, "nightshift_rows_waiting", partition=DAY) == 75
    assert {"nightshift_rows_in_total", "nightshift_batch_latency_seconds_count"} <= names
    assert {n.removesuffix("_total") for n in names} >= {
        n.removesuffix("_total")
        for n in METRIC_NAMES
        if n.endswith("_total")
        and "push_failures" not in n
        and "quarantined" not in n
        and "tokens" not in n
    }
    with pytest.raises(OSError):  # closed with the run
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2)


def test_a_port_in_use_is_a_warning_not_a_failure() -> None:
    warnings: list[str] = []
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with RunMetrics(MetricsSettings(port=port), warnings.append) as run:
            day = run.day("fraud_scores", DAY, "fraud_scoring_job", 100)
            day.shard_done(_seen(25))
    assert len(warnings) == 1 and f"127.0.0.1:{port}" in warnings[0]


def test_the_monitoring_page_lists_every_metric() -> None:
    page = (Path(__file__).parents[1] / "docs" / "monitoring.md").read_text()
    missing = [name for name in METRIC_NAMES if f"| `{name}` |" not in page]
    assert missing == []


def test_nothing_configured_creates_no_metrics() -> None:
    with RunMetrics(MetricsSettings(), print) as run:
        assert run.day("fraud_scores", DAY, "fraud_scoring_job") is None
        assert list(run.registry.collect()) == []

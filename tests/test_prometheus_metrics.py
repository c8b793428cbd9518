"""A day's metrics in a real Prometheus: Debian's prometheus scraping Debian's pushgateway on
loopback, days run through `dagster job execute`, the figures read back from Prometheus's HTTP
API equal to the day's Dagster metadata, also after a spot interruption and its resume."""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from dagster import AssetKey, DagsterInstance, materialize
from prometheus_client.parser import text_string_to_metric_families
from prometheus_world import (
    MISSING,
    PROMETHEUS,
    PUSHGATEWAY,
    alerts,
    api,
    get,
    query,
    start_prometheus,
    start_pushgateway,
)

from assets.day_metadata import day_figures
from assets.fraud import fraud_model
from assets.fraud.demo_data import generate_day
from policy.tags import READY_BY_TAG
from resources.inference import InferenceResource
from resources.storage import DataStore, StorageResource

BIN = Path(sys.executable).parent
ALERT_RULES = Path(__file__).resolve().parent.parent / "deploy/prometheus/nightshift-alerts.yml"
pytestmark = pytest.mark.skipif(PROMETHEUS is None or PUSHGATEWAY is None, reason=MISSING)

TRAIN_DAY, DAY, INTERRUPTED_DAY = "2026-03-01", "2026-03-02", "2026-03-03"
JOB = "nightshift"
# As in tests/test_spot_faults.py: small shards and one thread make a 100k-row day take
# seconds, so there is time to interrupt it between its first and last shard.
SLOW = {
    "NIGHTSHIFT_MAX_BATCH_SIZE": "32",
    "NIGHTSHIFT_SHARD_ROWS": "960",
    "NIGHTSHIFT_CPU_THREADS": "1",
}


@pytest.fixture(scope="module")
def monitoring(tmp_path_factory) -> Iterator[dict]:
    """A Pushgateway and a Prometheus scraping it every second, on free loopback ports; the
    Prometheus evaluates the shipped alert rules, as a deployment's would."""
    root = tmp_path_factory.mktemp("prometheus")
    with (
        start_pushgateway(root) as gateway,
        start_prometheus(root, rules=[ALERT_RULES], scrape=[gateway]) as prometheus,
    ):
        yield {"gateway": gateway, "prometheus": prometheus}


@pytest.fixture(scope="module")
def world(tmp_path_factory, monitoring) -> dict:
    """A data root with a trained fraud model and two 100k-row days, and the environment that
    points `dagster job execute` at it and at the Pushgateway."""
    root = tmp_path_factory.mktemp("metrics_world")
    data, home = root / "data", root / "home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    store = DataStore(str(data))
    generate_day(store, TRAIN_DAY, scale=0.05)
    for day in (DAY, INTERRUPTED_DAY):
        generate_day(store, day, scale=1.0)
    resources = {
        "storage": StorageResource(data_root=str(data)),
        "inference": InferenceResource(device="cpu", precision="fp32", cpu_threads=1),
    }
    with DagsterInstance.from_config(str(home)) as instance:
        assert materialize([fraud_model], resources=resources, instance=instance).success
    env = {
        **os.environ,
        **SLOW,
        "NIGHTSHIFT_DATA_ROOT": str(data),
        "DAGSTER_HOME": str(home),
        "NIGHTSHIFT_PUSHGATEWAY_URL": monitoring["gateway"],
        "NIGHTSHIFT_METRICS_PUSH_SECONDS": "0.5",
    }
    return {"store": store, "env": env, "home": home, **monitoring}


def _launch(world: dict, day: str, log: Path, tags: dict | None = None) -> subprocess.Popen:
    command = [
        str(BIN / "dagster"), "job", "execute", "-m", "orchestration.definitions",
        "-j", "fraud_scoring_job", "--tags", json.dumps({"dagster/partition": day, **(tags or {})}),
    ]  # fmt: skip
    return subprocess.Popen(
        command, env=world["env"], stdout=log.open("w"), stderr=subprocess.STDOUT,
        start_new_session=True,
    )  # fmt: skip


def _day_metadata(world: dict, day: str) -> dict:
    with DagsterInstance.from_config(str(world["home"])) as instance:
        events = instance.fetch_materializations(AssetKey("fraud_scores"), limit=100).records
    latest = next(e for e in events if e.partition_key == day)
    return day_figures(latest.asset_materialization.metadata)


def _pushed(world: dict, day: str) -> dict[str, float]:
    """The day's group as the Pushgateway holds it now: sample name -> value (unlabelled by
    shard; one series each), with the group's push time."""
    text = get(f"{world['gateway']}/metrics").decode()
    samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.labels.get("partition") == day and s.labels.get("job") == JOB:
                samples[s.name] = s.value
    return samples


def _groups(world: dict, day: str) -> list[dict]:
    """The Pushgateway's groups of ``day``, by their grouping labels."""
    data = json.loads(get(f"{world['gateway']}/api/v1/metrics"))["data"]
    return [g["labels"] for g in data if g["labels"].get("partition") == day]


def _scraped(world: dict, day: str, name: str) -> float | None:
    """The one series of ``name`` for the day in Prometheus, or None when it has none."""
    selector = f'{name}{{job="{JOB}",asset="fraud_scores",partition="{day}"}}'
    result = query(world["prometheus"], selector)
    assert len(result) <= 1, result
    return float(result[0]["value"][1]) if result else None


def _wait_for_scrape(world: dict, day: str) -> dict[str, float]:
    """Waits until Prometheus holds the day's latest push (its push time matches the
    Pushgateway's); returns that push as the Pushgateway holds it."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        pushed = _pushed(world, day)
        at = pushed.get("push_time_seconds")
        if at is not None and _scraped(world, day, "push_time_seconds") == at:
            return pushed
        time.sleep(0.5)
    raise AssertionError(f"Prometheus did not scrape the push of {day} within 60 s")


def _progress_shards(store: DataStore, day: str) -> int:
    path = f"{store.path('outputs', 'fraud_scores', '_staging', f'date={day}')}/_progress.json"
    try:
        return len(json.loads(store.read_bytes(path))["shards"])
    except (FileNotFoundError, OSError, ValueError, KeyError):
        return 0


def test_a_days_figures_in_prometheus_equal_its_metadata(world, tmp_path) -> None:
    run = _launch(world, DAY, tmp_path / "day.log")
    assert run.wait(timeout=300) == 0, (tmp_path / "day.log").read_text()[-3000:]
    _wait_for_scrape(world, DAY)
    meta = _day_metadata(world, DAY)
    assert meta["rows_out"] > 0 and meta["cost_usd"] > 0
    scraped = {name: _scraped(world, DAY, name) for name in (
        "nightshift_rows_in_total", "nightshift_rows_out_total",
        "nightshift_rows_quarantined_total", "nightshift_cost_usd",
        "nightshift_interruptions_total", "nightshift_rows_redone_total",
        "nightshift_batch_size_rows_count",
    )}  # fmt: skip
    assert scraped == {
        "nightshift_rows_in_total": meta["rows_in"],
        "nightshift_rows_out_total": meta["dagster/row_count"],
        "nightshift_rows_quarantined_total": meta["rows_quarantined"],
        "nightshift_cost_usd": meta["cost_usd"],
        "nightshift_interruptions_total": meta["interruptions"],
        "nightshift_rows_redone_total": meta["rows_redone"],
        "nightshift_batch_size_rows_count": meta["batch_count"],
    }
    assert _groups(world, DAY) == [{"job": JOB, "asset": "fraud_scores", "partition": DAY}]
    # The batch-latency histogram answers for p95, from the same model calls.
    p95 = query(
        world["prometheus"],
        f'histogram_quantile(0.95, nightshift_batch_latency_seconds_bucket{{partition="{DAY}"}})',
    )
    assert len(p95) == 1 and float(p95[0]["value"][1]) > 0
    # The shipped alert rules run in this Prometheus, on this day's series, and a day that was
    # recorded pages for nothing but its quarantine (the demo day's is under the limit).
    loaded = [r for g in api(world["prometheus"], "rules")["groups"] for r in g["rules"]]
    assert len(loaded) == 4 and all(r["health"] == "ok" for r in loaded), loaded
    assert not [a for a in alerts(world["prometheus"]) if a["labels"].get("partition") == DAY]


def test_an_interrupted_day_counts_its_rows_once_and_its_resume_replaces_the_group(
    world, tmp_path
) -> None:
    store = world["store"]
    # A ready-by two hours ahead: the capacity policy decides at launch and at the retry, so
    # the interrupted attempt's group carries its slack.
    ready = (dt.datetime.now(dt.UTC) + dt.timedelta(hours=2)).isoformat()
    run = _launch(world, INTERRUPTED_DAY, tmp_path / "interrupted.log", {READY_BY_TAG: ready})
    deadline = time.monotonic() + 240
    while _progress_shards(store, INTERRUPTED_DAY) < 4:
        assert run.poll() is None, (tmp_path / "interrupted.log").read_text()[-3000:]
        assert time.monotonic() < deadline, "no 4 shards within 240 s"
        time.sleep(0.05)
    os.killpg(run.pid, signal.SIGTERM)
    assert run.wait(timeout=120) != 0
    log = (tmp_path / "interrupted.log").read_text()
    assert "interrupted (SIGTERM received)" in log, log[-3000:]

    left = _wait_for_scrape(world, INTERRUPTED_DAY)
    assert _scraped(world, INTERRUPTED_DAY, "nightshift_interruptions_total") == 1
    rows_then = _scraped(world, INTERRUPTED_DAY, "nightshift_rows_in_total")
    expected = _scraped(world, INTERRUPTED_DAY, "nightshift_rows_expected")
    assert 0 < rows_then == left["nightshift_rows_in_total"] < expected
    slack = _scraped(world, INTERRUPTED_DAY, "nightshift_deadline_slack_seconds")
    assert slack is not None and slack > 0

    retry = _launch(world, INTERRUPTED_DAY, tmp_path / "retry.log", {READY_BY_TAG: ready})
    assert retry.wait(timeout=300) == 0, (tmp_path / "retry.log").read_text()[-3000:]
    final = _wait_for_scrape(world, INTERRUPTED_DAY)
    meta = _day_metadata(world, INTERRUPTED_DAY)
    assert meta["interruptions"] == 1 and meta["shards_resumed"] >= 4
    # Each row once: the resumed shards' rows are not added to the first attempt's.
    assert (
        _scraped(world, INTERRUPTED_DAY, "nightshift_rows_in_total") == meta["rows_in"] == expected
    )
    assert _scraped(world, INTERRUPTED_DAY, "nightshift_rows_out_total") == meta["rows_out"]
    assert _scraped(world, INTERRUPTED_DAY, "nightshift_rows_redone_total") == meta["rows_redone"]
    assert _scraped(world, INTERRUPTED_DAY, "nightshift_interruptions_total") == 1
    assert _scraped(world, INTERRUPTED_DAY, "nightshift_cost_usd") == meta["cost_usd"]
    assert (
        _scraped(world, INTERRUPTED_DAY, "nightshift_rows_quarantined_total")
        == meta["rows_quarantined"]
    )
    total = query(
        world["prometheus"], f'sum(nightshift_rows_in_total{{partition="{INTERRUPTED_DAY}"}})'
    )
    assert float(total[0]["value"][1]) == meta["rows_in"]
    # Replaced, not added to: one group for the day, and the first attempt's decision (which
    # the resumed attempt, past its launch, did not make) is gone from it and from Prometheus.
    assert _groups(world, INTERRUPTED_DAY) == [
        {"job": JOB, "asset": "fraud_scores", "partition": INTERRUPTED_DAY}
    ]
    assert "nightshift_deadline_slack_seconds" in left
    assert "nightshift_deadline_slack_seconds" not in final
    assert _scraped(world, INTERRUPTED_DAY, "nightshift_deadline_slack_seconds") is None

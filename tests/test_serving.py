"""Serving (issue 38): each published day becomes a new version in the serving store and is
made current in one step, on the embedded SQLite target, on a real PostgreSQL server and on a
real Redis server (Debian's redis-server, started here on loopback)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from aws_world import stop_process_group, wait_for
from dagster import DagsterInstance, Definitions, RunConfig, materialize
from helpers import asset_metadata
from serving_world import day, embeddings_day, recall_at, seen, vectors_day

from assets.recommendations import interactions, recommendation_model, user_recommendations
from assets.recommendations.assets import UserRecommendationsConfig
from assets.recommendations.demo_data import generate_day
from assets.serving import defs as serving_assets
from assets.serving import user_recommendations_serving
from orchestration.serving import publish_jobs
from orchestration.serving_cli import publish_after
from resources.serving import (
    PostgresTarget,
    RedisTarget,
    ServingError,
    ServingTarget,
    SqliteTarget,
    serving_from_env,
    table_name,
)
from resources.storage import DataStore

REPO = Path(__file__).resolve().parents[1]
ASSET = "user_recommendations"
KINDS = ["sqlite", "postgres"]
# The SQL targets and Redis: the contract's tests run on each.
TARGETS = [*KINDS, "redis"]


@pytest.fixture
def redis_url(tmp_path: Path) -> Iterator[str]:
    """A throwaway Redis server on a free loopback port, keeping nothing on disk."""
    import redis

    if not (server_bin := shutil.which("redis-server")):
        pytest.fail(
            "redis-server is missing: install Debian's redis-server (`make test` does, through "
            "`bash deploy/local/install-redis.sh`); this test installs nothing"
        )
    port, folder = _closed_port(), tmp_path / "redis"
    folder.mkdir()
    server = subprocess.Popen(
        [server_bin, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no", "--dir", str(folder)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )  # fmt: skip
    url = f"redis://127.0.0.1:{port}/0"

    def ready() -> bool:
        assert server.poll() is None, "redis-server exited at start"
        try:
            return redis.Redis.from_url(url).ping()
        except redis.ConnectionError:
            return False

    try:
        wait_for(ready, 30, "redis-server to answer PING")
        yield url
    finally:
        stop_process_group(server)


@pytest.fixture(params=TARGETS)
def target(request, tmp_path: Path) -> ServingTarget:
    return _target(request.param, request, tmp_path)


def _target(kind: str, request, tmp_path: Path, **settings) -> ServingTarget:
    if kind == "sqlite":
        return SqliteTarget(path=str(tmp_path / "serving.sqlite"), **settings)
    if kind == "redis":
        return RedisTarget(url=request.getfixturevalue("redis_url"), **settings)
    import psycopg2

    port = request.getfixturevalue("postgres_port")
    name = f"serving_{abs(hash(request.node.nodeid)) % 10**9}"
    admin = psycopg2.connect(host="127.0.0.1", port=port, user="dagster", dbname="postgres")
    admin.autocommit = True
    with admin.cursor() as cur:
        cur.execute(f"DROP DATABASE IF EXISTS {name}")
        cur.execute(f"CREATE DATABASE {name}")
    admin.close()
    return PostgresTarget(host="127.0.0.1", port=port, user="dagster", dbname=name, **settings)


def _spec(target: ServingTarget) -> str:
    return json.dumps({"kind": type(target).__name__, "settings": target.model_dump()})


# A reader of the served view, as the product would be: its own process, polling until told to
# stop; every answer one JSON line, an error as its text.
READER = """
import json, os, sys, time
spec, stop = json.loads(sys.argv[1]), sys.argv[2]
query = ("SELECT count(*), count(DISTINCT user_id), min(model_version), max(model_version), "
         "sum(item_id) FROM user_recommendations")
if spec["kind"] == "SqliteTarget":
    import sqlite3
    db = sqlite3.connect(spec["settings"]["path"], timeout=30, isolation_level=None)
else:
    import psycopg2
    s = spec["settings"]
    db = psycopg2.connect(host=s["host"], port=s["port"], user=s["user"], dbname=s["dbname"])
    db.autocommit = True
while not os.path.exists(stop):
    cur = db.cursor()
    try:
        cur.execute(query)
        row = [v if isinstance(v, str) else int(v) for v in cur.fetchone()]
        print(json.dumps(row), flush=True)
    except Exception as exc:
        print(json.dumps({"error": str(exc)}), flush=True)
    time.sleep(0.005)
"""

# The same reader on Redis, as the product would read it: the pointer, then the version it names
# (the whole day here, to count it; a lookup is `HGET <version> <user_id>`).
REDIS_READER = """
import json, os, sys, time
import redis
spec, stop = json.loads(sys.argv[1]), sys.argv[2]
s = spec["settings"]
db = redis.Redis.from_url(s["url"], decode_responses=True)
asset = s["prefix"] + ":user_recommendations"
while not os.path.exists(stop):
    try:
        version = db.get(asset + ":current")
        rows = [r for v in db.hgetall(f"{asset}:v{version}").values() for r in json.loads(v)]
        models = [r["model_version"] for r in rows]
        print(json.dumps([len(rows), len({r["user_id"] for r in rows}), min(models),
                          max(models), sum(r["item_id"] for r in rows)]), flush=True)
    except Exception as exc:
        print(json.dumps({"error": str(exc)}), flush=True)
    time.sleep(0.005)
"""

# A load of the new day, slowed between batches (inside its one transaction) so that it can be
# killed part of the way through; it says how far it got.
LOADER = """
import json, sys, time
sys.path.insert(0, sys.argv[3])
from resources.serving import PostgresTarget, RedisTarget, SqliteTarget
from serving_world import day
spec, pause = json.loads(sys.argv[1]), float(sys.argv[2])
kinds = {"SqliteTarget": SqliteTarget, "PostgresTarget": PostgresTarget, "RedisTarget": RedisTarget}
target = kinds[spec["kind"]](**spec["settings"])
def progress(rows):
    print(f"loaded {rows}", flush=True)
    time.sleep(pause)
version = target.publish("user_recommendations", day("new", shift=1), partition="2026-03-02",
                         model_version="new", on_batch=progress)
print(f"current v{version.version}", flush=True)
"""


def _python(code: str, *args: str, **kwargs) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")])}
    return subprocess.Popen(
        [sys.executable, "-c", code, *args],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kwargs,
    )


def test_readers_see_the_old_day_or_the_new_day_while_a_load_is_killed_and_run_again(
    request, tmp_path: Path
) -> None:
    for kind in KINDS:
        _killed_load(_target(kind, request, tmp_path / kind, batch_rows=1_000), tmp_path / kind)


def _killed_load(target: ServingTarget, folder: Path) -> None:
    old, new = _read_while_a_load_is_killed_and_run_again(target, folder)
    # Version 2 was the killed load's, never committed: the load that finished took its number.
    assert [(v.version, v.current) for v in target.versions(ASSET)] == [(2, True), (1, False)]
    assert target.read_current(ASSET).equals(new)


def _read_while_a_load_is_killed_and_run_again(
    target: ServingTarget, folder: Path
) -> tuple[pa.Table, pa.Table]:
    """Two readers poll while a load of the new day is killed part of the way through and run
    again; they only ever saw the old day or the new one. Returns the two days."""
    folder.mkdir(exist_ok=True)
    old, new = day("old"), day("new", shift=1)
    target.publish(ASSET, old, partition="2026-03-01", model_version="old")
    stop = folder / "stop"
    reader = REDIS_READER if isinstance(target, RedisTarget) else READER
    readers = [_python(reader, _spec(target), str(stop)) for _ in range(2)]
    try:
        time.sleep(0.5)  # the readers are polling
        loader = _python(LOADER, _spec(target), "0.05", str(REPO / "tests"))
        for line in loader.stdout:
            if line.startswith("loaded 5000"):
                break
        loader.send_signal(signal.SIGKILL)
        loader.wait(timeout=30)
        assert target.current(ASSET).partition == "2026-03-01"  # the killed load changed nothing
        again = _python(LOADER, _spec(target), "0.02", str(REPO / "tests"))
        out, err = again.communicate(timeout=120)
        assert again.returncode == 0, err
        time.sleep(0.3)  # the readers see the new day
    finally:
        stop.touch()
        answers = [r.communicate(timeout=60)[0].splitlines() for r in readers]
    reads = [json.loads(line) for lines in answers for line in lines]
    assert reads and all(isinstance(r, list) for r in reads), [r for r in reads if "error" in r]
    assert {tuple(r) for r in reads} == {tuple(seen(old)), tuple(seen(new))}
    return old, new


def test_redis_readers_see_the_old_day_or_the_new_day_while_a_load_is_killed_and_run_again(
    request, tmp_path: Path
) -> None:
    import redis

    target = _target("redis", request, tmp_path, batch_rows=1_000)
    old, new = _read_while_a_load_is_killed_and_run_again(target, tmp_path / "redis-readers")
    # Version 2 was the killed load's, never complete: the load that finished took the next
    # number and deleted what v2 had loaded.
    assert [(v.version, v.current) for v in target.versions(ASSET)] == [(3, True), (1, False)]
    assert target.read_current(ASSET).equals(new)
    client = redis.Redis.from_url(target.url, decode_responses=True)
    assert sorted(client.keys(f"{target.prefix}:{ASSET}:v[0-9]*")) == [
        target.data_key(ASSET, 1),
        f"{target.data_key(ASSET, 1)}:order",
        target.data_key(ASSET, 3),
        f"{target.data_key(ASSET, 3)}:order",
    ]
    # A lookup is one command on the version the pointer names: the user's ranked items.
    served = json.loads(
        client.hget(target.data_key(ASSET, int(client.get(target.key(ASSET, "current")))), "7")
    )
    assert [(r["rank"], r["item_id"], r["model_version"]) for r in served] == [
        (r, 700 + r + 1, "new") for r in range(1, 11)
    ]


def test_rollback_restores_the_previous_day_byte_for_byte(target: ServingTarget) -> None:
    first, second = day("a", users=50), day("b", users=60, shift=3)
    target.publish(ASSET, first, partition="2026-03-01", commit="c1", model_version="a")
    target.publish(ASSET, second, partition="2026-03-02", commit="c2", model_version="b")
    with pytest.raises(ServingError, match=r"v2 serves 2026-03-02, not 2026-03-01; nothing"):
        target.rollback(ASSET, "2026-03-01")
    restored = target.rollback(ASSET, "2026-03-02")
    assert (restored.version, restored.partition, restored.commit) == (1, "2026-03-01", "c1")
    served = target.read_current(ASSET)
    assert served.schema == first.schema and served.equals(first)
    assert target.current(ASSET).version == 1


@pytest.mark.parametrize("kind", TARGETS)
def test_a_day_run_again_is_served_once_and_old_versions_are_dropped(
    kind: str, request, tmp_path: Path
) -> None:
    target = _target(kind, request, tmp_path, keep_versions=2)
    for n in range(3):
        target.publish(ASSET, day(f"m{n}", users=20), partition="2026-03-01", model_version=f"m{n}")
    kept = target.versions(ASSET)
    assert [(v.version, v.current) for v in kept] == [(3, True), (2, False)]
    every = target.versions(ASSET, include_dropped=True)
    assert [(v.version, v.dropped, v.partition) for v in every] == [
        (3, False, "2026-03-01"),
        (2, False, "2026-03-01"),
        (1, True, "2026-03-01"),
    ]
    assert target.read_current(ASSET).equals(day("m2", users=20))
    if isinstance(target, RedisTarget):
        import redis

        client = redis.Redis.from_url(target.url, decode_responses=True)
        assert not client.exists(target.data_key(ASSET, 1), f"{target.data_key(ASSET, 1)}:order")
        assert client.hlen(target.data_key(ASSET, 3)) == 20
        # A reader holding the pointer from before the last swap must still find its version.
        with pytest.raises(ValueError, match="greater than or equal to 2"):
            RedisTarget(url=target.url, keep_versions=1)
        return
    with pytest.raises(Exception, match="user_recommendations__v1"):
        with target._transaction() as cur:
            cur.execute('SELECT count(*) FROM "user_recommendations__v1"')


def test_a_store_that_goes_away_mid_load_leaves_the_current_day(request, tmp_path: Path) -> None:
    """PostgreSQL ends the loading connection part of the way through (as a failover or a
    restart would): the load fails, nothing of it remains, the old day is still served, and
    the next load is the next version."""
    import psycopg2

    from assets.serving.assets import left_current

    target = _target("postgres", request, tmp_path, batch_rows=100)
    target.publish(ASSET, day("old", users=30), partition="2026-03-01", model_version="old")
    admin = psycopg2.connect(host=target.host, port=target.port, user="dagster", dbname="postgres")
    admin.autocommit = True

    def store_goes_away(rows: int) -> None:
        if rows == 200:
            with admin.cursor() as cur:
                cur.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE datname = %s AND pid <> pg_backend_pid()",
                    (target.dbname,),
                )

    with pytest.raises(psycopg2.Error):
        target.publish(
            ASSET, day("new", users=30), partition="2026-03-02", on_batch=store_goes_away
        )
    admin.close()
    assert [(v.version, v.current) for v in target.versions(ASSET)] == [(1, True)]
    assert target.read_current(ASSET).equals(day("old", users=30))
    assert left_current(target, ASSET) == "v1 (2026-03-01) is still current"
    assert target.publish(ASSET, day("new", users=30), partition="2026-03-02").version == 2


def test_redis_going_away_mid_load_leaves_the_current_day(request, tmp_path: Path) -> None:
    """Redis closes the loading connection part of the way through (as a failover or a restart
    would): the load fails, it is never made current, the old day is still served, and the
    next load takes the next number and deletes what the failed one had loaded."""
    import redis

    from assets.serving.assets import left_current

    target = _target("redis", request, tmp_path, batch_rows=100)
    target.publish(ASSET, day("old", users=30), partition="2026-03-01", model_version="old")
    admin = redis.Redis.from_url(target.url)

    def store_goes_away(rows: int) -> None:
        if rows == 200:
            admin.client_kill_filter(_type="normal", skipme=True)

    with pytest.raises(redis.ConnectionError):
        target.publish(
            ASSET, day("new", users=30), partition="2026-03-02", on_batch=store_goes_away
        )
    assert admin.hlen(target.data_key(ASSET, 2)) == 20  # what it had loaded, never current
    assert [(v.version, v.current) for v in target.versions(ASSET)] == [(1, True)]
    assert target.read_current(ASSET).equals(day("old", users=30))
    assert left_current(target, ASSET) == "v1 (2026-03-01) is still current"
    assert target.publish(ASSET, day("new", users=30), partition="2026-03-02").version == 3
    assert not admin.exists(target.data_key(ASSET, 2))
    admin.close()


def test_the_settings_choose_redis(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NIGHTSHIFT_SERVING", "redis")
    with pytest.raises(ValueError, match="needs NIGHTSHIFT_SERVING_REDIS_URL"):
        serving_from_env()
    monkeypatch.setenv("NIGHTSHIFT_SERVING_REDIS_URL", "redis://app:secret@cache:6380/2")
    monkeypatch.setenv("NIGHTSHIFT_SERVING_KEEP_VERSIONS", "4")
    chosen = serving_from_env()
    assert isinstance(chosen, RedisTarget) and chosen.keep_versions == 4
    assert chosen.address() == "redis://app@cache:6380/2"  # never the password


@pytest.mark.parametrize("kind", TARGETS)
def test_alerts_are_served_in_the_types_they_were_published_with(
    kind: str, request, tmp_path: Path
) -> None:
    """Timestamps with their zone, exact amounts as text, nulls and flags come back as
    published, and the alert's transaction id is the indexed key."""
    import datetime as dt

    from assets.fraud.schemas import ALERTS, ALERTS_SCHEMA

    when = dt.datetime(2026, 3, 1, 23, 59, 59, 123456, tzinfo=dt.UTC)
    alerts = pa.Table.from_pylist(
        [
            {"transaction_id": "t1", "score": 0.75, "account_id": "a", "merchant_id": "m",
             "amount": 12.5, "currency": "EUR", "ts": when, "channel": "web", "country": "FR",
             "amount_exact": "12.50", "needs_review": True, "model_version": "v7"},
            {"transaction_id": "t2", "score": 0.5, "account_id": None, "merchant_id": "m",
             "amount": 1e6, "currency": "USD", "ts": when, "channel": "pos", "country": None,
             "amount_exact": None, "needs_review": False, "model_version": "v7"},
        ],
        schema=ALERTS_SCHEMA,
    )  # fmt: skip
    target = _target(kind, request, tmp_path)
    version = target.publish(ALERTS, alerts, partition="2026-03-01", model_version="v7")
    served = target.read_current(ALERTS)
    assert served.schema == ALERTS_SCHEMA and served.equals(alerts)
    if isinstance(target, RedisTarget):
        import redis

        client = redis.Redis.from_url(target.url, decode_responses=True)
        [alert] = json.loads(client.hget(version.table, "t2"))
        assert (alert["account_id"], alert["amount_exact"], alert["needs_review"]) == (
            None, None, False,
        )  # fmt: skip
        assert version.table == "nightshift:fraud_alerts:v1"
        return
    with target._transaction() as cur:
        cur.execute(f'SELECT count(*) FROM "{ALERTS}" WHERE transaction_id = {target.placeholder}',
                    ("t2",))  # fmt: skip
        assert cur.fetchone()[0] == 1
    assert version.table == "fraud_alerts__v1"


# -- the publish asset ------------------------------------------------------------------------

DAYS = ["2026-03-01", "2026-03-02", "2026-03-03"]
SCALE = 0.05


def test_the_publish_asset_serves_the_published_day_and_a_store_down_fails_once(
    request,
    data_root: Path,
    store: DataStore,
    resources: dict,
    instance: DagsterInstance,
    tmp_path: Path,
) -> None:
    store_root = data_root
    for date in DAYS:
        generate_day(store, date, scale=SCALE)
    config = RunConfig({"user_recommendations": UserRecommendationsConfig(k=5)})
    sources = [interactions, recommendation_model, user_recommendations]
    for date, selection in [(DAYS[-1], sources), (DAYS[-2], [user_recommendations])]:
        scored = materialize(
            selection, resources=resources, instance=instance, run_config=config, partition_key=date
        )
        assert scored.success
    published = store.read_output(ASSET, DAYS[-1])
    figures = store.output_figures(ASSET, DAYS[-1])

    for kind in TARGETS:
        target = _target(kind, request, tmp_path / kind)

        def serve(date: str, target: ServingTarget = target):
            done = materialize(
                [user_recommendations_serving],
                resources={**resources, "serving": target},
                instance=instance,
                partition_key=date,
            )
            assert done.success
            return done

        served = serve(DAYS[-1])
        meta = asset_metadata(served, "user_recommendations_serving")
        current = target.current(ASSET)
        assert meta["current_version"] == current.version == 1
        assert meta["dagster/row_count"] == published.num_rows and meta["previous_version"] == 0
        assert meta["served_at"] == target.address() and meta["load_seconds"] >= 0
        assert (current.commit, current.partition) == (figures.commit, DAYS[-1])
        assert current.model_version == figures.text("model_version") != ""
        assert current.checks and all(current.checks.values())
        assert target.read_current(ASSET).equals(published)
        # An earlier day scored again (a backfill) is not made current over a later one.
        kept = asset_metadata(serve(DAYS[-2]), "user_recommendations_serving")["not_current"]
        assert f"v1 serves a later day, {DAYS[-1]}" in kept
        assert target.current(ASSET).version == 1 and len(target.versions(ASSET)) == 1

    # What `nightshift run` runs after the recommendations job: the default target, under the
    # data root, and one line saying where the day is served.
    [(ok, line)] = publish_after("recommendations_job", DAYS[-1], instance, {})
    default = SqliteTarget()
    assert ok and line == (
        f"served user_recommendations_serving {DAYS[-1]}: v1 ({published.num_rows} rows) at "
        f"{default.address()} as 'user_recommendations'"
    )
    assert default.file().parent == store_root / "serving"
    assert default.read_current(ASSET).equals(published)

    # The same job against a store that is down: one failure naming it and the fix, no retry.
    for down in [
        PostgresTarget(host="127.0.0.1", port=_closed_port(), user="dagster", connect_timeout_s=2),
        RedisTarget(url=f"redis://127.0.0.1:{_closed_port()}/0", connect_timeout_s=2),
    ]:
        jobs = Definitions.merge(
            serving_assets,
            Definitions(jobs=publish_jobs, resources={**resources, "serving": down}),
        )
        failed = jobs.resolve_job_def("recommendations_serving_job").execute_in_process(
            partition_key=DAYS[-1], instance=instance, raise_on_error=False
        )
        assert not failed.success
        [failure] = failed.get_step_failure_events()
        assert not [e for e in failed.all_events if e.event_type_value == "STEP_UP_FOR_RETRY"]
        text = failure.step_failure_data.error.to_string()
        assert down.address() in text and "Fix: start the server" in text, text
        assert target.current(ASSET).version == 1  # the store that was up serves what it did


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_cli_lists_versions_and_rolls_back_one_step(data_root: Path, capsys) -> None:
    """`nightshift serving versions` and `rollback` on the default target under the data root."""
    from orchestration.cli import main

    target = SqliteTarget()  # <data root>/serving/serving.sqlite, as `make run` publishes
    assert target.file() == data_root / "serving" / "serving.sqlite"
    first, second = day("a", users=5), day("b", users=6, shift=1)
    target.publish(ASSET, first, partition="2026-03-01", commit="c1", model_version="a")
    target.publish(ASSET, second, partition="2026-03-02", commit="c2", model_version="b")
    assert main(["serving", "versions", "--asset", ASSET]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert listed[0] == f"{ASSET} at {target.address()}: 2 version(s), newest first"
    assert listed[2].split() == ["v2", "2026-03-02", "60", *listed[2].split()[3:4], "c2", "b"] + [
        "current"
    ]
    assert main(["serving", "rollback", "--asset", ASSET, "--date", "2026-03-01"]) == 1
    assert "v2 serves 2026-03-02, not 2026-03-01; nothing changed" in capsys.readouterr().err
    assert main(["serving", "rollback", "--asset", ASSET, "--date", "2026-03-02"]) == 0
    assert capsys.readouterr().out.startswith(f"{ASSET}: v1 (2026-03-01, 50 rows) is current")
    assert target.read_current(ASSET).equals(first)


@pytest.mark.parametrize("kind", TARGETS)
def test_the_publish_step_rolls_back_from_its_launch_config(
    kind: str, request, tmp_path: Path, resources: dict, instance: DagsterInstance
) -> None:
    """The Launchpad's rollback: the publish asset launched for the current day with
    ``rollback: true`` makes the previous version current in one step, and says so; launched for
    another day it is refused once, and nothing changes."""
    from assets.serving.assets import PublishConfig

    target = _target(kind, request, tmp_path)
    first, second = day("a", users=5), day("b", users=6, shift=1)
    target.publish(ASSET, first, partition="2026-03-01", commit="c1", model_version="a")
    target.publish(ASSET, second, partition="2026-03-02", commit="c2", model_version="b")

    def launch(date: str):
        return materialize(
            [user_recommendations_serving],
            resources={**resources, "serving": target},
            instance=instance,
            partition_key=date,
            run_config=RunConfig({"user_recommendations_serving": PublishConfig(rollback=True)}),
            raise_on_error=False,
        )

    refused = launch("2026-03-01")
    assert not refused.success
    [failure] = refused.get_step_failure_events()
    assert not [e for e in refused.all_events if e.event_type_value == "STEP_UP_FOR_RETRY"]
    text = failure.step_failure_data.error.to_string()
    assert "v2 serves 2026-03-02, not 2026-03-01; nothing changed" in text, text
    assert target.current(ASSET).version == 2 and target.read_current(ASSET).equals(second)

    rolled = launch("2026-03-02")
    assert rolled.success
    meta = asset_metadata(rolled, "user_recommendations_serving")
    assert (meta["current_version"], meta["current_partition"]) == (1, "2026-03-01")
    assert meta["rolled_back_from"] == 2 and meta["dagster/row_count"] == first.num_rows
    assert (meta["commit"], meta["model_version"]) == ("c1", "a")
    assert meta["served_at"] == target.address()
    assert meta["rolled_back"].startswith("user_recommendations 2026-03-02: rolled back: v1")
    assert target.current(ASSET).version == 1 and target.read_current(ASSET).equals(first)
    assert [v.version for v in target.versions(ASSET)] == [2, 1]  # the rolled-back day is kept


# Redis keeps at least two versions (docs/serving.md says why), so this is the SQL targets'.
@pytest.mark.parametrize("kind", KINDS)
def test_readers_follow_the_swap_when_only_one_version_is_kept(
    kind: str, request, tmp_path: Path
) -> None:
    """With ``keep_versions=1`` each swap drops the version a reader may be between finding and
    reading: every read and search still answers from one whole version."""
    import threading

    target = _target(kind, request, tmp_path, keep_versions=1)
    days = [vectors_day(200, seed) for seed in range(6)]
    target.publish(DOCS, days[0][0], partition="2026-03-01")
    errors: list[BaseException] = []
    seen_versions: set[int] = set()
    loading = threading.Event()

    def read() -> None:
        while not loading.is_set():
            try:
                rows = target.read_current(DOCS)
                # One whole version: 200 rows, all of one seed's documents.
                assert rows.num_rows == 200
                assert len({d.split("-")[1] for d in rows["doc_id"].to_pylist()}) == 1
                [(key, _)] = target.search(DOCS, days[0][1][0], k=1)
                seen_versions.add(int(key.split("-")[1]))
            except BaseException as exc:  # noqa: BLE001 - any failure is the finding
                errors.append(exc)
                return

    readers = [threading.Thread(target=read) for _ in range(2)]
    for reader in readers:
        reader.start()
    for seed, (rows, _) in enumerate(days[1:], start=1):
        target.publish(DOCS, rows, partition=f"2026-03-0{seed + 1}")
    loading.set()
    for reader in readers:
        reader.join(timeout=60)
    assert not errors, errors
    assert [v.version for v in target.versions(DOCS)] == [6]
    assert len(seen_versions) >= 1


def test_first_loads_at_once_on_a_new_postgres_database_both_land(request, tmp_path: Path) -> None:
    """Two first-ever loads against a database with no registry yet: one creates it, the other
    waits for it; both versions land, one after the other."""
    from concurrent.futures import ThreadPoolExecutor

    target = _target("postgres", request, tmp_path)
    with ThreadPoolExecutor(2) as pool:
        loads = [
            pool.submit(target.publish, ASSET, day(m, users=40), partition="2026-03-01")
            for m in ("a", "b")
        ]
        versions = sorted(load.result(timeout=120).version for load in loads)
    assert versions == [1, 2]
    assert [v.version for v in target.versions(ASSET)] == [2, 1]


def test_a_publish_of_a_day_never_published_says_what_stays_current(
    resources: dict, instance: DagsterInstance
) -> None:
    target = SqliteTarget()
    served = day("a", users=5)
    target.publish(ASSET, served, partition="2026-03-02", commit="c1", model_version="a")
    failed = materialize(
        [user_recommendations_serving],
        resources={**resources, "serving": target},
        instance=instance,
        partition_key="2026-03-03",
        raise_on_error=False,
    )
    assert not failed.success
    [failure] = failed.get_step_failure_events()
    assert not [e for e in failed.all_events if e.event_type_value == "STEP_UP_FOR_RETRY"]
    text = failure.step_failure_data.error.to_string()
    assert "no published output for 'user_recommendations', date 2026-03-03" in text, text
    assert "v1 (2026-03-02) is still current" in text, text
    assert target.current(ASSET).version == 1 and target.read_current(ASSET).equals(served)


def test_the_cli_serves_every_published_asset() -> None:
    from assets.serving import PUBLISHED
    from orchestration.serving_cli import SERVED_ASSETS

    assert sorted(SERVED_ASSETS) == sorted(PUBLISHED)


# ----- vectors: document_embeddings searchable by cosine ------------------------------------
DOCS = "document_embeddings"


def _ann_kept(target: ServingTarget, version: int) -> bool:
    """Whether version ``version``'s ANN index is still stored."""
    if isinstance(target, RedisTarget):
        import redis

        client = redis.Redis.from_url(target.url)
        return bool(client.exists(f"{target.data_key(DOCS, version)}:ann"))
    side = f"{table_name(DOCS, version)}__ann"
    with target._transaction() as cur:
        if isinstance(target, SqliteTarget):
            cur.execute("SELECT count(*) FROM sqlite_master WHERE name = ?", (side,))
        else:
            cur.execute("SELECT count(*) FROM pg_tables WHERE tablename = %s", (side,))
        return cur.fetchone()[0] == 1


def _vectors_served(target: ServingTarget):
    """``target`` serving a first day of 400 random unit vectors; that day and a second one."""
    first, second = vectors_day(400, seed=1), vectors_day(300, seed=2)
    target.publish(DOCS, first[0], partition="2026-03-01", model_version="m")
    return first, second


@pytest.mark.parametrize("kind", TARGETS)
def test_vectors_are_searched_by_cosine_and_their_index_rolls_back_with_the_day(
    kind: str, request, tmp_path: Path
) -> None:
    target = _target(kind, request, tmp_path, keep_versions=2)
    (first, first_vectors), (second, second_vectors) = _vectors_served(target)
    # The rows come back in the types they were published with, vectors included.
    served = target.read_current(DOCS)
    assert served.schema == first.schema and served.equals(first)
    for n in (0, 17, 399):
        best = target.search(DOCS, first_vectors[n], k=10)
        assert best[0][0] == f"doc-1-{n:04d}" and best[0][1] == pytest.approx(1.0, abs=1e-5)
        assert [s for _, s in best] == sorted((s for _, s in best), reverse=True)
        assert target.search_exact(DOCS, first_vectors[n], k=10)[0][0] == f"doc-1-{n:04d}"
    assert recall_at(target, DOCS, first_vectors[:50]) >= 0.9

    target.publish(DOCS, second, partition="2026-03-02", model_version="m")
    assert target.search(DOCS, second_vectors[5], k=1)[0][0] == "doc-2-0005"
    assert all(key.startswith("doc-2-") for key, _ in target.search(DOCS, first_vectors[5]))
    restored = target.rollback(DOCS, "2026-03-02")
    assert restored.version == 1
    assert target.search(DOCS, first_vectors[5], k=1)[0][0] == "doc-1-0005"
    assert target.read_current(DOCS).equals(first)

    # Made current again and a third day loaded: version 1 is beyond the two kept, and its
    # index goes with its rows.
    target.make_current(DOCS, 2)
    target.publish(DOCS, first, partition="2026-03-03", model_version="m")
    assert [v.version for v in target.versions(DOCS)] == [3, 2]
    assert not _ann_kept(target, 1) and _ann_kept(target, 2) and _ann_kept(target, 3)
    with pytest.raises(ServingError, match="a query of 10 dimensions against vectors of 64"):
        target.search(DOCS, first_vectors[0][:10])


def test_a_failed_vector_load_leaves_the_old_index_current(target: ServingTarget) -> None:
    (_, first_vectors), (second, second_vectors) = _vectors_served(target)

    def killed(rows: int) -> None:
        # After the rows, before the index and the registry record.
        raise KeyboardInterrupt("the load is killed")

    with pytest.raises(KeyboardInterrupt):
        target.publish(DOCS, second, partition="2026-03-02", on_batch=killed)
    assert [(v.version, v.current) for v in target.versions(DOCS)] == [(1, True)]
    assert target.search(DOCS, second_vectors[3], k=10)[0][0].startswith("doc-1-")
    assert target.search(DOCS, first_vectors[3], k=1)[0][0] == "doc-1-0003"
    # The next load is complete, index and all.
    loaded = target.publish(DOCS, second, partition="2026-03-02")
    assert target.search(DOCS, second_vectors[3], k=1)[0][0] == "doc-2-0003"
    assert _ann_kept(target, loaded.version)


def test_real_embeddings_find_themselves_and_the_index_finds_the_exact_neighbours(
    tmp_path: Path,
) -> None:
    """The asset's own model step (the shipped MiniLM, offline) over demo articles."""
    from assets.documents.demo_data import demo_articles
    from assets.embeddings.document_embeddings import EmbeddingsConfig
    from assets.text_models import sentence_encoder
    from evaluation.embeddings import asset_embeddings
    from resources.inference import InferenceResource

    inference = InferenceResource(device="cpu")
    texts = [f"{title}\n\n{body}" for title, body in demo_articles(240, seed=3)]
    matrix = asset_embeddings(sentence_encoder(inference), inference, EmbeddingsConfig(), texts)
    ids = [f"doc-{n:04d}" for n in range(len(texts))]
    target = SqliteTarget(path=str(tmp_path / "serving.sqlite"))
    target.publish(DOCS, embeddings_day(ids, matrix), partition="2026-03-01")
    for n in range(0, 240, 12):
        assert target.search(DOCS, matrix[n], k=10)[0][0] == ids[n]
    assert recall_at(target, DOCS, matrix[::6]) >= 0.9


def test_real_news_held_out_queries_find_the_exact_neighbours(tmp_path: Path) -> None:
    """Real text: 300 documents of the committed News Category sample (benchmarks/data)
    embedded by the asset's model step and served; 40 other documents of it as queries."""
    from benchmarks.news_corpus import news_documents, news_vectors

    documents = news_documents()
    matrix = news_vectors(documents[:300] + documents[-40:])
    ids = [f"news-{n:04d}" for n in range(300)]
    target = SqliteTarget(path=str(tmp_path / "serving.sqlite"))
    target.publish(DOCS, embeddings_day(ids, matrix[:300]), partition="2026-03-01")
    assert target.search(DOCS, matrix[7], k=1)[0][0] == ids[7]
    assert recall_at(target, DOCS, matrix[300:]) >= 0.9


def test_the_embeddings_publish_asset_serves_a_searchable_day(
    store: DataStore, resources: dict, tmp_path: Path
) -> None:
    """document_embeddings_serving, downstream of a day embedded by the asset itself."""
    from assets.documents.assets import documents
    from assets.documents.demo_data import generate_day as generate_documents
    from assets.embeddings.document_embeddings import document_embeddings
    from assets.serving import document_embeddings_serving

    date = DAYS[-1]
    generate_documents(store, date, scale=0.06)
    target = SqliteTarget(path=str(tmp_path / "serving.sqlite"))
    steps = [documents, document_embeddings, document_embeddings_serving]
    run = materialize(steps, resources={**resources, "serving": target}, partition_key=date)
    assert run.success
    published = store.read_output(DOCS, date)
    assert target.read_current(DOCS).equals(published)
    ids, vectors = published["doc_id"].to_pylist(), published["embedding"].to_pylist()
    assert target.search(DOCS, vectors[7], k=5)[0][0] == ids[7]

"""A day's commit to its Iceberg tables, attacked through real `dagster job execute` processes: a
SIGKILL or a full disk at each step of the publish, with a reader in another process polling the
table through pyiceberg and DuckDB; write-audit-publish, rollback, and concurrent days."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from dagster import DagsterInstance, materialize
from helpers import asset_metadata

from assets.fraud import fraud_model, fraud_scores, transactions
from assets.fraud.demo_data import generate_day
from assets.fraud.schemas import FLAGGED, SCORES, TRANSACTIONS
from resources.inference import InferenceResource
from resources.storage import DataStore, StorageResource

BIN = Path(sys.executable).parent
TESTS = Path(__file__).parent
TRAIN_DAY, DAY = "2026-04-01", "2026-04-02"
TMPFS_BYTES = 96 << 20
SHARD_ROWS = 1000


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> dict:
    """A data root with a trained fraud model and a scored day; ``outputs/`` on a tmpfs of its
    own when the test runs as root, so a test can fill it."""
    root = tmp_path_factory.mktemp("commits")
    data, home = root / "data", root / "home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    outputs = data / "outputs"
    outputs.mkdir(parents=True)
    mounted = os.geteuid() == 0 and _mount(outputs)
    store = DataStore(str(data))
    generate_day(store, TRAIN_DAY, scale=0.05)
    generate_day(store, DAY, scale=0.05)
    resources = _resources(StorageResource(data_root=str(data)))
    with DagsterInstance.from_config(str(home)) as instance:
        assert materialize([fraud_model], resources=resources, instance=instance).success
        assert _score(resources, instance).success
    env = {
        **os.environ,
        "NIGHTSHIFT_DATA_ROOT": str(data),
        "DAGSTER_HOME": str(home),
        "NIGHTSHIFT_CPU_THREADS": "1",
        "NIGHTSHIFT_SHARD_ROWS": str(SHARD_ROWS),  # as the in-process re-run's resources
        "PYTHONPATH": os.pathsep.join(
            [str(TESTS / "fault_site"), os.environ.get("PYTHONPATH", "")]
        ),
    }
    try:
        yield {
            "store": store,
            "data": data,
            "home": home,
            "env": env,
            "mounted": mounted,
            "resources": resources,
        }
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(outputs)], check=False)


def _mount(folder: Path) -> bool:
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={TMPFS_BYTES}", "tmpfs", str(folder)],
        capture_output=True,
    )
    return done.returncode == 0


def _resources(storage: StorageResource) -> dict:
    return {
        "storage": storage,
        "inference": InferenceResource(device="cpu", precision="fp32", shard_rows=SHARD_ROWS),
    }


@pytest.fixture(scope="module")
def s3_world(s3_server, tmp_path_factory) -> dict:
    """The same world on moto's S3, with the tables in moto's Glue catalog."""
    import boto3

    aws = {
        "AWS_ACCESS_KEY_ID": "test",
        "AWS_SECRET_ACCESS_KEY": "test",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    saved = {k: os.environ.get(k) for k in aws}
    os.environ.update(aws)
    root = tmp_path_factory.mktemp("commits_s3")
    home = root / "home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    bucket = f"nightshift-commits-{root.name.lower().replace('_', '-')[-20:]}"
    boto3.client("s3", endpoint_url=s3_server, region_name="us-east-1").create_bucket(Bucket=bucket)
    settings = {
        "data_root": f"s3://{bucket}/data",
        "s3_endpoint": s3_server,
        "s3_region": "us-east-1",
        "catalog": "glue",
    }
    store = DataStore(
        settings["data_root"], s3_server, "us-east-1", catalog="glue", catalog_uri=None
    )
    generate_day(store, TRAIN_DAY, scale=0.05)
    generate_day(store, DAY, scale=0.05)
    resources = _resources(StorageResource(**settings))
    with DagsterInstance.from_config(str(home)) as instance:
        assert materialize([fraud_model], resources=resources, instance=instance).success
        assert _score(resources, instance).success
    env = {
        **os.environ,
        "NIGHTSHIFT_DATA_ROOT": settings["data_root"],
        "NIGHTSHIFT_S3_ENDPOINT": s3_server,
        "NIGHTSHIFT_S3_REGION": "us-east-1",
        "NIGHTSHIFT_CATALOG": "glue",
        "DAGSTER_HOME": str(home),
        "NIGHTSHIFT_CPU_THREADS": "1",
        "NIGHTSHIFT_SHARD_ROWS": str(SHARD_ROWS),
        "PYTHONPATH": os.pathsep.join(
            [str(TESTS / "fault_site"), os.environ.get("PYTHONPATH", "")]
        ),
    }
    try:
        yield {"store": store, "home": home, "env": env, "resources": resources}
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _score(resources: dict, instance, date: str = DAY, raise_on_error: bool = True):
    return materialize(
        [transactions, fraud_model, fraud_scores],
        partition_key=date,
        resources=resources,
        instance=instance,
        selection=[transactions, fraud_scores],
        raise_on_error=raise_on_error,
    )


def _land_more(store: DataStore, tag: str, rows: int = 40) -> None:
    """A new landing file of the day: ``rows`` transactions copied from the first file under
    new ids, so the re-scored day differs from the published one in its row count."""
    first = store.landing_files(TRANSACTIONS, DAY)[0]
    first = pq.read_table(first, filesystem=store.fs).slice(0, rows)
    ids = pc.binary_join_element_wise(first["transaction_id"], pa.scalar(f"-{tag}"), "")
    more = first.set_column(first.schema.get_field_index("transaction_id"), "transaction_id", ids)
    path = f"{store.landing_path(TRANSACTIONS, DAY)}/part-{tag}.parquet"
    pq.write_table(more, path, filesystem=store.fs)


@contextmanager
def _reader(world: dict, tmp_path: Path):
    """Polls the day in another process (pyiceberg and DuckDB) while the block runs; yields
    the file of its observations."""
    out, stop = tmp_path / "seen.jsonl", tmp_path / "stop"
    catalog = json.dumps(world["store"].catalog_props)
    reader = subprocess.Popen(
        [sys.executable, str(TESTS / "table_reader.py"), catalog, SCORES, DAY, str(out), str(stop)],
        env={**world["env"], "PYTHONPATH": str(TESTS.parent)},
    )
    try:
        deadline = time.monotonic() + 60
        while not (out.exists() and out.read_text().count("\n") >= 1):
            assert reader.poll() is None and time.monotonic() < deadline, "the reader did not start"
            time.sleep(0.05)
        yield out
    finally:
        stop.touch()
        reader.wait(timeout=60)


def _observations(out: Path) -> list[dict]:
    return [json.loads(line) for line in out.read_text().splitlines()]


def _execute(world: dict, tmp_path: Path, fault: str) -> tuple[int, str]:
    log = tmp_path / "run.log"
    command = [
        str(BIN / "dagster"), "job", "execute", "-m", "orchestration.definitions",
        "-j", "fraud_scoring_job", "--tags", json.dumps({"dagster/partition": DAY}),
    ]  # fmt: skip
    env = {**world["env"], "NIGHTSHIFT_TEST_FAULT": fault}
    with log.open("w") as out:
        code = subprocess.run(command, env=env, stdout=out, stderr=subprocess.STDOUT, timeout=600)
    return code.returncode, log.read_text()


def _assert_never_broken(seen: list[dict], before: int, after: int) -> None:
    """Every read saw the old day or the new one whole: never none, both, or rows that are not
    the commit's that main names; pyiceberg and DuckDB agreed."""
    assert len(seen) >= 5, "the reader hardly read while the run went on"
    errors = [s["error"] for s in seen if "error" in s]
    assert not errors, errors[:3]
    counts = {(s["rows"], s["duckdb_rows"], s["commit_rows"]) for s in seen}
    allowed = {(n, n, n) for n in (before, after)}
    assert counts <= allowed, counts
    assert seen[0]["rows"] == before


def _rerun_and_check(world: dict, before: int) -> int:
    """A manual re-run (a new run, not the daemon's retry) after the fault: it resumes every
    shard the killed run finished, and publishes the day exactly once."""
    store = world["store"]
    with DagsterInstance.from_config(str(world["home"])) as instance:
        result = _score(world["resources"], instance)
    assert result.success
    meta = asset_metadata(result, SCORES)
    assert meta["shards"] > 0 and meta["shards_resumed"] == meta["shards"], meta
    out = store.read_output(SCORES, DAY)
    committed = store.output_figures(SCORES, DAY)
    assert out.num_rows == committed.value("rows") > before
    assert pc.count_distinct(out["transaction_id"]).as_py() == out.num_rows  # once each
    flagged = store.read_output(FLAGGED, DAY)
    assert store.output_commit(FLAGGED, DAY) == committed.commit
    assert flagged.num_rows == out.filter(pc.field("flagged")).num_rows
    assert not store.exists(store.path("outputs", SCORES, "_staging", f"date={DAY}"))
    return out.num_rows


@pytest.mark.parametrize(
    "point",
    [
        "stage:fraud_scores",  # the companions staged, the output's files being written
        "checks",  # every table staged, main untouched, the checks about to read the stage
        "publish:fraud_scores_flagged",  # the quarantine published, the details not yet
        "commit:fraud_scores",  # the output's manifests written, the catalog not yet moved
        "published",  # main moved, the staging area still there
    ],
)
def test_a_kill_at_each_step_of_the_publish_never_shows_a_broken_day(
    world, tmp_path, point
) -> None:
    store = world["store"]
    before = store.read_output(SCORES, DAY).num_rows
    _land_more(store, point.replace(":", "-"))
    with _reader(world, tmp_path) as seen:
        code, log = _execute(world, tmp_path, f"kill@{point}")
        assert code == -signal.SIGKILL, log[-3000:]
        on_main = store.read_output(SCORES, DAY).num_rows
        assert on_main == before or point == "published"
        after = _rerun_and_check(world, before)
    _assert_never_broken(_observations(seen), before, after)


@pytest.mark.parametrize("point", ["checks", "commit:fraud_scores"])
def test_a_kill_on_s3_with_the_glue_catalog_never_shows_a_broken_day(
    s3_world, tmp_path, point
) -> None:
    store = s3_world["store"]
    before = store.read_output(SCORES, DAY).num_rows
    _land_more(store, f"s3-{point.replace(':', '-')}")
    with _reader(s3_world, tmp_path) as seen:
        code, log = _execute(s3_world, tmp_path, f"kill@{point}")
        assert code == -signal.SIGKILL, log[-3000:]
        assert store.read_output(SCORES, DAY).num_rows == before
        after = _rerun_and_check(s3_world, before)
    _assert_never_broken(_observations(seen), before, after)


@pytest.mark.parametrize(
    ("point", "published"),
    [
        ("stage:fraud_scores", False),
        ("checks", False),
        ("publish:fraud_scores_flagged", False),
        ("commit:fraud_scores", False),
        ("published", True),  # only the staging area's removal is left: it waits for a re-run
    ],
)
def test_a_full_disk_at_each_step_of_the_publish_leaves_a_whole_day(
    world, tmp_path, point, published
) -> None:
    if not world["mounted"]:
        pytest.skip("filling a tmpfs of its own needs root (CI runs as root)")
    store = world["store"]
    outputs = world["data"] / "outputs"
    before = store.read_output(SCORES, DAY).num_rows
    _land_more(store, f"full-{point.replace(':', '-')}")
    with _reader(world, tmp_path) as seen:
        code, log = _execute(world, tmp_path, f"fill@{point}@{outputs}")
        if published:
            # The day is on main whole; what fails then is the job's next asset (the alerts
            # cannot take their lease on the full disk), naming the file.
            assert store.read_output(SCORES, DAY).num_rows > before
            assert code == 0 or "no space left on device writing" in log, log[-3000:]
        else:
            assert code != 0 and "No space left on device" in log, log[-3000:]
            assert store.read_output(SCORES, DAY).num_rows == before
        (outputs / "ballast").unlink()
        after = _rerun_and_check(world, before)
    _assert_never_broken(_observations(seen), before, after)
    assert shutil.disk_usage(outputs).free > TMPFS_BYTES // 2


def _commit_days(root: str, date: str, times: int, settings: dict | None = None) -> None:
    """One writer process: publishes its own day of a shared table ``times`` times, through
    the catalog the store ``settings`` name (the embedded one when None)."""
    store = DataStore(root, **(settings or {}))
    schema = pa.schema([("id", pa.int64()), ("run", pa.int32())])
    for run in range(times):
        rows = pa.table({"id": range(100), "run": [run] * 100}, schema=schema)
        figures = {"commit": f"{date}-{run}", "rows": 100}
        staged = store.tables.stage("shared", date, schema, [rows], figures)
        store.tables.publish("shared", date, staged)


@pytest.mark.parametrize("catalog", ["sqlite", "postgresql"])
def test_runs_committing_different_days_of_one_table_at_once_all_land(
    tmp_path, request, catalog
) -> None:
    """Three processes commit their own days of one table at once, through the embedded
    SQLite catalog and through the SQL catalog on a real PostgreSQL server (what nodes that
    share a data root use)."""
    import multiprocessing

    uri = None
    if catalog == "postgresql":
        port = request.getfixturevalue("postgres_port")
        uri = f"postgresql+psycopg2://dagster@127.0.0.1:{port}/postgres"
    root = str(tmp_path / "data")
    settings = {"catalog_uri": uri}
    _commit_days(root, "2026-04-01", 1, settings)  # the table exists before the race
    dates = ["2026-04-02", "2026-04-03", "2026-04-04"]
    context = multiprocessing.get_context("spawn")
    writers = [context.Process(target=_commit_days, args=(root, d, 8, settings)) for d in dates]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join(timeout=300)
        assert writer.exitcode == 0
    store = DataStore(root, catalog_uri=uri)
    assert store.catalog_props["uri"] == (uri or f"sqlite:///{tmp_path}/data/catalog/nightshift.db")
    for date in dates:
        day = store.read_output("shared", date)
        assert day.num_rows == 100 and set(day["run"].to_pylist()) == {7}
        assert store.output_commit("shared", date) == f"{date}-7"
        history = store.tables.history("shared", date)
        assert len({d.commit for d, where in history if where in ("current", "published")}) == 8
    assert store.read_output("shared", "2026-04-01").num_rows == 100


def test_runs_creating_one_table_at_once_all_land(tmp_path) -> None:
    """The first night of a new output on several nodes: each creates the table, or finds it
    created (partitioned from its first commit) by another, and every day lands."""
    import multiprocessing

    root = str(tmp_path / "data")
    dates = ["2026-04-02", "2026-04-03", "2026-04-04"]
    context = multiprocessing.get_context("spawn")
    writers = [context.Process(target=_commit_days, args=(root, d, 2)) for d in dates]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join(timeout=300)
        assert writer.exitcode == 0
    store = DataStore(root)
    table = store.tables.load("shared")
    assert [f.name for f in table.spec().fields] == ["date"]
    assert table.metadata.name_mapping() is not None
    for date in dates:
        assert store.read_output("shared", date).num_rows == 100
        assert store.output_commit("shared", date) == f"{date}-1"


def test_upkeep_expires_superseded_snapshots_and_orphans_and_keeps_each_days_head(
    tmp_path,
) -> None:
    import datetime as dt

    from inference.engine.table_upkeep import upkeep

    store = DataStore(str(tmp_path / "data"))
    schema = pa.schema([("id", pa.int64())])
    for run in range(3):
        rows = pa.table({"id": range(run * 10, run * 10 + 10)}, schema=schema)
        staged = store.tables.stage("kept", DAY, schema, [rows], {"commit": f"c{run}", "rows": 10})
        store.tables.publish("kept", DAY, staged)
    refused = store.tables.stage("kept", DAY, schema, [rows], {"commit": "bad", "rows": 10})
    store.tables.reject("kept", DAY, refused)
    other = store.tables.stage("kept", TRAIN_DAY, schema, [rows], {"commit": "old", "rows": 10})
    store.tables.publish("kept", TRAIN_DAY, other)
    stray = (
        tmp_path / "data" / "outputs" / "kept" / "data" / f"date={DAY}" / "left-by-a-crash.parquet"
    )
    pq.write_table(rows, stray)
    before = {d: store.read_output("kept", d) for d in (DAY, TRAIN_DAY)}
    files_before = len(list((tmp_path / "data" / "outputs" / "kept" / "data").rglob("*.parquet")))

    # Nothing is older than the retention yet: nothing goes.
    now = dt.datetime.now(dt.UTC)
    done = upkeep(store.tables, "kept", dt.timedelta(days=30), now, store.fs)
    assert (done.snapshots_expired, done.files_deleted, done.branches_removed) == (0, 0, [])

    later = now + dt.timedelta(days=31)
    done = upkeep(store.tables, "kept", dt.timedelta(days=30), later, store.fs)
    assert done.snapshots_expired > 0 and f"rejected-{DAY}-bad" in done.branches_removed
    assert not stray.exists() and done.files_deleted >= 3  # the stray, c0's and c1's files
    files_after = len(list((tmp_path / "data" / "outputs" / "kept" / "data").rglob("*.parquet")))
    assert (files_before, files_after) == (6, 2)  # the two days' heads are all that stay
    for date, table in before.items():  # every day's head survives, and reads the same
        assert store.read_output("kept", date).equals(table)
    assert (
        store.output_commit("kept", DAY) == "c2" and store.output_commit("kept", TRAIN_DAY) == "old"
    )
    assert [where for _, where in store.tables.history("kept", DAY)] == ["current"]


def test_history_and_rollback_from_the_command_line(tmp_path) -> None:
    root = str(tmp_path / "data")
    store = DataStore(root)
    schema = pa.schema([("id", pa.int64())])
    for run, n in enumerate((5, 7)):
        rows = pa.table({"id": range(n)}, schema=schema)
        staged = store.tables.stage("cli", DAY, schema, [rows], {"commit": f"c{run}", "rows": n})
        store.tables.publish("cli", DAY, staged, checks={"ids_unique": True}, model_version="m1")
    home = tmp_path / "home"
    env = {**os.environ, "NIGHTSHIFT_DATA_ROOT": root, "DAGSTER_HOME": str(home)}
    nightshift = str(BIN / "nightshift")

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [nightshift, "outputs", *args], env=env, capture_output=True, text=True
        )

    history = run("history", "--asset", "cli", "--date", DAY)
    assert history.returncode == 0, history.stderr
    lines = history.stdout.splitlines()
    assert "c1" in lines[2] and "current" in lines[2] and "1/1 checks passed" in lines[2]
    assert "c0" in history.stdout and "published" in history.stdout and "m1" in history.stdout
    back = run("rollback", "--asset", "cli", "--date", DAY)
    assert back.returncode == 0 and "main holds commit c0 again" in back.stdout, back.stdout
    assert DataStore(root).read_output("cli", DAY).num_rows == 5
    # The restored day is recorded in the Dagster instance: what the assets downstream read.
    from dagster import AssetKey, AssetRecordsFilter

    with DagsterInstance.from_config(str(home)) as instance:
        (record,) = instance.fetch_materializations(
            AssetRecordsFilter(asset_key=AssetKey("cli"), asset_partitions=[DAY]), limit=5
        ).records
    recorded = record.asset_materialization.metadata
    current = DataStore(root).output_figures("cli", DAY)
    assert recorded["table_snapshots"].value == {"cli": current.snapshot_id}
    assert recorded["rolled_back_to"].value == "c0" == current.commit
    missing = run("rollback", "--asset", "cli", "--date", DAY, "--to", "nope")
    assert missing.returncode == 1 and "no commit nope" in missing.stdout
    assert "c0 current" in missing.stdout and "c1 published" in missing.stdout


def test_the_scheduled_upkeep_job_runs_on_every_output_table(tmp_path, monkeypatch) -> None:
    from orchestration.upkeep import outputs_upkeep_job

    root = str(tmp_path / "data")
    store = DataStore(root)
    schema = pa.schema([("id", pa.int64())])
    for name in ("one", "two"):
        staged = store.tables.stage(name, DAY, schema, [schema.empty_table()], {"commit": "c"})
        store.tables.publish(name, DAY, staged)
    monkeypatch.setenv("NIGHTSHIFT_OUTPUT_RETENTION_DAYS", "7")
    result = outputs_upkeep_job.execute_in_process(
        resources={"storage": StorageResource(data_root=root)}
    )
    assert result.success
    done = result.output_for_node("expire_output_snapshots")
    assert sorted(d["table"] for d in done) == ["nightshift.one", "nightshift.two"]
    assert {d["retention_days"] for d in done} == {7}


def test_a_day_staged_earlier_never_replaces_one_staged_later(tmp_path) -> None:
    """Two runs of one day (a manual re-run beside a scheduled one) stage, check and publish
    under no common lock: the later-staged one published first is never replaced by the
    earlier one, in any table of the day, and neither is a rollback made since."""
    from inference.engine.tables import DayTable, StagedDay, SupersededError

    store = DataStore(str(tmp_path / "data"))
    tables = store.tables
    schema = pa.schema([("id", pa.int64())])

    def stage(commit: str, rows: int) -> StagedDay:
        """A day staged in a companion and the output, as the engine's writer stages one."""
        staged = StagedDay()
        for name in ("kept_quarantine", "kept"):
            figures = {"commit": commit, "rows": rows}
            part = tables.stage(name, DAY, schema, [pa.table({"id": range(rows)})], figures)
            staged.parts.append((DayTable(tables, name, DAY), part))
        return staged

    earlier, later = stage("earlier", 10), stage("later", 20)
    later.publish()
    with pytest.raises(SupersededError) as refused:
        earlier.publish()
    message = str(refused.value)
    assert "commit earlier" in message and "main holds commit later" in message
    assert "staged after it" in message and f"branch audit-{DAY}-earlier" in message
    for name in ("kept_quarantine", "kept"):  # every table of the day still on the later run
        assert store.output_commit(name, DAY) == "later"
        assert store.read_output(name, DAY).num_rows == 20

    # A person rolls the day back to the earlier commit: a run staged before that decision
    # does not undo it, and one staged after it publishes as usual.
    before_rollback = stage("before-rollback", 30)
    tables.rollback("kept", DAY, "earlier")
    with pytest.raises(SupersededError, match="rolled back to since"):
        tables.publish("kept", DAY, before_rollback.parts[-1][1])
    assert store.output_commit("kept", DAY) == "earlier"
    stage("after-rollback", 40).publish()
    assert store.output_commit("kept", DAY) == "after-rollback"
    assert store.read_output("kept", DAY).num_rows == 40

"""A range run records each day on its own: a day that fails leaves the days before it
materialised and checked, and a retry of the run redoes and records only the failed day."""

from __future__ import annotations

import os

import numpy as np
import pyarrow.parquet as pq
import pytest
from dagster import (
    AssetKey,
    DagsterEventType,
    DagsterInstance,
    Definitions,
    ReexecutionOptions,
    define_asset_job,
    execute_job,
    in_process_executor,
    reconstructable,
)
from fraud_world import trained_fraud_world
from helpers import cpu_resources

from assets.day_metadata import day_entries
from assets.fraud.assets import fraud_scores
from assets.fraud.demo_data import generate_day
from assets.fraud.schemas import SCORES, TRANSACTIONS
from policy.partitions import daily_partitions

DAYS = ["2026-06-02", "2026-06-03", "2026-06-04"]
ROOT = "NIGHTSHIFT_TEST_RANGE_ROOT"


def range_job():
    """fraud_scores alone, over the data root the test set up (rebuilt by re-execution)."""
    job = define_asset_job(
        "fraud_scores_range",
        [fraud_scores],
        partitions_def=daily_partitions,
        executor_def=in_process_executor,
    )
    resources = cpu_resources(os.environ[ROOT])
    return Definitions(assets=[fraud_scores], jobs=[job], resources=resources).resolve_job_def(
        "fraud_scores_range"
    )


def _break_amounts(store, date: str, rows: int) -> None:
    """Makes ``rows`` amounts of the day's first file non-finite: above the quarantine limit."""
    [path, *_] = store.landing_files(TRANSACTIONS, date)
    table = pq.read_table(path)
    amounts = table["amount"].to_numpy().copy()
    amounts[:rows] = np.nan
    index = table.schema.get_field_index("amount")
    pq.write_table(table.set_column(index, "amount", [amounts]), path)


def _days(instance: DagsterInstance, run_id: str) -> dict[str, dict]:
    """The fraud_scores days a run materialised, with their metadata."""
    records = instance.get_records_for_run(
        run_id, of_type={DagsterEventType.ASSET_MATERIALIZATION}
    ).records
    found = {}
    for record in records:
        mat = record.event_log_entry.dagster_event.event_specific_data.materialization
        if mat.asset_key == AssetKey(SCORES):
            found[mat.partition] = {k: v.value for k, v in day_entries(mat.metadata).items()}
    return found


def _checked(instance: DagsterInstance, run_id: str) -> dict[str, bool]:
    """Per day, whether every check of the run on its scores passed (the run also records the
    checks of each landing day it landed first)."""
    records = instance.get_records_for_run(
        run_id, of_type={DagsterEventType.ASSET_CHECK_EVALUATION}
    ).records
    passed: dict[str, bool] = {}
    for record in records:
        evaluation = record.event_log_entry.dagster_event.event_specific_data
        if evaluation.asset_key != AssetKey(SCORES):
            continue
        passed[evaluation.partition] = passed.get(evaluation.partition, True) and evaluation.passed
    return passed


@pytest.fixture
def world(tmp_path, monkeypatch):
    world = trained_fraud_world(tmp_path / "data", "2026-06-01", 0.02)
    for date in DAYS:
        generate_day(world["store"], date, scale=0.02, seed=int(date[-2:]))
    monkeypatch.setenv(ROOT, str(world["root"]))
    (tmp_path / "home").mkdir()
    with DagsterInstance.local_temp(str(tmp_path / "home")) as instance:
        yield {**world, "instance": instance}


def test_a_failed_day_leaves_the_days_before_it_and_a_retry_redoes_only_that_day(world):
    store, instance = world["store"], world["instance"]
    _break_amounts(store, DAYS[-1], rows=200)
    tags = {
        "dagster/asset_partition_range_start": DAYS[0],
        "dagster/asset_partition_range_end": DAYS[-1],
    }
    first = execute_job(
        reconstructable(range_job), instance=instance, tags=tags, raise_on_error=False
    )
    assert not first.success
    # The finished days are materialised with their own figures and checks; the failed one is not.
    done = _days(instance, first.run_id)
    assert sorted(done) == DAYS[:2]
    for date, meta in done.items():
        assert meta["dagster/row_count"] == store.read_output(SCORES, date).num_rows
        assert meta["output"].endswith(f"date={date}")
    assert _checked(instance, first.run_id) == dict.fromkeys(DAYS[:2], True)
    [failure] = [e for e in first.all_events if e.is_step_failure]
    assert DAYS[-1] in failure.step_failure_data.error.message
    assert not store.output_exists(SCORES, DAYS[-1])
    materialized = instance.get_materialized_partitions(AssetKey(SCORES))
    assert materialized == set(DAYS[:2])
    commits = {date: store.output_commit(SCORES, date) for date in DAYS[:2]}

    # The bad rows are fixed upstream; the run is retried from failure, as the UI's
    # "Re-execute from failure" does.
    generate_day(store, DAYS[-1], scale=0.02, seed=int(DAYS[-1][-2:]))
    retry = execute_job(
        reconstructable(range_job),
        instance=instance,
        reexecution_options=ReexecutionOptions.from_failure(first.run_id, instance),
        tags=tags,  # the UI's re-execution carries the parent's partition range the same way
    )
    assert retry.success
    # Only the failed day is redone and recorded; the others keep their commit.
    assert sorted(_days(instance, retry.run_id)) == [DAYS[-1]]
    assert _checked(instance, retry.run_id) == {DAYS[-1]: True}
    assert {date: store.output_commit(SCORES, date) for date in DAYS[:2]} == commits
    assert instance.get_materialized_partitions(AssetKey(SCORES)) == set(DAYS)
    logs = [e.message for e in instance.all_logs(retry.run_id) if e.message]
    assert sum("not redone" in line for line in logs) == 2, logs

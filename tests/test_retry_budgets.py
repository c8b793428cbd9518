"""Two retry budgets: errors retry by RetryPolicy, interruptions by their own durable count."""

import os
import signal
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import yaml
from dagster import (
    AssetExecutionContext,
    Backoff,
    MaterializeResult,
    RetryPolicy,
    asset,
    materialize,
)
from helpers import asset_metadata, cpu_resources

from assets.checkpointing import spot_safe
from assets.partitions import partition_dates
from assets.runner import scoring_metadata
from inference.engine.shard_worker import ModelStep
from inference.engine.work import Input, Output, Sizes, Work
from orchestration.jobs import pipeline_jobs
from policy.partitions import daily_partitions
from policy.retries import INTERRUPTION_BUDGET
from resources.inference import InferenceResource
from resources.storage import StorageResource

DEPLOY = Path(__file__).resolve().parents[1] / "deploy"
SCHEMA = pa.schema([("id", pa.int64()), ("y", pa.float64())])
DAY = "2026-03-02"
PLAN: dict = {}  # what each attempt of the test asset does: "error", a signal, or nothing


@asset(
    partitions_def=daily_partitions,
    retry_policy=RetryPolicy(max_retries=2, delay=0, backoff=Backoff.LINEAR),
)
def doubled(
    context: AssetExecutionContext, storage: StorageResource, inference: InferenceResource
) -> MaterializeResult:
    """Doubles 1,000 ids in shards of 200; the test plan injects failures per attempt."""
    store = storage.store()
    action = PLAN["attempts"][context.retry_number]
    batches = [pa.record_batch({"id": np.arange(1000)})]

    def transform(batch: pa.RecordBatch, prepared) -> pa.Table:
        if batch["id"][0].as_py() == 400 and action == "error":
            raise ValueError("a bad batch of data")
        if batch["id"][0].as_py() == 400 and isinstance(action, signal.Signals):
            os.kill(os.getpid(), action)
        ids = batch["id"].to_numpy()
        return pa.table({"id": ids, "y": ids * 2.0})

    with spot_safe(context, store, inference) as run:
        [date] = partition_dates(context)
        work = Work(
            Input(batches, files=[]), ModelStep(transform), Output(SCHEMA), "v1", Sizes(100)
        )
        report = run.partition("doubled", date, work)
    metadata = scoring_metadata(report, model_version="v1", device="cpu", model_loads=0)
    return MaterializeResult(metadata={**metadata, **run.metadata()})


def _materialize(data_root, instance):
    resources = cpu_resources(data_root, shard_rows=200, interruption_budget=2)
    return materialize(
        [doubled], partition_key=DAY, resources=resources, instance=instance, raise_on_error=False
    )


def test_error_and_soft_interruption_are_counted_apart(data_root, store, instance) -> None:
    PLAN["attempts"] = ["error", signal.SIGUSR1, None]
    result = _materialize(data_root, instance)
    assert result.success
    meta = asset_metadata(result, "doubled")
    assert (meta["error_retries"], meta["soft_interruptions"], meta["interruptions"]) == (1, 1, 1)
    # The soft interruption kept the two shards finished before it; the error kept the same two.
    assert meta["shards_resumed"] == 2 and meta["rows_out"] == 1000
    assert store.read_output("doubled", DAY)["y"].to_pylist() == [2.0 * i for i in range(1000)]


def test_hard_interruption_fails_the_run_and_tags_it_for_the_daemon(data_root, instance) -> None:
    PLAN["attempts"] = [signal.SIGTERM]
    result = _materialize(data_root, instance)
    assert not result.success
    tags = instance.get_run_by_id(result.run_id).tags
    assert tags["nightshift/interrupted"] == "true" and tags["nightshift/interruptions"] == "1"
    assert tags["dagster/retry_on_asset_or_op_failure"] == "true"
    [failure] = result.get_step_failure_events()
    assert "interrupted (SIGTERM received)" in failure.step_failure_data.error.message
    assert "will be relaunched" in failure.step_failure_data.error.message


def test_interruption_budget_is_its_own(data_root, instance) -> None:
    PLAN["attempts"] = [signal.SIGTERM]
    for attempt in (1, 2, 3):
        result = _materialize(data_root, instance)
        tags = instance.get_run_by_id(result.run_id).tags
        assert tags["nightshift/interruptions"] == str(attempt)
    # Over the budget of 2: no run-level retry is asked for, and the message says why.
    assert "dagster/retry_on_asset_or_op_failure" not in tags
    [failure] = result.get_step_failure_events()
    assert "interruption budget of 2 retries exhausted" in failure.step_failure_data.error.message


@pytest.mark.parametrize("env", ["local", "aws"])
def test_instance_run_retries_equal_the_interruption_budget(env: str) -> None:
    config = yaml.safe_load((DEPLOY / env / "dagster.yaml").read_text())
    assert config["run_retries"]["max_retries"] == INTERRUPTION_BUDGET


def test_interruption_budget_has_one_source() -> None:
    # The resource's default and each pipeline job's run tag are the policy constant.
    assert InferenceResource().interruption_budget == INTERRUPTION_BUDGET
    for job in pipeline_jobs:
        assert job.tags["dagster/max_retries"] == str(INTERRUPTION_BUDGET), job.name


@pytest.fixture(autouse=True)
def _clean_plan():
    yield
    PLAN.clear()

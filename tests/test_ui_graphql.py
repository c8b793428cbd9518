"""Operating nightshift through the real webserver and daemon: a UI backfill, the landing sensor, schedules, the run queue and automation."""

from __future__ import annotations

import datetime as dt
import json
import time

from ui_stack import DagsterStack, set_sensor_cursor, wait_for, wait_for_backfill

from assets.fraud.schemas import TRANSACTIONS_SCHEMA

RUNS = """
query Runs($filter: RunsFilter) {
  runsOrError(filter: $filter) {
    ... on Runs { results { runId status jobName startTime endTime tags { key value } } }
  }
}
"""

MATERIALIZATIONS = """
query Materializations($path: [String!]!, $partitions: [String!]) {
  assetOrError(assetKey: {path: $path}) {
    ... on Asset {
      assetMaterializations(partitions: $partitions) {
        partition
        runId
        metadataEntries {
          label
          ... on FloatMetadataEntry { floatValue }
          ... on IntMetadataEntry { intValue }
          ... on TextMetadataEntry { text }
          ... on PathMetadataEntry { path }
          ... on TableMetadataEntry { table { records } }
        }
      }
    }
  }
}
"""

CHECK_EXECUTIONS = """
query Checks($path: [String!]!, $check: String!) {
  assetCheckExecutions(assetKey: {path: $path}, checkName: $check, limit: 20) {
    runId
    status
    partition
  }
}
"""

SENSOR_TICKS = """
query Ticks($selector: SensorSelector!) {
  sensorOrError(sensorSelector: $selector) {
    ... on Sensor {
      sensorState { status ticks(limit: 10) { id status timestamp runIds runKeys skipReason } }
    }
  }
}
"""

SCHEDULE = """
query Schedule($selector: ScheduleSelector!) {
  scheduleOrError(scheduleSelector: $selector) {
    ... on Schedule { cronSchedule scheduleState { status } }
  }
}
"""

# The UI's "Test schedule": the code server evaluates a tick at a chosen time.
SCHEDULE_DRY_RUN = """
mutation DryRun($selector: ScheduleSelector!, $timestamp: Float) {
  scheduleDryRun(selectorData: $selector, timestamp: $timestamp) {
    ... on DryRunInstigationTick {
      evaluationResult { runRequests { runKey tags { key value } } skipReason error { message } }
    }
    ... on PythonError { message }
  }
}
"""


STALENESS = """
query Staleness($path: [String!]!, $partitions: [String!]) {
  assetNodes(assetKeys: [{path: $path}]) {
    staleStatusByPartition(partitions: $partitions)
    staleCausesByPartition(partitions: $partitions) { reason category key { path } }
  }
}
"""


def _figures(event: dict) -> dict[str, dict]:
    """A materialisation's metadata entries by label, the detail table's rows among them (as
    {"value": ...}): the headline is top-level, every other figure a row of that table."""
    entries = {e["label"]: e for e in event["metadataEntries"]}
    detail = entries.get("detail", {}).get("table", {}).get("records", [])
    rows = [json.loads(r) for r in detail]
    return {**{r["figure"]: {"value": r["value"]} for r in rows}, **entries}


def run_job_name(stack: DagsterStack, run_id: str) -> str:
    [run] = [r for r in _runs(stack) if r["runId"] == run_id]
    return run["jobName"]


def _runs(stack: DagsterStack, tags: dict[str, str] | None = None) -> list[dict]:
    tag_filter = [{"key": k, "value": v} for k, v in (tags or {}).items()]
    return stack.graphql(RUNS, filter={"tags": tag_filter})["runsOrError"]["results"]


def _tags(run: dict) -> dict[str, str]:
    return {t["key"]: t["value"] for t in run["tags"]}


def _materializations(stack: DagsterStack, asset: str, partitions: list[str]) -> list[dict]:
    data = stack.graphql(MATERIALIZATIONS, path=[asset], partitions=partitions)
    return data["assetOrError"]["assetMaterializations"]


def _sensor_ticks(stack: DagsterStack, sensor: str) -> list[dict]:
    data = stack.graphql(SENSOR_TICKS, selector=stack.selector("sensor", sensor))
    return data["sensorOrError"]["sensorState"]["ticks"]


def _finished(runs: list[dict]) -> list[dict] | None:
    done = {"SUCCESS", "FAILURE", "CANCELED"}
    return runs if runs and all(r["status"] in done for r in runs) else None


def test_ui_backfill_scores_the_range_in_one_run(ui_stack: DagsterStack) -> None:
    days = ui_stack.facts["days"]
    backfill = wait_for_backfill(ui_stack, ui_stack.facts["backfill_id"])
    assert backfill["status"] == "COMPLETED_SUCCESS", backfill

    # Single-run backfill policy: one run, one model load, for the whole range.
    [run] = backfill["runs"]
    assert run["status"] == "SUCCESS"
    tags = _tags(run)
    assert (
        tags["dagster/asset_partition_range_start"],
        tags["dagster/asset_partition_range_end"],
    ) == (days[0], days[-1])
    # The UI runs an asset page's backfill as Dagster's hidden asset job; the run names the
    # pipeline it did the work of.
    assert run_job_name(ui_stack, run["runId"]) == "__ASSET_JOB"
    assert tags["nightshift/pipeline"] == "fraud_scoring_job"

    # Each day is its own materialisation with its own figures, not the range's totals.
    from resources.storage import DataStore

    store = DataStore(str(ui_stack.data_root))
    materialized = _materializations(ui_stack, "fraud_scores", days)
    assert sorted(m["partition"] for m in materialized) == days
    for event in materialized:
        assert event["runId"] == run["runId"]
        day = event["partition"]
        metadata = _figures(event)
        assert metadata["rows_per_second"]["floatValue"] > 0
        landed = store.count_landing("transactions", day, TRANSACTIONS_SCHEMA)
        assert metadata["dagster/row_count"]["intValue"] == landed > 0
        assert metadata["rows_in"]["value"] == landed
        assert metadata["output"]["path"].endswith(f"fraud_scores/data/date={day}")
        assert metadata["partitions"]["value"] == 3  # the days this run covered
        assert metadata["model_loads"]["value"] == 1
        assert metadata["model_version"]["text"]
        # The headline comes first, then the one detail table.
        labels = [e["label"] for e in event["metadataEntries"]]
        assert labels[:2] == ["dagster/row_count", "output"] and "detail" in labels

    # Backfilled alone, the scores' days landed their transactions first in the same run:
    # each landing day is materialised and checked, and no scored day is unsynced.
    for landing in ("transactions", "transaction_screens"):
        landed_days = _materializations(ui_stack, landing, days)
        assert sorted(m["partition"] for m in landed_days) == days, landing
        assert {m["runId"] for m in landed_days} == {run["runId"]}, landing
    landing_checks = ui_stack.graphql(
        CHECK_EXECUTIONS, path=["transactions"], check="transaction_values_in_range"
    )["assetCheckExecutions"]
    assert sorted(e["partition"] for e in landing_checks if e["runId"] == run["runId"]) == days
    [node] = ui_stack.graphql(STALENESS, path=["fraud_scores"], partitions=days)["assetNodes"]
    assert node["staleStatusByPartition"] == ["FRESH"] * len(days), node
    assert node["staleCausesByPartition"] == [[]] * len(days), node

    for check in ("scores_in_unit_interval", "row_count_matches_input"):
        executions = ui_stack.graphql(CHECK_EXECUTIONS, path=["fraud_scores"], check=check)
        rows = [e for e in executions["assetCheckExecutions"] if e["runId"] == run["runId"]]
        # The range run evaluates each check once per day, each with its day's partition.
        assert sorted(e["partition"] for e in rows) == days, rows
        assert {e["status"] for e in rows} == {"SUCCEEDED"}, rows


def test_new_landing_partition_launches_exactly_one_run(ui_stack: DagsterStack) -> None:
    landed = ui_stack.facts["landed"]
    run_key = ui_stack.facts["landed_run_key"]

    def launched() -> list[dict] | None:
        return [t for t in _sensor_ticks(ui_stack, "landing_sensor") if t["runIds"]] or None

    [tick] = wait_for(launched, 120, "a landing_sensor tick that launches a run", every=2)
    assert tick["runKeys"] == [run_key]
    by_key = {"dagster/run_key": run_key}
    [run] = wait_for(lambda: _finished(_runs(ui_stack, by_key)), 240, "the sensor's run", every=2)
    assert (run["runId"], run["jobName"], run["status"]) == (
        tick["runIds"][0],
        "fraud_scoring_job",
        "SUCCESS",
    )
    tags = _tags(run)
    assert tags["dagster/partition"] == landed
    # Latency-sensitive work goes ahead of backfills in the queue, on the one GPU.
    assert tags["dagster/priority"] == "10" and tags["nightshift/gpu"] == "0"

    # Forget the new partition in the cursor (as after a lost cursor): the next tick finds in
    # the instance that a run already read these files, and asks for nothing.
    set_sensor_cursor(ui_stack, "landing_sensor", ui_stack.facts["cursor_before_landing"])
    forgotten = time.time()

    def evaluated_again() -> dict | None:
        # A tick still STARTED has not been evaluated yet: wait for one that has ended.
        ticks = _sensor_ticks(ui_stack, "landing_sensor")
        ended = (t for t in ticks if t["timestamp"] > forgotten and t["status"] != "STARTED")
        return next(ended, None)

    repeat = wait_for(evaluated_again, 150, "a later landing_sensor tick", every=3)
    assert repeat["runIds"] == [] and repeat["status"] == "SKIPPED", repeat
    assert repeat["runKeys"] == [], repeat
    assert len(_runs(ui_stack, by_key)) == 1


def test_gpu_runs_never_overlap(ui_stack: DagsterStack) -> None:
    """The backfill and the sensor's run were queued together; the run queue let one run hold
    the GPU at a time (tag limit for job runs, `gpu` pool for asset backfills)."""
    backfill = {"dagster/backfill": ui_stack.facts["backfill_id"]}
    sensor = {"dagster/run_key": ui_stack.facts["landed_run_key"]}
    gpu_runs = [
        *wait_for(lambda: _finished(_runs(ui_stack, backfill)), 240, "the backfill run"),
        *wait_for(lambda: _finished(_runs(ui_stack, sensor)), 240, "the sensor's run"),
    ]
    assert len(gpu_runs) == 2
    spans = sorted((r["startTime"], r["endTime"]) for r in gpu_runs)
    for (_, end), (start, _) in zip(spans, spans[1:], strict=False):
        assert start >= end, f"GPU runs overlapped: {spans}"


def test_downstream_alerts_follow_scores_once_checks_pass(ui_stack: DagsterStack) -> None:
    """Automation: fraud_alerts materialise for the backfilled days (their parent landed and its
    blocking checks passed), and not a second time for the day the sensor's job already did."""
    days, landed = ui_stack.facts["days"], ui_stack.facts["landed"]

    def alerts() -> list[dict] | None:
        found = _materializations(ui_stack, "fraud_alerts", days)
        return found if len(found) == len(days) else None

    automated = wait_for(alerts, 150, "fraud_alerts from the automation sensor", every=3)
    # One run or several: the range run records each day as it finishes, so the sensor may
    # find some days ready on one tick and the rest on the next. Each day once, by automation.
    assert sorted(m["partition"] for m in automated) == sorted(days)
    run_ids = {m["runId"] for m in automated}
    runs = [r for r in _runs(ui_stack) if r["runId"] in run_ids]
    assert len(runs) == len(run_ids)
    assert all(_tags(run)["dagster/from_automation_condition"] == "true" for run in runs), runs
    assert len(_materializations(ui_stack, "fraud_alerts", [landed])) == 1


def test_schedules_run_by_default_and_score_the_day_that_ended(ui_stack: DagsterStack) -> None:
    at_0200 = dt.datetime.now(dt.UTC).replace(hour=2, minute=0, second=0, microsecond=0)
    yesterday = (at_0200 - dt.timedelta(days=1)).date().isoformat()
    selector = ui_stack.selector("schedule", "fraud_scoring_job_schedule")
    schedule = ui_stack.graphql(SCHEDULE, selector=selector)["scheduleOrError"]
    assert schedule["scheduleState"]["status"] == "RUNNING"
    assert schedule["cronSchedule"] == "0 2 * * *"
    tick = ui_stack.graphql(SCHEDULE_DRY_RUN, selector=selector, timestamp=at_0200.timestamp())
    [request] = tick["scheduleDryRun"]["evaluationResult"]["runRequests"]
    tags = {t["key"]: t["value"] for t in request["tags"]}
    assert request["runKey"] == yesterday and tags["dagster/partition"] == yesterday
    assert tags["dagster/priority"] == "5", json.dumps(tags)

"""The deadline-aware capacity choice at a day's launch and retries: in the scoring engine, and
on the ECS path (EcsRunLauncher on moto, the real daemon's run retries).

The day's recent history is a committed ledger of the day before (a million rows at 1,000 rows
per second: about 1,000 s of work a night), and the deadline is the run's ``nightshift/ready_by``
tag, set relative to now: close, far, or closer than the work.
"""

import datetime as dt
import json
import os
import subprocess
import uuid

import boto3
import pytest
from aws_world import (
    BIN,
    CLUSTER,
    REPO,
    daemon_retry,
    dagster_daemon,
    launched,
    task_of,
    wait_for,
)
from dagster import DagsterRun
from tripled_world import PLAN, materialize_tripled

from assets.day_metadata import day_entries
from inference.engine.ledger import Attempt, LedgerBook, PartitionLedger
from policy.capacity import ON_DEMAND_PROVIDER, SPOT_PROVIDER
from policy.deadline import BEHIND, CANNOT_MAKE_IT, SAFETY_NET
from policy.ready_by import (
    DEFAULT_READY_BY,
    NightFacts,
    ReadyBy,
    deadline_decision,
    ready_by,
    ready_by_time,
    retry_tags,
)
from policy.tags import CAPACITY_REASON_TAG, CAPACITY_TAG, READY_BY_TAG, RUN_TASK_KWARGS_TAG
from resources.storage import DataStore

DAY, BEFORE = "2026-03-02", "2026-03-01"
HISTORY_ROWS, HISTORY_RATE = 1_000_000, 1000.0

pytestmark = pytest.mark.usefixtures("no_prices")


def _history(store, asset: str = "tripled", date: str = BEFORE) -> None:
    """A committed day before: a million rows in 1,000 s of scoring after a 10 s launch."""
    attempt = Attempt("history", "spot", 0.0, 10.0, 10.0 + HISTORY_ROWS / HISTORY_RATE)
    attempt.rows = HISTORY_ROWS
    ledger = PartitionLedger(asset, date, [attempt], rows_total=HISTORY_ROWS, committed=True)
    LedgerBook(store.partition_target(asset, date), asset, date).save(ledger)


def _in(seconds: float) -> str:
    return (dt.datetime.now(dt.UTC) + dt.timedelta(seconds=seconds)).isoformat()


def _interrupted_run(data_root, instance, store, ready_in: float):
    _history(store)
    PLAN["kill"] = True
    result = materialize_tripled(data_root, instance, tags={READY_BY_TAG: _in(ready_in)})
    assert not result.success
    return instance.get_run_by_id(result.run_id)


def _provider(tags) -> str:
    [strategy] = json.loads(tags[RUN_TASK_KWARGS_TAG])["capacityProviderStrategy"]
    return strategy["capacityProvider"]


# -- in the scoring engine -------------------------------------------------------------------


def _night_began(store, seconds_ago: float, asset: str = "tripled", date: str = DAY) -> None:
    """The day's night began earlier: a first attempt that failed before scoring a row."""
    began = dt.datetime.now(dt.UTC).timestamp() - seconds_ago
    attempt = Attempt("earlier", "spot", began, began + 5.0, began + 10.0)
    LedgerBook(store.partition_target(asset, date), asset, date).save(
        PartitionLedger(asset, date, [attempt])
    )


def test_interrupted_close_to_its_ready_by_the_retry_goes_on_demand(
    data_root, store, instance
) -> None:
    # The night began 300 s ago with 1,000 s of work and 1,450 s to the deadline; now about
    # 1,000 s of work are left and 1,150 s: behind a uniform schedule by about 80 s, a margin
    # no scheduling delay of the test's own run can close.
    _night_began(store, seconds_ago=300)
    run = _interrupted_run(data_root, instance, store, ready_in=1150)
    assert run.tags[CAPACITY_TAG] == "on-demand" and _provider(run.tags) == ON_DEMAND_PROVIDER
    reason = run.tags[CAPACITY_REASON_TAG]
    assert reason.startswith("on-demand: about 17 min of work left, 19 min to ")
    assert "behind a uniform schedule" in reason
    # The retry (the daemon copies the failed run's tags) records the reason on the day.
    result = materialize_tripled(data_root, instance, tags=dict(run.tags))
    assert result.success
    [mat] = result.asset_materializations_for_node("tripled")
    assert day_entries(mat.metadata)["capacity_reason"].value == reason
    assert day_entries(mat.metadata)["node_s_on_demand"].value > 0


def test_interrupted_far_from_its_ready_by_the_retry_stays_on_spot(
    data_root, store, instance
) -> None:
    run = _interrupted_run(data_root, instance, store, ready_in=10 * 3600)
    assert run.tags[CAPACITY_TAG] == "spot" and _provider(run.tags) == SPOT_PROVIDER
    assert run.tags[CAPACITY_REASON_TAG].startswith("spot: about 17 min of work left, 10.0 h")


def test_a_day_that_cannot_make_it_says_so_at_launch_and_retries_on_demand(
    data_root, store, instance
) -> None:
    run = _interrupted_run(data_root, instance, store, ready_in=600)
    assert run.tags[CAPACITY_TAG] == "on-demand"
    assert "cannot be met even so" in run.tags[CAPACITY_REASON_TAG]
    logs = [e.message for e in instance.all_logs(run.run_id) if e.message]
    at_launch = [m for m in logs if " at launch: " in m]
    assert at_launch and "cannot be met even so" in at_launch[0]


def test_an_old_day_leaves_the_choice_to_the_count_switch(data_root, store, instance) -> None:
    _history(store)
    PLAN["kill"] = True
    result = materialize_tripled(data_root, instance)  # 07:00 of 2026-03-03 passed long ago
    run = instance.get_run_by_id(result.run_id)
    assert CAPACITY_TAG not in run.tags and CAPACITY_REASON_TAG not in run.tags
    logs = [e.message for e in instance.all_logs(run.run_id) if e.message]
    assert any("(a backfill); the count-based switch decides" in m for m in logs)


def test_ready_by_defaults_to_0700_and_is_set_per_asset() -> None:
    assert DEFAULT_READY_BY == "07:00" and ready_by_time("fraud_scores", {}) == dt.time(7)
    env = {"NIGHTSHIFT_READY_BY": "fraud_scores=05:30, 08:00"}
    assert ready_by_time("fraud_scores", env) == dt.time(5, 30)
    assert ready_by_time("document_summaries", env) == dt.time(8)
    day = ready_by("fraud_scores", "2026-03-01", environ=env)
    assert day.at == dt.datetime(2026, 3, 2, 5, 30, tzinfo=dt.UTC) and day.label == "05:30"
    with pytest.raises(ValueError, match="NIGHTSHIFT_READY_BY"):
        ready_by_time("x", {"NIGHTSHIFT_READY_BY": "seven"})


# -- on ECS: EcsRunLauncher on moto and the real daemon ----------------------------------------

NOW = 1_000_000.0


def _facts(time_left_s: float, work_left_s: float, interruptions: int = 1) -> NightFacts:
    """A night 6 h long that started at landing; rows at 1,000 a second."""
    ready = ReadyBy(dt.datetime.fromtimestamp(NOW + time_left_s, dt.UTC), "07:00")
    return NightFacts(
        rows_left=int(work_left_s * 1000),
        rows_total=int(4 * 3600 * 1000),
        rows_per_second=1000.0,
        restart_overhead_s=120.0,
        first_started=NOW + time_left_s - 6 * 3600,
        now=NOW,
        ready=ready,
        interruptions=interruptions,
        on_demand_after=3,
    )


@pytest.fixture(scope="module")
def daemon(aws_env, aws_home, tmp_path_factory):
    env = {**os.environ, **aws_env, "DAGSTER_HOME": str(aws_home)}
    log = tmp_path_factory.mktemp("daemon") / "daemon.log"
    with dagster_daemon(env, log):
        yield env, log


def _launch(env, log, instance, tags: dict) -> DagsterRun:
    run_id = str(uuid.uuid4())
    tags = {"dagster/partition": "2026-03-01", **tags}
    launch = [BIN / "dagster", "job", "launch", "-w", "workspace.yaml"]
    launch += ["-j", "fraud_scoring_job", "--run-id", run_id, "--tags", json.dumps(tags)]
    done = subprocess.run(launch, cwd=REPO, env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-4000:]
    return wait_for(lambda: launched(instance, run_id), 120, "the ECS launch", log)


def _interrupt_and_retry(env, log, instance, run: DagsterRun, facts: NightFacts) -> DagsterRun:
    """What the interruption path does on the node, then the daemon's retry launch."""
    decision, _ = deadline_decision(facts)
    tags = retry_tags(decision, facts.interruptions, facts.on_demand_after, run.tags)
    instance.add_run_tags(run.run_id, tags)
    instance.report_run_failed(instance.get_run_by_id(run.run_id), "spot node reclaimed")
    task = run.tags["ecs/task_arn"]
    retry = daemon_retry(instance, run, log)
    # moto's tasks never end: stop both, so the next test's tasks find room on the nodes.
    ecs = boto3.client("ecs")
    for arn in (task, retry.tags["ecs/task_arn"]):
        ecs.stop_task(cluster=CLUSTER, task=arn, reason="test done")
    return retry


def test_ecs_interrupted_close_to_the_deadline_retries_on_demand(daemon, aws_instance) -> None:
    env, log = daemon
    run = _launch(env, log, aws_instance, {})
    assert task_of(run)["capacityProviderName"] == SPOT_PROVIDER
    # 2.1 h of work left, 2.3 h to 07:00: one more reclaim and restart would not fit.
    retry = _interrupt_and_retry(env, log, aws_instance, run, _facts(2.3 * 3600, 2.1 * 3600))
    assert task_of(retry)["capacityProviderName"] == ON_DEMAND_PROVIDER
    assert retry.tags[CAPACITY_TAG] == "on-demand"
    assert retry.tags[CAPACITY_REASON_TAG].startswith(
        "on-demand: about 2.1 h of work left, 2.3 h to 07:00"
    )
    assert deadline_decision(_facts(2.3 * 3600, 2.1 * 3600))[0].rule in (SAFETY_NET, BEHIND)


def test_ecs_interrupted_far_from_the_deadline_stays_on_spot(daemon, aws_instance) -> None:
    env, log = daemon
    run = _launch(env, log, aws_instance, {})
    retry = _interrupt_and_retry(env, log, aws_instance, run, _facts(5.5 * 3600, 3.0 * 3600))
    assert task_of(retry)["capacityProviderName"] == SPOT_PROVIDER
    assert retry.tags[CAPACITY_TAG] == "spot"
    assert retry.tags[CAPACITY_REASON_TAG].startswith("spot: about 3.0 h of work left, 5.5 h")


def test_ecs_a_day_past_saving_retries_on_demand_and_says_so(daemon, aws_instance) -> None:
    env, log = daemon
    run = _launch(env, log, aws_instance, {})
    facts = _facts(1.8 * 3600, 2.1 * 3600)
    assert deadline_decision(facts)[0].rule == CANNOT_MAKE_IT
    retry = _interrupt_and_retry(env, log, aws_instance, run, facts)
    assert task_of(retry)["capacityProviderName"] == ON_DEMAND_PROVIDER
    assert retry.tags[CAPACITY_REASON_TAG] == (
        "on-demand, and 07:00 cannot be met even so: about 2.1 h of work left, 1.8 h to 07:00 "
        "(the work left is more than the time left)"
    )


def test_ecs_a_day_that_cannot_make_it_says_so_at_launch_and_launches_on_demand(
    daemon, aws_env, aws_instance
) -> None:
    env, log = daemon
    store = DataStore(aws_env["NIGHTSHIFT_DATA_ROOT"])
    for day in ("2026-02-27", "2026-02-28"):
        # Ten million rows a day at 1,000 rows/s: 2.8 h of work; 07:00 is 1 h away.
        attempt = Attempt("history", "spot", 0.0, 120.0, 120.0 + 10_000)
        attempt.rows = 10_000_000
        ledger = PartitionLedger("fraud_scores", day, [attempt], 10_000_000, committed=True)
        LedgerBook(store.partition_target("fraud_scores", day), "fraud_scores", day).save(ledger)
    ready = dt.datetime.now(dt.UTC).replace(microsecond=0) + dt.timedelta(hours=1)
    run = _launch(env, log, aws_instance, {READY_BY_TAG: ready.isoformat()})
    assert task_of(run)["capacityProviderName"] == ON_DEMAND_PROVIDER
    assert run.tags[CAPACITY_TAG] == "on-demand"
    label = ready.strftime("%H:%M")
    reason = run.tags[CAPACITY_REASON_TAG]
    assert reason.startswith(f"on-demand, and {label} cannot be met even so: about 2.8 h of work")
    events = [e.message for e in aws_instance.all_logs(run.run_id) if e.message]
    assert f"at launch: {reason}" in events
    boto3.client("ecs").stop_task(cluster=CLUSTER, task=run.tags["ecs/task_arn"], reason="done")

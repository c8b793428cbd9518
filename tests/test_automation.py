"""Automation policy: the backfill-policy switch, run priorities and GPU tags, declarative automation, freshness, and the run failure sensor's reasons."""

from __future__ import annotations

import datetime as dt

import pytest
from dagster import (
    AssetCheckResult,
    AssetCheckSpec,
    AssetKey,
    DagsterInstance,
    DefaultSensorStatus,
    Definitions,
    MaterializeResult,
    asset,
    build_run_status_sensor_context,
    build_schedule_context,
    build_sensor_context,
    materialize,
)

from orchestration.automation import (
    CHECK_FAILED,
    ERROR,
    INTERRUPTED,
    classify_failure,
    failure_observations,
    run_failure_sensor,
)
from orchestration.definitions import defs
from policy.partitions import (
    BACKFILL_PARTITIONS_PER_RUN_ENV,
    backfill_policy,
    backfill_policy_from,
    daily_partitions,
)

DAY = "2026-03-02"


@asset(partitions_def=daily_partitions)
def exploding_scores() -> None:
    raise ValueError("model weights are corrupt")


@asset(
    partitions_def=daily_partitions,
    check_specs=[AssetCheckSpec("scores_in_unit_interval", asset="checked_scores", blocking=True)],
)
def checked_scores() -> MaterializeResult:
    return MaterializeResult(check_results=[AssetCheckResult(passed=False)])


@asset
def broken_model() -> None:
    raise RuntimeError("no GPU memory left")


@asset(partitions_def=daily_partitions, deps=[broken_model])
def scores_from_model() -> None:
    pass


def _failed_run(instance: DagsterInstance, asset_def, tags: dict | None = None, **kwargs):
    result = materialize(
        [asset_def], instance=instance, raise_on_error=False, tags=tags or {}, **kwargs
    )
    assert not result.success
    return result, instance.get_run_by_id(result.run_id)


@pytest.mark.parametrize(
    ("setting", "per_run"), [(None, None), ("", None), (" ", None), ("7", 7), ("1", 1)]
)
def test_backfill_policy_is_single_run_unless_partitions_per_run_set(setting, per_run) -> None:
    assert backfill_policy_from(setting).max_partitions_per_run == per_run


@pytest.mark.parametrize("setting", ["0", "-2", "two", "1.5"])
def test_a_bad_partitions_per_run_setting_names_the_variable(setting: str) -> None:
    with pytest.raises(ValueError, match=BACKFILL_PARTITIONS_PER_RUN_ENV):
        backfill_policy_from(setting)


def test_every_partitioned_asset_follows_the_one_backfill_policy() -> None:
    graph = defs.get_repository_def().asset_graph
    partitioned = [graph.get(k) for k in graph.get_all_asset_keys() if graph.get(k).is_partitioned]
    # With the shadows of fraud_scores and user_recommendations, and the publish steps of
    # user_recommendations, fraud_alerts and document_embeddings.
    assert len(partitioned) == 15
    assert {node.backfill_policy for node in partitioned} == {backfill_policy}


def test_gpu_jobs_and_triggers_carry_the_tags_the_run_queue_acts_on() -> None:
    for name in ("fraud_scoring_job", "recommendations_job", "fraud_training_job"):
        assert defs.resolve_job_def(name).tags["nightshift/gpu"] == "0"
    schedule = defs.get_repository_def().get_schedule_def("fraud_scoring_job_schedule")
    with DagsterInstance.ephemeral() as instance:
        when = dt.datetime(2026, 3, 5, 2, tzinfo=dt.UTC)
        context = build_schedule_context(instance=instance, scheduled_execution_time=when)
        [request] = schedule.evaluate_tick(context).run_requests
    assert request.tags["dagster/priority"] == "5"
    assert schedule.default_status.value == "RUNNING"


def test_downstream_assets_automate_and_scoring_assets_have_a_0700_deadline() -> None:
    graph = defs.get_repository_def().asset_graph
    automated = {
        k.to_user_string() for k in graph.get_all_asset_keys() if graph.get(k).automation_condition
    }
    assert automated == {
        "fraud_alerts",
        "daily_digest",
        "fraud_alerts_serving",
        "user_recommendations_serving",
        "document_embeddings_serving",
    }
    condition = graph.get(AssetKey("fraud_alerts")).automation_condition
    assert [c.get_label() for c in condition.children] == [
        "eager (31-day lookback)",
        "all_deps_blocking_checks_passed",
    ]
    fresh = {
        k.to_user_string() for k in graph.get_all_asset_keys() if graph.get(k).freshness_policy
    }
    assert fresh == {
        "fraud_scores",
        "user_recommendations",
        "document_summaries",
        "document_embeddings",
    }
    sensors = {s.name: s for s in defs.get_repository_def().sensor_defs}
    for name in ("automation_condition_sensor", "run_failure_sensor"):
        assert sensors[name].default_status == DefaultSensorStatus.RUNNING


def test_an_exception_is_reported_as_an_error_with_its_message(instance) -> None:
    _, run = _failed_run(instance, exploding_scores, partition_key=DAY)
    report = classify_failure(instance, run)
    assert (report.reason, report.partitions) == (ERROR, [DAY])
    assert report.assets == {"exploding_scores": True}
    assert "ValueError" in report.detail and "model weights are corrupt" in report.detail


def test_a_failed_blocking_check_is_reported_as_check_failed(instance) -> None:
    _, run = _failed_run(instance, checked_scores, partition_key=DAY)
    report = classify_failure(instance, run)
    assert report.reason == CHECK_FAILED
    assert "checked_scores.scores_in_unit_interval" in report.detail


def test_a_range_run_reports_every_partition_it_covered(instance) -> None:
    tags = {
        "dagster/asset_partition_range_start": "2026-03-01",
        "dagster/asset_partition_range_end": "2026-03-03",
    }
    _, run = _failed_run(instance, exploding_scores, tags)
    assert classify_failure(instance, run).partitions == ["2026-03-01", "2026-03-02", "2026-03-03"]


def test_interrupted_runs_are_told_apart_from_a_retry_that_inherited_the_tag(instance) -> None:
    interrupted = {"nightshift/interrupted": "true", "nightshift/interruptions": "1"}
    _, first = _failed_run(instance, exploding_scores, interrupted, partition_key=DAY)
    assert classify_failure(instance, first).reason == INTERRUPTED

    # The retry copied its parent's tags but was not interrupted itself: its own error counts.
    inherited = {**interrupted, "dagster/parent_run_id": first.run_id}
    _, retry = _failed_run(instance, exploding_scores, inherited, partition_key=DAY)
    assert classify_failure(instance, retry).reason == ERROR

    again = {**inherited, "nightshift/interruptions": "2"}
    _, second = _failed_run(instance, exploding_scores, again, partition_key=DAY)
    assert classify_failure(instance, second).reason == INTERRUPTED


# The sensor reads the asset graph through `repository_def`, which Dagster marks beta here.
@pytest.mark.filterwarnings("ignore:Parameter `repository_def`")
def test_the_sensor_records_why_each_partition_failed_on_the_asset(instance) -> None:
    result, run = _failed_run(instance, checked_scores, partition_key=DAY)
    context = build_run_status_sensor_context(
        sensor_name="run_failure_sensor",
        dagster_event=result.get_run_failure_event(),
        dagster_instance=instance,
        dagster_run=run,
        repository_def=Definitions(assets=[checked_scores]).get_repository_def(),
    ).for_run_failure()
    run_failure_sensor(context)

    [record] = instance.fetch_observations(AssetKey("checked_scores"), limit=5).records
    observation = record.asset_observation
    assert observation.partition == DAY
    assert observation.metadata["failure_reason"].value == CHECK_FAILED
    assert observation.metadata["failed_run"].value == run.run_id


def test_an_unpartitioned_parent_failing_reports_itself_once_and_the_skipped_partitions(
    instance,
) -> None:
    result = materialize(
        [broken_model, scores_from_model],
        instance=instance,
        partition_key=DAY,
        raise_on_error=False,
    )
    run = instance.get_run_by_id(result.run_id)
    graph = Definitions(assets=[broken_model, scores_from_model]).get_repository_def().asset_graph
    report = classify_failure(instance, run, lambda key: graph.get(key).is_partitioned)
    assert report.assets == {"broken_model": False, "scores_from_model": True}
    assert report.detail == "RuntimeError: no GPU memory left"
    observed = {(o.asset_key.to_user_string(), o.partition) for o in failure_observations(report)}
    assert observed == {("broken_model", None), ("scores_from_model", DAY)}


@pytest.mark.parametrize(
    ("job", "hour"),
    [
        ("fraud_scoring_job", 2),
        ("recommendations_job", 3),
        ("daily_summaries_job", 5),
        ("document_embeddings_job", 6),
    ],
)
def test_each_schedule_says_which_day_a_tick_scores_and_its_tick_asks_for_that_day(
    job: str, hour: int
) -> None:
    """The schedule page shows the description (its "Partition set" row reads None on this
    Dagster for every schedule): it names the job, the hour and the day a tick requests, and a
    tick does request that day, with the date as its run key."""
    schedule = defs.get_repository_def().get_schedule_def(f"{job}_schedule")
    description = schedule.description or ""
    assert f"at {hour:02d}:00 UTC, runs {job} for the previous UTC day" in description
    assert "a tick on day D requests partition D-1" in description
    for when, day in [
        (dt.datetime(2026, 3, 5, hour, tzinfo=dt.UTC), "2026-03-04"),
        (dt.datetime(2026, 3, 1, hour, tzinfo=dt.UTC), "2026-02-28"),
    ]:
        with DagsterInstance.ephemeral() as instance:
            context = build_schedule_context(instance=instance, scheduled_execution_time=when)
            [request] = schedule.evaluate_tick(context).run_requests
        assert (request.partition_key, request.run_key) == (day, day)


def test_new_documents_get_their_embeddings_through_the_landing_sensor(
    store, data_root, resources, instance
) -> None:
    """`landing_sensor` targets document_embeddings_job: a day of new documents asks for it
    (beside the summaries); the run it asks for materialises the day's embeddings, after which
    the sensor asks the embeddings job for nothing more, even with a lost cursor."""
    from assets.documents.assets import documents
    from assets.documents.demo_data import generate_day
    from assets.documents.schemas import DOCUMENTS_SCHEMA
    from assets.embeddings import document_embeddings
    from orchestration.sensors import landing_sensor
    from resources.storage import StorageResource

    sensor = defs.get_repository_def().get_sensor_def("landing_sensor")
    assert "document_embeddings_job" in {t.job_name for t in sensor.targets}
    generate_day(store, DAY, scale=0.02)

    def tick() -> list:
        context = build_sensor_context(
            instance=instance,
            resources={"storage": StorageResource(data_root=str(data_root))},
            repository_def=defs.get_repository_def(),
        )
        return list(landing_sensor(context).run_requests)

    requests = {r.job_name: r for r in tick()}
    assert set(requests) == {"daily_summaries_job", "document_embeddings_job"}
    request = requests["document_embeddings_job"]
    assert request.partition_key == DAY and request.tags["nightshift/dataset"] == "documents"
    # What the daemon launches for this request: the job's assets, for its partition and tags.
    job = defs.resolve_job_def(request.job_name)
    selected = {k.to_user_string() for k in job.asset_layer.selected_asset_keys}
    assert selected == {"documents", "document_embeddings"}
    result = materialize(
        [documents, document_embeddings],
        partition_key=request.partition_key,
        tags=request.tags,
        resources=resources,
        instance=instance,
    )
    assert result.success
    embedded = store.read_output("document_embeddings", DAY)
    assert embedded.num_rows == store.count_landing("documents", DAY, DOCUMENTS_SCHEMA) > 0
    assert [r.job_name for r in tick()] == ["daily_summaries_job"]

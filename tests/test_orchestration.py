"""Definitions load; every environment's resources build; schedules and the landing sensor evaluate."""

from __future__ import annotations

import datetime as dt
import json

import pytest
import torch
from dagster import DagsterInstance, build_schedule_context, build_sensor_context

from orchestration.definitions import build_definitions, defs
from orchestration.jobs import LANDING_TRIGGERS, PIPELINES
from orchestration.resources import ENVIRONMENTS, build_resources
from orchestration.sensors import (
    DEFAULT_LANDING_SENSOR_INTERVAL_S,
    LANDING_SENSOR_INTERVAL_ENV,
    landing_sensor,
    landing_sensor_interval_from,
)
from resources.storage import StorageResource

CONTRACT_ASSETS = {
    "transactions",
    "fraud_model",
    "fraud_scores",
    "fraud_alerts",
    "interactions",
    "recommendation_model",
    "user_recommendations",
    "documents",
    "document_summaries",
    "daily_digest",
    "document_embeddings",
}


def test_definitions_load_with_every_contract_asset() -> None:
    repo = defs.get_repository_def()
    keys = {k.to_user_string() for k in repo.asset_graph.get_all_asset_keys()}
    assert CONTRACT_ASSETS <= keys
    for job in [*PIPELINES, "fraud_training_job", "recommendations_training_job"]:
        assert defs.resolve_job_def(job) is not None
    assert {s.name for s in repo.schedule_defs} == {
        *(f"{j}_schedule" for j in PIPELINES),
        "outputs_upkeep_job_schedule",
    }
    assert {s.name for s in repo.sensor_defs} == {
        "landing_sensor",
        "run_failure_sensor",
        "automation_condition_sensor",
        "rescore_stale_sensor",
        "stale_days_sensor",
    }


@pytest.mark.parametrize("env", ENVIRONMENTS)
def test_every_environment_builds(env: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NIGHTSHIFT_DATA_ROOT", "s3://bucket/prefix")
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    resources = build_resources(env)
    assert set(resources) == {"storage", "inference", "serving"}
    build_definitions(env).get_repository_def().get_all_jobs()


def test_text_batch_budget_is_sized_to_the_device_unless_set(monkeypatch) -> None:
    from inference.text.workers import CPU_BATCH_TOKENS, GPU_BATCH_TOKENS
    from resources.inference import InferenceResource

    assert InferenceResource(device="cpu").batch_tokens == CPU_BATCH_TOKENS == 2_048
    assert InferenceResource(device="cpu", max_batch_tokens=512).batch_tokens == 512
    monkeypatch.setenv("NIGHTSHIFT_MAX_BATCH_TOKENS", "4096")
    assert build_resources("local")["inference"].batch_tokens == 4_096
    if torch.cuda.is_available():
        assert InferenceResource(device="cuda").batch_tokens == GPU_BATCH_TOKENS


def test_unknown_environment_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="unknown NIGHTSHIFT_ENV 'prod'"):
        build_resources("prod")


@pytest.mark.parametrize(
    ("job", "hour"),
    [
        ("fraud_scoring_job", 2),
        ("recommendations_job", 3),
        ("daily_summaries_job", 5),
        ("document_embeddings_job", 6),
    ],
)
def test_schedules_request_the_day_that_just_ended(job: str, hour: int) -> None:
    schedule = defs.get_repository_def().get_schedule_def(f"{job}_schedule")
    assert schedule.cron_schedule == f"0 {hour} * * *"
    when = dt.datetime(2026, 3, 5, hour, 0, tzinfo=dt.UTC)
    with DagsterInstance.ephemeral() as instance:
        context = build_schedule_context(instance=instance, scheduled_execution_time=when)
        requests = schedule.evaluate_tick(context).run_requests
    assert [r.partition_key for r in requests] == ["2026-03-04"]


def _sensor_tick(cursor: str | None, data_root: str):
    with DagsterInstance.ephemeral() as instance:
        context = build_sensor_context(
            instance=instance,
            cursor=cursor,
            resources={"storage": StorageResource(data_root=data_root)},
            repository_def=defs.get_repository_def(),
        )
        return landing_sensor(context)


@pytest.mark.parametrize(
    ("setting", "seconds"),
    [
        (None, DEFAULT_LANDING_SENSOR_INTERVAL_S),
        ("", DEFAULT_LANDING_SENSOR_INTERVAL_S),
        ("15", 15),
    ],
)
def test_landing_sensor_interval_is_the_default_unless_set(setting, seconds) -> None:
    assert landing_sensor_interval_from(setting) == seconds


@pytest.mark.parametrize("setting", ["0", "-5", "soon", "2.5"])
def test_a_bad_landing_sensor_interval_names_the_variable(setting: str) -> None:
    with pytest.raises(ValueError, match=LANDING_SENSOR_INTERVAL_ENV):
        landing_sensor_interval_from(setting)


def test_landing_sensor_launches_each_new_partition_once(store, data_root) -> None:
    import pyarrow as pa

    today = dt.datetime.now(dt.UTC).date()
    days = [(today - dt.timedelta(days=n)).isoformat() for n in (2, 1, 0)]
    for day in days:
        store.write_landing("transactions", day, pa.table({"x": [1]}))
    store.write_landing("documents", days[1], pa.table({"x": [1]}))

    first = _sensor_tick(None, str(data_root))
    launched = sorted((r.job_name, r.partition_key, r.run_key) for r in first.run_requests)
    # Today's folder is not a partition until the day is over. The run key carries the job and
    # the files' fingerprint, so changed files get a run of their own. New documents get their
    # summaries and their embeddings.
    fp = store.landing_fingerprint
    docs, fraud = f"documents:{days[1]}:{fp('documents', days[1])}", "fraud_scoring_job"
    assert launched == [
        ("daily_summaries_job", days[1], f"daily_summaries_job:{docs}"),
        ("document_embeddings_job", days[1], f"document_embeddings_job:{docs}"),
        (fraud, days[0], f"{fraud}:transactions:{days[0]}:{fp('transactions', days[0])}"),
        (fraud, days[1], f"{fraud}:transactions:{days[1]}:{fp('transactions', days[1])}"),
    ]
    assert set(json.loads(first.cursor)) == set(LANDING_TRIGGERS)

    second = _sensor_tick(first.cursor, str(data_root))
    assert not second.run_requests and second.skip_reason is not None

    store.write_landing("interactions", days[1], pa.table({"x": [1]}))
    third = _sensor_tick(second.cursor, str(data_root))
    assert [(r.job_name, r.partition_key) for r in third.run_requests] == [
        ("recommendations_job", days[1])
    ]


def test_landing_sensor_skips_days_a_run_already_read_until_their_files_change(
    store, data_root, resources, instance
) -> None:
    """Turned on over an instance with a day scored and a day failed on bad input, the sensor
    asks only for the day no run has read; a day is asked for again once its files change."""
    from dagster import materialize

    from assets.fraud import fraud_model, fraud_scores, transactions
    from assets.fraud.demo_data import generate_day
    from assets.fraud.schemas import TRANSACTIONS, TRANSACTIONS_SCHEMA

    scored, failed, new = "2026-03-01", "2026-03-02", "2026-03-03"
    for day in (scored, failed, new):
        generate_day(store, day, scale=0.02, seed=0)
    pipeline = [transactions, fraud_model, fraud_scores]
    run = dict(resources=resources, instance=instance, raise_on_error=False)
    assert materialize(pipeline, partition_key=scored, **run).success
    good = store.read_landing(TRANSACTIONS, failed, TRANSACTIONS_SCHEMA)
    store.write_landing(TRANSACTIONS, failed, good.drop_columns(["amount"]))
    assert not materialize(pipeline, partition_key=failed, **run).success

    def tick(cursor: str | None) -> list[tuple[str, str]]:
        context = build_sensor_context(
            instance=instance,
            cursor=cursor,
            resources={"storage": StorageResource(data_root=str(data_root))},
            repository_def=defs.get_repository_def(),
        )
        result = landing_sensor(context)
        ticks.append(result.cursor)
        return [(r.partition_key, r.run_key) for r in result.run_requests]

    def key(day: str) -> str:
        fingerprint = store.landing_fingerprint(TRANSACTIONS, day)
        return f"fraud_scoring_job:{TRANSACTIONS}:{day}:{fingerprint}"

    ticks: list[str] = []
    assert tick(None) == [(new, key(new))]
    assert tick(ticks[-1]) == []
    # The failed day's files are fixed, and the scored day's are re-delivered: both again,
    # each with a new run key; the new day (requested, no run yet) is not asked for twice.
    failed_key, scored_key = key(failed), key(scored)
    store.write_landing(TRANSACTIONS, failed, good)
    generate_day(store, scored, scale=0.02, seed=1)
    assert tick(ticks[-1]) == [(scored, key(scored)), (failed, key(failed))]
    assert key(failed) != failed_key and key(scored) != scored_key
    # A lost cursor asks again only for what no run has read; the run key dedupes it.
    assert tick(None) == [(scored, key(scored)), (failed, key(failed)), (new, key(new))]


def test_landing_sensor_asks_each_job_for_documents_it_has_not_read(
    store, data_root, resources, instance
) -> None:
    """Documents read by the summaries only, then re-delivered and read by the embeddings job:
    one job's read does not count for the other, so the sensor asks for the day for each job
    that has not read these files."""
    from dagster import materialize

    from assets.documents.assets import documents
    from assets.documents.demo_data import generate_day
    from assets.embeddings import document_embeddings
    from assets.summaries.document_summaries import document_summaries

    day = "2026-03-01"
    generate_day(store, day, scale=0.02)
    run = dict(partition_key=day, resources=resources, instance=instance)
    assert materialize([documents, document_summaries], **run).success

    def requested() -> list[tuple[str, str]]:
        context = build_sensor_context(
            instance=instance,
            resources={"storage": StorageResource(data_root=str(data_root))},
            repository_def=defs.get_repository_def(),
        )
        return [(r.job_name, r.partition_key) for r in landing_sensor(context).run_requests]

    # The summaries read these files; the embeddings did not.
    assert requested() == [("document_embeddings_job", day)]
    generate_day(store, day, scale=0.02, seed=1)  # re-delivered
    assert materialize([documents, document_embeddings], **run).success
    assert requested() == [("daily_summaries_job", day)]
    assert materialize([documents, document_summaries], **run).success
    assert requested() == []


def _plain_strings(value, path: str = ""):
    if isinstance(value, dict):
        for key, inner in value.items():
            yield from _plain_strings(inner, f"{path}.{key}" if path else key)
    elif isinstance(value, list):
        for i, inner in enumerate(value):
            yield from _plain_strings(inner, f"{path}[{i}]")
    elif isinstance(value, str):
        yield path, value


@pytest.mark.parametrize("name", sorted(j.name for j in defs.jobs if not j.name.startswith("__")))
def test_the_launchpad_scaffold_reads_back_as_written(name: str) -> None:
    """The Launchpad fills every field with its default and reads what it shows as YAML: a
    default that YAML 1.1 reads as another type (``off`` as false, a date, a number) makes the
    scaffold invalid and Materialize stays disabled."""
    import yaml
    from dagster import validate_run_config

    from assets.dagster_private import launchpad_defaults

    job = defs.resolve_job_def(name)
    defaults = launchpad_defaults(job)
    misread = {
        path: yaml.safe_load(text)
        for path, text in _plain_strings(defaults)
        if text and yaml.safe_load(text) != text
    }
    assert misread == {}, f"{name}: defaults YAML reads as another type: {misread}"
    if name in {"fraud_training_job", "fraud_scoring_job", *PIPELINES}:
        validate_run_config(job, defaults)  # raises naming the field when invalid

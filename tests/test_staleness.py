"""Staleness by model version: stale days listed for every partition at once, shown per day,
re-scored within the window through real runs, and each day's point-in-time figures."""

from __future__ import annotations

import datetime as dt
import json
from types import SimpleNamespace

import pytest
from dagster import (
    AssetKey,
    AssetMaterialization,
    AssetRecordsFilter,
    DagsterInstance,
    DagsterRunStatus,
    Definitions,
    Failure,
    build_sensor_context,
)
from helpers import asset_metadata, building_world, copy_world, cpu_resources

from assets import fraud
from assets.day_metadata import day_figures, day_metadata
from assets.fraud.demo_data import generate_day
from assets.fraud.schemas import MODEL_NAME, SCORES
from assets.runner import point_in_time
from assets.staleness import (
    ON_DAY_CHOICE,
    ScoredDay,
    champion,
    load_chosen,
    model_choice,
    model_window,
    scored_days,
    stale_days,
    version_for_day,
    window,
)
from inference.models.modelstore import ModelNotFoundError, load_model, save_model
from inference.models.registry import promote
from orchestration.cli import main
from orchestration.jobs import pipeline_job
from orchestration.rescore import (
    TARGETS_BY_ASSET,
    last_window,
    rescore_stale_sensor,
    stale_days_sensor,
    stale_in,
)
from policy.partitions import daily_partitions
from policy.tags import (
    BACKFILL_PRIORITY,
    MODEL_CHOICE_TAG,
    PARTITION_RANGE_END_TAG,
    PARTITION_RANGE_START_TAG,
    PARTITION_TAG,
    STALE_VERSION_TAG,
)
from resources.storage import DataStore, StorageResource

SCALE = 0.02
FRAUD = TARGETS_BY_ASSET[SCORES]


def _record(instance: DagsterInstance, asset: str, date: str, version: str) -> None:
    """A scored day's materialisation as the runner lays it out, without scoring."""
    metadata = day_metadata({"dagster/row_count": 1, "model_version": version, "seconds": 0.1})
    instance.report_runless_asset_event(
        AssetMaterialization(asset, partition=date, metadata=metadata)
    )


def test_every_partition_is_read_at_once_and_the_latest_materialisation_wins(instance):
    dates = window("2026-06-30", 150)  # more than Dagster's 100-partition staleness limit
    for n, date in enumerate(dates):
        _record(instance, "scored", date, "v1" if n % 3 else "v0")
    for date in dates[-20:]:
        _record(instance, "scored", date, "v2")  # re-scored: the newer record counts
    days = scored_days(instance, "scored")
    assert set(days) == set(dates)
    per_day = {
        d: day_figures(latest_materialization_of(instance, "scored", d).metadata)["model_version"]
        for d in dates
    }
    assert {d: s.version for d, s in days.items()} == per_day
    assert {d: s.version for d, s in scored_days(instance, "scored", dates[:5]).items()} == {
        d: per_day[d] for d in dates[:5]
    }
    stale = stale_days(days, "v2")
    assert [s.date for s in stale] == sorted(dates[:-20], reverse=True)
    assert stale_days(days, "v2", dates[-25:]) == stale[:5]
    assert {s.scored_by for s in stale} == {"v0", "v1"}


def latest_materialization_of(instance: DagsterInstance, asset: str, date: str):
    records = instance.fetch_materializations(
        AssetRecordsFilter(asset_key=AssetKey(asset), asset_partitions=[date]), limit=1
    ).records
    return records[0].asset_materialization


def test_a_day_without_a_version_is_stale_and_a_day_never_scored_is_not():
    scored = {
        "2026-06-02": ScoredDay("2026-06-02", None, "r1", 0.0),
        "2026-06-03": ScoredDay("2026-06-03", "v2", "r2", 0.0),
    }
    assert [(s.date, s.scored_by) for s in stale_days(scored, "v2", window("2026-06-04", 3))] == [
        ("2026-06-02", None)
    ]
    with pytest.raises(ValueError, match="at least one day"):
        window("2026-06-04", 0)


def test_a_choice_other_than_the_two_fails_naming_the_tag():
    assert model_choice({}) == "champion"
    assert model_choice({MODEL_CHOICE_TAG: ON_DAY_CHOICE}) == ON_DAY_CHOICE
    with pytest.raises(Failure, match=r"nightshift/model_choice='latest'.*champion_on_day"):
        model_choice({MODEL_CHOICE_TAG: "latest"})


def _save_version(store: DataStore, base: str, through: str, note: str) -> str:
    """A new fraud model version: ``base``'s weights, a manifest recording another window."""
    stored = load_model(store.read_bytes, store.models_dir, MODEL_NAME, base)
    manifest = {k: v for k, v in stored.manifest.items() if k not in ("name", "version")}
    start = min(manifest["trained_on"]["dates"])
    manifest |= {"trained_window": {"from": start, "through": through}, "note": note}
    return save_model(store.write_bytes, store.models_dir, MODEL_NAME, stored.tensors, manifest)


def test_the_version_on_a_day_comes_from_the_alias_history(tmp_path):
    store = DataStore(str(tmp_path))
    folder = f"{store.models_dir}/{MODEL_NAME}"
    for version in ("v1", "v2"):
        store.write_bytes(f"{folder}/{version}/manifest.json", b"{}")
    history = [
        {"alias": "champion", "version": v, "at": at, "by": "test", "reason": "", "forced": False}
        for v, at in (("v1", "2026-06-01T09:00:00+00:00"), ("v2", "2026-06-10T09:00:00+00:00"))
    ]
    store.write_bytes(f"{folder}/aliases.json", json.dumps({"history": history}).encode())
    store.write_bytes(f"{folder}/CURRENT", b"v2")
    assert version_for_day(store, MODEL_NAME, "2026-06-05", "champion") == "v2"
    assert version_for_day(store, MODEL_NAME, "2026-06-05", ON_DAY_CHOICE) == "v1"
    assert version_for_day(store, MODEL_NAME, "2026-06-10", ON_DAY_CHOICE) == "v2"
    with pytest.raises(ModelNotFoundError, match="no champion on 2026-05-31"):
        version_for_day(store, MODEL_NAME, "2026-05-31", ON_DAY_CHOICE)


def _days_before(last: str, n: int) -> str:
    return (dt.date.fromisoformat(last) - dt.timedelta(days=n)).isoformat()


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> dict:
    """Four days of transactions: three at the end of the partitions, one 40 days before; a
    model trained on all four; the old day and the first two recent ones scored with it. Built
    once; each test runs on a copy (see ``scored_world``)."""
    base = tmp_path_factory.mktemp("staleness")
    store = DataStore(str(base / "data"))
    last = daily_partitions.get_last_partition_key()
    recent, old = window(last, 3), _days_before(last, 40)
    with building_world(base) as instance:
        for date in (old, *recent):
            generate_day(store, date, scale=SCALE, seed=0)
        job = _fraud_job(cpu_resources(store.root))
        for date in (old, *recent[:2]):
            assert job.execute_in_process(partition_key=date, instance=instance).success
    return {"base": base, "recent": recent, "old": old}


@pytest.fixture
def scored_world(pristine, data_root, dagster_home, request) -> dict:
    """A copy of ``pristine``'s data root and Dagster instance, the test's own, with the fraud
    job over the copy; the test's ``instance`` opens the copy."""
    copy_world(pristine["base"], data_root, dagster_home)
    request.getfixturevalue("instance")  # opened after the copy
    resources = cpu_resources(data_root)
    return {
        "store": DataStore(str(data_root)),
        "job": _fraud_job(resources),
        "recent": pristine["recent"],
        "old": pristine["old"],
        "resources": resources,
    }


def _fraud_job(resources: dict):
    """The fraud pipeline's job over ``resources``."""
    [pipeline] = fraud.wiring.pipelines
    defs = Definitions(
        assets=fraud.defs.assets,
        asset_checks=fraud.defs.asset_checks,
        jobs=[pipeline_job(pipeline)],
        resources=resources,
    )
    return defs.resolve_job_def(pipeline.job)


def _count(instance: DagsterInstance, asset: str, date: str) -> int:
    records = instance.fetch_materializations(
        AssetRecordsFilter(asset_key=AssetKey(asset), asset_partitions=[date]), limit=10
    ).records
    return len(records)


def test_a_promotion_makes_days_stale_and_rescore_redoes_exactly_those_in_the_window(
    scored_world, instance, capsys
):
    store, job, recent, old = (scored_world[k] for k in ("store", "job", "recent", "old"))
    v1 = champion(store, MODEL_NAME)
    # The model trained on all four days, the last of the partitions among them: the old day's
    # score came from a model that saw its future.
    old_day = day_figures(latest_materialization_of(instance, SCORES, old).metadata)
    assert old_day["trained_through"] == recent[-1] and old_day["trained_after_day"] is True
    assert old_day["model_choice"] == "champion"

    v2 = _save_version(store, v1, through=recent[-1], note="second version")
    promote(store.read_bytes, store.write_bytes, store.models_dir, MODEL_NAME, v2, by="test")
    assert champion(store, MODEL_NAME) == v2
    # The last day is scored by the new champion already: a re-score must leave it alone.
    assert job.execute_in_process(partition_key=recent[-1], instance=instance).success

    stale = stale_in(instance, store, FRAUD, None)
    assert [(s.date, s.scored_by) for s in stale] == [
        (recent[1], v1),
        (recent[0], v1),
        (old, v1),
    ]
    observed = stale_days_sensor(
        build_sensor_context(instance=instance, resources={"storage": _storage(store)})
    )
    marks = {e.partition: e.metadata for e in observed.asset_events}
    assert set(marks) == {recent[1], recent[0], old}
    assert {m["stale_since_version"].value for m in marks.values()} == {v2}
    assert {m["scored_by"].value for m in marks.values()} == {v1}

    assert main(["stale", SCORES, "--window", "30"]) == 0
    listing = capsys.readouterr().out
    assert f"{SCORES} ({MODEL_NAME}): 2 stale day(s)" in listing
    assert listing.index(recent[1]) < listing.index(recent[0]) and old not in listing

    before = {
        (a, d): _count(instance, a, d) for a in ("transactions", SCORES) for d in (old, *recent)
    }
    sensor_context = build_sensor_context(instance=instance, resources={"storage": _storage(store)})
    # A day that a run is scoring already (a backfill someone launched) is left to it.
    running = instance.create_run_for_job(
        job, tags={PARTITION_TAG: recent[1]}, status=DagsterRunStatus.STARTED
    )
    assert [r.partition_key for r in rescore_stale_sensor(sensor_context).run_requests] == [
        recent[0]
    ]
    instance.delete_run(running.run_id)
    span = {PARTITION_RANGE_START_TAG: recent[0], PARTITION_RANGE_END_TAG: recent[1]}
    ranged = instance.create_run_for_job(job, tags=span, status=DagsterRunStatus.STARTED)
    assert rescore_stale_sensor(sensor_context).run_requests == []
    instance.delete_run(ranged.run_id)
    requests = rescore_stale_sensor(sensor_context).run_requests
    assert [r.partition_key for r in requests] == [recent[1], recent[0]]
    for request in requests:
        assert request.tags[STALE_VERSION_TAG] == v1
        assert request.tags[MODEL_CHOICE_TAG] == "champion"
        assert BACKFILL_PRIORITY.items() <= request.tags.items()
        assert set(request.asset_selection) == {AssetKey(SCORES), AssetKey("fraud_alerts")}
        result = job.execute_in_process(
            partition_key=request.partition_key,
            tags=request.tags,
            asset_selection=request.asset_selection,
            instance=instance,
        )
        assert result.success
        figures = asset_metadata(result, SCORES)
        assert figures["model_version"] == v2 and figures["trained_through"] == recent[-1]
        assert figures["trained_after_day"] is True
        assert _count(instance, "fraud_alerts", request.partition_key) == 2

    after = scored_days(instance, SCORES)
    assert {d: after[d].version for d in (*recent, old)} == {**dict.fromkeys(recent, v2), old: v1}
    for date in recent[:2]:
        assert store.read_output(SCORES, date)["model_version"].unique().to_pylist() == [v2]
        assert _count(instance, SCORES, date) == before[(SCORES, date)] + 1
    for date in (old, recent[-1]):
        assert _count(instance, SCORES, date) == before[(SCORES, date)]
    assert all(_count(instance, "transactions", d) == before[("transactions", d)] for d in recent)
    assert stale_in(instance, store, FRAUD, last_window()) == []
    assert rescore_stale_sensor(sensor_context).run_requests == []


def test_a_run_with_an_unknown_model_choice_fails_before_scoring(scored_world, instance):
    job, day = scored_world["job"], scored_world["recent"][-1]
    result = job.execute_in_process(
        partition_key=day,
        tags={MODEL_CHOICE_TAG: "newest"},
        instance=instance,
        raise_on_error=False,
    )
    assert not result.success
    [failure] = result.get_step_failure_events()
    assert "nightshift/model_choice='newest'" in failure.step_failure_data.error.message
    assert _count(instance, SCORES, day) == 0


def _storage(store: DataStore) -> StorageResource:
    return StorageResource(data_root=store.root)


def test_point_in_time_is_absent_for_a_version_the_store_does_not_hold(tmp_path):
    store = DataStore(str(tmp_path))
    window = model_window(store, "packaged-encoder-1")
    assert point_in_time(window, "2026-06-01", "champion") == {"model_choice": "champion"}


def _champions_since(store: DataStore, changes: list[tuple[str, str]]) -> None:
    """An alias history in which each (version, date) became champion at the start of date."""
    history = [
        {"alias": "champion", "version": v, "at": f"{d}T00:00:00+00:00", "by": "test"}
        | {"reason": "", "forced": False}
        for v, d in changes
    ]
    body = json.dumps({"name": MODEL_NAME, "history": history}).encode()
    store.write_bytes(f"{store.models_dir}/{MODEL_NAME}/aliases.json", body)


def test_a_backfill_can_score_with_the_champion_of_each_day(scored_world, instance):
    store, job, recent, old = (scored_world[k] for k in ("store", "job", "recent", "old"))
    v1 = champion(store, MODEL_NAME)
    v2 = _save_version(store, v1, through=recent[-1], note="second version")
    promote(store.read_bytes, store.write_bytes, store.models_dir, MODEL_NAME, v2, by="test")
    _champions_since(store, [(v1, old), (v2, recent[1])])
    on_day = {MODEL_CHOICE_TAG: ON_DAY_CHOICE}

    result = job.execute_in_process(partition_key=recent[0], tags=on_day, instance=instance)
    assert result.success
    figures = asset_metadata(result, SCORES)
    assert (figures["model_version"], figures["model_choice"]) == (v1, ON_DAY_CHOICE)
    assert store.read_output(SCORES, recent[0])["model_version"].unique().to_pylist() == [v1]
    # Scored by the version of its day on purpose, it is still not on the champion.
    assert [s.date for s in stale_in(instance, store, FRAUD, [recent[0]])] == [recent[0]]

    result = job.execute_in_process(partition_key=recent[1], tags=on_day, instance=instance)
    assert asset_metadata(result, SCORES)["model_version"] == v2

    across = {
        **on_day,
        "dagster/asset_partition_range_start": recent[0],
        "dagster/asset_partition_range_end": recent[1],
    }
    result = job.execute_in_process(tags=across, instance=instance, raise_on_error=False)
    assert not result.success
    message = "\n".join(e.step_failure_data.error.message for e in result.get_step_failure_events())
    assert f"{v1}: {recent[0]}; {v2}: {recent[1]}" in message and "one run per version" in message

    _champions_since(store, [(v2, recent[1])])  # a history that starts after the day
    result = job.execute_in_process(
        partition_key=recent[0], tags=on_day, instance=instance, raise_on_error=False
    )
    assert not result.success
    [failure] = [e for e in result.get_step_failure_events() if e.step_key == SCORES]
    assert f"had no champion on {recent[0]}" in failure.step_failure_data.error.message


def test_champion_on_day_is_refused_where_it_cannot_be_honoured(tmp_path):
    store = DataStore(str(tmp_path))
    on_day, dates = {MODEL_CHOICE_TAG: ON_DAY_CHOICE}, ["2026-06-01"]

    def packaged(store, inference, config):
        return SimpleNamespace(version="encoder-1")

    def champion_only(store, inference, config):
        return SimpleNamespace(version="v1")

    assert load_chosen(packaged, store, None, None, {}, dates)[1] == "champion"
    with pytest.raises(Failure, match="encoder-1 is not a version of the model store"):
        load_chosen(packaged, store, None, None, on_day, dates)
    manifest = json.dumps({"name": MODEL_NAME, "version": "v1"}).encode()
    store.write_bytes(f"{store.models_dir}/{MODEL_NAME}/v1/manifest.json", manifest)
    with pytest.raises(Failure, match="champion_only loads only the champion"):
        load_chosen(champion_only, store, None, None, on_day, dates)


def test_stale_names_the_assets_it_can_list(capsys):
    with pytest.raises(SystemExit) as exit_status:
        main(["stale", "document_summaries"])
    assert exit_status.value.code == 2
    assert "fraud_scores, user_recommendations" in capsys.readouterr().err

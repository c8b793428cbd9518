"""Shadow scoring through the real jobs: the challenger scores the night beside the champion into
outputs/<asset>_shadow/, its agreement is recorded, it never reaches alerts or the digest, it
never fails the champion's run, and a gate requiring clean nights waits for them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow.compute as pc
import pytest
from dagster import AssetKey, DagsterInstance, Failure, materialize
from helpers import asset_metadata, building_world, copy_world, cpu_inference, run_job

from assets.fraud.demo_data import generate_day
from assets.fraud.schemas import ALERTS, FLAGGED, MODEL_NAME, SCORES
from assets.shadow.asset import (
    AGREES_CHECK,
    SHADOW_ENV,
    ShadowConfig,
    shadow_enabled,
    shadow_name,
)
from assets.shadow.nights import nights_verdict, record_night, shadow_nights
from inference.models.registry import challenger_version, champion_version
from inference.models.shadow_nights import ShadowNight
from orchestration.definitions import defs
from orchestration.promotion import CLEAN_NIGHTS_ENV, GATE_CHECK, PROMOTE_JOB
from resources.storage import DataStore, StorageResource

SCALE = 0.02
HISTORY = [f"2026-03-{d:02d}" for d in range(1, 11)]
NIGHTS = ["2026-03-11", "2026-03-12"]
SHADOW = shadow_name(SCORES)


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> tuple[Path, str, str]:
    """A champion trained on one day, and a challenger trained on the whole history that
    measures better but waits: the gate requires two clean shadow nights. Built once; each test
    runs on a copy of it (see ``world``)."""
    base = tmp_path_factory.mktemp("shadow")
    with building_world(base) as instance, pytest.MonkeyPatch.context() as env:
        env.setenv(CLEAN_NIGHTS_ENV, "2")
        champion, challenger = _train_champion_and_challenger(
            DataStore(str(base / "data")), instance
        )
    return base, champion, challenger


def _train_champion_and_challenger(store: DataStore, instance: DagsterInstance) -> tuple[str, str]:
    """Lands the history and the nights, trains both versions; returns their names."""
    for day in HISTORY:
        generate_day(store, day, scale=SCALE)
    assert _retrain(instance, history_days=1).success
    for day in NIGHTS:
        generate_day(store, day, scale=SCALE)
    trained = _retrain(instance)
    assert not trained.success
    [gate] = [c for c in trained.get_asset_check_evaluations() if c.check_name == GATE_CHECK]
    figures = {k: v.value for k, v in gate.metadata.items()}
    # Better on every metric: only the missing nights keep it waiting.
    assert figures["margin_auprc"] > 0 and figures["clean_nights"] == 0
    assert (
        "0 of 2 clean shadow nights" in gate.description and "2 nights missing" in gate.description
    )
    champion = champion_version(store.read_bytes, store.models_dir, MODEL_NAME)
    challenger = challenger_version(store.read_bytes, store.models_dir, MODEL_NAME)
    assert challenger is not None and challenger != champion
    return champion, challenger


@pytest.fixture
def world(
    pristine, data_root: Path, dagster_home: Path, request, monkeypatch
) -> tuple[DataStore, str, str]:
    """A copy of ``pristine``'s data root and Dagster instance, the test's own; the test's
    ``instance`` opens the copy."""
    base, champion, challenger = pristine
    copy_world(base, data_root, dagster_home)
    monkeypatch.setenv(CLEAN_NIGHTS_ENV, "2")
    request.getfixturevalue("instance")  # opened after the copy
    return DataStore(str(data_root)), champion, challenger


def _retrain(instance: DagsterInstance, **settings):
    config = {"retrain": True, **settings}
    return run_job("fraud_training_job", instance, {"ops": {MODEL_NAME: {"config": config}}})


def _score(instance: DagsterInstance, day: str, monkeypatch, shadow: bool):
    monkeypatch.setenv(SHADOW_ENV, "1" if shadow else "0")
    result = run_job("fraud_scoring_job", instance, day=day)
    assert result.success
    return result


def _promote(instance: DagsterInstance):
    config = {"ops": {"promote_model": {"config": {"model": MODEL_NAME}}}}
    return run_job(PROMOTE_JOB, instance, config)


def _materialised(result, asset: str) -> bool:
    return any(e.asset_key == AssetKey(asset) for e in result.get_asset_materialization_events())


def _logged(instance: DagsterInstance, result) -> str:
    return "\n".join(e.user_message for e in instance.all_logs(result.run_id))


def _psi(expected: np.ndarray, actual: np.ndarray) -> float:
    """PSI over 20 equal bins of [0, 1], empty bins floored at 1e-4, written out by hand."""
    e, a = (np.histogram(x, bins=20, range=(0.0, 1.0))[0] for x in (expected, actual))
    e, a = (np.maximum(h / h.sum(), 1e-4) for h in (e, a))
    return float(np.sum((a - e) * np.log(a / e)))


def test_the_challenger_scores_the_night_in_the_shadow_and_its_agreement_is_recorded(
    world, instance, monkeypatch
) -> None:
    store, champion, challenger = world
    day = NIGHTS[0]

    result = _score(instance, day, monkeypatch, shadow=True)

    ours, theirs = store.read_output(SHADOW, day), store.read_output(SCORES, day)
    assert set(pc.unique(ours["model_version"]).to_pylist()) == {challenger}
    assert set(pc.unique(theirs["model_version"]).to_pylist()) == {champion}
    assert sorted(ours["transaction_id"].to_pylist()) == sorted(
        theirs["transaction_id"].to_pylist()
    )
    # The challenger's flagged details went to its own side output; alerts read the champion's.
    assert set(
        pc.unique(store.read_output(f"{FLAGGED}_shadow", day)["model_version"]).to_pylist()
    ) == {challenger}
    assert set(pc.unique(store.read_output(ALERTS, day)["model_version"]).to_pylist()) == {champion}

    recorded = asset_metadata(result, SHADOW)
    flagged = [
        set(pc.filter(t["transaction_id"], t["flagged"]).to_pylist()) for t in (theirs, ours)
    ]
    both, either = flagged[0] & flagged[1], flagged[0] | flagged[1]
    assert recorded["model_version"] == challenger and recorded["champion_version"] == champion
    # It compared against the champion's day at the snapshots fraud_scores handed on.
    assert recorded["read_snapshots"] == asset_metadata(result, SCORES)["table_snapshots"]
    assert recorded["flagged_champion"] == len(flagged[0]) > 0
    assert recorded["flagged_challenger"] == len(flagged[1]) > 0
    assert recorded["flagged_both"] == len(both)
    assert recorded["flagged_jaccard"] == pytest.approx(len(both) / len(either), abs=1e-6)
    scores = [t["score"].to_numpy().astype(np.float64) for t in (theirs, ours)]
    assert recorded["score_psi"] == pytest.approx(_psi(*scores), abs=1e-6)
    assert recorded["rows_unmatched"] == 0
    clean = recorded["flagged_jaccard"] >= 0.5 and recorded["score_psi"] <= 0.25
    assert recorded["clean"] is clean
    [check] = [c for c in result.get_asset_check_evaluations() if c.check_name == AGREES_CHECK]
    assert (check.asset_key, check.partition, check.passed) == (AssetKey(SHADOW), day, clean)
    [night] = shadow_nights(store, MODEL_NAME, challenger)
    assert (night.date, night.champion, night.clean) == (day, champion, clean)
    assert night.figures["flagged_jaccard"] == recorded["flagged_jaccard"]


def test_the_shadow_skips_when_off_or_without_a_challenger(world, instance, monkeypatch) -> None:
    store, champion, challenger = world

    off = _score(instance, NIGHTS[0], monkeypatch, shadow=False)
    assert not _materialised(off, SHADOW) and _materialised(off, ALERTS)
    assert f"{SHADOW}: not shadow-scored: shadow scoring is off" in _logged(instance, off)
    assert not store.output_exists(SHADOW, NIGHTS[0])

    forced = run_job(
        PROMOTE_JOB,
        instance,
        {"ops": {"promote_model": {"config": {"model": MODEL_NAME, "force": True, "reason": "t"}}}},
    )
    assert (
        forced.success
        and challenger_version(store.read_bytes, store.models_dir, MODEL_NAME) is None
    )
    alone = _score(instance, NIGHTS[0], monkeypatch, shadow=True)
    assert not _materialised(alone, SHADOW) and _materialised(alone, ALERTS)
    assert f"{MODEL_NAME} has no challenger waiting for promotion" in _logged(instance, alone)
    assert not store.output_exists(SHADOW, NIGHTS[0])
    assert shadow_nights(store, MODEL_NAME, challenger) == []


def test_shadow_outputs_never_reach_alerts_or_the_digest(world, instance, monkeypatch) -> None:
    store, _, _ = world
    graph = defs.get_repository_def().asset_graph
    shadows = {k for k in graph.get_all_asset_keys() if k.to_user_string().endswith("_shadow")}
    assert shadows == {AssetKey(SHADOW), AssetKey("user_recommendations_shadow")}
    for key in shadows:
        assert graph.get(key).child_keys == set()
    for consumer in (ALERTS, "daily_digest"):
        assert not _ancestors(graph, AssetKey(consumer)) & shadows

    _score(instance, NIGHTS[0], monkeypatch, shadow=False)
    without = store.read_output(ALERTS, NIGHTS[0])
    shadowed = _score(instance, NIGHTS[0], monkeypatch, shadow=True)
    assert _materialised(shadowed, SHADOW)
    with_shadow = store.read_output(ALERTS, NIGHTS[0])

    assert with_shadow.num_rows > 0
    assert with_shadow.sort_by("transaction_id").equals(without.sort_by("transaction_id"))


def test_a_failing_shadow_never_fails_the_champion(world, instance, monkeypatch) -> None:
    store, champion, challenger = world
    weights = Path(store.models_dir) / MODEL_NAME / challenger / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-64])

    result = _score(instance, NIGHTS[0], monkeypatch, shadow=True)

    assert _materialised(result, SCORES) and _materialised(result, ALERTS)
    assert not _materialised(result, SHADOW)
    errors = [
        e.user_message
        for e in instance.all_logs(result.run_id)
        if e.level >= 40 and e.step_key == SHADOW  # logging.ERROR
    ]
    assert any(f"challenger {challenger} failed to shadow-score" in m for m in errors)
    [night] = shadow_nights(store, MODEL_NAME, challenger)
    assert night.date == NIGHTS[0] and not night.clean and night.error
    observed = instance.fetch_observations(AssetKey(SHADOW), limit=1).records
    assert observed and observed[0].asset_observation.metadata["shadow_error"].value == night.error
    assert champion_version(store.read_bytes, store.models_dir, MODEL_NAME) == champion


def test_a_gate_requiring_two_clean_nights_promotes_after_the_second(
    world, instance, monkeypatch
) -> None:
    store, champion, challenger = world

    _score(instance, NIGHTS[0], monkeypatch, shadow=True)
    after_one = _promote(instance)

    assert not after_one.success
    [failure] = after_one.get_step_failure_events()
    message = failure.step_failure_data.error.message
    assert "1 of 2 clean shadow nights" in message and f"{NIGHTS[0]} clean" in message
    assert "1 night missing" in message and f"{challenger} stays challenger" in message
    assert champion_version(store.read_bytes, store.models_dir, MODEL_NAME) == champion

    _score(instance, NIGHTS[1], monkeypatch, shadow=True)
    after_two = _promote(instance)

    assert after_two.success
    assert champion_version(store.read_bytes, store.models_dir, MODEL_NAME) == challenger
    assert [n.date for n in shadow_nights(store, MODEL_NAME, challenger) if n.clean] == NIGHTS
    # Promoted: the next night has no challenger to shadow, and scores with the new champion.
    night = _score(instance, NIGHTS[1], monkeypatch, shadow=True)
    assert not _materialised(night, SHADOW)
    assert set(pc.unique(store.read_output(SCORES, NIGHTS[1])["model_version"]).to_pylist()) == {
        challenger
    }


def test_a_rescore_never_selects_the_shadow() -> None:
    from orchestration.rescore import TARGETS

    for target in TARGETS:
        assert not [a for a in target.selection if a.endswith("_shadow")]


def _ancestors(graph, key: AssetKey) -> set[AssetKey]:
    """Every asset ``key`` reads, directly or not."""
    found, frontier = set(), {key}
    while frontier:
        frontier = {p for k in frontier for p in graph.get(k).parent_keys} - found
        found |= frontier
    return found


def test_nights_are_recorded_replaced_and_judged_on_local_and_s3(any_store: DataStore) -> None:
    def night(date: str, champion: str = "c1", breaches=(), error=None) -> ShadowNight:
        figures = {"flagged_jaccard": 0.4 if breaches else 0.9}
        return ShadowNight(date, SHADOW, "v2", champion, figures, list(breaches), error)

    assert shadow_nights(any_store, MODEL_NAME, "v2") == []
    record_night(any_store, MODEL_NAME, night("2026-03-11", breaches=["flagged_jaccard 0.4 < 0.5"]))
    record_night(any_store, MODEL_NAME, night("2026-03-12", champion="c0"))
    record_night(any_store, MODEL_NAME, night("2026-03-13", error="ModelUnusableError: torn"))

    blocked = nights_verdict(any_store, MODEL_NAME, "v2", "c1", 2)
    assert not blocked.passed and blocked.clean == 0
    # The night against another champion does not count; each one that does is named.
    assert blocked.summary() == (
        "0 of 2 clean shadow nights against c1: 2026-03-11 not clean (flagged_jaccard 0.4 < "
        "0.5), 2026-03-13 not clean (failed: ModelUnusableError: torn)"
    )
    record_night(any_store, MODEL_NAME, night("2026-03-11"))  # the day re-run: replaced
    record_night(any_store, MODEL_NAME, night("2026-03-13"))
    assert [n.date for n in shadow_nights(any_store, MODEL_NAME, "v2")] == [
        "2026-03-11",
        "2026-03-12",
        "2026-03-13",
    ]
    assert nights_verdict(any_store, MODEL_NAME, "v2", "c1", 2).passed
    short = nights_verdict(any_store, MODEL_NAME, "v2", "c1", 3)
    assert not short.passed and "1 night missing" in short.summary()


def test_the_shadow_writes_through_the_storage_resource_on_local_and_s3(
    any_store: DataStore, instance: DagsterInstance
) -> None:
    from assets.fraud import fraud_alerts, fraud_model, fraud_scores, transactions
    from assets.fraud.shadow import fraud_scores_shadow

    for day in [*HISTORY[-3:], NIGHTS[0]]:
        generate_day(any_store, day, scale=SCALE)
    storage = StorageResource(
        data_root=any_store.root,
        s3_endpoint=any_store.s3_endpoint,
        s3_region=any_store.s3_region,
        catalog_uri=any_store.catalog_props.get("uri"),
    )
    resources = {"storage": storage, "inference": cpu_inference()}
    for history in (1, 3):  # the first version is champion, the second waits as challenger
        settings = {"retrain": True, "history_days": history, "epochs": 5}
        retrain = {"ops": {MODEL_NAME: {"config": settings}}}
        assert materialize(
            [fraud_model], resources=resources, run_config=retrain, instance=instance
        ).success
    challenger = challenger_version(any_store.read_bytes, any_store.models_dir, MODEL_NAME)

    result = materialize(
        [transactions, fraud_scores, fraud_alerts, fraud_scores_shadow],
        resources=resources,
        partition_key=NIGHTS[0],
        run_config={"ops": {SHADOW: {"config": {"enabled": True}}}},
        instance=instance,
    )

    assert result.success
    shadowed = any_store.read_output(SHADOW, NIGHTS[0])
    assert any_store.uri(any_store.output_path(SHADOW, NIGHTS[0])).startswith(
        "s3://" if any_store.root.startswith("s3://") else "/"
    )
    assert set(pc.unique(shadowed["model_version"]).to_pylist()) == {challenger}
    assert shadowed.num_rows == any_store.read_output(SCORES, NIGHTS[0]).num_rows > 0
    [night] = shadow_nights(any_store, MODEL_NAME, challenger)
    assert night.date == NIGHTS[0] and night.figures["rows_unmatched"] == 0


@pytest.mark.parametrize(
    ("setting", "on"), [("1", True), ("true", True), ("", False), ("0", False)]
)
def test_the_setting_turns_the_shadow_on_and_a_run_config_overrides_it(
    setting: str, on: bool, monkeypatch
) -> None:
    monkeypatch.setenv(SHADOW_ENV, setting)
    assert shadow_enabled(ShadowConfig()) is on
    assert shadow_enabled(ShadowConfig(enabled=not on)) is (not on)


def test_an_unreadable_setting_fails_naming_it(monkeypatch) -> None:
    monkeypatch.setenv(SHADOW_ENV, "maybe")
    with pytest.raises(Failure, match=f"{SHADOW_ENV}='maybe'"):
        shadow_enabled(ShadowConfig())

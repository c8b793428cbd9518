"""The fraud promotion gate through the real jobs: bad retrains wait as challenger while the
champion keeps scoring, a better one is promoted, and `nightshift promote --force` is recorded."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from dagster import AssetKey, DagsterInstance, RunsFilter
from helpers import asset_metadata, building_world, copy_world, run_job, trained_and_promoted

from assets.fraud.assets import MIN_VALIDATION_AUPRC
from assets.fraud.demo_data import generate_day
from assets.fraud.schemas import LABELLED_SCHEMA, MODEL_NAME, TRANSACTIONS_LABELLED
from inference.models.registry import (
    CHALLENGER,
    CHAMPION,
    alias_history,
    challenger_version,
    champion_version,
)
from orchestration.promotion import GATE_CHECK, TAG_BY, TAG_FORCED, TAG_REASON
from resources.storage import DataStore

SCALE = 0.02
HISTORY = [f"2026-03-{d:02d}" for d in range(1, 11)]
# Labelled after the champion was trained: the days the gate compares on.
NEW_DAYS = ["2026-03-11", "2026-03-12"]


@pytest.fixture
def store(data_root: Path) -> DataStore:
    return DataStore(str(data_root))


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> tuple[Path, str]:
    """The history landed, a champion trained on all of it, then the gate's days landed. Built
    once; each test that starts from it runs on a copy (see ``champion``)."""
    base = tmp_path_factory.mktemp("promotion")
    with building_world(base) as instance:
        store = DataStore(str(base / "data"))
        _land(store, HISTORY)
        return base, _champion_from_history(store, instance)


@pytest.fixture
def champion(pristine, store: DataStore, dagster_home: Path, request) -> str:
    """The champion of a copy of ``pristine``, the test's own; its ``instance`` opens the copy."""
    base, champion = pristine
    copy_world(base, Path(store.root), dagster_home)
    request.getfixturevalue("instance")  # opened after the copy
    return champion


def _land(store: DataStore, days: list[str]) -> None:
    for day in days:
        generate_day(store, day, scale=SCALE)


def _retrain(instance: DagsterInstance, **settings):
    config = {"retrain": True, **settings}
    return run_job("fraud_training_job", instance, {"ops": {MODEL_NAME: {"config": config}}})


def _champion_from_history(store: DataStore, instance: DagsterInstance, **settings) -> str:
    """The first version, trained on the history, then the gate's days land."""
    assert _retrain(instance, **settings).success
    _land(store, NEW_DAYS)
    return champion_version(store.read_bytes, store.models_dir, MODEL_NAME)


def _gate(result) -> dict:
    [gate] = [c for c in result.get_asset_check_evaluations() if c.check_name == GATE_CHECK]
    return {"passed": gate.passed, **{k: v.value for k, v in gate.metadata.items()}}


def _relabel(store: DataStore, relabel) -> None:
    """Rewrites the history's labels, as a bad label export would land them."""
    rng = np.random.default_rng(0)
    for day in HISTORY:
        table = store.read_landing(TRANSACTIONS_LABELLED, day, LABELLED_SCHEMA)
        labels = relabel(table["is_fraud"].to_numpy().copy(), rng)
        column = table.schema.get_field_index("is_fraud")
        labelled = table.set_column(column, table.schema.field(column), pa.array(labels))
        store.write_landing(TRANSACTIONS_LABELLED, day, labelled)


def _noisy(labels: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """A tenth of the frauds labelled genuine, and as many genuine ones labelled fraud."""
    fraud, genuine = np.flatnonzero(labels == 1), np.flatnonzero(labels == 0)
    flips = len(fraud) // 10
    labels[rng.choice(fraud, flips, replace=False)] = 0
    labels[rng.choice(genuine, flips, replace=False)] = 1
    return labels


def _scored_by(store: DataStore, instance: DagsterInstance, day: str) -> set[str]:
    assert run_job("fraud_scoring_job", instance, day=day).success
    return set(pc.unique(store.read_output("fraud_scores", day)["model_version"]).to_pylist())


def _assert_blocked(store: DataStore, instance: DagsterInstance, result, champion: str) -> dict:
    """The retrain's run fails on the gate naming both figures; the champion keeps scoring."""
    assert not result.success
    gate = _gate(result)
    challenger = asset_metadata(result, MODEL_NAME)["model_version"]
    assert gate["passed"] is False and gate["promoted"] is False
    assert gate["challenger"] == challenger and gate["champion"] == champion
    assert gate["evaluation_days"] == ", ".join(NEW_DAYS)
    assert gate["margin_auprc"] < -gate["tolerance_auprc"]
    description = next(
        c.description for c in result.get_asset_check_evaluations() if c.check_name == GATE_CHECK
    )
    for figure in (gate["challenger_auprc"], gate["champion_auprc"]):
        assert f"{figure:.4f}" in description
    assert champion_version(store.read_bytes, store.models_dir, MODEL_NAME) == champion
    assert challenger_version(store.read_bytes, store.models_dir, MODEL_NAME) == challenger
    # The next nightly run scores, with the champion.
    assert _scored_by(store, instance, NEW_DAYS[-1]) == {champion}
    return gate


def test_a_retrain_on_shuffled_labels_waits_as_challenger(champion, store, instance) -> None:
    _relabel(store, lambda labels, rng: rng.permutation(labels))

    gate = _assert_blocked(store, instance, _retrain(instance), champion)

    assert gate["challenger_auprc"] < 0.2 < MIN_VALIDATION_AUPRC < gate["champion_auprc"]


def test_a_worse_retrain_above_the_floor_waits_as_challenger(champion, store, instance) -> None:
    _relabel(store, _noisy)

    result = _retrain(instance, history_days=len(HISTORY) // 10)

    trained = asset_metadata(result, MODEL_NAME)
    # Every check but the gate would let it through: its own validation clears the floor.
    assert trained["training_days"] == 1 and trained["val_auprc"] >= MIN_VALIDATION_AUPRC
    others = [c for c in result.get_asset_check_evaluations() if c.check_name != GATE_CHECK]
    assert others and all(c.passed for c in others)
    gate = _assert_blocked(store, instance, result, champion)
    assert gate["challenger_auprc"] >= MIN_VALIDATION_AUPRC


def test_a_retrain_on_more_history_is_promoted_and_scores(store, instance) -> None:
    _land(store, HISTORY)
    champion = _champion_from_history(store, instance, history_days=1)

    result = _retrain(instance)

    assert result.success
    gate = _gate(result)
    trained, promoted = trained_and_promoted(result, MODEL_NAME)
    assert promoted["promoted_by"] == f"run {result.run_id}" and not promoted["forced"]
    assert gate["passed"] is True and gate["promoted"] is True
    assert gate["champion"] == champion and gate["challenger"] == trained["model_version"]
    assert gate["margin_auprc"] > 0 and trained["training_days"] == len(HISTORY)
    # Trained before the days it was judged on, and recorded so.
    assert trained["trained_through"] == HISTORY[-1] < NEW_DAYS[0]
    new = champion_version(store.read_bytes, store.models_dir, MODEL_NAME)
    assert new == trained["model_version"] != champion
    assert challenger_version(store.read_bytes, store.models_dir, MODEL_NAME) is None
    moves = alias_history(store.read_bytes, store.models_dir, MODEL_NAME)
    assert [(m.alias, m.version) for m in moves] == [
        (CHAMPION, champion),
        (CHALLENGER, new),
        (CHAMPION, new),
        (CHALLENGER, None),
    ]
    assert moves[2].by == f"run {result.run_id}" and not moves[2].forced
    assert f"{gate['challenger_auprc']:.4f}" in moves[2].reason
    assert _scored_by(store, instance, NEW_DAYS[-1]) == {new}


def test_force_promotes_through_the_cli_and_records_who_and_why(
    champion, store, instance, dagster_home
) -> None:
    _relabel(store, _noisy)
    assert not _retrain(instance, history_days=1).success
    challenger = challenger_version(store.read_bytes, store.models_dir, MODEL_NAME)
    nightshift = Path(sys.executable).with_name("nightshift")
    env = {**os.environ, "DAGSTER_HOME": str(dagster_home)}

    refused = subprocess.run(
        [nightshift, "promote", MODEL_NAME], env=env, capture_output=True, text=True, timeout=300
    )
    unreasoned = subprocess.run(
        [nightshift, "promote", MODEL_NAME, "--force"], env=env, capture_output=True, text=True
    )
    reason = "labels re-exported; the new window is the one we trust"
    forced = subprocess.run(
        [nightshift, "promote", MODEL_NAME, "--force", "--reason", reason, "--by", "ana"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )

    # Without --force the gate judges it again and says why not, naming both figures.
    assert refused.returncode == 1, refused.stderr
    assert "stays challenger" in refused.stderr and f"champion {champion}" in refused.stderr
    assert unreasoned.returncode == 2 and "--reason" in unreasoned.stderr
    assert forced.returncode == 0, forced.stderr
    assert f"{challenger} is champion" in forced.stdout
    assert champion_version(store.read_bytes, store.models_dir, MODEL_NAME) == challenger
    last = [m for m in alias_history(store.read_bytes, store.models_dir, MODEL_NAME)
            if m.alias == CHAMPION][-1]  # fmt: skip
    assert (last.version, last.by, last.reason, last.forced) == (challenger, "ana", reason, True)
    with DagsterInstance.get() as recorded:
        runs = recorded.get_runs(RunsFilter(job_name="promote_model_job"))
    tags = [r.tags for r in runs if r.tags.get(TAG_FORCED) == "true"]
    assert tags == [{**tags[0], TAG_BY: "ana", TAG_REASON: reason}]


def test_a_damaged_champion_is_replaced_by_hand_as_the_fix_says(champion, store, instance) -> None:
    weights = Path(store.models_dir) / MODEL_NAME / champion / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-64])
    scoring = run_job("fraud_scoring_job", instance, day=NEW_DAYS[-1])
    assert not scoring.success
    [failure] = scoring.get_step_failure_events()
    assert "nightshift promote fraud_model --force" in failure.step_failure_data.error.message

    retrained = _retrain(instance)

    # It trained (there is no champion it could be compared with), and the gate says who decides.
    challenger = asset_metadata(retrained, MODEL_NAME)["model_version"]
    assert not retrained.success and _gate(retrained)["passed"] is False
    [gate] = [c for c in retrained.get_asset_check_evaluations() if c.check_name == GATE_CHECK]
    assert f"--version {challenger} --force" in gate.description
    # And the same fix for a person in the UI (issue 44: the fix was given for the CLI only).
    assert "launch promote_model_job" in gate.description
    assert f"{{model: fraud_model, version: {challenger}, force: true" in gate.description
    assert champion_version(store.read_bytes, store.models_dir, MODEL_NAME) == champion


def _status(instance: DagsterInstance, days: list[str]) -> list[tuple[str, list[str]]]:
    """Each day's status of fraud_scores and the root causes, as the UI's badge reads them
    (Dagster's own resolver over the project's asset graph)."""
    from dagster import AssetKey

    from assets.dagster_private import stale_status_resolver
    from orchestration.definitions import build_definitions

    resolver = stale_status_resolver(instance, build_definitions("local").resolve_asset_graph())
    key = AssetKey("fraud_scores")
    return [
        (
            resolver.get_status(key, day).value,
            [
                f"{c.key.asset_key.to_user_string()} {c.reason}"
                for c in resolver.get_stale_root_causes(key, day)
            ],
        )
        for day in days
    ]


def test_scored_days_stay_fresh_until_a_promotion_changes_their_model(
    champion, store, instance
) -> None:
    """The model asset's data version is its champion (assets/model_asset.py): nightly runs
    that reuse it and a retrain whose challenger waits leave the scored days fresh; a promotion
    marks them unsynced, naming the model, and the model's latest materialisation says who is
    champion."""
    for day in NEW_DAYS:  # two nights, each materialising the model again (reused)
        assert _scored_by(store, instance, day) == {champion}
    assert _status(instance, NEW_DAYS) == [("FRESH", [])] * 2

    _relabel(store, _noisy)
    assert not _retrain(instance, history_days=1).success  # the gate keeps it challenger
    challenger = challenger_version(store.read_bytes, store.models_dir, MODEL_NAME)
    assert challenger and challenger != champion
    assert _status(instance, NEW_DAYS) == [("FRESH", [])] * 2

    reason = "labels re-exported"
    config = {"model": MODEL_NAME, "force": True, "reason": reason, "by": "ana"}
    assert run_job("promote_model_job", instance, {"ops": {"promote_model": {"config": config}}})
    assert _status(instance, NEW_DAYS) == [("STALE", ["fraud_model has a new data version"])] * 2
    latest = instance.get_latest_materialization_event(AssetKey(MODEL_NAME)).asset_materialization
    shown = {k: v.value for k, v in latest.metadata.items()}
    assert shown["model_version"] == challenger and shown["alias"] == CHAMPION
    assert shown["promoted_by"] == "ana" and shown["reason"] == reason
    assert _scored_by(store, instance, NEW_DAYS[-1]) == {challenger}
    assert _status(instance, NEW_DAYS) == [
        ("STALE", ["fraud_model has a new data version"]),
        ("FRESH", []),
    ]

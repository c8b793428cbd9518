"""The recommendation model's promotion gate through the real jobs: P@10 and recall@10 of both
versions on the held-out days decide, and the nightly lists come from the champion."""

from __future__ import annotations

from pathlib import Path

import pyarrow.compute as pc
import pytest
from dagster import DagsterInstance
from helpers import asset_metadata, run_job, trained_and_promoted

from assets.recommendations.demo_data import generate_day
from assets.recommendations.schemas import RECOMMENDATION_MODEL, USER_RECOMMENDATIONS
from inference.models.registry import challenger_version, champion_version
from orchestration.promotion import GATE_CHECK
from resources.storage import DataStore

SCALE = 0.05  # 1,000 users x 250 items, ~2,000 events a day
HISTORY = [f"2026-03-{d:02d}" for d in range(1, 11)]
NEW_DAYS = ["2026-03-11", "2026-03-12"]
JOB = "recommendations_training_job"


@pytest.fixture
def store(data_root: Path) -> DataStore:
    return DataStore(str(data_root))


def _land(store: DataStore, days: list[str]) -> None:
    for day in days:
        generate_day(store, day, scale=SCALE, seed=0)


def _retrain(instance: DagsterInstance, **settings):
    config = {"ops": {RECOMMENDATION_MODEL: {"config": {"retrain": True, **settings}}}}
    return run_job(JOB, instance, config)


def _gate(result) -> tuple[dict, str]:
    [gate] = [c for c in result.get_asset_check_evaluations() if c.check_name == GATE_CHECK]
    return {k: v.value for k, v in gate.metadata.items()}, gate.description


def _champion(store: DataStore) -> str:
    return champion_version(store.read_bytes, store.models_dir, RECOMMENDATION_MODEL)


def _listed_by(store: DataStore, instance: DagsterInstance, day: str) -> set[str]:
    assert run_job("recommendations_job", instance, day=day).success
    lists = store.read_output(USER_RECOMMENDATIONS, day)
    return set(pc.unique(lists["model_version"]).to_pylist())


def test_a_worse_model_waits_and_the_champion_keeps_recommending(store, instance) -> None:
    _land(store, HISTORY)
    assert _retrain(instance).success
    champion = _champion(store)
    _land(store, NEW_DAYS)

    # A two-tower model of three short epochs: a real model, and a worse one than EASE.
    result = _retrain(instance, model="two_tower", dims=16, epochs=3)

    assert not result.success
    gate, description = _gate(result)
    challenger = asset_metadata(result, RECOMMENDATION_MODEL)["model_version"]
    assert (gate["challenger"], gate["champion"], gate["promoted"]) == (challenger, champion, False)
    assert gate["evaluation_days"] == ", ".join(NEW_DAYS)
    assert gate["margin_recall_at_10"] < -gate["tolerance_recall_at_10"]
    for k in ("precision_at_10", "recall_at_10"):
        assert f"{gate[f'challenger_{k}']:.4f}" in description
        assert f"{gate[f'champion_{k}']:.4f}" in description
    assert _champion(store) == champion
    assert (
        challenger_version(store.read_bytes, store.models_dir, RECOMMENDATION_MODEL) == challenger
    )
    assert _listed_by(store, instance, NEW_DAYS[-1]) == {champion}


def test_a_model_of_more_history_is_promoted(store, instance) -> None:
    _land(store, HISTORY[:1])
    assert _retrain(instance).success
    first = _champion(store)
    _land(store, [*HISTORY[1:], *NEW_DAYS])

    result = _retrain(instance)

    assert result.success
    gate, _ = _gate(result)
    trained, promoted = trained_and_promoted(result, RECOMMENDATION_MODEL)
    assert promoted["promoted_by"] == f"run {result.run_id}"
    assert gate["promoted"] is True and gate["champion"] == first
    assert gate["margin_recall_at_10"] > 0 and gate["margin_precision_at_10"] > 0
    # Fitted on the history only: the gate's days were held out of training.
    assert trained["trained_on"] == f"{HISTORY[0]}..{HISTORY[-1]} ({len(HISTORY)} days)"
    assert trained["holdout_date"] == NEW_DAYS[-1]
    assert _champion(store) == trained["model_version"] != first
    assert _listed_by(store, instance, NEW_DAYS[-1]) == {trained["model_version"]}

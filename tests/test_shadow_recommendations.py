"""Shadow scoring of the recommendations through the real job: the challenger ranks the day's
audience into user_recommendations_shadow, and the day records each user's top-K overlap with
the champion's list."""

from __future__ import annotations

from pathlib import Path

import pyarrow.compute as pc
import pytest
from dagster import AssetKey, DagsterInstance
from helpers import asset_metadata, run_job

from assets.recommendations.demo_data import generate_day
from assets.recommendations.schemas import RECOMMENDATION_MODEL, USER_RECOMMENDATIONS
from assets.recommendations.shadow import RECOMMENDATION_SHADOW_LIMITS
from assets.shadow.asset import AGREES_CHECK, SHADOW_ENV, shadow_name
from assets.shadow.nights import shadow_nights
from inference.models.agreement import breaches
from inference.models.registry import challenger_version, champion_version
from resources.storage import DataStore

SCALE = 0.05  # 1,000 users x 250 items, ~2,000 events a day
HISTORY = [f"2026-03-{d:02d}" for d in range(1, 11)]
NEW_DAYS = ["2026-03-11", "2026-03-12"]
SHADOW = shadow_name(USER_RECOMMENDATIONS)


def _retrain(instance: DagsterInstance, **settings):
    config = {"ops": {RECOMMENDATION_MODEL: {"config": {"retrain": True, **settings}}}}
    return run_job("recommendations_training_job", instance, config)


def _lists(table) -> dict[int, set]:
    lists: dict[int, set] = {}
    for user, item in zip(table["user_id"].to_pylist(), table["item_id"].to_pylist(), strict=True):
        lists.setdefault(user, set()).add(item)
    return lists


def test_the_challenger_ranks_the_audience_in_the_shadow_with_its_top_k_overlap(
    data_root: Path, instance: DagsterInstance, monkeypatch
) -> None:
    store = DataStore(str(data_root))
    for day in HISTORY:
        generate_day(store, day, scale=SCALE, seed=0)
    assert _retrain(instance).success
    for day in NEW_DAYS:
        generate_day(store, day, scale=SCALE, seed=0)
    # A two-tower model of a few short epochs: worse than EASE, it waits as challenger.
    assert not _retrain(instance, model="two_tower", dims=16, epochs=3).success
    champion = champion_version(store.read_bytes, store.models_dir, RECOMMENDATION_MODEL)
    challenger = challenger_version(store.read_bytes, store.models_dir, RECOMMENDATION_MODEL)
    day, k = NEW_DAYS[-1], 10
    monkeypatch.setenv(SHADOW_ENV, "1")

    config = {"ops": {USER_RECOMMENDATIONS: {"config": {"k": k}}}}
    result = run_job("recommendations_job", instance, config, day=day)

    assert result.success
    ours, theirs = store.read_output(SHADOW, day), store.read_output(USER_RECOMMENDATIONS, day)
    assert set(pc.unique(ours["model_version"]).to_pylist()) == {challenger}
    assert set(pc.unique(theirs["model_version"]).to_pylist()) == {champion}
    # The champion's settings of the run (k) are the shadow's.
    assert pc.max(ours["rank"]).as_py() == pc.max(theirs["rank"]).as_py() == k
    mine, its = _lists(ours), _lists(theirs)
    assert set(mine) == set(its)
    overlaps = [len(mine[u] & its[u]) / max(len(mine[u]), len(its[u])) for u in its]
    recorded = asset_metadata(result, SHADOW)
    assert recorded["users_champion"] == recorded["users_challenger"] == len(its)
    assert recorded["users_unmatched"] == 0
    assert recorded["mean_topk_overlap"] == pytest.approx(sum(overlaps) / len(overlaps), abs=1e-6)
    assert recorded["min_topk_overlap"] == pytest.approx(min(overlaps), abs=1e-6)
    assert recorded["users_no_overlap"] == sum(o == 0 for o in overlaps)
    clean = not breaches(recorded, RECOMMENDATION_SHADOW_LIMITS)
    assert recorded["clean"] is clean
    [check] = [c for c in result.get_asset_check_evaluations() if c.check_name == AGREES_CHECK]
    assert (check.asset_key, check.passed) == (AssetKey(SHADOW), clean)
    [night] = shadow_nights(store, RECOMMENDATION_MODEL, challenger)
    assert (night.date, night.champion, night.clean) == (day, champion, clean)

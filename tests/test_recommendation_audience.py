"""Recommendations for the whole audience: audience windows, quarantined interactions, the
unknown-item warning, EASE, and the evaluation harness on a synthetic log."""

from __future__ import annotations

from datetime import UTC, datetime

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
import torch
from dagster import RunConfig, materialize
from helpers import asset_metadata

from assets.recommendations import interactions, recommendation_model, user_recommendations
from assets.recommendations.assets import UserRecommendationsConfig
from assets.recommendations.demo_data import generate_day
from assets.recommendations.list_checks import list_check_results
from assets.recommendations.schemas import INTERACTIONS, INTERACTIONS_SCHEMA, USER_RECOMMENDATIONS
from evaluation.recommendations import evaluate, load_movielens, table
from inference.recs.ease import EaseConfig, fit_ease
from inference.recs.recommend import recommend
from inference.recs.sparse import SparseRows
from resources.storage import DataStore

OLD, RECENT, DAY = "2026-01-21", "2026-04-21", "2026-05-01"  # DAY - 100, DAY - 10, DAY
LONE_OLD, LONE_RECENT, LONE_TODAY = 9001, 9002, 9003


def _day(date: str, users, items, events=None, weights=None) -> pa.Table:
    n = len(users)
    ts = datetime.fromisoformat(date).replace(hour=12, tzinfo=UTC)
    return pa.table(
        {
            "user_id": pa.array(users, pa.int64()),
            "item_id": pa.array(items, pa.int64()),
            "ts": pa.array([ts] * n, INTERACTIONS_SCHEMA.field("ts").type),
            "event": pa.array(events or ["view"] * n, pa.string()),
            "weight": pa.array(weights or [1.0] * n, pa.float32()),
        },
        schema=INTERACTIONS_SCHEMA,
    )


def _land_population(store: DataStore) -> None:
    """Three days of 40 users over 30 items; one user appears only on each day."""
    rng = np.random.default_rng(0)
    for date, lone in ((OLD, LONE_OLD), (RECENT, LONE_RECENT), (DAY, LONE_TODAY)):
        users = rng.integers(1, 41, 300).tolist() + [lone, lone]
        items = rng.integers(1, 31, 300).tolist() + [1, 2]
        store.write_landing(INTERACTIONS, date, _day(date, users, items))


def _recommend(resources, instance, date: str, **config):
    run_config = RunConfig({"user_recommendations": UserRecommendationsConfig(k=5, **config)})
    return materialize(
        [interactions, user_recommendations],
        partition_key=date,
        resources=resources,
        instance=instance,
        run_config=run_config,
        raise_on_error=False,
    )


def _checks(result) -> dict:
    return {e.check_name: e for e in result.get_asset_check_evaluations()}


# -- the audience -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("audience", "listed"),
    [
        ({}, {LONE_RECENT, LONE_TODAY}),  # default: seen within the trailing 90 days
        ({"audience_days": 5}, {LONE_TODAY}),
        ({"audience": "all"}, {LONE_OLD, LONE_RECENT, LONE_TODAY}),
    ],
)
def test_audience_is_everyone_seen_in_the_window(
    store, resources, instance, audience: dict, listed: set
) -> None:
    _land_population(store)
    assert materialize([recommendation_model], resources=resources, instance=instance).success

    result = _recommend(resources, instance, DAY, **audience)

    assert result.success
    errors = [c for c in result.get_asset_check_evaluations() if c.severity.value == "ERROR"]
    assert all(c.passed for c in errors)
    assert _checks(result)["every_audience_user_has_recommendations"].passed
    out = store.read_output(USER_RECOMMENDATIONS, DAY)
    lones = {LONE_OLD, LONE_RECENT, LONE_TODAY}
    assert set(pc.unique(out["user_id"]).to_pylist()) & lones == listed
    # A user with no activity on the day still gets a full list, their history excluded.
    for user in listed:
        items = out.filter(pc.equal(out["user_id"], user))["item_id"].to_pylist()
        assert len(items) == 5 and not {1, 2} & set(items)
    meta = asset_metadata(result, USER_RECOMMENDATIONS)
    assert meta["rows_in"] == meta["audience_users"] == len(pc.unique(out["user_id"]))


def test_the_audience_check_fails_when_a_user_is_missing(store, resources, instance) -> None:
    _land_population(store)
    assert materialize([recommendation_model], resources=resources, instance=instance).success
    assert _recommend(resources, instance, DAY).success
    out = store.read_output(USER_RECOMMENDATIONS, DAY)
    kept = out.filter(pc.not_equal(out["user_id"], LONE_RECENT))
    # A day published by another writer of the table, past the scoring asset's checks.
    store.publish(USER_RECOMMENDATIONS, DAY, [kept], kept.schema)

    verdict = {r.check_name: r for r in list_check_results(store, DAY)}[
        "every_audience_user_has_recommendations"
    ]
    assert not verdict.passed and verdict.metadata["mismatched_users"].value == 1


# -- quarantined interactions -----------------------------------------------------------------


def _bad_rows(store: DataStore, date: str, broken: dict[int, tuple[str, float]]) -> pa.Table:
    """The demo day with rows ``broken`` given (event, weight); returns the landed table."""
    day = store.read_landing(INTERACTIONS, date, INTERACTIONS_SCHEMA)
    events, weights = day["event"].to_pylist(), day["weight"].to_pylist()
    for row, (event, weight) in broken.items():
        events[row], weights[row] = event, weight
    day = day.set_column(3, "event", pa.array(events, pa.string()))
    day = day.set_column(4, "weight", pa.array(weights, pa.float32()))
    store.write_landing(INTERACTIONS, date, day)
    return day


def test_bad_interactions_are_quarantined_with_reasons_and_conserved(
    store, resources, instance
) -> None:
    for date in ("2026-03-01", "2026-03-02"):
        generate_day(store, date, scale=0.05)
    assert materialize([recommendation_model], resources=resources, instance=instance).success
    date = "2026-03-03"
    generate_day(store, date, scale=0.05)
    broken = {
        3: ("view", -1.0),
        10: ("view", float("nan")),
        11: ("view", float("inf")),
        20: ("like", 1.0),
        21: ("view", None),
    }
    day = _bad_rows(store, date, broken)

    result = _recommend(resources, instance, date)

    assert result.success  # 5 of ~2,000 rows: within the 1% limit
    source = asset_metadata(result, INTERACTIONS)
    assert source["rows_quarantined"] == 5
    assert source["rows_used"] + source["rows_quarantined"] == day.num_rows
    assert source["quarantine_reasons"] == {
        "non_finite_weight": 3,
        "negative_weight": 1,
        "unknown_event": 1,
    }
    held = store.read_output("interactions_quarantine", date).to_pylist()
    reasons = {r["row_number"]: r["reason"] for r in held}
    assert reasons == {
        3: "negative_weight",
        10: "non_finite_weight",
        11: "non_finite_weight",
        20: "unknown_event",
        21: "non_finite_weight",
    }
    assert [r["user_id"] for r in held] == [day["user_id"][i].as_py() for i in sorted(broken)]
    verdict = _checks(result)["interaction_events_are_valid"]
    assert not verdict.passed and verdict.severity.value == "WARN"
    assert "will be quarantined" in verdict.description
    scored = asset_metadata(result, USER_RECOMMENDATIONS)
    assert scored["interaction_rows"] == day.num_rows
    assert scored["interaction_rows_used"] + scored["interaction_rows_quarantined"] == day.num_rows
    assert scored["interaction_rows_quarantined"] == 5


def test_too_many_bad_interactions_fail_naming_rate_and_reasons(store, resources, instance) -> None:
    generate_day(store, "2026-03-01", scale=0.05)
    assert materialize([recommendation_model], resources=resources, instance=instance).success
    date = "2026-03-02"
    generate_day(store, date, scale=0.05)
    rows = store.read_landing(INTERACTIONS, date, INTERACTIONS_SCHEMA).num_rows
    _bad_rows(store, date, {i: ("view", -2.0) for i in range(0, rows, 10)})

    source = materialize(
        [interactions], partition_key=date, resources=resources, instance=instance,
        raise_on_error=False,
    )  # fmt: skip
    scoring = materialize(
        [user_recommendations], partition_key=date, resources=resources, instance=instance,
        raise_on_error=False,
    )  # fmt: skip

    verdict = _checks(source)["interaction_events_are_valid"]
    assert not verdict.passed and verdict.severity.value == "ERROR" and not source.success
    assert "above the quarantine limit" in verdict.description
    assert "negative_weight" in verdict.description
    assert not store.output_exists("interactions_quarantine", date)
    message = str(scoring.get_step_failure_events()[0].event_specific_data.error)
    bad = len(range(0, rows, 10))
    assert f"{bad / rows:.2%} of rows ({bad} of {rows})" in message
    assert "quarantine limit" in message and "negative_weight" in message
    assert not store.output_exists(USER_RECOMMENDATIONS, date)


# -- items the model does not know ------------------------------------------------------------


def test_a_day_of_unknown_items_warns(store, resources, instance) -> None:
    _land_population(store)
    assert materialize([recommendation_model], resources=resources, instance=instance).success
    later = "2026-05-02"
    users = list(range(1, 41))
    store.write_landing(INTERACTIONS, later, _day(later, users, [5000 + u for u in users]))

    result = _recommend(resources, instance, later)

    assert result.success  # a warning, not a blocked day
    verdict = _checks(result)["unknown_item_share_below_limit"]
    assert not verdict.passed and verdict.severity.value == "WARN"
    assert verdict.metadata["unknown_item_share"].value == 1.0
    assert asset_metadata(result, USER_RECOMMENDATIONS)["unknown_item_share"] == 1.0
    # On the ordinary day it passes.
    assert _checks(_recommend(resources, instance, DAY))["unknown_item_share_below_limit"].passed


# -- EASE -------------------------------------------------------------------------------------


def test_ease_matches_the_closed_form_and_excludes_seen_items() -> None:
    rng = np.random.default_rng(5)
    users, items = rng.integers(0, 30, 400), rng.integers(100, 120, 400)
    model, _ = fit_ease(users, items, np.ones(400), EaseConfig(l2=3.0), torch.device("cpu"))
    x = np.zeros((30, 20))
    x[users, items - 100] = 1.0
    p = np.linalg.inv(x.T @ x + 3.0 * np.eye(20))
    expected = np.eye(20) - p / np.diag(p)
    np.testing.assert_allclose(model.item_item.numpy(), expected, atol=1e-5)
    assert np.all(np.diag(model.item_item.numpy()) == 0)

    lists = list(recommend(model, np.arange(30), (users, items), k=5, block_size=7))

    scores = x @ expected
    for b in lists:
        for user in np.unique(b.user_ids):
            got = b.item_ids[b.user_ids == user]
            seen = set(items[users == user].tolist())
            assert not seen & set(got.tolist())
            ranked = [100 + i for i in np.argsort(-scores[user], kind="stable")]
            assert got.tolist() == [i for i in ranked if i not in seen][:5]


def test_ease_keeps_the_most_popular_items_when_the_catalogue_is_capped() -> None:
    items = np.array([7] * 5 + [8] * 3 + [9] * 1)
    config = EaseConfig(max_items=2)
    model, _ = fit_ease(np.arange(9), items, np.ones(9), config, torch.device("cpu"))
    assert model.items.ids.tolist() == [7, 8]
    history = SparseRows.from_pairs(np.zeros(1), np.zeros(1), 1)
    assert model.personalised(np.array([-1]), history).tolist() == [True]


# -- the evaluation harness -------------------------------------------------------------------


def _synthetic_log(seed: int = 0) -> np.ndarray:
    """60 users rating 40 items over 6 days, with two taste groups."""
    rng = np.random.default_rng(seed)
    rows = []
    start = int(datetime(1998, 1, 1, tzinfo=UTC).timestamp())
    for user in range(1, 61):
        group = user % 2
        for item in rng.choice(np.arange(1, 21) + 20 * group, 12, replace=False):
            rows.append((user, item, rng.integers(3, 6), start + rng.integers(0, 6 * 86400)))
    return np.array(rows, np.int64)


def test_evaluation_harness_runs_on_a_synthetic_log_and_prints_the_table(capsys) -> None:
    rows = evaluate(_synthetic_log(), dataset="synthetic", two_tower=False, neighbours=10)
    print(table(rows))

    printed = capsys.readouterr().out
    methods = {r["method"] for r in rows}
    assert {"popularity", "item-kNN (cosine, 10 neighbours)", "EASE (lambda 500)"} <= methods
    assert any(m.startswith("nightshift ease") for m in methods)
    assert {r["metric"] for r in rows} == {"P@10", "recall@10", "NDCG@10", "users_with_lists"}
    assert all(r["dataset"] == "synthetic" and r["users"] > 0 for r in rows)
    assert all(0 <= r["value"] <= 1 for r in rows if r["metric"] != "users_with_lists")
    assert "| dataset | method | P@10 | recall@10 | NDCG@10 | users_with_lists |" in printed
    assert "| synthetic | popularity |" in printed


def test_evaluation_says_how_to_get_movielens_when_it_is_missing(tmp_path) -> None:
    with pytest.raises(FileNotFoundError, match="grouplens.org.*ml-100k.zip"):
        load_movielens(tmp_path / "u.data")
    (tmp_path / "u.data").write_text("1\t2\t3\t4\n")
    with pytest.raises(ValueError, match="sha256"):
        load_movielens(tmp_path / "u.data")

"""The landing stage's screening of a day, kept for exactly its files: fraud_scores reuses the
plan the transactions checks made instead of screening the day again, and screens again when
its ceiling differs or a file changed after the checks; and a pipeline hook that names a
parameter it would not be handed fails when the pipeline is declared, naming what it may take."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from dagster import DagsterInstance, materialize
from fraud_world import trained_fraud_world

from assets.fraud import scoring
from assets.fraud.assets import fraud_scores, transactions
from assets.fraud.demo_data import generate_day
from assets.nightly import Landing, Output, Predictor, nightly
from inference.engine.quarantine import QuarantinePlan
from resources.storage import DataStore

DAY = "2026-03-02"


def test_a_kept_plan_is_handed_back_for_the_same_files_and_rules_only(store: DataStore):
    folder = Path(store.landing_path("things", DAY))
    folder.mkdir(parents=True)
    pq.write_table(pa.table({"id": list(range(6))}), folder / "part-0.parquet")
    plan = QuarantinePlan(6, np.array([1, 4]), np.array(["a", "b"], object))
    assert store.landing_read("things", DAY, kept=True).screened({"v": 1}) is None
    store.keep_screen("things", DAY, plan, {"v": 1, "limit": 2.5})

    read = store.landing_read("things", DAY, kept=True)
    again = read.screened({"v": 1, "limit": 2.5})
    assert again is not None and again.digest() == plan.digest()
    assert read.screened({"v": 1, "limit": 3.0}) is None  # made under another limit
    assert store.landing_read("things", DAY).screened({"v": 1, "limit": 2.5}) is None  # not asked
    pq.write_table(pa.table({"id": list(range(7))}), folder / "part-1.parquet")
    assert store.landing_read("things", DAY, kept=True).screened({"v": 1, "limit": 2.5}) is None


def _score(world: dict, instance: DagsterInstance, config: dict | None = None):
    run_config = {"ops": {"fraud_scores": {"config": config}}} if config else None
    return materialize(
        [transactions, fraud_scores],
        partition_key=DAY,
        resources=world["resources"],
        instance=instance,
        selection=[fraud_scores],
        run_config=run_config,
    )


def test_fraud_scores_reuses_the_landing_checks_plan(tmp_path, monkeypatch):
    world = trained_fraud_world(tmp_path / "data", "2026-03-01", 0.02)
    store = world["store"]
    generate_day(store, DAY, scale=0.02, seed=1)
    screened: list[float] = []
    real = scoring.screen_transactions

    def counted(store_, date, **kwargs):
        screened.append(kwargs["amount_ceiling"])
        return real(store_, date, **kwargs)

    monkeypatch.setattr(scoring, "screen_transactions", counted)
    with DagsterInstance.ephemeral() as instance:
        landed = materialize(
            [transactions], partition_key=DAY, resources=world["resources"], instance=instance
        )
        assert landed.success
        assert _score(world, instance).success
        assert screened == []  # the transactions checks' plan, kept for these files

        # Another ceiling than the checks screened under: the day is screened again.
        assert _score(world, instance, {"amount_ceiling": 1e9}).success
        assert screened == [1e9]


def test_a_hook_naming_what_it_is_not_handed_fails_at_declaration():
    class Echo(Predictor):
        def load(self, device: str) -> None:
            pass

        def __call__(self, batch: pa.RecordBatch) -> dict:
            return {"y": np.zeros(batch.num_rows)}

    schema = pa.schema([("id", pa.string()), ("x", pa.float64())])
    with pytest.raises(TypeError) as raised:
        nightly(
            "echo_scores",
            Echo,
            Landing("echo_things", schema, key="id"),
            Output(pa.schema([("y", pa.float64())])),
            sizes=lambda cfg: None,
        )
    message = str(raised.value)
    assert "echo_scores: sizes" in message and "takes cfg" in message
    assert "config (the scoring asset's config)" in message

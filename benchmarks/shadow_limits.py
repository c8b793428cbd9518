"""Measures the shadow's agreement figures for challengers of known quality, the evidence for
the clean-night limits of assets/fraud/shadow.py and assets/recommendations/shadow.py.

Each scenario trains a champion and a challenger on the generated demo data through the real
training job (the gate made to wait with NIGHTSHIFT_PROMOTION_CLEAN_NIGHTS), then runs the
nightly job with NIGHTSHIFT_SHADOW=1 on two days and prints each day's figures, as Markdown.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/shadow_limits.py > benchmarks/shadow-limits.md
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from dagster import DagsterInstance  # noqa: E402
from helpers import run_job  # noqa: E402

from assets.fraud import demo_data as fraud_data  # noqa: E402
from assets.fraud.schemas import LABELLED_SCHEMA, TRANSACTIONS_LABELLED  # noqa: E402
from assets.fraud.shadow import FRAUD_SHADOW  # noqa: E402
from assets.recommendations import demo_data as recs_data  # noqa: E402
from assets.recommendations.shadow import RECOMMENDATION_SHADOW  # noqa: E402
from assets.shadow.asset import Shadow  # noqa: E402
from assets.shadow.nights import shadow_nights  # noqa: E402
from inference.models.registry import challenger_version  # noqa: E402
from resources.storage import DataStore  # noqa: E402

HISTORY = [f"2026-03-{d:02d}" for d in range(1, 11)]
NIGHTS = ["2026-03-11", "2026-03-12"]
FRAUD_SCALE, RECS_SCALE = 0.02, 0.05


def _shuffle(store: DataStore) -> None:
    rng = np.random.default_rng(0)
    for day in HISTORY:
        table = store.read_landing(TRANSACTIONS_LABELLED, day, LABELLED_SCHEMA)
        column = table.schema.get_field_index("is_fraud")
        labels = rng.permutation(table["is_fraud"].to_numpy())
        relabelled = table.set_column(column, table.schema.field(column), pa.array(labels))
        store.write_landing(TRANSACTIONS_LABELLED, day, relabelled)


def _scenario(
    shadow: Shadow,
    land: Callable[[DataStore, str], None],
    champion: dict,
    challenger: dict,
    before_retrain: Callable[[DataStore], None] | None = None,
    champion_days: list[str] = HISTORY,
) -> list[dict]:
    with tempfile.TemporaryDirectory() as tmp:
        root, home = Path(tmp, "data"), Path(tmp, "home")
        root.mkdir(), home.mkdir()
        os.environ.update(
            NIGHTSHIFT_DATA_ROOT=str(root),
            DAGSTER_HOME=str(home),
            NIGHTSHIFT_PROMOTION_CLEAN_NIGHTS="99",
            NIGHTSHIFT_SHADOW="1",
        )
        store = DataStore(str(root))
        for day in champion_days:
            land(store, day)
        model = shadow.model
        with DagsterInstance.get() as instance:
            train = f"{'fraud' if model == 'fraud_model' else 'recommendations'}_training_job"
            ops = lambda c: {"ops": {model: {"config": {"retrain": True, **c}}}}  # noqa: E731
            assert run_job(train, instance, ops(champion)).success
            for day in [d for d in HISTORY if d not in champion_days] + NIGHTS:
                land(store, day)
            if before_retrain:
                before_retrain(store)
            run_job(train, instance, ops(challenger))
            version = challenger_version(store.read_bytes, store.models_dir, model)
            assert version, "the challenger was promoted: nothing to shadow"
            job = "fraud_scoring_job" if model == "fraud_model" else "recommendations_job"
            for day in NIGHTS:
                assert run_job(job, instance, day=day).success
            return [n.figures | {"date": n.date, "clean": n.clean} for n in
                    shadow_nights(store, model, version)]  # fmt: skip


def main() -> None:
    fraud = lambda store, day: fraud_data.generate_day(store, day, scale=FRAUD_SCALE)  # noqa: E731
    recs = lambda store, day: recs_data.generate_day(store, day, scale=RECS_SCALE, seed=0)  # noqa: E731
    scenarios = [
        ("fraud: 10 days vs a champion of 1 day (better)", FRAUD_SHADOW, fraud,
         {"history_days": 1}, {}, None),
        ("fraud: same 10 days, seed 1 vs seed 0 (as good)", FRAUD_SHADOW, fraud,
         {}, {"seed": 1}, None),
        ("fraud: 1 day of the history (worse)", FRAUD_SHADOW, fraud,
         {}, {"history_days": 1}, None),
        ("fraud: shuffled labels (broken)", FRAUD_SHADOW, fraud, {}, {}, _shuffle),
        ("recs: EASE l2 250 vs 500 (as good)", RECOMMENDATION_SHADOW, recs, {}, {"l2": 250.0}, None),
        ("recs: EASE l2 1000 vs 500 (as good)", RECOMMENDATION_SHADOW, recs, {}, {"l2": 1000.0}, None),
        ("recs: two-tower, 3 epochs (worse)", RECOMMENDATION_SHADOW, recs,
         {}, {"model": "two_tower", "dims": 16, "epochs": 3}, None),
    ]  # fmt: skip
    print("| scenario | night | figures | clean |\n|---|---|---|---|")
    for name, shadow, land, champion, challenger, before in scenarios:
        for night in _scenario(shadow, land, champion, challenger, before):
            figures = {k: v for k, v in night.items() if k not in ("date", "clean")}
            shown = ", ".join(f"{k} {v:g}" for k, v in sorted(figures.items()))
            print(f"| {name} | {night['date']} | {shown} | {night['clean']} |", flush=True)


if __name__ == "__main__":
    main()

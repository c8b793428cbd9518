"""A scoring asset materialised alone (as from its page) lands and checks its input's day in the same run, and what a scored day's metadata shows first and plots."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
from dagster import AssetKey, DagsterEventType, DagsterInstance, materialize
from fraud_world import trained_fraud_world
from helpers import cpu_resources

from assets.day_metadata import DETAIL, HEADLINE, PLOTTED, day_figures
from assets.fraud import fraud_model, fraud_scores
from assets.fraud.demo_data import generate_day
from assets.fraud.schemas import MODEL_NAME
from inference.models.registry import challenger_version, promote

DAYS = ["2026-03-02", "2026-03-03"]
RANGE = {
    "dagster/asset_partition_range_start": DAYS[0],
    "dagster/asset_partition_range_end": DAYS[-1],
}
LANDING_CHECKS = {
    "transaction_ids_present_and_unique",
    "transaction_values_in_range",
    "transactions_landed_on_time",
}


@pytest.fixture(scope="module")
def fraud(tmp_path_factory) -> dict:
    world = trained_fraud_world(tmp_path_factory.mktemp("fraud") / "data", "2026-03-01", 0.01)
    for day in DAYS:
        generate_day(world["store"], day, scale=0.01, seed=2)
    return world


def _materialised(instance: DagsterInstance, run_id: str) -> list[tuple[str, str, int]]:
    """(asset, partition, storage id) of each materialisation the run recorded, in order."""
    records = instance.get_records_for_run(
        run_id, of_type=DagsterEventType.ASSET_MATERIALIZATION
    ).records
    return [
        (r.event_log_entry.asset_materialization.asset_key.to_user_string(),
         r.event_log_entry.asset_materialization.partition, r.storage_id)
        for r in records
    ]  # fmt: skip


def test_a_range_of_fraud_scores_alone_lands_each_day_first(fraud: dict) -> None:
    with DagsterInstance.ephemeral() as instance:
        result = materialize(
            [fraud_scores], tags=RANGE, resources=fraud["resources"], instance=instance
        )
        assert result.success
        events = _materialised(instance, result.run_id)
        # Each day: the landing day and its saved screen, then the day's scores.
        assert [(a, p) for a, p, _ in events] == [
            (asset, day)
            for day in DAYS
            for asset in ("transactions", "transaction_screens", "fraud_scores")
        ]
        checks = result.get_asset_check_evaluations()
        landing = {
            (c.check_name, c.partition) for c in checks if c.asset_key.path == ["transactions"]
        }
        assert landing == {(name, day) for name in LANDING_CHECKS for day in DAYS}
        assert all(c.passed for c in checks if c.asset_key.path == ["transactions"])
        logs = [r.message or "" for r in instance.all_logs(result.run_id)]
        assert sum("landing it in this step first" in m for m in logs) == len(DAYS)
        # Every check was counted as this step's output: no "did not yield" notice.
        assert not [m for m in logs if "did not yield or return expected outputs" in m]

        # Scored again alone: the days were checked against the same files, nothing re-lands.
        again = materialize(
            [fraud_scores], tags=RANGE, resources=fraud["resources"], instance=instance
        )
        assert again.success
        assert {a for a, _, _ in _materialised(instance, again.run_id)} == {"fraud_scores"}

        # New files for the second day: that day (only) is landed and checked again.
        generate_day(fraud["store"], DAYS[-1], scale=0.01, seed=3)
        changed = materialize(
            [fraud_scores], tags=RANGE, resources=fraud["resources"], instance=instance
        )
        assert changed.success
        relanded = [(a, p) for a, p, _ in _materialised(instance, changed.run_id)]
        assert ("transactions", DAYS[-1]) in relanded
        assert ("transactions", DAYS[0]) not in relanded


@pytest.mark.parametrize(
    ("domain", "asset", "dataset", "model"),
    [
        ("recommendations", "user_recommendations", "interactions", "recommendation_model"),
        ("embeddings", "document_embeddings", "documents", None),
    ],
)
def test_every_domain_lands_its_input_when_scored_alone(
    domain, asset, dataset, model, tmp_path: Path
) -> None:
    root = tmp_path / "data"
    demo = "documents" if domain == "embeddings" else domain
    generate = importlib.import_module(f"assets.{demo}.demo_data").generate_day
    from resources.storage import DataStore

    generate(DataStore(str(root)), DAYS[0], scale=0.01, seed=0)
    module = importlib.import_module(f"assets.{domain}")
    resources = cpu_resources(root, max_batch_size=64)
    with DagsterInstance.ephemeral() as instance:
        if model:
            trained = materialize([getattr(module, model)], resources=resources, instance=instance)
            assert trained.success
        result = materialize(
            [getattr(module, asset)],
            partition_key=DAYS[0],
            resources=resources,
            instance=instance,
            run_config={"ops": {asset: {"config": {"max_quarantine_rate": 0.2}}}},
        )
        assert result.success
        order = [(a, p) for a, p, _ in _materialised(instance, result.run_id)]
        assert order == [(dataset, DAYS[0]), (asset, DAYS[0])]
        landing = [c for c in result.get_asset_check_evaluations() if c.asset_key.path == [dataset]]
        assert landing and all(c.partition == DAYS[0] for c in landing)


def test_a_scored_day_shows_the_headline_first_and_plots_eight_series(fraud: dict) -> None:
    store = fraud["store"]
    with DagsterInstance.ephemeral() as instance:
        first = materialize(
            [fraud_scores], partition_key=DAYS[0], resources=fraud["resources"], instance=instance
        )
        # A new model scores the next day: the plotted change marks it.
        retrain = {"ops": {"fraud_model": {"config": {"retrain": True, "seed": 7}}}}
        assert materialize(
            [fraud_model], resources=fraud["resources"], instance=instance, run_config=retrain
        ).success
        # Promoted by hand: this test is about the scored days' figures, not the gate.
        read, models = store.read_bytes, store.models_dir
        challenger = challenger_version(read, models, MODEL_NAME)
        promote(read, store.write_bytes, models, MODEL_NAME, challenger, forced=True)
        second = materialize(
            [fraud_scores], partition_key=DAYS[1], resources=fraud["resources"], instance=instance
        )
    assert first.success and second.success
    [day] = [m for m in first.asset_materializations_for_node("fraud_scores")
             if m.asset_key == AssetKey("fraud_scores")]  # fmt: skip
    metadata = day.metadata
    keys = list(metadata)
    assert keys[:2] == ["dagster/row_count", "output"]
    assert keys[: len([k for k in HEADLINE if k in metadata])] == [
        k for k in HEADLINE if k in metadata
    ]
    numeric = [k for k, v in metadata.items() if isinstance(v.value, int | float)]
    assert set(numeric) <= set(PLOTTED) and 6 <= len(numeric) <= 8, numeric
    assert keys.index(DETAIL) == len([k for k in HEADLINE if k in metadata])
    # Where the day's rows went opens the detail table (rows_quarantined sat at its bottom).
    detail = [r.data["figure"] for r in metadata[DETAIL].value.records]
    assert detail[:3] == ["rows_in", "rows_out", "rows_quarantined"], detail
    # Nothing is lost: the detail table holds every other figure, read back by name.
    figures = day_figures(metadata)
    rows = store.read_output("fraud_scores", DAYS[0]).num_rows
    assert figures["rows_in"] == figures["dagster/row_count"] == rows
    assert figures["model_loads"] == 1 and figures["partitions"] == 1
    assert figures["commit"] and figures["device"] and figures["rows_per_second"] > 0
    assert {"read_seconds", "batch_latency_p50_ms", "flagged", "check_seconds"} <= set(figures)
    assert figures["model_version_changed"] == 0

    [next_day] = [m for m in second.asset_materializations_for_node("fraud_scores")
                  if m.asset_key == AssetKey("fraud_scores")]  # fmt: skip
    changed = day_figures(next_day.metadata)
    assert changed["model_version"] != figures["model_version"]
    assert changed["model_version_changed"] == 1

    # The checks record the rows they sampled: the whole 1,000-row day, not the 10,000 asked.
    for check in first.get_asset_check_evaluations():
        if check.asset_key == AssetKey("fraud_scores"):
            assert check.metadata["sample_rows"].value == rows, check.check_name
            assert check.metadata["sample_rows_limit"].value == 10_000


def test_an_input_landed_without_a_spec_fails_the_day_naming_what_to_materialise(
    store, resources, instance, tmp_path: Path
) -> None:
    """A landing asset that only checks its contract (``land_files``, as the documented example
    does) has no spec to land it from a scoring step: scoring it alone fails the day at once,
    naming the upstream day to materialise; once that day is landed, scoring alone proceeds."""
    import pyarrow as pa
    from safetensors.torch import save_file

    from examples import churn_scores as example

    weights = tmp_path / "churn_mlp.safetensors"
    save_file(example.churn_mlp().state_dict(), weights)
    rows = [(f"c{i:05d}", 12.0, 50.0, 1.0) for i in range(50)]
    table = pa.table(list(zip(*rows, strict=True)), schema=example.CUSTOMERS_SCHEMA)
    store.write_landing(example.CUSTOMERS, DAYS[0], table)
    config = {"ops": {example.ASSET: {"config": {"model_path": str(weights)}}}}

    def run(*assets):
        scoring = example.churn_scores in assets
        return materialize(
            list(assets), partition_key=DAYS[0], resources=resources, instance=instance,
            run_config=config if scoring else {}, raise_on_error=False,
        )  # fmt: skip

    alone = run(example.churn_scores)
    assert not alone.success
    [failure] = alone.get_step_failure_events()
    message = failure.step_failure_data.error.message
    assert (
        f"{example.ASSET} {DAYS[0]}: its input {example.CUSTOMERS} was not materialised and "
        f"checked for this day: materialise {example.CUSTOMERS} for {DAYS[0]}"
    ) in message
    assert failure.step_failure_data.user_failure_data is not None  # a Failure: not retried
    assert not store.output_exists(example.ASSET, DAYS[0])

    assert run(example.customers).success
    assert run(example.churn_scores).success

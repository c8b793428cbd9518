"""docs/your-own-model.md's churn example as the tests drive it: a landed day of customers with
one bad row of each kind, a run of examples/churn_scores.py, and what a scored day must hold.
Shared by test_your_own_model and the Ray executor's test of the same example."""

from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import torch
from dagster import materialize
from helpers import asset_metadata
from safetensors.torch import load_file

from examples import churn_scores as example
from examples.churn_scores import (  # noqa: F401 - churn_mlp is the example's model, for callers
    ASSET,
    CUSTOMERS,
    CUSTOMERS_SCHEMA,
    churn_mlp,
)
from inference.generation.checkpoints import weights_version

# What the engine publishes: the landing key, the predictor's columns, the model version.
SCORES_SCHEMA = pa.schema(
    {"customer_id": pa.string(), "churn_probability": pa.float32(), "model_version": pa.string()}
)

DAYS = ["2026-03-01", "2026-03-02"]
GOOD = 600  # scorable customers a day; five more rows a day cannot be scored
BAD = {
    "null_customer_id": (None, 12.0, 50.0, 1.0),
    "null_tenure_months": ("c00900", None, 50.0, 1.0),
    "non_finite_monthly_spend": ("c00901", 12.0, float("nan"), 1.0),
    "non_finite_support_tickets": ("c00902", 12.0, 50.0, float("inf")),
    "duplicate_customer_id": ("c00003", 30.0, 80.0, 0.0),
}
CHECKS = {"row_count_matches_input", "churn_probabilities_in_unit_interval"}


def land(store, date: str, seed: int) -> dict[str, tuple]:
    """Lands a day of customers with one bad row of each kind; returns the good rows by id."""
    rng = np.random.default_rng(seed)
    good = [
        (f"c{i:05d}", rng.uniform(0, 72), rng.uniform(10, 150), float(rng.integers(0, 10)))
        for i in range(GOOD)
    ]
    rows = list(good)
    for at, row in zip((5, 100, 250, 400, 590), BAD.values(), strict=True):
        rows.insert(at, row)
    columns = list(zip(*rows, strict=True))
    store.write_landing(CUSTOMERS, date, pa.table(columns, schema=CUSTOMERS_SCHEMA))
    return {row[0]: row[1:] for row in good}


def run(resources, instance, model_path, day=DAYS[0], **config):
    """Materialises the example's customers and churn_scores for ``day`` (None: both days in one
    run) with ``config`` for churn_scores; a failed run is returned, not raised."""
    tags = {}
    if day is None:  # the two-day range, as one run
        tags = {
            "dagster/asset_partition_range_start": DAYS[0],
            "dagster/asset_partition_range_end": DAYS[-1],
        }
    return materialize(
        [example.customers, example.churn_scores],
        partition_key=day,
        tags=tags,
        run_config={"ops": {ASSET: {"config": {"model_path": str(model_path), **config}}}},
        resources=resources,
        instance=instance,
        raise_on_error=False,
    )


def expected_scores(good: dict[str, tuple], weights: Path) -> dict[str, float]:
    """What the model says for each scorable customer, computed here without the runner."""
    net = churn_mlp()
    net.load_state_dict(load_file(weights))
    with torch.no_grad():
        p = torch.sigmoid(net(torch.tensor(list(good.values()), dtype=torch.float32)))
    return dict(zip(good, p.squeeze(1).tolist(), strict=True))


def assert_day(
    store, result, day: str, good: dict[str, tuple], weights: Path, model_loads: int = 1
) -> dict:
    """Asserts ``day`` holds one score per good customer, as the model says, the bad rows each
    quarantined with its reason, and the day's metadata and checks; returns the metadata.
    ``model_loads``: loads in the step's own process (none when Ray actors run the shards)."""
    scores = store.read_output(ASSET, day)
    assert scores.schema.equals(SCORES_SCHEMA)
    ids, probabilities = scores["customer_id"], scores["churn_probability"]
    got = dict(zip(ids.to_pylist(), probabilities.to_pylist(), strict=True))
    assert scores.num_rows == len(got) == GOOD  # one row per good customer, none twice
    expected = expected_scores(good, weights)
    assert got.keys() == expected.keys()
    assert np.allclose([got[k] for k in expected], list(expected.values()), atol=1e-6)
    assert all(0.0 <= p <= 1.0 for p in got.values())
    assert set(scores["model_version"].to_pylist()) == {weights_version(weights)}

    quarantined = store.read_output(f"{ASSET}_quarantine", day)
    assert Counter(quarantined["reason"].to_pylist()) == dict.fromkeys(BAD, 1)
    assert set(quarantined.column_names) >= {*CUSTOMERS_SCHEMA.names, "row_number", "reason"}

    meta = asset_metadata(result, ASSET, day)
    assert meta["dagster/row_count"] == meta["rows_out"] == GOOD
    assert meta["rows_in"] == GOOD + len(BAD) and meta["rows_quarantined"] == len(BAD)
    assert meta["quarantine_reasons"] == dict.fromkeys(BAD, 1)
    assert meta["model_version"] == weights_version(weights) and meta["model_loads"] == model_loads
    assert meta["likely_to_churn"] == sum(p >= 0.5 for p in got.values())
    assert meta["output"].endswith(f"date={day}")
    checks = [c for c in result.get_asset_check_evaluations() if c.partition == day]
    assert {c.check_name for c in checks} == CHECKS and all(c.passed for c in checks)
    return meta

"""A model of your own behind the promotion gate: a Gate with the spec's own metric function
decides, through the same blocking check the built-in domains get."""

import numpy as np
import pyarrow as pa
import torch
from dagster import Config, MaterializeResult, asset, materialize
from helpers import cpu_resources

from assets.promotion import held_out_days
from inference.engine.device import Runtime
from inference.models.gate import Gate, training_days
from inference.models.modelstore import load_model
from inference.models.registry import challenger_version, champion_version, register, window_of
from orchestration.promotion import GATE_CHECK, gate_check
from resources.storage import DataStore, StorageResource

MODEL, READINGS = "sensor_alarm", "sensor_readings"
READINGS_SCHEMA = pa.schema([("value", pa.float64()), ("alarm", pa.bool_())])
DAYS = [f"2026-05-{d:02d}" for d in range(1, 8)]


def accuracy(store: DataStore, version: str, days: list[str], runtime: Runtime) -> dict:
    """The spec's metric: the share of readings whose alarm the version's cut-off predicts."""
    cut = load_model(store.read_bytes, store.models_dir, MODEL, version).tensors["cut"].item()
    rows = pa.concat_tables(store.read_landing(READINGS, d, READINGS_SCHEMA) for d in days)
    predicted = rows["value"].to_numpy() >= cut
    return {"accuracy": float(np.mean(predicted == rows["alarm"].to_numpy()))}


GATE = Gate(
    model=MODEL,
    metrics=("accuracy",),
    labelled_days=lambda store: store.landing_dates(READINGS),
    evaluate=accuracy,
    tolerances={"accuracy": 0.0},
)


class AlarmConfig(Config):
    cut: float


@asset(name=MODEL)
def sensor_alarm(config: AlarmConfig, storage: StorageResource) -> MaterializeResult:
    """A cut-off above which a reading raises the alarm, registered as the gate expects."""
    store = storage.store()
    labelled = store.landing_dates(READINGS)
    days = training_days(labelled, held_out_days(store, GATE, labelled), len(labelled))
    tensors, manifest = {"cut": torch.tensor([config.cut])}, {"trained_window": window_of(days)}
    version, alias = register(
        store.read_bytes, store.write_bytes, store.models_dir, MODEL, tensors, manifest
    )
    return MaterializeResult(metadata={"model_version": version, "alias": alias})


def _land(store: DataStore, days: list[str]) -> None:
    rng = np.random.default_rng(0)
    for day in days:
        value = rng.uniform(0, 1, 500)
        store.write_landing(READINGS, day, pa.table({"value": value, "alarm": value >= 0.5}))


def _train(data_root, instance, cut: float):
    config = {"ops": {MODEL: {"config": {"cut": cut}}}}
    return materialize(
        [sensor_alarm, gate_check(GATE)],
        resources=cpu_resources(data_root),
        instance=instance,
        run_config=config,
        raise_on_error=False,
    )


def _gate(result) -> dict:
    [gate] = [c for c in result.get_asset_check_evaluations() if c.check_name == GATE_CHECK]
    return {"passed": gate.passed, **{k: v.value for k, v in gate.metadata.items()}}


def test_the_specs_metric_decides_promotion(data_root, instance) -> None:
    store = DataStore(str(data_root))
    _land(store, DAYS[:5])
    assert _train(data_root, instance, 0.6).success
    champion = champion_version(store.read_bytes, store.models_dir, MODEL)
    _land(store, DAYS[5:])

    worse = _train(data_root, instance, 0.9)
    better = _train(data_root, instance, 0.5)

    refused = _gate(worse)
    assert not worse.success and refused["passed"] is False
    assert refused["challenger_accuracy"] < refused["champion_accuracy"]
    assert refused["evaluation_days"] == ", ".join(DAYS[5:])
    promoted = _gate(better)
    assert better.success and promoted["passed"] is True and promoted["champion"] == champion
    assert promoted["challenger_accuracy"] == 1.0 > promoted["champion_accuracy"]
    assert champion_version(store.read_bytes, store.models_dir, MODEL) == promoted["challenger"]
    assert challenger_version(store.read_bytes, store.models_dir, MODEL) is None

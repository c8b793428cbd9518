"""``churn_scores``: your own model as a nightly batch-inference asset (docs/your-own-model.md).

Each day's customers are scored by a small torch MLP whose weights are a safetensors file at a
local path. The spec says how to load the model and how to score one day; the runner gives the
asset its checkpointed shards, resume, exactly-once commit, quarantine, checks and metadata.
"""

from pathlib import Path

import numpy as np
import pyarrow as pa
import torch
from dagster import AssetExecutionContext, AssetSpec, Definitions
from pydantic import Field
from torch import nn

from assets.checkpointing import Input, Output, SpotSafeRun, Work
from assets.days import daily_assets
from assets.gates import SuiteRun, conservation_figures
from assets.landing import land_files
from assets.partitions import PartitionReport
from assets.runner import Day, Model, ScoringSpec, score, scoring_asset
from inference.engine.invariants import StreamStats
from inference.engine.screen import screen_required
from inference.engine.shard_worker import ModelStep
from inference.generation.checkpoints import load_weights, weights_version
from inference.tabular.tabular_model import stack_features
from orchestration.resources import build_resources
from resources.inference import InferenceResource
from resources.quality import QualityConfig, load_suites
from resources.storage import DataStore, StorageResource

CUSTOMERS, ASSET, GROUP = "customers", "churn_scores", "churn"
FEATURES = ["tenure_months", "monthly_spend", "support_tickets"]
CUSTOMERS_SCHEMA = pa.schema([("customer_id", pa.string())] + [(f, pa.float64()) for f in FEATURES])
SCORES_SCHEMA = pa.schema(
    {"customer_id": pa.string(), "churn_probability": pa.float32(), "model_version": pa.string()}
)
SUITES = load_suites(Path(__file__).parent / "suites" / f"{ASSET}.json")


def churn_mlp() -> nn.Module:
    """The architecture the weights were trained in: the features in, one churn logit out."""
    return nn.Sequential(nn.Linear(len(FEATURES), 16), nn.ReLU(), nn.Linear(16, 1))


class ChurnConfig(QualityConfig):
    model_path: str = Field(description="Local path of the model's weights: a .safetensors file.")


def load(store: DataStore, inference: InferenceResource, config: ChurnConfig) -> Model:
    version = weights_version(config.model_path)  # a missing or pickled file fails here
    key = f"{ASSET}:{version}"  # a range backfill loads the model once, under this key

    def build(runtime) -> nn.Module:
        return load_weights(churn_mlp(), config.model_path).to(runtime.device).eval()

    return Model(version, key, inference.model(key, build))


def landed(store: DataStore, date: str):
    """The day's customers in their deterministic input order (screened, then scored)."""
    return store.iter_landing(CUSTOMERS, date, CUSTOMERS_SCHEMA)


def day(run: SpotSafeRun, date: str, model: Model, config: ChurnConfig, limit: float) -> Day:
    store, net, device = run.store, model.value, run.inference.runtime.device
    # Rows with no id, a missing feature or a repeated id are set aside, never scored; too
    # many of them and the runner fails the day before any inference, publishing nothing.
    plan = screen_required(landed(store, date), "customer_id", FEATURES)

    def transform(batch: pa.RecordBatch, x: np.ndarray) -> pa.RecordBatch:
        with torch.inference_mode():
            p = torch.sigmoid(net(torch.from_numpy(x).to(device))).squeeze(1).cpu().numpy()
        version = pa.repeat(pa.scalar(model.version), len(p))
        return pa.record_batch([batch["customer_id"], pa.array(p), version], SCORES_SCHEMA)

    def observe(scored: pa.RecordBatch, out: pa.Table, stats: StreamStats) -> None:
        p = out["churn_probability"].to_numpy()
        stats.count("probabilities_outside_unit_interval", (~((p >= 0) & (p <= 1))).sum())
        stats.count("likely_to_churn", (p >= 0.5).sum())

    work = Work(
        Input(landed(store, date), quarantine=plan),
        ModelStep(transform, lambda batch: stack_features(batch, FEATURES), observe=observe),
        Output(SCORES_SCHEMA),
        depends_on={"model": model.version},  # new weights: old progress is discarded
    )

    def checks(report: PartitionReport):
        rows = store.count_landing(CUSTOMERS, date, CUSTOMERS_SCHEMA)  # from the file footers
        figures = conservation_figures(store, ASSET, date, report.shards, rows)
        outside = report.shards.stats.counts.get("probabilities_outside_unit_interval", 0)
        suites = SuiteRun(SUITES)
        suites.add(date, {**figures, "probabilities_outside_unit_interval": outside}, None, {})
        return suites.results({})

    def metadata(report: PartitionReport) -> dict:
        return {"likely_to_churn": report.shards.stats.counts.get("likely_to_churn", 0)}

    return Day(work, checks, metadata)


CHURN_SCORES = ScoringSpec(ASSET, CUSTOMERS, SUITES, load, day)


@daily_assets(AssetSpec(CUSTOMERS, group_name=GROUP))
def customers(context: AssetExecutionContext, storage: StorageResource):
    """Every active customer at the end of the day, with tenure, monthly spend and support
    tickets, as the billing system lands them (`landing/customers/date=D/*.parquet`)."""
    yield from land_files(context, storage, CUSTOMERS, CUSTOMERS_SCHEMA)


@scoring_asset(CHURN_SCORES, deps=[customers], group=GROUP, kinds={"pytorch"})
def churn_scores(
    context: AssetExecutionContext,
    config: ChurnConfig,
    storage: StorageResource,
    inference: InferenceResource,
):
    """Each customer's probability of cancelling, for the retention team's morning list.

    One row per customer: `churn_probability` in [0, 1] and the `model_version` (file name and
    content hash of the weights) that scored it. Customers with no id, a missing or non-finite
    feature, or an id seen before go to `churn_scores_quarantine` with the reason.
    """
    yield from score(context, CHURN_SCORES, config, storage, inference)


defs = Definitions(assets=[customers, churn_scores], resources=build_resources())

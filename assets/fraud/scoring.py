"""``fraud_scores``: the fraud probability of every transaction of the day, declared on the
public module (``nightshift``).

A day's transactions are screened against the contract (the plan ``transactions`` saved for
these exact files is reused), cut into shards of whole accounts (inference/fraud/accounts.py),
featurised against each shard's account profile, clamped to the model's training ranges and
scored by :class:`FraudPredictor`, which loads the registered model once per process or Ray
actor; flagged rows' details are committed beside the scores for ``fraud_alerts``.
"""

from __future__ import annotations

import copy
from functools import partial
from typing import Any

import numpy as np
import pyarrow as pa
from dagster import AssetCheckResult

from assets.fraud.gates import score_check_results
from assets.fraud.landing import FraudQualityConfig, transactions
from assets.fraud.model import fraud_model
from assets.fraud.pipeline import SCORED_COLUMNS, load_scorer, score_reference
from assets.fraud.quality import screen_transactions
from assets.fraud.schemas import (
    EXACT_COLUMNS,
    FLAGGED,
    FLAGGED_SCHEMA,
    GROUP,
    MODEL_NAME,
    SCORES,
    SCORES_SCHEMA,
    TRANSACTIONS,
    TRANSACTIONS_SCHEMA,
)
from assets.nightly import Checks, Landing, Output, Predictor, nightly
from assets.partitions import PartitionReport
from inference.engine.device import make_runtime
from inference.engine.invariants import StreamStats
from inference.engine.quarantine import QuarantinePlan
from inference.engine.work import Sizes
from inference.fraud.accounts import DayWide, account_cut, day_profile
from inference.fraud.alerts import flagged_details
from inference.fraud.score_figures import score_observer
from inference.fraud.screening import screen_rules
from inference.models.registry import champion_version
from inference.tabular.ranges import REVIEW, Guarded
from resources.inference import InferenceResource
from resources.landing_files import LandingRead
from resources.storage import DataStore

__all__ = ["FEATURE_ROWS", "FRAUD_SCORES", "SHARD_ROWS", "FraudPredictor", "FraudQualityConfig"]

# Rows whose features are assembled together (one call of the step; the model itself runs in
# calls of the resource's max_batch_size). Each call's code lookups hash the whole account
# vocabulary of the shard once, so fewer, larger calls cost less; but a default shard cut in two
# calls has its second call's features assembled while the first is scored, and the first
# ready sooner (docs/benchmarks.md, "The engine after the scoring runner").
FEATURE_ROWS = 131_072
# Transactions per checkpointed shard unless the resource sets one: large enough that a day is
# a few shard files and progress writes, small enough that a retry redoes little and a shard's
# profile stays small.
SHARD_ROWS = 250_000


class FraudPredictor(Predictor):
    """The registered fraud MLP (``fraud_model``): the champion, or the version the run chose.

    Its threshold comes with its weights, its training score histogram (the drift check's
    reference) is read once per run in the step. Each shard gets a copy holding the profile of
    its accounts; a batch's features are computed against it and clamped to the model's
    training ranges (their rows marked ``needs_review``, see inference.tabular.ranges).
    """

    def choose(self, store: DataStore, version: str | None) -> None:
        self.store = store
        self.chosen = version or champion_version(store.read_bytes, store.models_dir, MODEL_NAME)
        self.reference = score_reference(store, self.chosen)

    def version(self) -> str:
        return self.chosen

    def load(self, device: str) -> None:
        self.scorer = load_scorer(self.store, self.chosen, make_runtime(device, self.precision))
        self.threshold = np.float32(self.scorer.threshold)
        self.observed = score_observer(float(self.threshold), self.chosen)

    def shard(self, rows: pa.Table, day_wide: DayWide) -> FraudPredictor:
        shard = copy.copy(self)
        shard.profile = day_profile(rows, day_wide)
        return shard

    def prepare(self, batch: pa.RecordBatch) -> Guarded:
        x = self.profile.features(batch, self.scorer.features)
        if self.scorer.ranges is None:  # a model saved before ranges were recorded
            return Guarded(x, np.zeros(len(x), bool), {}, {})
        return self.scorer.ranges.guard(x)

    def __call__(self, batch: pa.RecordBatch, guarded: Guarded) -> dict[str, Any]:
        self.guarded = guarded  # its clamped features are recorded with the call's figures
        scores = self.scorer.score(guarded.x, max_rows=self.max_batch_size)
        return {
            "score": scores,
            "flagged": scores >= self.threshold,
            "needs_review": guarded.review,
        }

    def observe(self, rows: pa.RecordBatch, output: pa.Table, stats: StreamStats) -> None:
        self.observed(rows, output, stats)

    def record(self, stats: StreamStats) -> None:
        self.guarded.record(stats)

    def describe(self, stats: StreamStats) -> dict[str, Any]:
        return {
            "threshold": self.scorer.threshold,
            **self.scorer.batch_sizing(self.max_batch_size).describe(),
            "flagged": stats.counts.get("flagged", 0),
            "needs_review": stats.counts.get(REVIEW, 0),
        }


def screen(
    landed: LandingRead, store: DataStore, date: str, config: FraudQualityConfig
) -> QuarantinePlan:
    """The rows fraud_scores sets aside, under ``config.amount_ceiling``: the plan the landing
    checks kept for exactly the files the step scores, if they ran under the same ceiling; else
    the day screened now."""
    kept = landed.screened(screen_rules(config.amount_ceiling))
    if kept is not None:
        return kept
    return screen_transactions(store, date, amount_ceiling=config.amount_ceiling).plan


def judged(
    store: DataStore,
    report: PartitionReport,
    version: str,
    config: FraudQualityConfig,
    model: FraudPredictor,
) -> list[AssetCheckResult]:
    """The fraud_scores suites over the day's exact figures and sample."""
    return score_check_results(
        store,
        [report],
        version=version,
        threshold=model.scorer.threshold,
        reference=model.reference,
        ranges=model.scorer.ranges,
        sample_rows=config.check_sample_rows,
        seed=config.check_seed,
    )


def threshold(config: FraudQualityConfig, model: FraudPredictor) -> dict[str, float]:
    """The alert threshold stored with the model decides the flags beside its version."""
    return {"threshold": float(model.scorer.threshold)}


def sizes(config: FraudQualityConfig, inference: InferenceResource) -> Sizes:
    return Sizes(
        batch_size=max(FEATURE_ROWS, inference.max_batch_size), default_shard_rows=SHARD_ROWS
    )


DESCRIPTION = """The fraud probability of every transaction of the day, and whether it is flagged.

One row per transaction: `score` in [0, 1], `flagged` when the score reaches the model's
alert threshold, `needs_review` when a feature was beyond the model's training range (it is
clamped to that range before scoring, never extrapolated), and the `model_version` that
scored it. A range backfill loads the model once and records each day on its own.
Transactions that cannot be scored (missing fields, non-finite or negative amounts, amounts
above the contract's ceiling, times outside the day, repeated ids) go to
`fraud_scores_quarantine` with a reason, never silently dropped; above the quarantine limit
the day fails and nothing is published."""

PIPELINE = nightly(
    SCORES,
    FraudPredictor,
    Landing(
        TRANSACTIONS,
        TRANSACTIONS_SCHEMA,
        key="transaction_id",
        asset=transactions,
        screen=screen,
        columns=SCORED_COLUMNS,
        exact=EXACT_COLUMNS,
    ),
    Output(
        pa.schema([SCORES_SCHEMA.field(n) for n in ("score", "flagged", "needs_review")]),
        sample=True,
        side=(FLAGGED, FLAGGED_SCHEMA, partial(flagged_details, schema=FLAGGED_SCHEMA)),
    ),
    Checks(suite="suites/fraud_scores.json", results=judged),
    hour_utc=2,
    description=DESCRIPTION,
    group=GROUP,
    config=FraudQualityConfig,
    sizes=sizes,
    depends_on=threshold,
    deps=[fraud_model],
    kinds={"pytorch"},
    shards=account_cut,
)
fraud_scores = PIPELINE.scoring_asset
# The runner's spec of fraud_scores: what its shadow (assets/fraud/shadow.py) runs again.
FRAUD_SCORES = PIPELINE.spec

"""``fraud_scores`` as a spec for the scoring runner: load the current model, score a day.

A day's transactions are screened against the contract (the plan ``transactions`` saved for
these exact files is reused), featurised against the day's account profile, clamped to the
model's training ranges and scored; flagged rows' details are committed beside the scores for
``fraud_alerts``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import pyarrow as pa

from assets.checkpointing import SpotSafeRun
from assets.fraud.gates import SCORE_SUITES, score_check_results
from assets.fraud.landing import FraudQualityConfig
from assets.fraud.pipeline import (
    flagged_details,
    load_scorer,
    score_reference,
    scored_transactions,
)
from assets.fraud.quality import load_screen, screen_transactions
from assets.fraud.schemas import (
    FLAGGED,
    FLAGGED_SCHEMA,
    MODEL_NAME,
    SCORES,
    SCORES_SCHEMA,
    TRANSACTIONS,
)
from assets.runner import Day, Model, ScoringSpec
from inference.engine.device import make_runtime
from inference.engine.shard_worker import ModelStep, ShardInput
from inference.engine.work import Input, Output, Sizes, Work
from inference.fraud.accounts import (
    AccountShardProgram,
    AccountShards,
    DayWide,
    shard_count,
)
from inference.fraud.profile import PartitionProfile
from inference.fraud.score_figures import score_observer
from inference.models.registry import champion_version
from inference.tabular.ranges import REVIEW, Guarded
from inference.tabular.tabular import TabularScorer
from resources.inference import InferenceResource
from resources.quality import locate_in_landing
from resources.storage import DataStore

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


class FraudModel(NamedTuple):
    """The scorer, and the training score histogram the drift check compares each day with
    (None for a model saved without one): both read once per run."""

    scorer: TabularScorer
    reference: list[int] | None


def load(
    store: DataStore,
    inference: InferenceResource,
    config: FraudQualityConfig,
    version: str | None = None,
) -> Model:
    """The champion, or ``version`` where the run chose another (assets/staleness.py)."""
    version = version or champion_version(store.read_bytes, store.models_dir, MODEL_NAME)
    key = f"{MODEL_NAME}:{version}"
    scorer = inference.model(key, lambda runtime: load_scorer(store, version, runtime))
    return Model(
        version,
        key,
        FraudModel(scorer, score_reference(store, version)),
        device=scorer.runtime.describe(),
        metadata={"threshold": scorer.threshold},
    )


def day(run: SpotSafeRun, date: str, model: Model, config: FraudQualityConfig, limit: float) -> Day:
    """One day of transactions, scored in checkpointed shards of whole accounts.

    Transactions that cannot be scored are quarantined to ``fraud_scores_quarantine`` with
    their reason; above ``limit`` of the day the step fails before any inference. Each shard
    holds every row of its accounts (inference/fraud/accounts.py), so the account profile is built
    per shard and memory follows the shard, not the day. Features beyond the model's training
    range are clamped to it and their rows marked ``needs_review`` (see inference.tabular.ranges).
    """
    store, (scorer, reference), version = run.store, model.value, model.version
    settings = run.inference
    # The landing checks' plan for these exact files, if they ran; else the day is screened.
    plan = load_screen(store, date, config.amount_ceiling)
    if plan is None:
        plan = screen_transactions(store, date, amount_ceiling=config.amount_ceiling).plan
    plan = locate_in_landing(plan, store, TRANSACTIONS, date)
    count = shard_count(plan.rows - plan.count, run.shard_rows(SHARD_ROWS))
    day_wide = DayWide()

    def shards() -> Iterator[ShardInput]:
        cut = AccountShards(count, plan, day_wide)
        try:
            cut.write(scored_transactions(store, date))
            yield from cut.inputs()
        finally:
            cut.close()

    program = AccountShardProgram(
        model.key,
        _LoadScorer(store, version, settings.device, settings.precision),
        day_wide,
        _ScoringStep(version, settings.max_batch_size),
    )
    work = Work(
        Input(
            shards=shards,
            quarantine=plan,
            layout={"shard_layout": "account_hash", "account_shards": count},
        ),
        program,
        Output(SCORES_SCHEMA, side=(FLAGGED, FLAGGED_SCHEMA), sample=True),
        depends_on={"model": version, "threshold": float(scorer.threshold)},
        sizes=Sizes(
            batch_size=max(FEATURE_ROWS, settings.max_batch_size), default_shard_rows=SHARD_ROWS
        ),
    )

    def checks(report):
        return score_check_results(
            store,
            [report],
            version=version,
            threshold=scorer.threshold,
            reference=reference,
            ranges=scorer.ranges,
            sample_rows=config.check_sample_rows,
            seed=config.check_seed,
        )

    def metadata(report) -> dict:
        counts = report.shards.stats.counts
        return {
            **scorer.batch_sizing(settings.max_batch_size).describe(),
            "flagged": counts.get("flagged", 0),
            "needs_review": counts.get(REVIEW, 0),
        }

    return Day(work, checks, metadata)


def scoring_step(
    scorer: TabularScorer, profile: PartitionProfile, version: str, model_rows: int
) -> ModelStep:
    """Featurise against ``profile`` (one shard's accounts), clamp to the training ranges,
    score in calls of ``model_rows``, observe."""
    threshold, ranges = np.float32(scorer.threshold), scorer.ranges

    def prepare(batch: pa.RecordBatch) -> Guarded:
        x = profile.features(batch, scorer.features)
        if ranges is None:  # a model saved before ranges were recorded: nothing to clamp to
            return Guarded(x, np.zeros(len(x), bool), {}, {})
        return ranges.guard(x)

    def transform(batch: pa.RecordBatch, guarded: Guarded) -> pa.RecordBatch:
        scores = scorer.score(guarded.x, max_rows=model_rows)
        return pa.record_batch(
            [
                batch["transaction_id"],
                pa.array(scores, pa.float32()),
                pa.array(scores >= threshold),
                pa.array(guarded.review),
                pa.repeat(pa.scalar(version, pa.string()), len(scores)),
            ],
            schema=SCORES_SCHEMA,
        )

    return ModelStep(
        transform,
        prepare,
        observe=score_observer(float(threshold), version),
        observe_prepared=lambda guarded, stats: guarded.record(stats),
        side=flagged_details,
    )


@dataclass(frozen=True)
class _ScoringStep:
    """``scoring_step`` with the version and batch size bound (picklable for workers)."""

    version: str
    model_rows: int

    def __call__(self, scorer: TabularScorer, profile: PartitionProfile) -> ModelStep:
        return scoring_step(scorer, profile, self.version, self.model_rows)


@dataclass(frozen=True)
class _LoadScorer:
    """Loads the scorer where the shard runs, on the device given (a worker's own, or the
    step's: in the step's process the scorer it loaded is used instead)."""

    store: DataStore
    version: str
    device: str
    precision: str

    def __call__(self) -> TabularScorer:
        return load_scorer(self.store, self.version, make_runtime(self.device, self.precision))


FRAUD_SCORES = ScoringSpec(
    asset=SCORES, dataset=TRANSACTIONS, suites=SCORE_SUITES, load=load, day=day
)

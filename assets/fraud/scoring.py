"""``fraud_scores`` as a spec for the scoring runner: load the current model, score a day.

A day's transactions are screened against the contract (the plan ``transactions`` saved for
these exact files is reused), featurised against the day's account profile, clamped to the
model's training ranges and scored; flagged rows' details are committed beside the scores for
``fraud_alerts``.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import pyarrow as pa
from pydantic import Field

from assets.checkpointing import SpotSafeRun, Work
from assets.fraud.gates import SCORE_SUITES, score_check_results
from assets.fraud.pipeline import SCORED_COLUMNS, flagged_details, load_scorer, score_reference
from assets.fraud.quality import load_screen, score_observer, screen_transactions
from assets.fraud.schemas import (
    AMOUNT_CEILING,
    FLAGGED,
    FLAGGED_SCHEMA,
    MODEL_NAME,
    SCORES,
    SCORES_SCHEMA,
    TRANSACTIONS,
    TRANSACTIONS_SCHEMA,
)
from assets.runner import Day, Model, ScoringSpec
from inference.modelstore import current_version
from inference.ranges import REVIEW, Guarded
from inference.streaming import release_freed_memory
from inference.tabular import TabularScorer
from resources.inference import InferenceResource
from resources.quality import QualityConfig, StreamedSample
from resources.storage import DataStore

# Rows whose features are assembled together while scoring (a shard is cut at shard_rows, so
# at most that). Each batch's code lookups hash the whole account vocabulary once, so bigger is
# cheaper: on a 1M-row day (186k accounts), features only, 1.53 s in batches of 4,096 rows (the
# resource's default model batch), 0.52 s in 65,536, 0.39 s in 262,144; the scoring pass end to
# end 0.58-0.60 s at 65,536 against 0.46-0.50 s at 262,144. About 60 MB of temporaries each.
FEATURE_ROWS = 262_144
# Transactions per checkpointed shard unless the resource sets one: about 0.25 s of scoring on
# one CPU core, so a retry redoes little, while a 1M-row day is 4 shard files instead of 20
# (each shard costs a parquet file and two progress writes).
SHARD_ROWS = 250_000


class FraudQualityConfig(QualityConfig):
    amount_ceiling: float = Field(
        default=AMOUNT_CEILING,
        description="The data contract's largest amount, in the transaction's currency units: "
        "a larger amount is quarantined as `amount_above_ceiling`, never scored. Give "
        "`transactions` and `fraud_scores` the same value.",
    )


class FraudModel(NamedTuple):
    """The scorer, and the training score histogram the drift check compares each day with
    (None for a model saved without one): both read once per run."""

    scorer: TabularScorer
    reference: list[int] | None


def load(store: DataStore, inference: InferenceResource, config: FraudQualityConfig) -> Model:
    version = current_version(store.read_bytes, store.models_dir, MODEL_NAME)
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
    """One day of transactions, scored in checkpointed shards.

    Transactions that cannot be scored are quarantined to ``fraud_scores_quarantine`` with
    their reason; above ``limit`` of the day the step fails before any inference. The output
    checks' seeded sample is taken as the scores stream. Features beyond the model's training
    range are clamped to it and their rows marked ``needs_review`` (see inference.ranges).
    """
    store, (scorer, reference), version = run.store, model.value, model.version
    # The landing checks' plan for these exact files, if they ran: then only the profile is built.
    screen = screen_transactions(
        store,
        date,
        build_profile=True,
        plan=load_screen(store, date, config.amount_ceiling),
        amount_ceiling=config.amount_ceiling,
    )
    plan = screen.plan
    plan.check_rate(limit, f"{SCORES} {date}")
    profile = screen.profile()
    del screen  # the builder's buffers: only the finished profile is needed from here
    release_freed_memory()
    threshold, ranges = np.float32(scorer.threshold), scorer.ranges
    model_rows = run.inference.max_batch_size
    sample = StreamedSample(plan.rows - plan.count, config.check_sample_rows, config.check_seed)
    observer = score_observer(float(threshold), version)

    def observe(scored: pa.RecordBatch, out: pa.Table, stats) -> None:
        observer(scored, out, stats)
        sample.add(out)

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

    work = Work(
        SCORES_SCHEMA,
        store.iter_landing(TRANSACTIONS, date, TRANSACTIONS_SCHEMA, columns=SCORED_COLUMNS),
        transform,
        inputs=store.landing_files(TRANSACTIONS, date),
        depends_on={"model": version, "threshold": float(threshold)},
        prepare=prepare,
        # Features are assembled for up to FEATURE_ROWS rows at a time (per-call lookups cost
        # about as much as a 50k-row batch's own work), and scored in model calls of the
        # resource's max_batch_size.
        batch_size=max(FEATURE_ROWS, model_rows),
        default_shard_rows=SHARD_ROWS,
        quarantine=plan,
        observe=observe,
        observe_prepared=lambda guarded, stats: guarded.record(stats),
        side=(FLAGGED, FLAGGED_SCHEMA, flagged_details),
        sample=sample,
    )

    def checks(report):
        return score_check_results(
            store,
            [report],
            version=version,
            threshold=scorer.threshold,
            reference=reference,
            ranges=ranges,
            sample_rows=config.check_sample_rows,
            seed=config.check_seed,
        )

    def metadata(report) -> dict:
        counts = report.shards.stats.counts
        return {
            **scorer.batch_sizing(run.inference.max_batch_size).describe(),
            "flagged": counts.get("flagged", 0),
            "needs_review": counts.get(REVIEW, 0),
        }

    return Day(work, checks, metadata)


FRAUD_SCORES = ScoringSpec(
    asset=SCORES, dataset=TRANSACTIONS, suites=SCORE_SUITES, load=load, day=day
)

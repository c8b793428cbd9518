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
from pydantic import Field

from assets.checkpointing import Shards, SpotSafeRun, Work
from assets.fraud.accounts import AccountShardProgram, AccountShards, shard_count
from assets.fraud.gates import SCORE_SUITES, score_check_results
from assets.fraud.pipeline import SCORED_COLUMNS, flagged_details, load_scorer, score_reference
from assets.fraud.profile import PartitionProfile
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
from inference.device import make_runtime
from inference.distributed import ShardFunctions, ShardInput
from inference.ranges import REVIEW, Guarded
from inference.registry import champion_version
from inference.streaming import release_freed_memory
from inference.tabular import TabularScorer
from resources.inference import InferenceResource
from resources.quality import QualityConfig, StreamedSample, locate_in_landing
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
    """One day of transactions, scored in checkpointed shards.

    Transactions that cannot be scored are quarantined to ``fraud_scores_quarantine`` with
    their reason; above ``limit`` of the day the step fails before any inference. The output
    checks' seeded sample is taken as the scores stream. Features beyond the model's training
    range are clamped to it and their rows marked ``needs_review`` (see inference.ranges).
    """
    store, (scorer, reference), version = run.store, model.value, model.version
    threshold, ranges = np.float32(scorer.threshold), scorer.ranges
    model_rows = run.inference.max_batch_size
    common = dict(
        inputs=store.landing_files(TRANSACTIONS, date),
        depends_on={"model": version, "threshold": float(threshold)},
        # Features are assembled for up to FEATURE_ROWS rows at a time (per-call lookups cost
        # about as much as a 50k-row batch's own work), and scored in model calls of the
        # resource's max_batch_size.
        batch_size=max(FEATURE_ROWS, model_rows),
        default_shard_rows=SHARD_ROWS,
    )
    if run.distributed:
        work = _by_account(run, date, model, config, limit, common)
    else:
        # The landing checks' plan for these exact files, if they ran: then only the profile
        # is built.
        screen = screen_transactions(
            store,
            date,
            build_profile=True,
            plan=load_screen(store, date, config.amount_ceiling),
            amount_ceiling=config.amount_ceiling,
        )
        plan = locate_in_landing(screen.plan, store, TRANSACTIONS, date)
        plan.check_rate(limit, f"{SCORES} {date}")
        profile = screen.profile()
        del screen  # the builder's buffers: only the finished profile is needed from here
        release_freed_memory()
        sample = StreamedSample(plan.rows - plan.count, config.check_sample_rows, config.check_seed)
        functions = scoring_functions(scorer, profile, version, model_rows)
        observer = functions.observe

        def observe(scored: pa.RecordBatch, out: pa.Table, stats) -> None:
            observer(scored, out, stats)
            sample.add(out)

        work = Work(
            SCORES_SCHEMA,
            store.iter_landing(TRANSACTIONS, date, TRANSACTIONS_SCHEMA, columns=SCORED_COLUMNS),
            functions.transform,
            prepare=functions.prepare,
            quarantine=plan,
            observe=observe,
            observe_prepared=functions.observe_prepared,
            side=(FLAGGED, FLAGGED_SCHEMA, flagged_details),
            sample=sample,
            **common,
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


def scoring_functions(
    scorer: TabularScorer, profile: PartitionProfile, version: str, model_rows: int
) -> ShardFunctions:
    """Featurise against ``profile``, clamp to the training ranges, score, observe: the same
    functions for the whole day here and for one shard of accounts on a worker."""
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

    return ShardFunctions(
        transform,
        prepare,
        observe=score_observer(float(threshold), version),
        side=flagged_details,
        observe_prepared=lambda guarded, stats: guarded.record(stats),
    )


@dataclass(frozen=True)
class _ShardFunctions:
    """``scoring_functions`` with the version and batch size bound (picklable for workers)."""

    version: str
    model_rows: int

    def __call__(self, scorer: TabularScorer, profile: PartitionProfile) -> ShardFunctions:
        return scoring_functions(scorer, profile, self.version, self.model_rows)


@dataclass(frozen=True)
class _LoadScorer:
    """Loads the scorer in a worker process, on the device the worker has."""

    store: DataStore
    version: str
    device: str
    precision: str

    def __call__(self) -> TabularScorer:
        return load_scorer(self.store, self.version, make_runtime(self.device, self.precision))


def _scored_by_shards(batch: pa.RecordBatch, prepared) -> pa.Table:
    """The Work's own model step when its shards' program builds the real one on workers."""
    raise RuntimeError("fraud_scores cut by account is scored by its shards' program")


def _by_account(
    run: SpotSafeRun, date: str, model: Model, config: FraudQualityConfig, limit: float, common
) -> Work:
    """The day cut into shards of whole accounts for workers elsewhere (assets/fraud/accounts):
    no day-wide profile is built here, and each worker's profile holds its shard's accounts."""
    store = run.store
    plan = load_screen(store, date, config.amount_ceiling)
    if plan is None:  # the landing checks did not run on these files: screen them (no profile)
        plan = screen_transactions(store, date, amount_ceiling=config.amount_ceiling).plan
    plan = locate_in_landing(plan, store, TRANSACTIONS, date)
    plan.check_rate(limit, f"{SCORES} {date}")
    settings = run.inference
    shards = AccountShards(
        shard_count(plan.rows - plan.count, run.shard_rows(common["default_shard_rows"])), plan
    )
    figures = shards.write(
        store.iter_landing(TRANSACTIONS, date, TRANSACTIONS_SCHEMA, columns=SCORED_COLUMNS)
    )

    def inputs() -> Iterator[ShardInput]:
        try:
            yield from shards.inputs()
        finally:
            shards.close()

    program = AccountShardProgram(
        model.key,
        _LoadScorer(store, model.version, settings.device, settings.precision),
        figures,
        _ShardFunctions(model.version, settings.max_batch_size),
    )
    layout = {"shard_layout": "account_hash", "account_shards": shards.shards}
    return Work(
        SCORES_SCHEMA,
        (),  # the shards carry the rows
        _scored_by_shards,
        quarantine=plan,
        side=(FLAGGED, FLAGGED_SCHEMA, flagged_details),
        shards=Shards(program, inputs, layout),
        **common,
    )


FRAUD_SCORES = ScoringSpec(
    asset=SCORES, dataset=TRANSACTIONS, suites=SCORE_SUITES, load=load, day=day
)

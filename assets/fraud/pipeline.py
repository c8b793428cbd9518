"""The fraud domain's steps as plain functions over a DataStore: the assets call these.

Every step streams a landing partition in record batches; only the feature pre-pass holds a few
columns of a whole partition. Scoring writes the flagged transactions' details beside the scores
(``fraud_scores_flagged``, committed with them), so alerts never re-read landing data that may
have changed since, or that holds a quarantined duplicate of a scored id.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from assets.fraud.quality import SCREEN_BATCH_ROWS
from assets.fraud.schemas import (
    ALERTS,
    ALERTS_SCHEMA,
    EXACT_COLUMNS,
    FLAGGED,
    LABELLED_SCHEMA,
    MODEL_NAME,
    SCORES,
    TRANSACTIONS,
    TRANSACTIONS_LABELLED,
    TRANSACTIONS_SCHEMA,
)
from assets.promotion import held_out_days
from inference.engine.device import Runtime
from inference.fraud.alerts import recall_at_alerts
from inference.fraud.features import (
    FEATURE_COLUMNS,
    PROFILE_COLUMNS,
    PartitionProfile,
    check_feature_names,
)
from inference.fraud.score_figures import reference_rows, score_histogram
from inference.fraud.screening import SCREEN_COLUMNS
from inference.models.gate import Gate, training_days
from inference.models.modelstore import load_model
from inference.models.registry import champion_version, register, window_of
from inference.tabular.ranges import FeatureRanges
from inference.tabular.tabular import TabularScorer, TrainConfig, train_classifier
from inference.tabular.tabular_metrics import average_precision
from resources.storage import DataStore, LandingDataError, Published

if TYPE_CHECKING:
    import torch


def profile(store: DataStore, dataset: str, date: str, schema: pa.Schema) -> PartitionProfile:
    """The feature pre-pass over one landing partition."""
    batches = store.iter_landing(
        dataset, date, schema, columns=PROFILE_COLUMNS, batch_size=SCREEN_BATCH_ROWS
    )
    return PartitionProfile.build(batches)


def training_set(
    store: DataStore, dates: Sequence[str], features: Sequence[str], log: Callable[[str], None]
) -> tuple[np.ndarray, np.ndarray]:
    """Features and labels of the labelled history on ``dates``, each day featurised on its own."""
    xs, ys = [], []
    for date in dates:
        context = profile(store, TRANSACTIONS_LABELLED, date, LABELLED_SCHEMA)
        batches = store.iter_landing(
            TRANSACTIONS_LABELLED, date, LABELLED_SCHEMA, columns=[*FEATURE_COLUMNS, "is_fraud"]
        )
        for batch in batches:
            xs.append(context.features(batch, features))
            ys.append(batch["is_fraud"].to_numpy(zero_copy_only=False).astype(np.int8))
        log(f"labelled history {date}: {context.rows} transactions")
    return np.concatenate(xs), np.concatenate(ys)


def train_and_save(
    store: DataStore,
    features: Sequence[str],
    history_days: int,
    config: TrainConfig,
    device: torch.device,
    log: Callable[[str], None],
) -> tuple[str, str, dict, float]:
    """Trains on the most recent ``history_days`` of labelled history, leaving out the days the
    promotion gate will compare it with the champion on, and registers it.

    Returns:
        (version, the alias it holds: champion for the first version, else challenger,
        manifest, training seconds).
    """
    import torch

    check_feature_names(features)
    labelled = store.landing_dates(TRANSACTIONS_LABELLED)
    held_out = held_out_days(store, FRAUD_GATE, labelled)
    dates = training_days(labelled, held_out, history_days)
    if not dates:
        where = store.uri(store.path("landing", TRANSACTIONS_LABELLED))
        kept = (
            f" (besides {', '.join(held_out)}, held out for the promotion gate)" if held_out else ""
        )
        raise LandingDataError(f"no labelled history to train on under {where}{kept}")
    if held_out:
        log(f"held out for the promotion gate: {', '.join(held_out)}")
    x, y = training_set(store, dates, features, log)
    trained = train_classifier(x, y, features, config, device)
    manifest = trained.manifest(
        {
            "trained_on": {"dataset": TRANSACTIONS_LABELLED, "dates": dates},
            "trained_window": window_of(dates),
            # What the score distribution looked like on the training history: the reference
            # the score_distribution_matches_training check compares each day against.
            # Each feature's training range (clamped to at scoring) and drift reference.
            "feature_ranges": FeatureRanges.fit(x, list(features)).to_json(),
            "score_reference": score_histogram(
                TabularScorer.from_trained(
                    trained, Runtime(torch.device("cpu"), torch.float32)
                ).score(reference_rows(x, config.seed))
            ),
        }
    )
    tensors = trained.tensors()
    version, alias = register(
        store.read_bytes,
        store.write_bytes,
        store.models_dir,
        MODEL_NAME,
        tensors,
        manifest,
        cas=store.cas(),
    )
    log(
        f"trained fraud model {version} ({alias}) on {len(y)} rows in {trained.seconds:.1f}s: "
        f"AUPRC {trained.metrics['val_auprc']:.3f}, ROC-AUC {trained.metrics['val_roc_auc']:.3f}"
    )
    return version, alias, manifest, trained.seconds


def evaluate(store: DataStore, version: str, days: list[str], runtime: Runtime) -> dict:
    """How well one version finds fraud on the labelled ``days``, scored as nightly scoring
    scores them (features clamped to the version's training ranges):

    - ``auprc``: the ranking, over every threshold;
    - ``recall_at_champion_alerts``: the share of frauds among its top rows when it raises as
      many alerts as the champion raises at its own alert threshold. Each version picks its
      own threshold on its own validation split, so recall at each one's threshold moves with
      how many alerts it raises, not with how well it ranks; at the champion's alert count the
      analysts' workload is the same and only the ranking decides;
    - ``recall_at_threshold``: recall at the version's own threshold (reported, not gated).
    """
    scores, y, threshold = _held_out_scores(store, version, days, runtime)
    champion = champion_version(store.read_bytes, store.models_dir, MODEL_NAME)
    if champion == version:
        alerts = int(np.count_nonzero(scores >= threshold))
    else:
        theirs, _, their_threshold = _held_out_scores(store, champion, days, runtime)
        alerts = int(np.count_nonzero(theirs >= their_threshold))
    fraud = y == 1
    return {
        "auprc": average_precision(y, scores),
        "recall_at_champion_alerts": recall_at_alerts(y, scores, alerts),
        "recall_at_threshold": float(np.mean(scores[fraud] >= threshold)),
        "champion_alerts": alerts,
    }


def _held_out_scores(
    store: DataStore, version: str, days: list[str], runtime: Runtime
) -> tuple[np.ndarray, np.ndarray, float]:
    """One version's scores of the labelled ``days``, their labels and its alert threshold."""
    stored = load_model(store.read_bytes, store.models_dir, MODEL_NAME, version)
    scorer = TabularScorer.from_stored(stored.tensors, stored.manifest, runtime)
    x, y = training_set(store, days, stored.manifest["features"], lambda _: None)
    if scorer.ranges is not None:
        x = scorer.ranges.guard(x).x
    if not (y == 1).any():
        where = store.uri(store.path("landing", TRANSACTIONS_LABELLED))
        raise LandingDataError(
            f"{TRANSACTIONS_LABELLED} on {', '.join(days)} under {where}: {len(y)} rows and no "
            "is_fraud label set, so a fraud model cannot be judged on them"
        )
    return scorer.score(x, max_rows=EVAL_BATCH_ROWS), y, float(scorer.threshold)


# Rows per model call when the gate scores held-out days.
EVAL_BATCH_ROWS = 65_536

FRAUD_GATE = Gate(
    model=MODEL_NAME,
    metrics=("auprc", "recall_at_champion_alerts"),
    labelled_days=lambda store: store.landing_dates(TRANSACTIONS_LABELLED),
    evaluate=evaluate,
    # About how far apart retrains of one history with other seeds measure on two demo days,
    # and what the real card data allows (docs/models.md).
    tolerances={"auprc": 0.025, "recall_at_champion_alerts": 0.075},
)


def load_scorer(store: DataStore, version: str, runtime: Runtime) -> TabularScorer:
    stored = load_model(store.read_bytes, store.models_dir, MODEL_NAME, version)
    return TabularScorer.from_stored(stored.tensors, stored.manifest, runtime)


def score_reference(store: DataStore, version: str) -> list[int] | None:
    """The model's training score histogram, or None for a model saved without one."""
    stored = load_model(store.read_bytes, store.models_dir, MODEL_NAME, version)
    return stored.manifest.get("score_reference")


# What scoring reads of each transaction: the features, and the details an alert carries.
SCORED_COLUMNS = [*SCREEN_COLUMNS, "currency"]


def scored_transactions(store: DataStore, date: str) -> Iterator[pa.RecordBatch]:
    """The day's transactions as scoring reads them: the scored columns, each exact column
    followed by its landed text (``amount_exact``), which flagged details and quarantine keep."""
    return store.iter_landing(
        TRANSACTIONS, date, TRANSACTIONS_SCHEMA, columns=SCORED_COLUMNS, exact=EXACT_COLUMNS
    )


def _output(store: DataStore, asset: str, date: str) -> ds.Dataset:
    """The day as published, read through its table (an empty day keeps its columns)."""
    if not store.output_exists(asset, date):
        raise FileNotFoundError(
            f"'{asset}' has no published day {date} in table "
            f"{store.tables.identifier(asset)}: materialise it first"
        )
    return ds.dataset(store.read_output(asset, date))


class StaleScoresError(LandingDataError):
    """fraud_alerts' input is unusable as published: the scores and their side output were not
    committed together. Permanent until fraud_scores is re-run, so it is never retried."""


def flagged_transactions(store: DataStore, date: str) -> pa.Table:
    """The day's flagged transactions as scoring saw them, from the side output committed with
    ``fraud_scores``; fails when the two do not come from the same commit."""
    where = f"in table {store.tables.identifier(FLAGGED)}"
    scored, flagged = store.output_commit(SCORES, date), store.output_commit(FLAGGED, date)
    if scored is None or scored != flagged:
        raise StaleScoresError(
            f"fraud_scores {date} (commit {scored}) has no flagged-transaction details from the "
            f"same commit {where} (found {flagged}): it was scored by an older nightshift or "
            f"its commit did not finish; re-run fraud_scores for {date}"
        )
    return _output(store, FLAGGED, date).to_table()


def stage_alerts(store: DataStore, date: str) -> tuple[Published, float]:
    """Stages the day's flagged transactions with their details, highest score first: not on
    main until their check passed (``Published.staged`` publishes or rejects them).

    The details come from what scoring read, not from landing: a landing file replaced since,
    or a duplicate id that scoring quarantined, cannot change an alert.

    Returns:
        where they are staged, and the flagged amount in total.
    """
    alerts = flagged_transactions(store, date)
    alerts = alerts.sort_by([("score", "descending"), ("transaction_id", "ascending")])
    staged = store.publish(ALERTS, date, [alerts], ALERTS_SCHEMA, audit=True)
    return staged, float(pc.sum(alerts["amount"]).as_py() or 0.0)


def count_alerts(store: DataStore, dates: Sequence[str]) -> tuple[int, int]:
    """(flagged rows in fraud_scores, rows in fraud_alerts) over the dates."""
    flagged = sum(_output(store, SCORES, d).count_rows(filter=pc.field("flagged")) for d in dates)
    alerts = sum(_output(store, ALERTS, d).count_rows() for d in dates)
    return flagged, alerts

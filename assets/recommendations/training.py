"""Training the recommendation model from landing history, and saving or reusing it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
from dagster import MetadataValue

from assets.promotion import held_out_days
from assets.recommendations.history import read_interactions
from assets.recommendations.schemas import INTERACTIONS, RECOMMENDATION_MODEL
from inference.engine.device import Runtime
from inference.models.gate import Gate, training_days
from inference.models.modelstore import load_model
from inference.models.registry import champion_version, register, window_of
from inference.recs.ease import EaseConfig, EaseRecommender, fit_ease
from inference.recs.history import Interactions
from inference.recs.recommend import holdout_recall, recommend
from inference.recs.two_tower import Recommender, TrainConfig, fit_recommender
from resources.storage import DataStore, LandingDataError

if TYPE_CHECKING:
    import torch

RECALL_K = 20
KINDS = {
    "ease": "EASE (closed-form item-item, Steck 2019)",
    "two_tower": "two-tower (bag-of-history user tower, full-softmax multinomial loss)",
}
Model = Recommender | EaseRecommender


@dataclass(frozen=True)
class TrainedModel:
    """A saved model version and its manifest (settings, data span, metrics)."""

    version: str
    manifest: dict
    # Kept out of the manifest, whose hash is the version: retraining on the same data with
    # the same settings then yields the same version.
    timings: dict = field(default_factory=dict)
    # The alias the version holds once registered (champion for a first version).
    alias: str = ""

    def metadata(self, reused: bool) -> dict:
        """Asset metadata: the metrics as numbers the UI plots, then what was trained on."""
        m = self.manifest
        span = m["trained_on"]
        numbers = {k: v for k, v in m["metrics"].items() if isinstance(v, int | float)}
        return {
            **numbers,
            **self.timings,
            "model_version": self.version,
            "reused": reused,
            **({"alias": self.alias} if self.alias else {}),
            "trained_through": span["last_date"],
            "holdout_date": str(m["metrics"]["holdout_date"]),
            "trained_on": f"{span['first_date']}..{span['last_date']} ({span['days']} days)",
            "model": m.get("model", "two_tower"),
            "users": m["users"],
            "items": m["items"],
            "interactions": m["interactions"],
            **({"dims": m["dims"]} if "dims" in m else {}),
            "manifest": MetadataValue.json(m),
        }


def fit(
    triples: tuple, config: TrainConfig | EaseConfig, device: torch.device
) -> tuple[Model, float, float | None]:
    """Fits the configured kind of model: (model, seconds, final training loss or None)."""
    if isinstance(config, EaseConfig):
        model, seconds = fit_ease(*triples, config, device)
        return model, seconds, None
    model, factors = fit_recommender(*triples, config, device)
    return model, factors.seconds, factors.losses[-1] if factors.losses else None


@dataclass(frozen=True)
class _Fitted:
    """A fitted model with what it was fitted on and measured against."""

    model: Model
    days: list[str]
    interactions: int
    metrics: dict
    timings: dict[str, float]
    loss: float | None


def train_and_save(
    store: DataStore, dates: list[str], config: TrainConfig | EaseConfig, device: torch.device
) -> TrainedModel:
    """Trains, measures recall@20 on held-out days and registers the version.

    The first version measures on the last day with a trial model fitted without it, and is
    saved fitted on every day. A retrain (a champion exists) is fitted without the most recent
    days the champion did not train on, so the promotion gate can compare the two on them; its
    recall@20 is measured there.
    """
    held_out = held_out_days(store, RECOMMENDATION_GATE, dates)
    if held_out:
        fitted = _fit_challenger(store, dates, held_out, config, device)
    else:
        fitted = _fit_first(store, dates, config, device)
    kind, days = fitted.model.KIND, fitted.days
    manifest = {
        "model": kind,
        "kind": KINDS[kind],
        **({"dims": config.dims} if isinstance(config, TrainConfig) else {}),
        "train_config": config.__dict__,
        "trained_on": {"first_date": days[0], "last_date": days[-1], "days": len(days)},
        "trained_window": window_of(days),
        "interactions": fitted.interactions,
        "users": len(fitted.model.users),
        "items": len(fitted.model.items),
        "metrics": {
            **fitted.metrics,
            "final_loss": round(fitted.loss, 4) if fitted.loss is not None else None,
        },
    }
    tensors = fitted.model.to_tensors()
    version, alias = register(
        store.read_bytes,
        store.write_bytes,
        store.models_dir,
        RECOMMENDATION_MODEL,
        tensors,
        manifest,
        cas=store.cas(),
    )
    return TrainedModel(version, {**manifest, "version": version}, fitted.timings, alias)


def _fit_first(
    store: DataStore, dates: list[str], config: TrainConfig | EaseConfig, device: torch.device
) -> _Fitted:
    """Recall@20 on the last day from a trial fitted without it, then a fit on every day."""
    metrics: dict = {"holdout_date": None}
    timings: dict[str, float] = {}
    if len(dates) > 1:
        history = read_interactions(store, dates[:-1])
        trial, trial_seconds, _ = fit(history.triples, config, device)
        holdout = read_interactions(store, dates[-1:])
        metrics = _holdout_metrics(trial, history, holdout, dates[-1])
        timings["holdout_fit_seconds"] = round(trial_seconds, 2)
    everything = read_interactions(store, dates)
    model, seconds, loss = fit(everything.triples, config, device)
    timings["train_seconds"] = round(seconds, 2)
    return _Fitted(model, dates, len(everything), metrics, timings, loss)


def _fit_challenger(
    store: DataStore,
    dates: list[str],
    held_out: list[str],
    config: TrainConfig | EaseConfig,
    device: torch.device,
) -> _Fitted:
    """A fit on the days before ``held_out``, with recall@20 measured on them."""
    days = training_days(dates, held_out, len(dates))
    if not days:
        raise LandingDataError(
            f"no '{INTERACTIONS}' day before {held_out[0]} to train {RECOMMENDATION_MODEL} on: "
            "the days from it are held out for the promotion gate"
        )
    history = read_interactions(store, days)
    model, seconds, loss = fit(history.triples, config, device)
    metrics = _holdout_metrics(model, history, read_interactions(store, held_out), held_out[-1])
    return _Fitted(model, days, len(history), metrics, {"train_seconds": round(seconds, 2)}, loss)


def _holdout_metrics(model: Model, history: Interactions, holdout: Interactions, day: str) -> dict:
    recall = holdout_recall(model, history.pairs, holdout.pairs, k=RECALL_K)
    return {
        "holdout_date": day,
        f"recall_at_{RECALL_K}": round(recall.model, 4),
        f"popularity_recall_at_{RECALL_K}": round(recall.popularity, 4),
        "recall_lift_over_popularity": round(recall.model / max(recall.popularity, 1e-9), 3),
        "eval_users": recall.users,
    }


def current_model(store: DataStore) -> TrainedModel:
    """The champion; raises ModelNotFoundError if none was trained."""
    stored = load_model(store.read_bytes, store.models_dir, RECOMMENDATION_MODEL)
    return TrainedModel(stored.version, stored.manifest)


def load_recommender(store: DataStore, version: str, runtime: Runtime) -> Model:
    """Loads one saved version onto the runtime's device (the inference resource caches it).

    The manifest says which kind it is; manifests written before EASE existed are two-tower.
    """
    stored = load_model(store.read_bytes, store.models_dir, RECOMMENDATION_MODEL, version)
    kind = EaseRecommender if stored.manifest.get("model") == "ease" else Recommender
    return kind.from_tensors(stored.tensors, runtime.device, runtime.dtype)


def current_recommender_version(store: DataStore) -> str:
    return champion_version(store.read_bytes, store.models_dir, RECOMMENDATION_MODEL)


# The promotion gate's list length: the top of the list a user actually sees.
GATE_K = 10


def evaluate(store: DataStore, version: str, days: list[str], runtime: Runtime) -> dict:
    """P@10 and recall@10 of one version on ``days``: each user is recommended 10 items, from
    their history before the first of those days, as nightly scoring would, and judged on the
    items they first took on those days. Every such user counts, whichever version knows them
    (a user a version cannot rank gets its popularity list), so both versions face the same
    users."""
    model = load_recommender(store, version, runtime)
    before = [d for d in store.landing_dates(INTERACTIONS) if d < min(days)]
    history = read_interactions(store, before).pairs
    relevant = _new_pairs(history, read_interactions(store, days).pairs)
    if relevant.empty:
        where = store.uri(store.path("landing", INTERACTIONS))
        raise LandingDataError(
            f"'{INTERACTIONS}' on {', '.join(days)} under {where}: no user took an item new to "
            f"them, so {RECOMMENDATION_MODEL} cannot be judged on these days"
        )
    users = relevant["user_id"].unique()
    listed = pd.concat(
        pd.DataFrame({"user_id": b.user_ids, "item_id": b.item_ids})
        for b in recommend(model, users, history, GATE_K, block_size=4096)
    )
    hits = listed.merge(relevant, on=["user_id", "item_id"]).groupby("user_id").size()
    hits = hits.reindex(users, fill_value=0).to_numpy()
    wanted = relevant.groupby("user_id").size().reindex(users).to_numpy()
    return {
        f"precision_at_{GATE_K}": float(np.mean(hits / GATE_K)),
        f"recall_at_{GATE_K}": float(np.mean(hits / np.minimum(GATE_K, wanted))),
    }


def _new_pairs(history: tuple, later: tuple) -> pd.DataFrame:
    """The distinct (user, item) pairs of ``later`` that are not in ``history``."""
    seen = pd.DataFrame({"user_id": history[0], "item_id": history[1]}).drop_duplicates()
    new = pd.DataFrame({"user_id": later[0], "item_id": later[1]}).drop_duplicates()
    marked = new.merge(seen, how="left", indicator=True)
    return marked.loc[marked["_merge"] == "left_only", ["user_id", "item_id"]]


RECOMMENDATION_GATE = Gate(
    model=RECOMMENDATION_MODEL,
    metrics=(f"precision_at_{GATE_K}", f"recall_at_{GATE_K}"),
    labelled_days=lambda store: store.landing_dates(INTERACTIONS),
    evaluate=evaluate,
    # About how far apart retrains of one history measure on two demo days (docs/models.md).
    tolerances={f"precision_at_{GATE_K}": 0.01, f"recall_at_{GATE_K}": 0.02},
)

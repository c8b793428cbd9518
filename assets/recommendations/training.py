"""Training the recommendation model from landing history, and saving or reusing it."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from dagster import MetadataValue

from assets.recommendations.history import read_interactions
from assets.recommendations.schemas import RECOMMENDATION_MODEL
from inference.device import Runtime
from inference.ease import EaseConfig, EaseRecommender, fit_ease
from inference.modelstore import load_model
from inference.recommend import Recommender, TrainConfig, fit_recommender, holdout_recall
from inference.registry import champion_version, register, window_of
from resources.storage import DataStore

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


def train_and_save(
    store: DataStore, dates: list[str], config: TrainConfig | EaseConfig, device: torch.device
) -> TrainedModel:
    """Measures recall@20 with the last day held out, then trains on every day and saves.

    The held-out figures come from a model fitted without the last day, so they say how the
    saved model (fitted on all days, same settings) can be expected to do on the next one.
    """
    metrics: dict = {"holdout_date": None}
    timings: dict[str, float] = {}
    if len(dates) > 1:
        history = read_interactions(store, dates[:-1])
        holdout = read_interactions(store, dates[-1:])
        trial, trial_seconds, _ = fit(history.triples, config, device)
        recall = holdout_recall(trial, history.pairs, holdout.pairs, k=RECALL_K)
        metrics = {
            "holdout_date": dates[-1],
            f"recall_at_{RECALL_K}": round(recall.model, 4),
            f"popularity_recall_at_{RECALL_K}": round(recall.popularity, 4),
            "recall_lift_over_popularity": round(recall.model / max(recall.popularity, 1e-9), 3),
            "eval_users": recall.users,
        }
        timings["holdout_fit_seconds"] = round(trial_seconds, 2)
    everything = read_interactions(store, dates)
    model, seconds, loss = fit(everything.triples, config, device)
    kind = model.KIND
    manifest = {
        "model": kind,
        "kind": KINDS[kind],
        **({"dims": config.dims} if isinstance(config, TrainConfig) else {}),
        "train_config": config.__dict__,
        "trained_on": {"first_date": dates[0], "last_date": dates[-1], "days": len(dates)},
        "trained_window": window_of(dates),
        "interactions": len(everything),
        "users": len(model.users),
        "items": len(model.items),
        "metrics": {
            **metrics,
            "final_loss": round(loss, 4) if loss is not None else None,
        },
    }
    version, _ = register(
        store.read_bytes,
        store.write_bytes,
        store.models_dir,
        RECOMMENDATION_MODEL,
        model.to_tensors(),
        manifest,
    )
    timings["train_seconds"] = round(seconds, 2)
    return TrainedModel(version, {**manifest, "version": version}, timings)


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

"""Recommendation quality on a real public rating log, nightshift beside the usual baselines.

Protocol: each user's ratings sorted by time; the last ``holdout`` share (at least one) is held
out (``--split random``: a seeded random share instead), the rest is replayed as daily ``interactions`` partitions (event ``view``, weight = the
rating, days shifted so the log starts on 2026-01-02). The real assets are materialised
against a temporary data root: ``interactions`` and ``recommendation_model`` on the landed days,
then ``user_recommendations`` for the last day with ``k`` lists, seen items excluded. A held-out
rating >= 4 is relevant; P@k, recall@k (hits / min(k, relevant)) and NDCG@k are averaged over
users with at least one relevant held-out item. Popularity, item-kNN (cosine; every item a
neighbour by default, which measured best of 20-all) and EASE (λ = 500) are computed here from the same training ratings, seen items
excluded the same way.

MovieLens 100k (GroupLens, University of Minnesota) may be used for research but not
redistributed, so it is not in the repository: put ``u.data`` from
https://files.grouplens.org/datasets/movielens/ml-100k.zip into ``.nightshift/eval/ml-100k/``
(its sha256 is checked). Run::

    HF_HUB_OFFLINE=1 nice .venv/bin/python -m evaluation.recommendations [--split random]
"""

from __future__ import annotations

import argparse
import hashlib
import tempfile
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pyarrow as pa
import torch
from dagster import DagsterInstance, RunConfig, materialize

from assets.recommendations import interactions, recommendation_model, user_recommendations
from assets.recommendations.assets import RecommendationModelConfig, UserRecommendationsConfig
from assets.recommendations.schemas import INTERACTIONS, INTERACTIONS_SCHEMA, USER_RECOMMENDATIONS
from inference.recs.ease import DEFAULT_L2, item_item_weights
from inference.recs.sparse import SparseRows, Vocabulary
from inference.recs.topk_blocks import top_k
from resources.inference import InferenceResource
from resources.storage import DataStore, StorageResource

ML_100K = Path(".nightshift/eval/ml-100k/u.data")
ML_100K_SHA256 = "06416e597f82b7342361e41163890c81036900f418ad91315590814211dca490"
FIRST_DAY = datetime(2026, 1, 2, tzinfo=UTC)
CPU = torch.device("cpu")


def load_movielens(path: Path = ML_100K) -> np.ndarray:
    """MovieLens 100k ``u.data`` as an (n, 4) int64 array: user, item, rating, unix seconds."""
    if not path.exists():
        raise FileNotFoundError(
            f"{path} is missing. MovieLens 100k may not be redistributed, so it is not in the "
            "repository: download https://files.grouplens.org/datasets/movielens/ml-100k.zip, "
            f"and copy ml-100k/u.data to {path} (sha256 {ML_100K_SHA256})."
        )
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if digest != ML_100K_SHA256:
        raise ValueError(f"{path} has sha256 {digest}, not MovieLens 100k's {ML_100K_SHA256}")
    return np.loadtxt(path, dtype=np.int64)


def split_last(
    ratings: np.ndarray, holdout: float, shuffle: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Per user, the latest ``holdout`` share of ratings (at least one) held out; with
    ``shuffle`` (a seed) a random share of each user's ratings instead."""
    within = ratings[:, 3]
    if shuffle is not None:
        within = np.random.default_rng(shuffle).permutation(len(ratings))
    order = np.lexsort((np.arange(len(ratings)), within, ratings[:, 0]))
    ordered = ratings[order]
    users, starts, counts = np.unique(ordered[:, 0], return_index=True, return_counts=True)
    held = np.maximum(1, np.floor(counts * holdout)).astype(np.int64)
    rank = np.arange(len(ordered)) - np.repeat(starts, counts)
    test = rank >= np.repeat(counts - held, counts)
    return ordered[~test], ordered[test]


def replay(store: DataStore, train: np.ndarray) -> list[str]:
    """Lands the training ratings as daily ``interactions`` partitions; returns the days."""
    shift = FIRST_DAY.timestamp() - (int(train[:, 3].min()) // 86400) * 86400
    seconds = train[:, 3] + int(shift)
    days = seconds // 86400
    dates = []
    for day in np.unique(days):
        rows = train[days == day]
        date = (datetime.fromtimestamp(int(day) * 86400, UTC)).date().isoformat()
        ts = pa.array((seconds[days == day] * 1_000_000).astype("datetime64[us]"))
        table = pa.table(
            {
                "user_id": rows[:, 0],
                "item_id": rows[:, 1],
                "ts": ts.cast(INTERACTIONS_SCHEMA.field("ts").type),
                "event": ["view"] * len(rows),
                "weight": rows[:, 2].astype(np.float32),
            },
            schema=INTERACTIONS_SCHEMA,
        )
        store.write_landing(INTERACTIONS, date, table)
        dates.append(date)
    return dates


def run_pipeline(
    root: Path, last_day: str, k: int, model: str, audience: str
) -> tuple[dict[int, list[int]], int]:
    """Materialises the real assets; returns each listed user's items and the users listed."""
    resources = {
        "storage": StorageResource(data_root=str(root)),
        "inference": InferenceResource(device="cpu", precision="fp32"),
    }
    config = RunConfig(
        {
            "recommendation_model": RecommendationModelConfig(retrain=True, model=model),
            "user_recommendations": UserRecommendationsConfig(k=k, audience=audience),
        }
    )
    with DagsterInstance.ephemeral() as instance:
        result = materialize(
            [interactions, recommendation_model, user_recommendations],
            partition_key=last_day,
            resources=resources,
            instance=instance,
            run_config=config,
            raise_on_error=True,
        )
    assert result.success
    out = DataStore(str(root)).read_output(USER_RECOMMENDATIONS, last_day).to_pandas()
    out = out.sort_values(["user_id", "rank"])
    lists = out.groupby("user_id")["item_id"].apply(list).to_dict()
    return {int(u): [int(i) for i in items] for u, items in lists.items()}, len(lists)


def baselines(train: np.ndarray, k: int, neighbours: int) -> dict[str, dict[int, list[int]]]:
    """Popularity, item-kNN (cosine) and EASE lists from the training ratings."""
    label = "all" if neighbours >= len(np.unique(train[:, 1])) else str(neighbours)
    return _baselines(train, k, neighbours, label)


def _baselines(
    train: np.ndarray, k: int, neighbours: int, label: str
) -> dict[str, dict[int, list[int]]]:
    users, items = Vocabulary.build(train[:, 0]), Vocabulary.build(train[:, 1])
    seen = SparseRows.from_pairs(users.index(train[:, 0]), items.index(train[:, 1]), len(users))
    local, cols, _ = seen.take(np.arange(seen.n_rows))
    x = torch.zeros(len(users), len(items))
    x[torch.from_numpy(local), torch.from_numpy(cols)] = 1.0
    counts = x.sum(0)
    gram = x.T @ x
    norms = counts.sqrt().clamp(min=1e-9)
    cosine = gram / norms[:, None] / norms[None, :]
    cosine.fill_diagonal_(0)
    if neighbours < len(items):  # keep each item's nearest neighbours only
        cut = torch.topk(cosine, neighbours, dim=0).values[-1]
        cosine = torch.where(cosine >= cut[None, :], cosine, torch.zeros(()))
    ease, _ = item_item_weights(seen, len(items), DEFAULT_L2, CPU)
    none = torch.zeros(len(users), 1), torch.zeros(len(items), 1)
    scorers = {
        "popularity": (*none, counts),
        f"item-kNN (cosine, {label} neighbours)": (x, cosine.T.contiguous(), None),
        f"EASE (lambda {DEFAULT_L2:g})": (x, ease.T, None),
    }
    lists = {}
    for name, scorer in scorers.items():
        _, ranked = top_k(*scorer, seen, k, tiled=False)
        lists[name] = {
            int(u): [int(items.ids[i]) for i in row if i >= 0]
            for u, row in zip(users.ids, ranked, strict=True)
        }
    return lists


def metrics(lists: dict[int, list[int]], relevant: dict[int, set[int]], k: int) -> dict:
    """P@k, recall@k and NDCG@k over users with a relevant held-out item (no list: zeros)."""
    discounts = 1 / np.log2(np.arange(2, k + 2))
    p, r, n = [], [], []
    for user, good in relevant.items():
        hits = np.array([i in good for i in lists.get(user, [])[:k]], bool)
        gains = float((discounts[: len(hits)] * hits).sum())
        p.append(hits.sum() / k)
        r.append(hits.sum() / min(k, len(good)))
        n.append(gains / discounts[: min(k, len(good))].sum())
    return {f"P@{k}": np.mean(p), f"recall@{k}": np.mean(r), f"NDCG@{k}": np.mean(n)}


def evaluate(
    ratings: np.ndarray | None = None,
    dataset: str = "MovieLens 100k",
    *,
    k: int = 10,
    holdout: float = 0.2,
    split: str = "last",
    neighbours: int | None = None,
    two_tower: bool = True,
) -> list[dict]:
    """Scores nightshift and the baselines on one rating log.

    Args:
        ratings: (n, 4) user, item, rating, unix seconds; MovieLens 100k from the cache if None.
        dataset: the name in the rows.
        k: list length.
        holdout: share of each user's ratings held out.
        split: ``last`` holds out each user's latest ratings; ``random`` a seeded random share.
        neighbours: item-kNN neighbourhood size (None: every item; the strongest measured).
        two_tower: also run the pipeline with the two-tower model.

    Returns:
        rows of dataset, method, metric, value, users (users the metric averages over, or
        for ``users_with_lists`` the users in the log).
    """
    ratings = load_movielens() if ratings is None else np.asarray(ratings, np.int64)
    train, test = split_last(ratings, holdout, shuffle=0 if split == "random" else None)
    relevant: dict[int, set[int]] = {}
    for user, item in test[test[:, 2] >= 4][:, :2]:
        relevant.setdefault(int(user), set()).add(int(item))
    everyone = len(np.unique(ratings[:, 0]))
    rows: list[dict] = []

    def add(method: str, lists: dict[int, list[int]], listed: int | None = None) -> None:
        for metric, value in metrics(lists, relevant, k).items():
            rows.append(_row(dataset, method, metric, value, len(relevant)))
        if listed is not None:
            rows.append(_row(dataset, method, "users_with_lists", listed, everyone))

    with tempfile.TemporaryDirectory(prefix="nightshift-eval-") as tmp:
        root = Path(tmp) / "data"
        days = replay(DataStore(str(root)), train)
        runs = [("ease", "all"), ("ease", "recent")] + ([("two_tower", "all")] if two_tower else [])
        for model, audience in runs:
            lists, listed = run_pipeline(root, days[-1], k, model, audience)
            window = "every known user" if audience == "all" else "users seen in the last 90 days"
            add(f"nightshift {model} ({window})", lists, listed)
    for method, lists in baselines(train, k, neighbours or len(np.unique(train[:, 1]))).items():
        add(method, lists)
    return rows


def _row(dataset: str, method: str, metric: str, value: float, users: int) -> dict:
    return {
        "dataset": dataset,
        "method": method,
        "metric": metric,
        "value": round(float(value), 4),
        "users": users,
    }


def table(rows: list[dict]) -> str:
    """The rows as a Markdown table, one line per method, one column per metric."""
    metrics_seen = list(dict.fromkeys(r["metric"] for r in rows))
    methods = list(dict.fromkeys((r["dataset"], r["method"]) for r in rows))
    values = {(r["dataset"], r["method"], r["metric"]): r for r in rows}
    users = next((r["users"] for r in rows if r["metric"] != "users_with_lists"), 0)
    lines = [
        f"| dataset | method | {' | '.join(metrics_seen)} |",
        "|---|---|" + "---|" * len(metrics_seen),
    ]
    for dataset, method in methods:
        cells = []
        for m in metrics_seen:
            row = values.get((dataset, method, m))
            if row is None:
                cells.append("")
            elif m == "users_with_lists":
                cells.append(f"{int(row['value'])} of {row['users']}")
            else:
                cells.append(f"{row['value']:.3f}")
        lines.append(f"| {dataset} | {method} | {' | '.join(cells)} |")
    note = f"Metrics average over {users} users with a relevant held-out item."
    return "\n".join(lines) + "\n\n" + note


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--holdout", type=float, default=0.2)
    parser.add_argument("--split", choices=["last", "random"], default="last")
    parser.add_argument("--neighbours", type=int, default=None, help="item-kNN (default: all)")
    parser.add_argument("--no-two-tower", action="store_true")
    args = parser.parse_args()
    rows = evaluate(
        k=args.k,
        holdout=args.holdout,
        split=args.split,
        neighbours=args.neighbours,
        two_tower=not args.no_two_tower,
    )
    print(table(rows))


if __name__ == "__main__":
    main()

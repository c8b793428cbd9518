"""Demo interaction logs with real latent structure, for the recommendations domain.

The catalogue is split into genres; every user has a sparse taste over genres and an activity
rate, and items within a genre have a skewed popularity. Tastes, activity and popularity are
derived from the seed alone, so the same user behaves consistently on every date; only which
users show up and what they pick that day depend on the date. A model that learns the genre
structure therefore beats a global popularity ranking by a clear margin.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from datetime import date as Date

import numpy as np
import pyarrow as pa

from assets.recommendations.schemas import INTERACTIONS, INTERACTIONS_SCHEMA
from resources.storage import DataStore

USERS_AT_SCALE_1 = 20_000
ITEMS_AT_SCALE_1 = 5_000
GENRES = 24
EVENTS = np.array(["view", "click", "purchase"])
EVENT_PROBABILITIES = np.array([0.80, 0.15, 0.05])
# A purchase says more about taste than a view; downstream training weights events by this.
EVENT_WEIGHTS = np.array([1.0, 2.0, 4.0], dtype=np.float32)
# Share of events that ignore taste and follow global popularity (browsing the front page).
EXPLORATION = 0.15
DAY_US = 86_400 * 1_000_000


@dataclass(frozen=True)
class World:
    """The seed-derived population: ids, tastes, activity and item popularity."""

    user_ids: np.ndarray  # int64, (users,)
    item_ids: np.ndarray  # int64, (items,), grouped by genre
    user_genre_cdf: np.ndarray  # (users, genres) cumulative taste
    user_activity: np.ndarray  # chance a user is active on a given day
    user_intensity: np.ndarray  # mean extra events on an active day
    genre_offsets: np.ndarray  # (genres + 1,) slices of item_ids per genre
    within_genre_cdf: np.ndarray  # genre index + cumulative popularity inside the genre
    global_cdf: np.ndarray  # cumulative popularity over all items


def make_world(scale: float = 1.0, seed: int = 0) -> World:
    """Builds the population for a scale; depends on (scale, seed) only, never on the date."""
    rng = np.random.default_rng([seed])
    n_users = max(50, round(USERS_AT_SCALE_1 * scale))
    n_items = max(GENRES * 4, round(ITEMS_AT_SCALE_1 * scale))
    # Sparse ids, not 0..n-1, so nothing downstream can confuse an id with a row index.
    user_ids = np.sort(rng.choice(10**9, size=n_users, replace=False)).astype(np.int64) + 1
    item_ids = rng.choice(10**8, size=n_items, replace=False).astype(np.int64) + 1

    genre_share = rng.dirichlet(np.full(GENRES, 3.0))
    sizes = np.maximum(2, np.round(genre_share * n_items).astype(int))
    sizes[-1] = n_items - sizes[:-1].sum()
    genre_offsets = np.concatenate([[0], np.cumsum(sizes)])
    popularity = rng.lognormal(mean=0.0, sigma=1.3, size=n_items)
    popularity *= np.repeat(rng.lognormal(0.0, 0.5, GENRES), sizes)  # some genres are bigger hits
    within = np.empty(n_items)
    for g in range(GENRES):
        part = popularity[genre_offsets[g] : genre_offsets[g + 1]]
        within[genre_offsets[g] : genre_offsets[g + 1]] = g + np.cumsum(part) / part.sum()

    # A small concentration makes most users care about one to three genres.
    tastes = rng.dirichlet(np.full(GENRES, 0.12), size=n_users)
    return World(
        user_ids=user_ids,
        item_ids=item_ids,
        user_genre_cdf=np.cumsum(tastes, axis=1),
        user_activity=rng.beta(2.0, 5.0, size=n_users),
        user_intensity=rng.gamma(2.0, 3.0, size=n_users),
        genre_offsets=genre_offsets,
        within_genre_cdf=within,
        global_cdf=np.cumsum(popularity) / popularity.sum(),
    )


def generate_interactions(world: World, date: str, seed: int = 0) -> pa.Table:
    """One day of interaction events for a world, seeded from (seed, date)."""
    rng = np.random.default_rng([seed, int(date.replace("-", ""))])
    active = np.flatnonzero(rng.random(len(world.user_ids)) < world.user_activity)
    counts = 1 + rng.poisson(world.user_intensity[active])
    users = np.repeat(active, counts)
    n = len(users)

    draw = rng.random(n)
    genres = (world.user_genre_cdf[users] < draw[:, None]).sum(axis=1).clip(max=GENRES - 1)
    items = np.searchsorted(world.within_genre_cdf, genres + rng.random(n))
    items = np.clip(items, world.genre_offsets[genres], world.genre_offsets[genres + 1] - 1)
    explore = rng.random(n) < EXPLORATION
    items[explore] = np.searchsorted(world.global_cdf, rng.random(explore.sum())).clip(
        max=len(world.item_ids) - 1
    )

    events = rng.choice(len(EVENTS), size=n, p=EVENT_PROBABILITIES)
    midnight = datetime.combine(Date.fromisoformat(date), datetime.min.time(), UTC)
    start_us = int(midnight.timestamp()) * 1_000_000
    ts = np.sort(rng.integers(0, DAY_US, size=n)) + start_us
    order = rng.permutation(n)  # events of one user are spread over the day, not adjacent
    users, items, events = users[order], items[order], events[order]
    return pa.table(
        {
            "user_id": pa.array(world.user_ids[users], pa.int64()),
            "item_id": pa.array(world.item_ids[items], pa.int64()),
            "ts": pa.array(ts, pa.timestamp("us", tz="UTC")),
            "event": pa.array(EVENTS[events], pa.string()),
            "weight": pa.array(EVENT_WEIGHTS[events], pa.float32()),
        },
        schema=INTERACTIONS_SCHEMA,
    )


def generate_day(store: DataStore, date: str, scale: float = 1.0, seed: int = 0) -> dict[str, int]:
    """Writes one day of ``interactions`` landing data; same arguments, same bytes.

    At scale 1: 20k users, 5k items, about 40k events a day from about 5.7k active users.
    """
    table = generate_interactions(make_world(scale, seed), date, seed)
    store.write_landing(INTERACTIONS, date, table, on_time=True)
    return {INTERACTIONS: table.num_rows}

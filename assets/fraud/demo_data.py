"""Synthetic card transactions with learnable fraud, for demos and tests.

A fixed population of accounts and merchants (seeded by ``seed`` and ``scale``) transacts every
day (seeded by ``seed`` and the date). Each account has a home country, a typical spend, channel
habits and a handful of regular merchants; a few accounts travel on a given day. Fraud comes in
incidents on a victim account (about 1.2% of transactions):

- bursts: several quick card-not-present payments at merchants new to the account;
- large amounts: a few times to tens of times the account's usual spend;
- foreign use: payments or cash withdrawals in a country the account is not in that day.

Legitimate behaviour overlaps each pattern a little (travel, large purchases, split payments),
so the patterns are learnable but not trivially separable.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from datetime import date as Date
from functools import lru_cache

import numpy as np
import pyarrow as pa

from assets.fraud.schemas import (
    LABELLED_SCHEMA,
    TRANSACTIONS,
    TRANSACTIONS_LABELLED,
    TRANSACTIONS_SCHEMA,
)
from resources.storage import DataStore

ROWS_PER_DAY = 100_000
HOME_COUNTRIES = np.array(["GB", "DE", "FR", "NL", "ES", "IT", "IE", "BE"])
HOME_WEIGHTS = np.array([0.30, 0.20, 0.15, 0.10, 0.08, 0.08, 0.05, 0.04])
TRAVEL_COUNTRIES = np.array(["ES", "FR", "IT", "PT", "GR", "US", "DE", "GB", "TH", "TR", "MA"])
TRAVEL_WEIGHTS = np.array([0.16, 0.14, 0.13, 0.12, 0.10, 0.10, 0.07, 0.07, 0.04, 0.04, 0.03])
FRAUD_COUNTRIES = np.array(["BR", "MX", "TH", "ZA", "TR", "AE", "MA", "US", "CN", "ID"])
CURRENCIES = {
    "GB": "GBP",
    "US": "USD",
    "TH": "THB",
    "TR": "TRY",
    "MA": "MAD",
    "BR": "BRL",
    "MX": "MXN",
    "ZA": "ZAR",
    "AE": "AED",
    "CN": "CNY",
    "ID": "IDR",
}
CHANNELS = np.array(["pos", "online", "atm", "contactless"])
REGULAR_MERCHANTS = 6
FRAUD_INCIDENTS_PER_ROW = 0.0035


@dataclass(frozen=True)
class Population:
    """The accounts and merchants that exist, whatever the day."""

    home: np.ndarray  # index into HOME_COUNTRIES
    activity: np.ndarray  # probability an account makes a given transaction
    spend_mu: np.ndarray  # log of typical spend
    spend_sigma: np.ndarray
    channel_cdf: np.ndarray  # (accounts, channels) cumulative channel habits
    regulars: np.ndarray  # (accounts, REGULAR_MERCHANTS) merchant indices
    merchant_popularity: np.ndarray
    merchant_price: np.ndarray  # multiplier on spend at that merchant


@lru_cache(maxsize=4)
def population(scale: float, seed: int) -> Population:
    """The population for a scale and seed (cached: every day of a run shares it)."""
    rng = np.random.default_rng([seed, 0x5EED])
    n_accounts = max(60, int(round(20_000 * scale)))
    n_merchants = max(40, int(round(4_000 * scale)))
    popularity = 1.0 / np.arange(1, n_merchants + 1) ** 0.9
    popularity = rng.permutation(popularity / popularity.sum())
    habits = rng.dirichlet([4.0, 3.0, 0.4, 3.0], size=n_accounts)
    activity = rng.lognormal(0.0, 0.7, n_accounts)
    return Population(
        home=rng.choice(len(HOME_COUNTRIES), n_accounts, p=HOME_WEIGHTS),
        activity=activity / activity.sum(),
        spend_mu=rng.normal(3.2, 0.5, n_accounts),
        spend_sigma=rng.uniform(0.35, 0.75, n_accounts),
        channel_cdf=np.cumsum(habits, axis=1),
        regulars=rng.choice(n_merchants, (n_accounts, REGULAR_MERCHANTS), p=popularity),
        merchant_popularity=popularity,
        merchant_price=rng.lognormal(0.0, 0.3, n_merchants),
    )


def _day_seconds(rng: np.random.Generator, n: int) -> np.ndarray:
    """Times of day in seconds: busy around lunch and early evening, quiet at night."""
    centre = rng.choice([11.5 * 3600, 18.0 * 3600], n, p=[0.45, 0.55])
    return np.mod(rng.normal(centre, 3.2 * 3600), 86_400).astype(np.int64)


def _pick_channels(rng: np.random.Generator, cdf: np.ndarray) -> np.ndarray:
    return (rng.random((len(cdf), 1)) > cdf).sum(axis=1).clip(0, len(CHANNELS) - 1)


def _legit(rng: np.random.Generator, pop: Population, n: int) -> dict[str, np.ndarray]:
    n_accounts, n_merchants = len(pop.activity), len(pop.merchant_popularity)
    acc = rng.choice(n_accounts, n, p=pop.activity)
    regular = pop.regulars[acc, rng.integers(0, REGULAR_MERCHANTS, n)]
    other = rng.choice(n_merchants, n, p=pop.merchant_popularity)
    merchant = np.where(rng.random(n) < 0.8, regular, other)
    seconds = _day_seconds(rng, n)
    # Split payments: a second payment by the same account at the same merchant minutes after
    # another, so not every burst is fraud.
    follow = np.flatnonzero(rng.random(n) < 0.03)
    parent = rng.integers(0, n, len(follow))
    acc[follow], merchant[follow] = acc[parent], merchant[parent]
    seconds[follow] = np.minimum(seconds[parent] + rng.integers(30, 900, len(follow)), 86_399)
    spend = np.exp(rng.normal(pop.spend_mu[acc], pop.spend_sigma[acc]))
    amount = spend * pop.merchant_price[merchant]
    # Some legitimate purchases are big too (a flight, a sofa).
    amount *= np.where(rng.random(n) < 0.01, rng.uniform(4, 15, n), 1.0)
    # Travellers spend the whole day abroad.
    travelling = rng.random(n_accounts) < 0.02
    destination = TRAVEL_COUNTRIES[rng.choice(len(TRAVEL_COUNTRIES), n_accounts, p=TRAVEL_WEIGHTS)]
    country = np.where(travelling[acc], destination[acc], HOME_COUNTRIES[pop.home[acc]])
    return {
        "account": acc,
        "merchant": merchant,
        "amount": amount,
        "seconds": seconds,
        "channel": _pick_channels(rng, pop.channel_cdf[acc]),
        "country": country,
    }


def _fraud(rng: np.random.Generator, pop: Population, incidents: int) -> dict[str, np.ndarray]:
    n_accounts, n_merchants = len(pop.activity), len(pop.merchant_popularity)
    kind = rng.choice(3, incidents, p=[0.5, 0.25, 0.25])  # burst, large amount, foreign
    size = np.select(
        [kind == 0, kind == 1],
        [rng.integers(3, 9, incidents), rng.integers(1, 3, incidents)],
        rng.integers(1, 4, incidents),
    )
    incident = np.repeat(np.arange(incidents), size)
    n = len(incident)
    kind_row = kind[incident]
    acc = rng.choice(n_accounts, incidents, p=pop.activity)[incident]
    start = rng.integers(0, 86_400, incidents)[incident]
    # Rows of one incident follow each other by about 40 s (bursts) to 20 min (others).
    gaps = np.where(kind_row == 0, rng.exponential(40, n), rng.exponential(1_200, n))
    gaps = gaps.astype(np.int64)
    first = np.r_[True, incident[1:] != incident[:-1]]
    gaps[first] = 0
    offsets = np.cumsum(gaps) - np.repeat(np.cumsum(gaps)[first], size)
    seconds = np.minimum(start + offsets, 86_399)
    # Fraudsters often pick obscure merchants, and never the account's own regular ones on purpose.
    merchant = np.where(
        rng.random(n) < 0.6,
        rng.integers(0, n_merchants, n),
        rng.choice(n_merchants, n, p=pop.merchant_popularity),
    )
    spend = np.exp(rng.normal(pop.spend_mu[acc], pop.spend_sigma[acc]))
    multiplier = np.select(
        [kind_row == 0, kind_row == 1],
        [rng.lognormal(0.4, 0.5, n), rng.lognormal(2.0, 0.6, n)],
        rng.lognormal(0.8, 0.6, n),
    )
    abroad = (kind_row == 2) | ((kind_row == 0) & (rng.random(incidents) < 0.4)[incident])
    country = np.where(
        abroad,
        FRAUD_COUNTRIES[rng.integers(0, len(FRAUD_COUNTRIES), incidents)][incident],
        HOME_COUNTRIES[pop.home[acc]],
    )
    channel = np.select(
        [kind_row == 0, kind_row == 1],
        [np.where(rng.random(n) < 0.85, 1, 0), rng.choice([0, 1, 3], n, p=[0.3, 0.6, 0.1])],
        rng.choice([0, 2, 3], n, p=[0.4, 0.4, 0.2]),
    )
    return {
        "account": acc,
        "merchant": merchant,
        "amount": spend * multiplier,
        "seconds": seconds,
        "channel": channel,
        "country": country,
    }


def _ids(prefix: str, numbers: np.ndarray, digits: int) -> np.ndarray:
    return np.char.add(prefix, np.char.zfill(numbers.astype(str), digits))


def _day_start_micros(date: str) -> int:
    day = datetime.combine(Date.fromisoformat(date), datetime.min.time(), tzinfo=UTC)
    return int(day.timestamp()) * 1_000_000


def generate_day(store: DataStore, date: str, scale: float = 1.0, seed: int = 0) -> dict[str, int]:
    """Writes one day of transactions and their labelled copy to the landing area.

    Args:
        store: where to write (``landing/transactions`` and ``landing/transactions_labelled``).
        date: the day, ``YYYY-MM-DD``.
        scale: 1.0 is about 100k transactions a day; the population scales with it.
        seed: same seed, date and scale give the same bytes.

    Returns:
        rows written per dataset.
    """
    day = Date.fromisoformat(date)
    rng = np.random.default_rng([seed, day.toordinal()])
    pop = population(float(scale), int(seed))
    rows = max(50, int(round(ROWS_PER_DAY * scale)))
    fraud = _fraud(rng, pop, max(1, rng.poisson(rows * FRAUD_INCIDENTS_PER_ROW)))
    legit = _legit(rng, pop, rows - len(fraud["account"]))
    parts = {k: np.concatenate([legit[k], fraud[k]]) for k in legit}
    label = np.r_[np.zeros(len(legit["account"]), np.int8), np.ones(len(fraud["account"]), np.int8)]
    micros = parts["seconds"] * 1_000_000 + rng.integers(0, 1_000_000, len(label))
    order = np.argsort(micros, kind="stable")
    country = parts["country"][order]
    ids = _ids(f"tx-{day:%Y%m%d}-", np.arange(len(order)), 7)
    amount = np.round(parts["amount"][order], 2)
    # Cash machines hand out round sums.
    atm = parts["channel"][order] == 2
    amount[atm] = np.maximum(np.round(amount[atm], -1), 10.0)
    table = pa.table(
        {
            "transaction_id": ids,
            "account_id": _ids("acct-", parts["account"][order], 6),
            "merchant_id": _ids("m-", parts["merchant"][order], 5),
            "amount": amount,
            "currency": np.array([CURRENCIES.get(c, "EUR") for c in country]),
            "ts": pa.array(_day_start_micros(date) + micros[order], pa.timestamp("us", tz="UTC")),
            "channel": CHANNELS[parts["channel"][order]],
            "country": country,
        },
        schema=TRANSACTIONS_SCHEMA,
    )
    labelled = table.append_column(LABELLED_SCHEMA.field("is_fraud"), pa.array(label[order]))
    store.write_landing(TRANSACTIONS, date, table, on_time=True)
    store.write_landing(TRANSACTIONS_LABELLED, date, labelled, on_time=True)
    return {TRANSACTIONS: table.num_rows, TRANSACTIONS_LABELLED: labelled.num_rows}

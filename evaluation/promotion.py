"""The fraud promotion gate on real card transactions: retrain noise, bad retrains, a better one.

The data is the committed ULB credit-card sample (tests/fixtures/creditcard_sample.csv: all 492
frauds of the ULB set and 1,230 genuine rows, 28.6% fraud, ~48 hours of ``Time``). It is cut by
``Time`` into ``--windows`` equal windows, each landed as one pseudo-day of
``transactions_labelled`` (window k on ``2026-03-01`` + k days, each row at its own second of
the day, ``Time`` mod 86,400), so the newest windows are the newest days, as the gate requires.
The ULB rows carry no cardholder, merchant, country or channel: each row is its own account
and merchant, with one country and channel, so of nightshift's features only the amount and the
time of day tell rows apart. V1..V28 never reach the model: the pipeline cannot compute them.

Every figure comes from the real path: ``fraud_training_job`` run in this process on a temporary
data root (as tests/test_promotion.py runs it), whose blocking check
``challenger_not_worse_than_champion`` scores both versions with the gate's own evaluation
function (assets/fraud/pipeline.py ``evaluate``) on the last two pseudo-days, which neither
version trained on. Each trial starts from a copy of one root holding the champion, so every
challenger meets the same champion.

Two figures are measured beside the gate, on the same trial's root: the sampling error of the
gate's figures (the gate's evaluation function called directly on bootstrap resamples of the
held-out rows), and the recall each version reaches at the champion's alert budget (the
pipeline's ``load_scorer`` and ``training_set``), a comparison a lower threshold cannot win.
The tables (evaluation/promotion_report.py) replay the gate's rule over the measured
figures with other tolerances.

    python -m evaluation.promotion [--json FILE]
    python -m evaluation.promotion --report FILE  # the tables of a saved run
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa

from assets.fraud.pipeline import FRAUD_GATE, load_scorer, training_set
from assets.fraud.schemas import LABELLED_SCHEMA, MODEL_NAME, TRANSACTIONS_LABELLED
from evaluation.promotion_report import SAME, report, rule_table
from inference.engine.device import make_runtime
from orchestration.promotion import GATE_CHECK
from resources.storage import DataStore

CREDITCARD = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "creditcard_sample.csv"
FIRST_DAY = date(2026, 3, 1)
SECONDS_PER_DAY = 86_400
# Pseudo-days of 4, 8 and 12 hours: 77, 136 and 212 frauds on the two held-out days.
WINDOWS = (12, 6, 4)
SEEDS = 12
BAD_SEEDS = 5
METRICS = FRAUD_GATE.metrics


def pseudo_days(frame: pd.DataFrame, windows: int) -> dict[str, pd.DataFrame]:
    """The sample cut by ``Time`` into ``windows`` equal spans, oldest first, keyed by date."""
    span = (frame["Time"].max() + 1) / windows
    index = np.minimum((frame["Time"] // span).astype(int), windows - 1)
    return {(FIRST_DAY + timedelta(days=k)).isoformat(): frame[index == k] for k in range(windows)}


def labelled_table(rows: pd.DataFrame, day: str, tag: str = "") -> pa.Table:
    """One pseudo-day of ULB rows in the transactions_labelled contract; ``tag`` keeps the ids
    of a resampled day unique (a row drawn twice is two transactions, two accounts)."""
    start = datetime.fromisoformat(day).replace(tzinfo=UTC)
    seconds = (rows["Time"].to_numpy() % SECONDS_PER_DAY).astype("int64")
    keys = [f"{i}{tag}-{n}" if tag else str(i) for n, i in enumerate(rows.index)]
    n = len(rows)
    return pa.table(
        {
            "transaction_id": [f"ulb-{k}" for k in keys],
            # No cardholder or merchant in the ULB set: one of each per transaction.
            "account_id": [f"acct-{k}" for k in keys],
            "merchant_id": [f"m-{k}" for k in keys],
            "amount": rows["Amount"].to_numpy(np.float64),
            "currency": ["EUR"] * n,
            "ts": pa.array(
                [start + timedelta(seconds=int(s)) for s in seconds], pa.timestamp("us", tz="UTC")
            ),
            "channel": ["pos"] * n,
            "country": ["BE"] * n,
            "is_fraud": rows["Class"].to_numpy(np.int8),
        },
        schema=LABELLED_SCHEMA,
    )


@dataclass(frozen=True)
class Trial:
    """One retrain judged by the gate: what it trained on and the check's figures."""

    scenario: str
    seed: int
    history_days: int
    training_days: int
    val_auprc: float
    passed: bool
    gate: dict
    budget_recall: dict
    bootstrap: dict | None = None


@contextmanager
def data_root(source: Path | None = None) -> Iterator[Path]:
    """A temporary data root (a copy of ``source`` if given), as $NIGHTSHIFT_DATA_ROOT."""
    with tempfile.TemporaryDirectory(prefix="nightshift-promotion-") as tmp:
        root = Path(tmp) / "data"
        if source is None:
            root.mkdir()
        else:
            shutil.copytree(source, root)
        before = os.environ.get("NIGHTSHIFT_DATA_ROOT")
        os.environ["NIGHTSHIFT_DATA_ROOT"] = str(root)
        try:
            yield root
        finally:
            if before is None:
                os.environ.pop("NIGHTSHIFT_DATA_ROOT")
            else:
                os.environ["NIGHTSHIFT_DATA_ROOT"] = before


def train(seed: int, history_days: int | None = None):
    """One run of the real fraud_training_job on $NIGHTSHIFT_DATA_ROOT, on a fresh instance."""
    from dagster import DagsterInstance

    from orchestration.definitions import build_definitions

    config: dict = {"retrain": True, "seed": seed}
    if history_days is not None:
        config["history_days"] = history_days
    job = build_definitions("local").resolve_job_def("fraud_training_job")
    with DagsterInstance.ephemeral() as instance:
        return job.execute_in_process(
            run_config={
                "ops": {MODEL_NAME: {"config": config}},
                "loggers": {"console": {"config": {"log_level": "WARNING"}}},
            },
            instance=instance,
            raise_on_error=False,
        )


def _materialization(result) -> dict:
    """The model as its step trained it: a run whose gate promoted it materialises the model a
    second time, as champion (assets/model_asset.py)."""
    event, *promoted = result.get_asset_materialization_events()
    assert len(promoted) <= 1, "one training run materialises its model once, or twice"
    metadata = event.event_specific_data.materialization.metadata
    return {k: v.value for k, v in metadata.items()}


def _gate(result) -> tuple[bool, dict]:
    [check] = [c for c in result.get_asset_check_evaluations() if c.check_name == GATE_CHECK]
    return check.passed, {k: v.value for k, v in check.metadata.items()}


def land(store: DataStore, days: dict[str, pd.DataFrame], names: Sequence[str]) -> None:
    for day in names:
        store.write_landing(TRANSACTIONS_LABELLED, day, labelled_table(days[day], day))


def relabel(store: DataStore, history: Sequence[str], change: Relabel, seed: int) -> None:
    """Rewrites the history's labels in place, as a bad label export would land them."""
    rng = np.random.default_rng(seed)
    for day in history:
        table = store.read_landing(TRANSACTIONS_LABELLED, day, LABELLED_SCHEMA)
        labels = change(table["is_fraud"].to_numpy().copy(), rng)
        column = table.schema.get_field_index("is_fraud")
        table = table.set_column(column, table.schema.field(column), pa.array(labels, pa.int8()))
        store.write_landing(TRANSACTIONS_LABELLED, day, table)


Relabel = Callable[[np.ndarray, np.random.Generator], np.ndarray]


def shuffled(labels: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    return rng.permutation(labels)


def noisy(labels: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """A tenth of the frauds labelled genuine, and as many genuine ones labelled fraud (the
    noisy export of tests/test_promotion.py)."""
    fraud, genuine = np.flatnonzero(labels == 1), np.flatnonzero(labels == 0)
    flips = max(1, len(fraud) // 10)
    labels[rng.choice(fraud, flips, replace=False)] = 0
    labels[rng.choice(genuine, flips, replace=False)] = 1
    return labels


def trial(scenario: str, seed: int, history_days: int | None = None) -> Trial:
    """A retrain through fraud_training_job on $NIGHTSHIFT_DATA_ROOT, and its gate's verdict,
    with both versions' recall at the champion's alert budget beside it."""
    result = train(seed, history_days)
    trained = _materialization(result)
    passed, gate = _gate(result)
    if not gate.get("evaluated"):
        raise RuntimeError(f"{scenario} seed {seed}: the gate judged nothing: {gate}")
    store = DataStore(os.environ["NIGHTSHIFT_DATA_ROOT"])
    versions = {"challenger": gate["challenger"], "champion": gate["champion"]}
    budget = budget_recall(store, versions, gate["evaluation_days"].split(", "))
    return Trial(
        scenario,
        seed,
        history_days or 0,
        int(trained["training_days"]),
        float(trained["val_auprc"]),
        passed,
        gate,
        budget,
    )


@contextmanager
def champion_root(
    days: dict[str, pd.DataFrame], history: int, seed: int, history_days: int | None
) -> Iterator[tuple[Path, dict]]:
    """A data root whose champion trained on the first ``history`` pseudo-days (its last
    ``history_days`` of them, if given), with the rest landed after it, as labels arrive.

    Yields:
        the root, and the champion's version, validation AUPRC and whether it cleared the
        validation floor (a champion below it is still the champion the gate compares with).
    """
    names = list(days)
    with data_root() as root:
        store = DataStore(str(root))
        land(store, days, names[:history])
        first = train(seed, history_days)
        if not first.is_node_success(MODEL_NAME):
            raise RuntimeError(f"the champion did not train: {first.get_step_failure_events()}")
        trained = _materialization(first)
        floor = [c for c in first.get_asset_check_evaluations() if c.check_name != GATE_CHECK]
        land(store, days, names[history:])
        yield (
            root,
            {
                "version": trained["model_version"],
                "training_days": int(trained["training_days"]),
                "val_auprc": float(trained["val_auprc"]),
                "floor_passed": all(c.passed for c in floor),
            },
        )


def bootstrap(store: DataStore, held: pd.DataFrame, versions: dict[str, str], reps: int) -> dict:
    """The sampling error of the gate's figures: ``reps`` resamples of the held-out rows (with
    replacement, landed as pseudo-days after every other), each scored for every version by
    the gate's own evaluation function.

    Returns:
        per metric, the standard error of each version's figure and of the paired margin
        (the first version's figure minus the second's).
    """
    runtime = make_runtime("cpu", "fp32")
    rng = np.random.default_rng(0)
    drawn: dict[str, dict[str, list[float]]] = {v: {k: [] for k in METRICS} for v in versions}
    for rep in range(reps):
        day = (RESAMPLED_FROM + timedelta(days=rep)).isoformat()
        rows = held.iloc[rng.integers(0, len(held), len(held))]
        store.write_landing(TRANSACTIONS_LABELLED, day, labelled_table(rows, day, f"r{rep}"))
        for name, version in versions.items():
            measured = FRAUD_GATE.evaluate(store, version, [day], runtime)
            for k in METRICS:
                drawn[name][k].append(measured[k])
    first, second = versions
    out: dict = {"reps": reps}
    for k in METRICS:
        a, b = np.array(drawn[first][k]), np.array(drawn[second][k])
        out[k] = {f"{first}_se": a.std(ddof=1), f"{second}_se": b.std(ddof=1),
                  "margin_se": (a - b).std(ddof=1)}  # fmt: skip
    return out


def budget_recall(store: DataStore, versions: dict[str, str], days: list[str]) -> dict:
    """Each version's recall when it raises as many alerts on ``days`` as the champion raises
    at its own threshold: recall at one alert budget, which a lower threshold cannot buy.

    Scored as the gate's evaluation scores (features from ``training_set``, clamped to each
    version's training ranges).
    """
    runtime = make_runtime("cpu", "fp32")
    scored = {}
    for name, version in versions.items():
        scorer = load_scorer(store, version, runtime)
        x, y = training_set(store, days, scorer.features, lambda _: None)
        if scorer.ranges is not None:
            x = scorer.ranges.guard(x).x
        scored[name] = (scorer.score(x), scorer.threshold)
    champion, threshold = scored["champion"]
    alerts = int(np.sum(champion >= threshold))
    out: dict = {"alerts": alerts, "rows": len(y), "threshold": {}}
    for name, (scores, own) in scored.items():
        top = np.argsort(-scores, kind="stable")[:alerts]
        out[name] = float(y[top].sum() / y.sum())
        # Recall at the version's own alert threshold: what the gate compared before.
        out["threshold"][name] = float(np.mean(scores[y == 1] >= own))
    return out


# Resampled held-out days are landed from here on, after every pseudo-day of the sample.
RESAMPLED_FROM = date(2030, 1, 1)


def run(
    path: Path, windows: int, seeds: int, bad_seeds: int, resampled_pairs: int = 2, reps: int = 200
) -> dict:
    """Every scenario on one cut of the sample; returns the cut's facts and the trials."""
    frame = pd.read_csv(path, index_col=0)
    days = pseudo_days(frame, windows)
    names = list(days)
    history = windows - FRAUD_GATE.eval_days
    held = pd.concat([days[d] for d in names[history:]])
    trials: list[Trial] = []
    champions = []
    with champion_root(days, history, 0, None) as (base, champion):
        champions.append(champion)
        for seed in range(1, seeds):
            with data_root(base) as root:
                done = trial(SAME, seed)
                if seed <= resampled_pairs:
                    gate = done.gate
                    versions = {"challenger": gate["challenger"], "champion": gate["champion"]}
                    errors = bootstrap(DataStore(str(root)), held, versions, reps)
                    done = replace(done, bootstrap=errors)
                trials.append(done)
        for seed in range(bad_seeds):
            with data_root(base) as root:
                relabel(DataStore(str(root)), names[:history], shuffled, seed)
                trials.append(trial("shuffled labels", seed))
            with data_root(base) as root:
                relabel(DataStore(str(root)), names[:history], noisy, seed)
                trials.append(
                    trial("a tenth of the history, 10% flipped", seed, max(1, history // 10))
                )
    with champion_root(days, history, 0, 1) as (base, champion):
        champions.append(champion)
        for seed in range(bad_seeds):
            with data_root(base):
                trials.append(trial("all history against a one-day champion", seed, history))
    return {
        "windows": windows,
        "hours_per_day": round(float(frame["Time"].max() + 1) / windows / 3600, 2),
        "history_days": history,
        "held_out_days": names[history:],
        "held_out_rows": len(held),
        "held_out_frauds": int(held["Class"].sum()),
        "champions": champions,
        "trials": [t.__dict__ for t in trials],
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, default=CREDITCARD)
    parser.add_argument("--windows", type=int, nargs="+", default=list(WINDOWS))
    parser.add_argument("--seeds", type=int, default=SEEDS, help="versions per history")
    parser.add_argument("--bad-seeds", type=int, default=BAD_SEEDS, help="retrains per scenario")
    parser.add_argument("--reps", type=int, default=200, help="resamples of the held-out rows")
    parser.add_argument("--json", type=Path, help="also write every trial's figures here")
    parser.add_argument("--report", type=Path, help="only print the tables of a --json file")
    args = parser.parse_args(argv)
    if args.report:
        cuts = json.loads(args.report.read_text())
    else:
        cuts = []
        for windows in args.windows:
            cuts.append(run(args.data, windows, args.seeds, args.bad_seeds, reps=args.reps))
            if args.json:  # after each cut, so a failure later keeps what was measured
                args.json.write_text(json.dumps(cuts, indent=1))
    for cut in cuts:
        print(report(cut, FRAUD_GATE.tolerances), end="\n\n")
    print(rule_table(cuts))
    return 0


if __name__ == "__main__":
    sys.exit(main())

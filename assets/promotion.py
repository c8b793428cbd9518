"""The promotion gate over a DataStore: a challenger replaces the champion only when it
measures at least as well on the same held-out days, the most recent labelled days that neither
version trained on.

Plain functions that read the versions' windows from the model store, measure both versions and
move the aliases; the gate, its verdict and its day arithmetic are plain values
(``inference/models/gate.py``). ``orchestration/promotion.py`` makes them a blocking asset check
on each training asset and a promotion job. A domain supplies a ``Gate``: which days are
labelled, and a metric function scoring one version on some of those days.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from assets.shadow.nights import nights_verdict
from inference.engine.device import Runtime
from inference.models.gate import (
    CannotJudgeError,
    Gate,
    Metrics,
    Verdict,
    evaluation_days,
    promote_anyway,
    window_span,
)
from inference.models.modelstore import ModelNotFoundError, ModelUnusableError, load_model
from inference.models.registry import (
    challenger_version,
    champion_version,
    promote,
    trained_window,
)
from resources.storage import DataStore


def version_window(store: DataStore, name: str, version: str) -> tuple[str, str] | None:
    """The days the version trained on, from its manifest."""
    return trained_window(load_model(store.read_bytes, store.models_dir, name, version).manifest)


def held_out_days(store: DataStore, gate: Gate, labelled: Sequence[str]) -> list[str]:
    """The days a new version must not train on, so the gate can compare it with the champion:
    the most recent ``gate.eval_days`` labelled days after the last one the champion trained
    on. Empty when the name has no champion (its first version is compared with nothing), or
    when no labelled day came after the champion's (the gate will say it cannot measure).

    A new version trains only on days before these, so its window never spans them.
    """
    try:
        champion = champion_version(store.read_bytes, store.models_dir, gate.model)
        window = version_window(store, gate.model, champion)
    except (ModelNotFoundError, ModelUnusableError):
        # No champion, or one whose files are damaged: nothing this version can be compared
        # with, so it trains on every day and waits for a person to promote it.
        return []
    if window is None:
        return []
    return [d for d in sorted(labelled) if d > window[1]][-gate.eval_days :]


def judge(
    store: DataStore,
    gate: Gate,
    runtime: Runtime,
    challenger: str,
    by: str,
    tolerances: Metrics | None = None,
    clean_nights: int | None = None,
) -> Verdict:
    """Evaluates ``challenger`` and the champion on the same held-out days and promotes the
    challenger when no metric trails the champion's by more than its tolerance (the gate's,
    or ``tolerances`` where they name a metric) and, when ``clean_nights`` (default the
    gate's) is above 0, its last that many shadow nights against the champion were clean.

    Raises:
        CannotJudgeError: every labelled day is inside a training window, or a version's
            files are unusable.
    """
    name, read = gate.model, store.read_bytes
    tolerance = {**gate.tolerances, **(tolerances or {})}
    champion = champion_version(read, store.models_dir, name)
    try:
        windows = [version_window(store, name, v) for v in (challenger, champion)]
    except ModelUnusableError as exc:
        raise CannotJudgeError(
            f"{name}: cannot compare challenger {challenger} with champion {champion}: {exc}. "
            f"If the challenger should score: {promote_anyway(name, challenger)}"
        ) from exc
    days = evaluation_days(gate.labelled_days(store), windows, gate.eval_days)
    if not days:
        raise CannotJudgeError(
            f"{name}: no labelled day that neither challenger {challenger} (trained on "
            f"{window_span(windows[0])}) nor champion {champion} (trained on {window_span(windows[1])}) "
            f"trained on: land newer labels and run `nightshift promote {name}` (or "
            f"promote_model_job with model {name}), or {promote_anyway(name, challenger)}"
        )
    ours, theirs = (_measure(store, gate, v, days, runtime) for v in (challenger, champion))
    passed = all(ours[k] >= theirs[k] - tolerance[k] for k in gate.metrics)
    required = gate.clean_nights if clean_nights is None else clean_nights
    nights = nights_verdict(store, name, challenger, champion, required) if required else None
    passed = passed and (nights is None or nights.passed)
    verdict = Verdict(
        name, challenger, champion, days, ours, theirs, tolerance, passed, None, nights
    )
    if not passed:
        return verdict
    change = promote(
        read,
        store.write_bytes,
        store.models_dir,
        name,
        challenger,
        by,
        verdict.summary(),
        cas=store.cas(),
    )
    return replace(verdict, change=change)


def pending_challenger(store: DataStore, name: str) -> str | None:
    """The version waiting for promotion, if any."""
    return challenger_version(store.read_bytes, store.models_dir, name)


def _measure(store: DataStore, gate: Gate, version: str, days: list[str], runtime: Runtime):
    measured = gate.evaluate(store, version, days, runtime)
    missing = [k for k in gate.metrics if k not in measured]
    if missing:
        raise KeyError(f"{gate.model}: the gate's metric function returned no {missing}")
    return {k: float(measured[k]) for k in gate.metrics}

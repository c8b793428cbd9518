"""A scoring asset's day is scored only over a landing day that was checked against these files.

A person who backfills ``fraud_scores`` alone from its page (or materialises it alone) selects
no landing asset: Dagster runs only the scoring step. Left there, the scored days would sit
over ``transactions`` days that were never materialised and whose checks never ran, and the UI
would show every one of them as unsynced. So the scoring step lands such a day itself, with
the same code the landing asset runs: the landing day (and its companions, the saved screen)
is materialised and its checks are recorded in the same run, before the day is scored; a day
whose blocking landing checks fail is not scored. A day already landed and checked against
the same files (in this run's landing step, or an earlier run) is not landed again.

Why land rather than refuse: the landing code is the domain's one :class:`LandingSpec`, which
every domain declares (fraud, recommendations, summaries, embeddings), so this holds for all
of them, and a backfill from any asset page ends with the graph consistent instead of failed.
A dataset without a spec that says how to land it fails the day naming what to materialise.
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from typing import Any

from dagster import AssetExecutionContext, AssetKey, Failure
from dagster_shared.check import CheckError

from assets.day_metadata import day_figures
from assets.days import DayRecorder, latest_materialization
from assets.landing import (
    CHECKED,
    LANDING_FINGERPRINT,
    LANDINGS,
    PASSED,
    LandingSpec,
    land_day,
)
from resources.quality import QualityConfig
from resources.storage import DataStore


def land_unchecked(
    context: AssetExecutionContext,
    asset: str,
    dataset: str,
    config: QualityConfig,
    store: DataStore,
    date: str,
    limit: Any,
) -> Generator[Any, None, list[str]]:
    """Lands and checks ``dataset``'s day in this step unless it was checked against its
    current files; returns the blocking landing checks that failed (the day must not be
    scored), empty when none did or nothing had to be landed.

    Args:
        asset: the scoring asset, for messages.
        config: the scoring asset's config: its quality settings (limit, sample, seed and the
            domain's own, e.g. the amount ceiling) apply to the landing day too.
    """
    if checked(context, store, dataset, date):
        return []
    spec = LANDINGS.get(dataset)
    if spec is None or spec.config is None:
        raise Failure(description=how_to_land(context, asset, dataset, [date]), allow_retries=False)
    context.log.info(
        f"{asset} {date}: {dataset} {date} was not materialised and checked against its "
        f"current files; landing it in this step first"
    )
    days = DayRecorder(context, blocking=spec.blocking)
    yield from land_day(context, spec, _landing_config(spec, config), store, date, limit, days)
    return [failure.rsplit(": ", 1)[-1] for failure in days.failed]


def checked(context: AssetExecutionContext, store: DataStore, dataset: str, date: str) -> bool:
    """Whether the dataset's day was last materialised from its current files, with its
    blocking checks passed."""
    latest = latest_materialization(context, dataset, date)
    if latest is None:
        return False
    figures = day_figures(latest.asset_materialization.metadata)
    current = store.landing_fingerprint(dataset, date) or ""
    return figures.get(LANDING_FINGERPRINT) == current and figures.get(CHECKED) == PASSED


def refuse_blocked(asset: str, dataset: str, date: str, failed: Sequence[str]) -> None:
    """Fails the step, before anything is published, when the day's landing checks failed."""
    if failed:
        raise Failure(
            description=f"{asset} {date}: not scored: blocking checks of {dataset} {date} "
            f"failed ({', '.join(failed)}); see their results on {dataset}'s page, fix the "
            "landing files and run this again",
            allow_retries=False,
        )


def how_to_land(
    context: AssetExecutionContext, asset: str, dataset: str, dates: Sequence[str]
) -> str:
    """Which upstream days to materialise before ``asset`` can score ``dates``, and how."""
    graph = context.job_def.asset_layer.asset_graph
    key = AssetKey(asset)
    parents = graph.get(key).parent_keys if graph.has(key) else set()
    companions = [
        k for k in parents if graph.has(k) and AssetKey(dataset) in graph.get(k).parent_keys
    ]
    upstream = [dataset, *sorted(k.to_user_string() for k in companions)]
    days = dates[0] if len(dates) == 1 else f"{dates[0]}..{dates[-1]}"
    jobs = jobs_holding(context, {key, AssetKey(dataset)})
    launch = f", or launch {' or '.join(jobs)} for them" if jobs else ""
    return (
        f"{asset} {days}: its input {dataset} was not materialised and checked for "
        f"{'this day' if len(dates) == 1 else 'these days'}: materialise "
        f"{' and '.join(upstream)} for {days}{launch}"
    )


def jobs_holding(context: AssetExecutionContext, keys: set[AssetKey]) -> list[str]:
    """The named jobs that materialise all of ``keys``; none outside a code location."""
    try:
        repository = context.repository_def
    except CheckError:  # materialize() and execute_in_process run without a repository
        return []
    return sorted(
        job.name
        for job in repository.get_all_jobs()
        if not job.name.startswith("__") and keys <= job.asset_layer.selected_asset_keys
    )


def _landing_config(spec: LandingSpec, config: QualityConfig) -> QualityConfig:
    """The landing asset's config (its own defaults, e.g. its deadline) with the scoring
    asset's quality settings wherever both have them."""
    assert spec.config is not None
    fields = spec.config.model_fields
    shared = {k: v for k, v in config.model_dump().items() if k in fields}
    return spec.config(**shared)

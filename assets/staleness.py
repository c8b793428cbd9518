"""Staleness by model version: which scored days a new champion made stale, and the data
window of the model that scored a day, which the day records (``assets.runner.point_in_time``).

A scored day's materialisation records its ``model_version``; a day is stale when that version
is not the champion's. Dagster's own staleness serves code and data versions, and per partition
it skips any edge with more than 100 upstream partitions (dagster#14265), so it cannot say this
for a year of days. Here the latest materialisation of every partition of an asset is read in
two instance queries whatever the number of partitions (:func:`scored_days`), instead of one
query per day (benchmarks/stale.py measures both).

A day also records the data window of the model that scored it: ``trained_through`` after the
day means the model saw data from after the day it scored (``trained_after_day``). Which version
a backfill uses is a choice recorded on every day (``model_choice``): the current champion, the
default, or the version that was champion on that day (the run tag :data:`MODEL_CHOICE_TAG`).
"""

from __future__ import annotations

import datetime as dt
import inspect
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow.fs as pafs
from dagster import AssetKey, AssetRecordsFilter, DagsterEventType, DagsterInstance, Failure

from assets.day_metadata import day_figures
from inference.models.modelstore import ModelNotFoundError
from inference.models.registry import champion_on, champion_version, trained_window
from policy.tags import MODEL_CHOICE_TAG
from resources.storage import DataStore

CHAMPION_CHOICE = "champion"
ON_DAY_CHOICE = "champion_on_day"
MODEL_CHOICES = (CHAMPION_CHOICE, ON_DAY_CHOICE)

# Storage ids per records query: SQLite builds before 3.32 allow 999 bound parameters.
_IDS_PER_QUERY = 900


@dataclass(frozen=True)
class ScoredDay:
    """The latest materialisation of one day of a scored asset.

    Attributes:
        date: the partition.
        version: the ``model_version`` it records (None: a day that records none).
        run_id: the run that recorded it.
        timestamp: when, in seconds since the epoch.
    """

    date: str
    version: str | None
    run_id: str
    timestamp: float


@dataclass(frozen=True)
class StaleDay:
    """A day scored by a version other than the champion."""

    date: str
    scored_by: str | None
    champion: str


def scored_days(
    instance: DagsterInstance, asset: str, dates: Sequence[str] | None = None
) -> dict[str, ScoredDay]:
    """The latest materialisation of each day of ``asset`` (of ``dates``, default every day).

    One query maps each partition to its latest materialisation's storage id (the index the
    UI's partition status reads), one more per 900 days reads those records; a day's history of
    re-scores is never scanned.
    """
    key = AssetKey(asset)
    latest = instance.get_latest_storage_id_by_partition(
        key, DagsterEventType.ASSET_MATERIALIZATION, partitions=set(dates) if dates else None
    )
    days: dict[str, ScoredDay] = {}
    ordered = sorted(latest.values())
    for start in range(0, len(ordered), _IDS_PER_QUERY):
        ids = ordered[start : start + _IDS_PER_QUERY]
        records = instance.fetch_materializations(
            AssetRecordsFilter(asset_key=key, storage_ids=ids), limit=len(ids)
        ).records
        for record in records:
            event = record.asset_materialization
            if event is None or event.partition is None:
                continue
            version = day_figures(event.metadata).get("model_version")
            days[event.partition] = ScoredDay(
                event.partition, version, record.run_id, record.timestamp
            )
    return days


def stale_days(
    scored: Mapping[str, ScoredDay], champion: str, dates: Sequence[str] | None = None
) -> list[StaleDay]:
    """The days of ``scored`` (those among ``dates``, if given) not scored by ``champion``,
    newest first. A day that records no version counts as stale: nothing shows it is on the
    champion. A day never scored is not stale: it is missing, which backfills handle."""
    wanted = set(dates) if dates is not None else None
    return [
        StaleDay(day.date, day.version, champion)
        for day in sorted(scored.values(), key=lambda d: d.date, reverse=True)
        if day.version != champion and (wanted is None or day.date in wanted)
    ]


def window(last: str, days: int) -> list[str]:
    """The ``days`` dates ending on ``last``, oldest first."""
    if days < 1:
        raise ValueError(f"a window is at least one day, not {days}")
    end = dt.date.fromisoformat(last)
    return [(end - dt.timedelta(days=n)).isoformat() for n in range(days - 1, -1, -1)]


def champion(store: DataStore, model: str) -> str:
    """The model's champion version; raises ModelNotFoundError when it has none."""
    return champion_version(store.read_bytes, store.models_dir, model)


def model_choice(tags: Mapping[str, str]) -> str:
    """The run's choice of version (:data:`MODEL_CHOICE_TAG`), default the champion.

    Raises:
        Failure: the tag holds something else (named with the values it takes); a retry would
            read the same tag, so it is not retried.
    """
    choice = tags.get(MODEL_CHOICE_TAG, CHAMPION_CHOICE)
    if choice not in MODEL_CHOICES:
        raise Failure(
            description=f"run tag {MODEL_CHOICE_TAG}={choice!r}: expected one of "
            f"{', '.join(MODEL_CHOICES)}",
            allow_retries=False,
        )
    return choice


def version_for_day(store: DataStore, model: str, date: str, choice: str) -> str:
    """The version that scores ``date`` under ``choice``: the champion, or the version that was
    champion at the end of that day.

    Raises:
        ModelNotFoundError: no version was champion on that day (the model came later, or its
            alias history starts after the day).
    """
    if choice == CHAMPION_CHOICE:
        return champion(store, model)
    version = champion_on(store.read_bytes, store.models_dir, model, date)
    if version is None:
        raise ModelNotFoundError(
            f"{MODEL_CHOICE_TAG}={ON_DAY_CHOICE}: model '{model}' had no champion on {date} "
            f"(its alias history, {store.models_dir}/{model}/aliases.json, starts later); "
            f"score {date} with the current champion ({MODEL_CHOICE_TAG}={CHAMPION_CHOICE})",
            model,
        )
    return version


def load_chosen(
    load: Callable[..., Any],
    store: DataStore,
    inference: Any,
    config: Any,
    tags: Mapping[str, str],
    dates: Sequence[str],
) -> tuple[Any, str]:
    """The run's model under its choice (:func:`model_choice`), and the choice.

    ``load`` is a scoring spec's ``(store, inference, config) -> Model``: it loads the champion.
    Under ``champion_on_day`` the version that was champion on the run's days is loaded instead,
    through ``load(..., version=V)``; a run loads one model, so its days must share that
    version: a range across a promotion fails, naming the days of each version.

    Raises:
        Failure: the choice is unknown, the model has no alias history for it, the spec cannot
            load a given version, or the range spans several champions.
    """
    choice = model_choice(tags)
    model = load(store, inference, config)
    if choice == CHAMPION_CHOICE:
        return model, choice
    manifest = version_manifest(store, model.version)
    if manifest is None:
        raise _refusal(f"{model.version} is not a version of the model store (a packaged model)")
    if "version" not in inspect.signature(load).parameters:
        raise _refusal(f"{load.__module__}.{load.__name__} loads only the champion")
    name = manifest["name"]
    on_day: dict[str, list[str]] = {}
    for date in dates:
        try:
            version = version_for_day(store, name, date, choice)
        except ModelNotFoundError as exc:
            raise _refusal(str(exc)) from exc
        on_day.setdefault(version, []).append(date)
    if len(on_day) > 1:
        spans = "; ".join(f"{v}: {', '.join(days)}" for v, days in on_day.items())
        raise _refusal(
            f"the run's days were on {len(on_day)} champions ({spans}): launch one run per version"
        )
    [version] = on_day
    if version == model.version:
        return model, choice
    return load(store, inference, config, version=version), choice


def _refusal(why: str) -> Failure:
    return Failure(
        description=f"{MODEL_CHOICE_TAG}={ON_DAY_CHOICE} cannot be honoured: {why}",
        allow_retries=False,
    )


def model_window(store: DataStore, version: str) -> tuple[str, str] | None:
    """The data window (first, last day) ``version`` trained on, read once per run from its
    manifest; None for a model whose manifest records no window (a packaged encoder trains on
    no day of ours) or a version the store does not hold."""
    manifest = version_manifest(store, version)
    return trained_window(manifest) if manifest is not None else None


def version_manifest(store: DataStore, version: str) -> dict | None:
    """The manifest of ``version`` under any model name of the store, or None when no model
    there has that version (versions are content hashes: at most one name holds it)."""
    try:
        names = store.fs.get_file_info(pafs.FileSelector(store.models_dir))
    except FileNotFoundError:
        return None
    for info in names:
        if info.type != pafs.FileType.Directory:
            continue
        path = f"{info.path}/{version}/manifest.json"
        if store.exists(path):
            return json.loads(store.read_bytes(path))
    return None

"""The shadow nights of a challenger in the model store: one record per day it shadow-scored,
and the last N against the champion, which a promotion gate with ``clean_nights`` requires
(the records and the verdict themselves are plain values, ``inference/models/shadow_nights.py``).

A record lives in the model store beside the aliases it argues about, as JSON:
``<models>/<name>/shadow/<version>/date=<D>.json``. It names the day, the challenger and the
champion it was compared with, the agreement figures, the limits they broke, or the error that
stopped the shadow. A re-run of the day replaces its record. Only nights compared with the
current champion count: a night against a champion that has since been replaced says nothing
about the one the challenger would replace now.
"""

from __future__ import annotations

import json
from dataclasses import asdict

import pyarrow.fs as pafs

from inference.models.shadow_nights import NightsVerdict, ShadowNight
from resources.storage import DataStore


def nights_dir(store: DataStore, model: str, version: str) -> str:
    return f"{store.models_dir}/{model}/shadow/{version}"


def record_night(store: DataStore, model: str, night: ShadowNight) -> str:
    """Writes (or replaces) the night's record; returns its path."""
    path = f"{nights_dir(store, model, night.challenger)}/date={night.date}.json"
    store.write_bytes(path, json.dumps(asdict(night), indent=2, sort_keys=True).encode())
    return path


def shadow_nights(store: DataStore, model: str, version: str) -> list[ShadowNight]:
    """Every night ``version`` of ``model`` shadow-scored, oldest first.

    Raises:
        ValueError: a record is not a shadow night (naming its path).
    """
    folder = nights_dir(store, model, version)
    infos = store.fs.get_file_info(pafs.FileSelector(folder, allow_not_found=True))
    nights = []
    for info in sorted(infos, key=lambda i: i.path):
        if info.type != pafs.FileType.File or not info.base_name.endswith(".json"):
            continue
        try:
            nights.append(ShadowNight(**json.loads(store.read_bytes(info.path))))
        except (ValueError, TypeError) as exc:
            raise ValueError(f"{store.uri(info.path)} is not a shadow night ({exc})") from exc
    return sorted(nights, key=lambda n: n.date)


def nights_verdict(
    store: DataStore, model: str, challenger: str, champion: str, required: int
) -> NightsVerdict:
    """The challenger's ``required`` most recent nights (by date) against ``champion``."""
    against = [n for n in shadow_nights(store, model, challenger) if n.champion == champion]
    last = against[-required:] if required > 0 else []
    return NightsVerdict(model, challenger, champion, required, last)

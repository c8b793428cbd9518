"""The shadow nights of a challenger: one record per day it shadow-scored, and whether the last
N of them were clean, which a promotion gate with ``clean_nights`` requires.

A record lives in the model store beside the aliases it argues about, as JSON:
``<models>/<name>/shadow/<version>/date=<D>.json``. It names the day, the challenger and the
champion it was compared with, the agreement figures, the limits they broke, or the error that
stopped the shadow. A re-run of the day replaces its record. Only nights compared with the
current champion count: a night against a champion that has since been replaced says nothing
about the one the challenger would replace now.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

import pyarrow.fs as pafs

from resources.storage import DataStore


@dataclass(frozen=True)
class ShadowNight:
    """One day a challenger scored in the shadow of the champion.

    Attributes:
        date: the partition.
        asset: the shadow asset (``<scored asset>_shadow``).
        challenger: the version that shadow-scored the day.
        champion: the version that scored it for real.
        figures: the agreement figures (inference/models/agreement.py).
        breaches: the limits the figures broke; empty on a clean night.
        error: why the shadow could not score or compare the day (then never clean).
        run_id: the run that recorded it.
    """

    date: str
    asset: str
    challenger: str
    champion: str
    figures: dict[str, float] = field(default_factory=dict)
    breaches: list[str] = field(default_factory=list)
    error: str | None = None
    run_id: str = ""

    @property
    def clean(self) -> bool:
        return self.error is None and not self.breaches

    def describe(self) -> str:
        """``2026-03-11 clean`` or ``2026-03-11 not clean (flagged_jaccard 0.41 < 0.5)``."""
        if self.clean:
            return f"{self.date} clean"
        why = f"failed: {self.error}" if self.error else "; ".join(self.breaches)
        return f"{self.date} not clean ({why})"


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


@dataclass(frozen=True)
class NightsVerdict:
    """Whether a challenger's last ``required`` nights against ``champion`` were clean."""

    model: str
    challenger: str
    champion: str
    required: int
    last: list[ShadowNight]

    @property
    def passed(self) -> bool:
        return len(self.last) >= self.required and all(n.clean for n in self.last)

    @property
    def clean(self) -> int:
        return sum(n.clean for n in self.last)

    def summary(self) -> str:
        """``2 of 2 clean shadow nights: 2026-03-11 clean, 2026-03-12 clean``, naming each
        night not clean and how many are missing."""
        head = f"{self.clean} of {self.required} clean shadow nights against {self.champion}"
        parts = [n.describe() for n in self.last]
        missing = self.required - len(self.last)
        if missing > 0:
            parts.append(
                f"{missing} night{'s' if missing > 1 else ''} missing: no shadow of "
                f"{self.challenger} recorded (the scoring job shadows it with NIGHTSHIFT_SHADOW=1)"
            )
        return f"{head}: {', '.join(parts)}" if parts else head

    def metadata(self) -> dict[str, int | str | bool]:
        return {
            "clean_nights_required": self.required,
            "clean_nights": self.clean,
            "shadow_nights": ", ".join(n.describe() for n in self.last),
            "shadow_passed": self.passed,
        }


def nights_verdict(
    store: DataStore, model: str, challenger: str, champion: str, required: int
) -> NightsVerdict:
    """The challenger's ``required`` most recent nights (by date) against ``champion``."""
    against = [n for n in shadow_nights(store, model, challenger) if n.champion == champion]
    last = against[-required:] if required > 0 else []
    return NightsVerdict(model, challenger, champion, required, last)

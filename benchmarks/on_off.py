"""One landed fraud day scored with a setting on and off, alternated in one process: what a
feature that must cost nothing when nothing happens (the watchdog, the metrics) costs a day."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from benchmarks.common import Workload
from benchmarks.executor import outputs, same

Day = Callable[[str], tuple[float, dict]]  # "on" or "off" -> wall seconds, the day's metadata


@dataclass
class OnOff:
    """Each setting's wall and engine seconds, and whether every output equalled the first."""

    seconds: dict[str, list[float]]
    engine_seconds: dict[str, list[float]]
    outputs_equal: bool

    def best(self, setting: str) -> float:
        return min(self.seconds[setting])

    def facts(self) -> dict[str, Any]:
        rounded = lambda runs: {k: [round(s, 3) for s in v] for k, v in runs.items()}  # noqa: E731
        return {
            "seconds": rounded(self.seconds),
            "engine_seconds": rounded(self.engine_seconds),
            "outputs_equal": self.outputs_equal,
        }


def alternate(day: Day, root: Any, repeats: int) -> OnOff:
    """Scores the day at ``root`` off (a warm-up: imports, page cache; its output is the one
    compared), on, then ``repeats`` times each, alternated so that both see the same load."""
    day("off")
    first = outputs(root)
    day("on")
    equal = same(first, outputs(root))
    runs: dict[str, list[float]] = {"on": [], "off": []}
    engine: dict[str, list[float]] = {"on": [], "off": []}
    for _ in range(repeats):
        for setting in ("on", "off"):
            seconds, meta = day(setting)
            runs[setting].append(seconds)
            engine[setting].append(meta["seconds"])
    return OnOff(runs, engine, equal and same(first, outputs(root)))


def compare(
    w: Workload,
    ran: OnOff,
    rows: int,
    on: str,
    off: str,
    repeats: int,
    target: float | None = None,
) -> None:
    """The day's rows/s on over off, best of ``repeats`` (``target``: the least ratio the
    feature may cost); a setting that changed the output is an error, not a figure."""
    if not ran.outputs_equal:
        raise RuntimeError(f"the day scored with {on} differs from the day with {off}")
    w.compare(
        on,
        off,
        rows / ran.best("on"),
        rows / ran.best("off"),
        "rows/s",
        True,
        target,
        f"best of {repeats} alternated in one process; outputs equal: {ran.outputs_equal}",
    )

"""Spot traces: reading a trace file, the real traces' cache, and cutting a trace into nights.

A trace file is JSON ``{"metadata": {"gap_seconds": N}, "data": [...]}``, one value per tick.
In github.com/skypilot-org/spot-traces a tick's value is the number of instances available
(running, for the preemption traces), as its README says: checked against the raw probe logs
its availability traces were made from (docs/spot-and-cost.md). A one-node job has spot at a
tick when the value is at least 1.

The real traces carry no licence, so they are not in this repository: they live in a
git-ignored cache (``.nightshift/traces/``), each file checked against the sha256 committed in
``spot_traces.sha256``, and :func:`real_trace_paths` says how to get them when they are missing.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np

CACHE = Path(__file__).resolve().parents[2] / ".nightshift" / "traces"
SOURCE_REPO = "https://github.com/skypilot-org/spot-traces"
SOURCE_COMMIT = "221da1ab9bdfe7966da296265d7694d52dc0c5a6"
HOW_TO_GET = (
    f"git clone {SOURCE_REPO} /tmp/spot-traces && "
    f"git -C /tmp/spot-traces checkout {SOURCE_COMMIT} && "
    "mkdir -p .nightshift/traces && "
    "cp -r /tmp/spot-traces/availability /tmp/spot-traces/preemption .nightshift/traces/"
)


@dataclass(frozen=True)
class Trace:
    """Availability of one spot pool over time: instances available at each tick."""

    name: str
    gap_seconds: float
    counts: np.ndarray

    def available(self, nodes: int = 1) -> np.ndarray:
        """Per tick, whether ``nodes`` spot instances could be had."""
        return self.counts >= nodes

    @property
    def hours(self) -> float:
        return len(self.counts) * self.gap_seconds / 3600


def load_trace(path: Path, name: str | None = None) -> Trace:
    """Reads a trace file; raises ValueError naming the file and field when it is malformed."""
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: not a readable JSON trace ({exc})") from exc
    if not isinstance(doc, dict) or not isinstance(doc.get("metadata"), dict):
        raise ValueError(f"{path}: expected an object with 'metadata' and 'data'")
    gap = doc["metadata"].get("gap_seconds")
    if isinstance(gap, bool) or not isinstance(gap, int | float) or not gap > 0:
        raise ValueError(f"{path}: metadata.gap_seconds must be a positive number, got {gap!r}")
    data = doc.get("data")
    if not isinstance(data, list) or not data:
        raise ValueError(f"{path}: 'data' must be a non-empty list of instance counts")
    bad = [i for i, v in enumerate(data) if isinstance(v, bool) or not isinstance(v, int | float)]
    if bad:
        raise ValueError(f"{path}: data[{bad[0]}] is {data[bad[0]]!r}, not a number")
    counts = np.asarray(data, dtype=np.float64)
    if (counts < 0).any():
        first = int(np.flatnonzero(counts < 0)[0])
        raise ValueError(f"{path}: data[{first}] is negative ({data[first]})")
    return Trace(name or Path(path).stem, float(gap), counts)


def resample(available: np.ndarray, gap_seconds: float, step_seconds: float) -> np.ndarray:
    """Availability on a grid of ``step_seconds``: a step has spot only if every trace tick it
    overlaps has spot (a reclaim inside a step loses the step)."""
    ticks = len(available)
    steps = int(ticks * gap_seconds // step_seconds)
    starts = np.arange(steps) * step_seconds
    first = np.floor(starts / gap_seconds).astype(np.int64)
    last = np.ceil((starts + step_seconds) / gap_seconds).astype(np.int64) - 1
    last = np.minimum(last, ticks - 1)
    missing = np.concatenate([[0], np.cumsum(~available)])
    return (missing[last + 1] - missing[first]) == 0


def nights(
    steps: np.ndarray, night_steps: int, stride_steps: int, offset_steps: int = 0
) -> np.ndarray:
    """Windows of ``night_steps`` cut every ``stride_steps``: shape (nights, night_steps)."""
    starts = np.arange(offset_steps, len(steps) - night_steps + 1, stride_steps)
    if len(starts) == 0:
        return np.zeros((0, night_steps), dtype=bool)
    return np.stack([steps[s : s + night_steps] for s in starts])


def checksums() -> dict[str, str]:
    """The committed sha256 of each real trace, by path under the cache."""
    text = resources.files("orchestration.simulate").joinpath("spot_traces.sha256").read_text()
    table = {}
    for line in text.splitlines():
        if line.strip():
            digest, path = line.split(maxsplit=1)
            table[path.strip()] = digest
    return table


def real_trace_paths(cache: Path = CACHE) -> list[tuple[str, Path]]:
    """(name, path) of every real trace in the cache, each checked against its sha256.

    Raises:
        FileNotFoundError: the cache lacks a trace; the message says how to get them.
        ValueError: a cached file's sha256 differs from the committed one.
    """
    table = checksums()
    missing = [p for p in table if not (cache / p).is_file()]
    if missing:
        raise FileNotFoundError(
            f"{len(missing)} of the {len(table)} spot traces are not in {cache} (first: "
            f"{missing[0]}). They have no licence, so they are not committed; get them from "
            f"{SOURCE_REPO} at commit {SOURCE_COMMIT} with:\n  {HOW_TO_GET}\n"
            "or pass your own trace files with --trace PATH."
        )
    found = []
    for rel, digest in sorted(table.items()):
        path = cache / rel
        actual = hashlib.sha256(path.read_bytes()).hexdigest()
        if actual != digest:
            raise ValueError(f"{path}: sha256 {actual}, expected {digest}; fetch it again")
        found.append((trace_name(rel), path))
    return found


def trace_name(rel: str) -> str:
    """A short name: ``availability/1-node/aws-02-15-2023/us-east-1a_v100_1.json`` reads
    ``avail-1/aws-02-15-2023/us-east-1a_v100_1``."""
    parts = Path(rel).with_suffix("").parts
    if len(parts) == 4:
        kind = {"availability": "avail", "preemption": "preempt"}.get(parts[0], parts[0])
        return f"{kind}-{parts[1].split('-')[0]}/{parts[2]}/{parts[3]}"
    return Path(rel).stem

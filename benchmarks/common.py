"""What every workload shares: timing, result rows, threads, peak memory, a data folder."""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any, TypeVar

import torch

T = TypeVar("T")


@dataclass
class Comparison:
    """One figure of the benchmark: nightshift against a peer, measured in the same run.

    ``ratio`` is always "how many times better nightshift is": for rates (rows/s, tokens/s)
    nightshift's value over the peer's, for times the peer's over nightshift's (so 1.2 means
    20% faster either way), and for memory the peer's over nightshift's as well.
    """

    workload: str
    subject: str
    peer: str
    subject_value: float
    peer_value: float
    unit: str
    higher_is_better: bool
    target: float | None = None
    note: str = ""
    ratio: float = field(init=False)
    met: bool | None = field(init=False)

    def __post_init__(self) -> None:
        if self.higher_is_better:
            self.ratio = self.subject_value / self.peer_value if self.peer_value else float("inf")
        else:
            self.ratio = (
                self.peer_value / self.subject_value if self.subject_value else float("inf")
            )
        self.met = None if self.target is None else self.ratio >= self.target

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["ratio"] = round(self.ratio, 3)
        return out


@dataclass
class Workload:
    """A workload's comparisons plus free-form facts (sizes, settings, raw timings)."""

    name: str
    comparisons: list[Comparison] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0

    def compare(self, *args: Any, **kwargs: Any) -> Comparison:
        comparison = Comparison(self.name, *args, **kwargs)
        self.comparisons.append(comparison)
        return comparison


def timed(call: Callable[[], T]) -> tuple[T, float]:
    """Runs ``call`` once and returns (result, wall seconds)."""
    began = time.perf_counter()
    result = call()
    return result, time.perf_counter() - began


def best_of(call: Callable[[], T], repeats: int) -> tuple[T, float]:
    """The fastest of ``repeats`` runs: on a shared machine the minimum is the least noisy."""
    best: tuple[T, float] | None = None
    for _ in range(max(1, repeats)):
        result, seconds = timed(call)
        if best is None or seconds < best[1]:
            best = (result, seconds)
    return best


def best_alternated(calls: dict[str, Callable[[], T]], rounds: int) -> dict[str, tuple[T, float]]:
    """The fastest of ``rounds`` runs of each call, the calls taking turns within each round.

    Where two figures make one ratio, taking turns puts both under the machine's speed of the
    same minute; timed one block after the other, a shared machine's drift between the blocks
    lands in the ratio.
    """
    best: dict[str, tuple[T, float]] = {}
    for _ in range(max(1, rounds)):
        for name, call in calls.items():
            result, seconds = timed(call)
            if name not in best or seconds < best[name][1]:
                best[name] = (result, seconds)
    return best


def set_threads(threads: int) -> int:
    """Pins torch (and faiss, OpenMP, BLAS where present) to ``threads`` intra-op threads.

    On a shared 2-core machine a second thread that has to wait for a busy core can make a
    small matmul 20x slower, so the benchmark fixes the count and records it.
    """
    for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[name] = str(threads)
    torch.set_num_threads(threads)
    try:
        import faiss

        faiss.omp_set_num_threads(threads)
    except ImportError:
        pass
    return torch.get_num_threads()


# Dagster's console logger prints every event at DEBUG; the benchmark keeps errors only.
QUIET_RUN_CONFIG = {"loggers": {"console": {"config": {"log_level": "ERROR"}}}}


def environment(threads: int) -> dict[str, Any]:
    """Facts a reader needs to judge the figures: machine, load, threads, versions."""
    import pyarrow
    import transformers

    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 1
    cuda = torch.cuda.is_available()
    return {
        "machine": platform.machine(),
        "processor": _cpu_name(),
        "cores_available": cores,
        "torch_threads": threads,
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
        "device": torch.cuda.get_device_name(0) if cuda else "cpu",
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "pyarrow": pyarrow.__version__,
    }


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


@contextmanager
def quiet_logs() -> Iterator[None]:
    """Silences Dagster's and transformers' per-event logging while a workload runs."""
    import logging

    names = ("dagster", "transformers", "ContinuousBatchingLogger", "sentence_transformers")
    saved = {n: logging.getLogger(n).level for n in names}
    for n in names:
        logging.getLogger(n).setLevel(logging.ERROR)
    try:
        yield
    finally:
        for n, level in saved.items():
            logging.getLogger(n).setLevel(level)

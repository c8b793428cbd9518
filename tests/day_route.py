"""The project's own counter of one day's route: which project files a scoring day passes
through, in order, from the scoring asset until its output is published.

It runs a real day (the fraud pipeline on generated data, in process) with a profiler that
follows the day: from the scoring asset's ``score``, a call is on the route when the Dagster
layer (assets/, nightshift/) hands a project function the day itself, that is the day's date or
an object whose ``date`` is that day (its report, its staged snapshot). The run's context is not
the day: a range backfill's run holds many. Consecutive calls within one file are one stay; a stay in a file
the day had already left is a return. Test modules and third-party code are not counted.

Run it: ``.venv/bin/python tests/day_route.py`` prints the route and its two counts.
"""

from __future__ import annotations

import inspect
import sys
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

LAYER = ("assets/", "nightshift/")

_RESUMABLE = inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR

# The scoring asset's body, where the route starts.
START = (str(ROOT / "assets" / "runner.py"), "score")


@dataclass
class Route:
    """The stays of one day, in order: (file, functions called there)."""

    stays: list[tuple[str, list[str]]] = field(default_factory=list)

    def enter(self, path: str, function: str) -> None:
        if self.stays and self.stays[-1][0] == path:
            if function not in self.stays[-1][1]:
                self.stays[-1][1].append(function)
            return
        self.stays.append((path, [function]))

    @property
    def files(self) -> list[str]:
        return list(dict.fromkeys(path for path, _ in self.stays))

    @property
    def returns(self) -> int:
        return len(self.stays) - len(self.files)

    def describe(self) -> str:
        seen: set[str] = set()
        lines = []
        for n, (path, functions) in enumerate(self.stays, 1):
            again = " (return)" if path in seen else ""
            seen.add(path)
            lines.append(f"{n:3}. {path}{again}: {', '.join(functions)}")
        lines.append(f"{len(self.files)} files entered, {self.returns} returns")
        return "\n".join(lines)


def _project_file(filename: str) -> str | None:
    path = Path(filename)
    try:
        relative = path.relative_to(ROOT)
    except ValueError:
        return None
    if relative.parts[0] in {"tests", ".venv", "benchmarks"} or relative.suffix != ".py":
        return None
    return relative.as_posix()


@contextmanager
def following(date: str) -> Iterator[Route]:
    """Profiles every thread while the block runs and records the day's route in it."""
    route = Route()
    started: list[bool] = []
    # Generator frames seen, held so that no later frame takes a finished one's id.
    resumed: dict[int, FrameType] = {}

    def holds_day(value: object) -> bool:
        if isinstance(value, str):
            return value == date
        return getattr(value, "date", None) == date if hasattr(value, "date") else False

    def profile(frame: FrameType, event: str, arg: object) -> None:
        if event != "call":
            return
        code = frame.f_code
        if code.co_flags & _RESUMABLE and _project_file(code.co_filename) is not None:
            # A generator's first call and every resumption are "call" events: only the first
            # enters the file.
            if id(frame) in resumed:
                return
            resumed[id(frame)] = frame
        if (code.co_filename, code.co_name) == START and not started:
            started.append(True)
            route.enter(_project_file(code.co_filename) or "", code.co_qualname)
        if not started:
            return
        path = _project_file(code.co_filename)
        if path is None:
            return
        caller = frame.f_back
        caller_path = _project_file(caller.f_code.co_filename) if caller is not None else None
        if caller_path is None or not caller_path.startswith(LAYER):
            return
        if caller_path == path:
            # A file's own helper: the day has not moved (the file calling it never left).
            return
        count = code.co_argcount + code.co_kwonlyargcount
        names = code.co_varnames[:count]
        local = frame.f_locals
        try:
            if any(holds_day(local.get(name)) for name in names):
                route.enter(path, code.co_qualname)
        except Exception:  # an object whose attribute access raises is not the day
            return

    threading.setprofile(profile)
    sys.setprofile(profile)
    try:
        yield route
    finally:
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]


def one_fraud_day(date: str = "2026-03-02", scale: float = 0.02) -> Route:
    """Lands and scores one fraud day in process and returns its route."""
    from dagster import DagsterInstance, materialize
    from fraud_world import trained_fraud_world

    from assets.fraud.assets import fraud_scores, transactions
    from assets.fraud.demo_data import generate_day

    with tempfile.TemporaryDirectory(prefix="day_route-") as tmp:
        world = trained_fraud_world(Path(tmp) / "data", "2026-03-01", scale)
        generate_day(world["store"], date, scale=scale, seed=1)
        with DagsterInstance.ephemeral() as instance:
            assert materialize(
                [transactions],
                partition_key=date,
                resources=world["resources"],
                instance=instance,
            ).success
            with following(date) as route:
                result = materialize(
                    [fraud_scores],
                    partition_key=date,
                    resources=world["resources"],
                    instance=instance,
                    selection=[fraud_scores],
                )
            assert result.success
    return route


def one_churn_day(date: str = "2026-03-01") -> Route:
    """Lands and scores one day of the churn example (a pipeline on the public module)."""
    import churn_world
    import torch
    from dagster import DagsterInstance
    from helpers import cpu_resources
    from safetensors.torch import save_file

    from resources.storage import DataStore

    with tempfile.TemporaryDirectory(prefix="day_route-") as tmp:
        root = Path(tmp) / "data"
        weights = Path(tmp) / "churn_mlp.safetensors"
        torch.manual_seed(0)
        save_file(churn_world.churn_mlp().state_dict(), weights)
        churn_world.land(DataStore(str(root)), date, seed=0)
        with DagsterInstance.ephemeral() as instance, following(date) as route:
            result = churn_world.run(cpu_resources(root), instance, weights, day=date)
        assert result.success
    return route


if __name__ == "__main__":
    print(one_fraud_day().describe(), one_churn_day().describe(), sep="\n\n")

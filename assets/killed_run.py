"""Marks a run failed whose step the watchdog's backstop killed (inference/engine/backstop.py).

A step whose model call held the interpreter is SIGKILLed by the backstop, and with the
pipelines' executor that is the run's own process: it reports nothing, and the run stays
"started" in the instance for ever, where the daemon's run retry never sees it (a local
instance has no run monitoring to notice a dead worker). The backstop runs this module once
the step is dead, with its line on stdin; the run's failure, with that line as its message, is
what the daemon's ``run_retries`` relaunches from, as after any dead run worker.

Run: ``python -m assets.killed_run RUN_ID < line``. It needs the run's instance
(``DAGSTER_HOME``); without one, or for a run that already ended, it says so and does nothing.
"""

from __future__ import annotations

import sys


def command(run_id: str) -> tuple[str, ...]:
    """The backstop's command for the run ``run_id``."""
    return (sys.executable, "-m", "assets.killed_run", run_id)


def mark_failed(run_id: str, line: str) -> str:
    """Reports the run failed with ``line``; returns what was done, in words."""
    from dagster import DagsterInstance

    with DagsterInstance.get() as instance:
        run = instance.get_run_by_id(run_id)
        if run is None:
            return f"run {run_id} is not in the instance at {instance.root_directory}"
        if run.is_finished:
            return f"run {run_id} had already ended ({run.status.value}); left as it is"
        instance.report_run_failed(run, f"step killed by the watchdog's backstop: {line}")
    return f"run {run_id} marked failed, for the daemon's run retry"


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m assets.killed_run RUN_ID < line", file=sys.stderr)
        return 2
    try:
        said = mark_failed(argv[0], sys.stdin.read().strip())
    except Exception as exc:  # no instance here (no DAGSTER_HOME), or its storage unreachable
        print(f"run {argv[0]} not marked failed: {exc}", file=sys.stderr)
        return 1
    print(said)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""What `nightshift run` prints of each run: a table of what was materialised, and one line
for a failed run, whose full traces go to a log file beside the instance."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dagster import ExecuteInProcessResult

# Below DAGSTER_HOME: the full traces of `nightshift run`'s failed runs, one file a run.
RUN_LOGS = "nightshift-run-logs"


def failure_line(job_name: str, date: str, result: ExecuteInProcessResult) -> str:
    """One line for a failed run: each failed step and the first line of its message, and
    where the full traces are (a log file beside the instance, and the run's page)."""
    failures = result.get_step_failure_events()
    reasons = [f"{e.step_key}: {_first_line(e.step_failure_data.error)}" for e in failures]
    if not reasons and (run_failure := result.get_run_failure_event()) is not None:
        reasons = [run_failure.message or "the run failed"]
    log = _write_failure_log(job_name, date, result)
    return (
        f"{job_name} {date}: failed in run {result.run_id[:8]}: {'; '.join(reasons)} "
        f"(full traces: {log}; `make ui` shows the run)"
    )


def _first_line(error) -> str:
    """An error's message without its class path, first line only."""
    message = (error.message or error.cls_name or "").strip()
    head, _, rest = message.partition(": ")
    if rest and head.rsplit(".", 1)[-1] == error.cls_name:
        message = rest
    return message.splitlines()[0] if message else error.cls_name


def _write_failure_log(job_name: str, date: str, result: ExecuteInProcessResult) -> Path:
    """Writes every failed step's error with its stack trace and causes; returns the file."""
    folder = Path(os.environ["DAGSTER_HOME"]) / RUN_LOGS
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{job_name}-{date}-{result.run_id}.log"
    lines = [f"{job_name} {date} run {result.run_id}"]
    for event in result.get_step_failure_events():
        lines += ["", f"step {event.step_key}:", event.step_failure_data.error.to_string()]
    if (run_failure := result.get_run_failure_event()) is not None:
        lines += ["", run_failure.message or ""]
    path.write_text("\n".join(lines) + "\n")
    return path


def materialization_rows(result: ExecuteInProcessResult) -> list[tuple]:
    """One row per materialised asset: asset, partition, rows in, rows out, seconds, cost
    (a scored day's, over all its attempts, from its cost ledger), output."""
    from assets.day_metadata import day_figures

    seconds = {
        e.step_key: e.event_specific_data.duration_ms / 1000
        for e in result.all_events
        if e.is_step_success
    }
    rows = []
    for event in result.get_asset_materialization_events():
        mat = event.event_specific_data.materialization
        meta = day_figures(mat.metadata)
        asset = mat.asset_key.to_user_string()
        rows_out = meta.get("rows_out", meta.get("dagster/row_count", ""))
        where = meta.get("output", "")
        cost = meta.get("cost_usd")
        rows.append(
            (
                asset,
                mat.partition or "-",
                meta.get("rows_in", ""),
                rows_out,
                f"{seconds.get(event.step_key, 0.0):.2f}",
                f"${cost:.4f}" if cost is not None else "",
                where,
                meta.get("cost_basis", ""),
            )
        )
    return rows


def print_table(rows: list[tuple]) -> None:
    """What the costs are priced at (``at g5.xlarge prices``), then the table."""
    bases = sorted({row[-1] for row in rows if row[-1]})
    rows = [row[:-1] for row in rows]
    if bases:
        print(f"cost: node time over all attempts, {' / '.join(bases)}")
    header = ("asset", "partition", "rows in", "rows out", "seconds", "cost", "output")
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, tuple("-" * w for w in widths), *rows]:
        print("  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())

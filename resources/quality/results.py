"""A suite's evidence over a run's partitions as one Dagster check result."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from dagster import AssetCheckResult, MetadataValue

from resources.quality.suites import SEVERITIES, CheckSuite
from resources.quality.validation import Evidence


def check_result(
    suite: CheckSuite,
    evidence: Sequence[Evidence],
    metadata: dict[str, Any] | None = None,
    severity: str | None = None,
    description: str | None = None,
) -> AssetCheckResult:
    """The Dagster result of one suite over the run's partitions, with its evidence.

    Metadata: expectations evaluated and failed, the failures (expectation, column, unexpected
    count and percent, a few offending values) as a table, and whatever the caller adds (sample
    size and seed, the statistics behind it).
    """
    failures = [{**f, "partition": e.partition} for e in evidence for f in e.failures]
    meta: dict[str, Any] = {
        "expectations_evaluated": sum(e.evaluated for e in evidence),
        "expectations_failed": len(failures),
        "partitions_failed": sum(1 for e in evidence if not e.passed),
        "suite_version": suite.version,
    }
    if failures:
        meta["failures"] = MetadataValue.md(_failure_table(failures))
        first = failures[0]
        meta["unexpected_count"] = int(first["unexpected_count"] or 0)
        if first["unexpected_percent"] is not None:
            meta["unexpected_percent"] = round(float(first["unexpected_percent"]), 4)
    if len(evidence) == 1:
        # One partition: its figures as plain numbers, which the UI plots over partitions.
        meta.update({k: v for k, v in evidence[0].figures.items() if _number(v)})
    elif evidence:
        meta["statistics"] = MetadataValue.json({e.partition: e.figures for e in evidence})
    meta.update(metadata or {})
    return AssetCheckResult(
        check_name=suite.name,
        asset_key=suite.asset,
        passed=not failures,
        severity=SEVERITIES[severity or suite.severity],
        metadata=meta,
        description=description or suite.description or None,
    )


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _failure_table(failures: list[dict]) -> str:
    rows = [
        "| partition | part | expectation | column / arguments | unexpected | % | examples |",
        "|---|---|---|---|---|---|---|",
    ]
    for f in failures[:20]:
        args = f["kwargs"].get("column") or ", ".join(f"{k}={v}" for k, v in f["kwargs"].items())
        percent = "" if f["unexpected_percent"] is None else f"{f['unexpected_percent']:.3g}"
        shown = f["examples"] or f["observed"] or f["error"] or ""
        rows.append(
            f"| {f['partition']} | {f['part']} | {f['expectation']} | {args} | "
            f"{f['unexpected_count'] if f['unexpected_count'] is not None else ''} | {percent} | "
            f"{json.dumps(shown)[:120]} |"
        )
    return "\n".join(rows)

"""A domain's suites file: one named suite per Dagster check, with its severity, and what a
suite found over a run's partitions (``Evidence``) as that check's Dagster result."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dagster import AssetCheckResult, AssetCheckSeverity, AssetCheckSpec, MetadataValue

SEVERITIES = {"ERROR": AssetCheckSeverity.ERROR, "WARN": AssetCheckSeverity.WARN}


@dataclass(frozen=True)
class CheckSuite:
    """One named suite of a domain's JSON file: a Dagster check and its expectations."""

    name: str
    asset: str
    severity: str
    description: str
    statistics: list[dict] = field(default_factory=list)
    sample: list[dict] = field(default_factory=list)
    version: str = ""

    @property
    def blocking(self) -> bool:
        return self.severity == "ERROR"

    @property
    def columns(self) -> list[str]:
        """The statistics this suite reads, in the order it names them."""
        names = []
        for e in self.statistics:
            kwargs = e.get("kwargs", {})
            for key in ("column", "column_A", "column_B"):
                if key in kwargs and kwargs[key] not in names:
                    names.append(kwargs[key])
        return names

    def spec(self) -> AssetCheckSpec:
        return AssetCheckSpec(
            self.name, asset=self.asset, blocking=self.blocking, description=self.description
        )


def load_suites(path: Path) -> dict[str, CheckSuite]:
    """Reads an asset's suites file; raises ValueError naming the file on a malformed suite."""
    raw = path.read_bytes()
    data = json.loads(raw)
    # The file's content hash: a check's evidence names the exact suite that produced it.
    version = hashlib.sha256(raw).hexdigest()[:12]
    suites = {}
    for entry in data["checks"]:
        severity = entry.get("severity", "ERROR")
        if severity not in SEVERITIES:
            raise ValueError(f"{path}: check '{entry['name']}' has severity {severity!r}")
        suites[entry["name"]] = CheckSuite(
            name=entry["name"],
            asset=data["asset"],
            severity=severity,
            description=entry.get("description", ""),
            statistics=list(entry.get("statistics", [])),
            sample=list(entry.get("sample", [])),
            version=version,
        )
    return suites


@dataclass
class Evidence:
    """What one suite found on one partition."""

    partition: str
    evaluated: int = 0
    failures: list[dict[str, Any]] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return not self.failures


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
    meta: dict[str, Any] = {"failed_because": failure_reason(failures)} if failures else {}
    meta |= {
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
        # A caller's own description already says why (the contract checks' verdicts).
        description=description or _described(suite.description, failures),
    )


def failure_reason(failures: Sequence[dict[str, Any]]) -> str:
    """The first failure in a sentence, so that the check's page says why it failed without
    opening the failures table: "<day>: hours_after_day_end is [18.4], allowed max_value=2.0
    (expect_column_values_to_be_between); and 1 more" (bounds as validated: run parameters
    already stand in them)."""
    first = failures[0]
    column = first["kwargs"].get("column")
    bounds = ", ".join(
        f"{k}={json.dumps(v)[:80]}"
        for k, v in first["kwargs"].items()
        if k not in ("column", "mostly")
    )
    found = first["examples"] or first["observed"]
    said = f"{first['partition']}: {column or 'the day'}"
    if first["error"]:
        said += f" could not be checked: {first['error']}"
    else:
        said += f" is {json.dumps(found)[:120]}" if found not in (None, [], "") else " failed"
        said += f", allowed {bounds}" if bounds else ""
    said += f" ({first['expectation']})"
    return said + (f"; and {len(failures) - 1} more" if len(failures) > 1 else "")


def _described(description: str | None, failures: Sequence[dict[str, Any]]) -> str | None:
    if not failures:
        return description or None
    return f"Failed: {failure_reason(failures)}. {description or ''}".strip()


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

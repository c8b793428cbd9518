"""A domain's suites file: one named suite per Dagster check, with its severity."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

from dagster import AssetCheckSeverity, AssetCheckSpec

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

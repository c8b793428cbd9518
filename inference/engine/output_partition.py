"""An output partition: where it and its staging area live, the names inside it, what decides its
content (fingerprints), and what writing it did (``ShardReport``)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

import pyarrow.fs as pafs

from inference.engine.invariants import StreamStats
from inference.engine.leases import CasStore

PROGRESS = "_progress.json"
MANIFEST = "_manifest.json"
# Underscore folders are skipped by Hive-style readers (pyarrow, Spark, Athena) of a partition.
QUARANTINE_DIR = "_quarantine"
SIDE_DIR = "_side"
# Statistics counts named "quarantined:<reason>" hold the partition's quarantined rows by reason.
QUARANTINED_PREFIX = "quarantined:"


@dataclass(frozen=True)
class PartitionTarget:
    """Where one output partition, its staging area and its lease live."""

    fs: pafs.FileSystem
    final_dir: str
    staging_dir: str
    trash_dir: str
    lease_path: str
    cas: CasStore
    uri_prefix: str = ""

    @property
    def local(self) -> bool:
        return isinstance(self.fs, pafs.LocalFileSystem)

    def uri(self, path: str) -> str:
        return f"{self.uri_prefix}{path}"


@dataclass
class ShardReport:
    """What the checkpointing did for one partition."""

    shards: int = 0
    shards_resumed: int = 0
    rows_redone: int = 0
    attempt: int = 1
    interruptions: int = 0
    already_committed: bool = False
    uri: str = ""
    rows_in: int = 0
    rows_out: int = 0
    rows_scored: int = 0
    rows_quarantined: int = 0
    quarantine_uri: str = ""
    rows_side: int = 0
    side_uri: str = ""
    commit: str = ""
    stats: StreamStats = field(default_factory=StreamStats)

    def as_dict(self) -> dict[str, Any]:
        return {
            "shards": self.shards,
            "shards_resumed": self.shards_resumed,
            "rows_redone": self.rows_redone,
            "attempt": self.attempt,
            "interruptions": self.interruptions,
        }


def fingerprint(*parts: Any) -> str:
    """A stable hash of whatever decides a partition's output (inputs, model, settings)."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:20]


def input_fingerprint(fs: pafs.FileSystem, files: list[str]) -> list[tuple[str, int, str]]:
    """Identity of input files: path, size and modification time (ETag-like)."""
    infos = fs.get_file_info(files)
    return [(i.path, i.size or 0, str(i.mtime_ns or i.mtime)) for i in infos]

"""Upkeep of the output tables: snapshot expiry and orphan-file cleanup, with a retention.

Each day's head on main (the snapshot that put it there) is kept whatever its age: it is what
history and rollback start from, and what ``OutputTables.current`` reads. Every other snapshot
older than the retention goes, and so do audit and rejected branches cut before it. Files under
a table's location that no remaining snapshot references (data of expired snapshots, writes of
attempts that died before their commit, manifests of expired snapshots) are deleted once they
are older than the retention too, so that a write still in flight is never taken for an orphan.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field

import pyarrow.fs as pafs

from inference.engine.tables import (
    AUDIT_BRANCH,
    REJECTED_BRANCH,
    OutputTables,
    bare_path,
    day_heads,
)


@dataclass
class Upkeep:
    """What one table's upkeep removed."""

    table: str
    snapshots_expired: int = 0
    branches_removed: list[str] = field(default_factory=list)
    files_deleted: int = 0
    bytes_deleted: int = 0
    # Why snapshots were left to the catalog: one that runs its own expiry refuses ours.
    refused: str | None = None

    def describe(self, days: int) -> str:
        told = (
            f"{self.table}: {self.snapshots_expired} snapshot(s) expired, "
            f"{len(self.branches_removed)} branch(es) removed, {self.files_deleted} file(s) "
            f"deleted ({self.bytes_deleted} bytes); retention {days} day(s)"
        )
        if self.refused:
            told += f"; snapshots left to the catalog, which refused to expire them: {self.refused}"
        return told


def upkeep(
    tables: OutputTables,
    name: str,
    retention: dt.timedelta,
    now: dt.datetime,
    fs: pafs.FileSystem,
) -> Upkeep:
    """Expires ``name``'s snapshots and deletes its orphan files older than ``retention``
    (``fs``: the filesystem of the table's location, paths without a URI scheme).

    A catalog that expires snapshots itself refuses the commit (Lakana answers 403 and names
    its own maintenance command): the refusal is reported in :attr:`Upkeep.refused`, and the
    orphan files, which no snapshot references, are still deleted."""
    from pyiceberg.exceptions import ForbiddenError

    done = Upkeep(tables.identifier(name))
    table = tables.load(name)
    if table is None:
        return done
    cutoff_ms = int((now - retention).timestamp() * 1000)
    old_branches = [
        ref_name
        for ref_name, ref in table.metadata.refs.items()
        if ref_name.startswith((AUDIT_BRANCH, REJECTED_BRANCH))
        and table.snapshot_by_id(ref.snapshot_id).timestamp_ms < cutoff_ms
    ]
    try:
        if old_branches:
            update = table.manage_snapshots()
            for ref_name in old_branches:
                update = update.remove_branch(ref_name)
            update.commit()
            done.branches_removed = old_branches
            table = tables.load(name)
        keep = {day.snapshot_id for day in day_heads(table).values()}
        keep |= {ref.snapshot_id for ref in table.metadata.refs.values()}
        expired = [
            s.snapshot_id
            for s in table.snapshots()
            if s.timestamp_ms < cutoff_ms and s.snapshot_id not in keep
        ]
        if expired:
            table.maintenance.expire_snapshots().by_ids(expired).commit()
            done.snapshots_expired = len(expired)
    except ForbiddenError as exc:
        done.refused = str(exc)
    _delete_orphans(tables.load(name), cutoff_ms, done, fs)
    return done


def _referenced(table) -> set[str]:
    """Every file path the table's metadata still reaches (without a URI scheme)."""
    paths = {table.metadata_location}
    paths |= {entry.metadata_file for entry in table.metadata.metadata_log}
    for snapshot in table.snapshots():
        paths.add(snapshot.manifest_list)
        for manifest in snapshot.manifests(table.io):
            paths.add(manifest.manifest_path)
            for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=False):
                paths.add(entry.data_file.file_path)
    return {bare_path(p) for p in paths}


def _delete_orphans(table, cutoff_ms: int, done: Upkeep, fs: pafs.FileSystem) -> None:
    location = bare_path(table.location())
    referenced = _referenced(table)
    for folder in ("data", "metadata"):
        selector = pafs.FileSelector(f"{location}/{folder}", recursive=True, allow_not_found=True)
        for info in fs.get_file_info(selector):
            if info.type != pafs.FileType.File or info.path in referenced:
                continue
            # The metadata JSON files are the catalog's to prune (previous-versions-max).
            if info.path.endswith(".metadata.json"):
                continue
            if info.mtime is None or info.mtime.timestamp() * 1000 >= cutoff_ms:
                continue
            fs.delete_file(info.path)
            done.files_deleted += 1
            done.bytes_deleted += info.size or 0

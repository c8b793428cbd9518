"""How a partition written in staging is published: by renaming the staging folder into place
(local), or by copying its files under commit-unique names and writing the manifest last (S3).

``io`` works on the writing partition's filesystem; its staging folder is where a companion's
(quarantine, side output) files wait until they are published.
"""

from __future__ import annotations

import uuid

import pyarrow as pa

from inference.engine.output_partition import MANIFEST, PartitionTarget
from inference.engine.partition_io import PartitionIO


def swap_in(io: PartitionIO, t: PartitionTarget) -> None:
    """Renames the staging folder into place; readers see the old or the new partition."""
    old = f"{t.trash_dir}/{uuid.uuid4().hex}"
    if io.exists(t.final_dir):
        io.mkdir(t.trash_dir)
        t.fs.move(t.final_dir, old)
    t.fs.move(t.staging_dir, t.final_dir)
    io.delete_dir(t.trash_dir)


def commit_by_manifest(
    io: PartitionIO, t: PartitionTarget, source: str, files: list[str], manifest: dict
) -> None:
    parts = []
    for i, name in enumerate(files):
        part = f"part-{manifest['commit']}-{i:05d}.parquet"
        t.fs.copy_file(f"{source}/{name}", f"{t.final_dir}/{part}")
        parts.append(part)
    # The manifest is the commit point: written last, in one PUT.
    io.write_json(f"{t.final_dir}/{MANIFEST}", {**manifest, "files": parts})
    io.keep_only(t.final_dir, {*parts, MANIFEST})


def commit_beside(
    io: PartitionIO,
    subdir: str,
    q: PartitionTarget,
    files: list[str],
    manifest: dict,
    schema: pa.Schema | None = None,
) -> None:
    """Publishes a companion (quarantined rows, side output; possibly no rows) as its own
    partition, replacing any earlier one, while the shards' copies stay in staging until the
    partition commits. A side output with no rows is still published, as an empty file."""
    source = f"{io.target.staging_dir}/{subdir}"
    if schema is not None and not files:
        io.mkdir(source)
        io.write_parquet(f"{source}/empty.parquet", [], schema)
        files = ["empty.parquet"]
    if not q.local:
        io.mkdir(q.final_dir)
        commit_by_manifest(io, q, source, files, manifest)
        return
    io.delete_dir(q.staging_dir)
    io.mkdir(q.staging_dir)
    for name in files:
        q.fs.copy_file(f"{source}/{name}", f"{q.staging_dir}/{name}")
    io.write_json(f"{q.staging_dir}/{MANIFEST}", {**manifest, "files": files})
    swap_in(io, q)

"""File operations on an output partition's filesystem: parquet and JSON written whole (a
temporary file renamed into place locally, one PUT on S3), a shard's companion files in staging,
reads, folders, and which columns a shard's parquet dictionary-encodes."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from inference.engine.diskspace import writing
from inference.engine.output_partition import PartitionTarget


class PartitionIO:
    """Writes, reads and removes files on ``target``'s filesystem; local writes go through a
    temporary file, and a write that fails for lack of space names the file."""

    def __init__(self, target: PartitionTarget):
        self.target = target

    def write_parquet(self, path: str, tables: Iterable[pa.Table], schema: pa.Schema) -> int:
        tmp = f"{path}.tmp" if self.target.local else path
        with self._writing(tmp, path):
            rows = self._write_tables(tmp, tables, schema)
        if self.target.local:
            self.target.fs.move(tmp, path)
        return rows

    def write_beside(
        self,
        subdir: str,
        target: PartitionTarget | None,
        name: str,
        tables: list[pa.Table],
        schema: pa.Schema | None = None,
    ) -> str | None:
        """Writes a shard's companion rows (quarantined, side output) into ``subdir`` of staging;
        removes a stale file when the shard now has none."""
        path = f"{self.target.staging_dir}/{subdir}/{name}"
        if not tables:
            if target is not None and self.exists(path):
                self.target.fs.delete_file(path)
            return None
        if target is None:
            raise ValueError(f"a shard has rows for {subdir} but the writer has no target for it")
        self.mkdir(f"{self.target.staging_dir}/{subdir}")
        self.write_parquet(path, tables, schema or tables[0].schema)
        return name

    def _write_tables(self, tmp: str, tables: Iterable[pa.Table], schema: pa.Schema) -> int:
        rows, out = 0, None
        try:
            for table in tables:
                table = table.select(schema.names).cast(schema)
                if out is None:
                    out = pq.ParquetWriter(
                        tmp,
                        schema,
                        filesystem=self.target.fs,
                        use_dictionary=dictionary_columns(table),
                    )
                out.write_table(table)
                rows += table.num_rows
            if out is None:  # no rows: an empty file that still carries the schema
                out = pq.ParquetWriter(tmp, schema, filesystem=self.target.fs)
        finally:
            if out is not None:
                out.close()
        return rows

    def _writing(self, tmp: str, path: str):
        """Removes a failed write's temporary file, and names the file when space ran out."""

        def cleanup() -> None:
            if tmp != path and self.exists(tmp):
                self.target.fs.delete_file(tmp)

        return writing(path, self.target.uri(path), cleanup, local=self.target.local)

    def write_json(self, path: str, data: dict) -> None:
        raw = json.dumps(data, sort_keys=True).encode()
        fs = self.target.fs
        tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}" if self.target.local else path
        with self._writing(tmp, path):
            with fs.open_output_stream(tmp) as out:
                out.write(raw)
        if tmp != path:
            fs.move(tmp, path)

    def read_json(self, path: str) -> dict | None:
        try:
            with self.target.fs.open_input_stream(path) as stream:
                return json.loads(stream.read())
        except (FileNotFoundError, OSError):
            return None

    def exists(self, path: str) -> bool:
        return self.target.fs.get_file_info(path).type != pafs.FileType.NotFound

    def delete_dir(self, path: str) -> None:
        if self.exists(path):
            self.target.fs.delete_dir(path)

    def mkdir(self, path: str) -> None:
        self.target.fs.create_dir(path, recursive=True)

    def keep_only(self, folder: str, keep: set[str]) -> None:
        """Deletes every file and folder directly in ``folder`` whose name is not in ``keep``."""
        for info in self.target.fs.get_file_info(pafs.FileSelector(folder)):
            if info.base_name in keep:
                continue
            if info.type == pafs.FileType.Directory:
                self.target.fs.delete_dir(info.path)
            else:
                self.target.fs.delete_file(info.path)


def dictionary_columns(table: pa.Table, sample: int = 4096) -> list[str]:
    """Columns worth dictionary-encoding: those with at most half as many distinct values as
    rows in a leading sample (a model version, a reason), not ids or scores.

    Parquet tries a dictionary on every column by default and gives up only once it outgrows
    its page limit: on a shard of unique ids and float scores that makes the write several
    times slower and the file larger than a dictionary on the repetitive columns alone.
    """
    head = table.slice(0, sample)
    chosen = []
    for name in head.column_names:
        column = head[name]
        if pa.types.is_boolean(column.type) or not len(column):
            continue
        if pa.types.is_nested(column.type):  # lists and structs: parquet's default
            chosen.append(name)
        elif pc.count_distinct(column).as_py() * 2 <= len(column):
            chosen.append(name)
    return chosen

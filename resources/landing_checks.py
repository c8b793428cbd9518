"""Landing files against the pipeline's contract: each file's schema checked on its own, so an
error names the file and the column, and where a file that cannot be decoded stops decoding."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from inference.engine.timestamps import is_naive_for


class LandingDataError(ValueError):
    """Landing data is missing or does not match the schema the pipeline needs."""


def locate_damage(fs: pafs.FileSystem, file: str, columns: list[str]) -> str:
    """Where a parquet file stops decoding: ", row group R, column 'C', bytes A-B", or ""."""
    try:
        parquet = pq.ParquetFile(file, filesystem=fs)
        meta = parquet.metadata
        names = parquet.schema_arrow.names
        for group in range(meta.num_row_groups):
            for name in [c for c in columns if c in names]:
                try:
                    parquet.read_row_group(group, columns=[name])
                except (pa.ArrowInvalid, OSError):
                    chunk = meta.row_group(group).column(names.index(name))
                    start = chunk.dictionary_page_offset or chunk.data_page_offset
                    end = start + chunk.total_compressed_size
                    return f", row group {group}, column '{name}', bytes {start}-{end}"
    except (pa.ArrowInvalid, OSError):
        return ""
    return ""


def check_schema(
    actual: pa.Schema, required: pa.Schema, where: str, timezone: str | None = None
) -> None:
    """Raises LandingDataError naming the file and column that does not fit the contract.

    A timestamp without a time zone where the contract has one is accepted only with the
    dataset's landing timezone, which says whose wall-clock time it is; else it would be read
    as UTC, and a local evening's rows would land in the next day.
    """
    for want in required:
        index = actual.get_field_index(want.name)
        if index < 0:
            raise LandingDataError(
                f"{where}: required column '{want.name}' ({want.type}) is missing; "
                f"found columns {actual.names}"
            )
        found = actual.field(index).type
        if is_naive_for(found, want.type) and timezone is None:
            raise LandingDataError(
                f"{where}: column '{want.name}' is {found} without a time zone; expected "
                f"{want.type}: write it with a time zone, or set the dataset's landing timezone "
                "(NIGHTSHIFT_LANDING_TIMEZONE or the storage resource's landing_timezone, e.g. "
                "'America/New_York') to read it as wall-clock time there"
            )
        if not _compatible(found, want.type):
            raise LandingDataError(
                f"{where}: column '{want.name}' has type {found}, expected {want.type}"
            )


def _compatible(found: pa.DataType, expected: pa.DataType) -> bool:
    if found == expected:
        return True
    checks = [pa.types.is_integer, pa.types.is_floating, pa.types.is_string, pa.types.is_timestamp]
    for check in checks:
        if check(expected):
            if check is pa.types.is_string:
                return pa.types.is_string(found) or pa.types.is_large_string(found)
            if check is pa.types.is_floating:
                return pa.types.is_floating(found) or pa.types.is_integer(found)
            return check(found)
    return False

"""Which files below a landing partition folder are data, by their names and their first bytes,
and each data file against the pipeline's contract.

The landing contract is parquet, and a file is parquet by its content, not its name: Hive and
Impala write ``000000_0``, other writers ``.parq`` or ``.PARQUET``. Every file below the folder
ends in exactly one of three places, so none is dropped without a word:

- **data**: a ``*.parquet`` name, or any other name whose bytes start or end with parquet's
  magic ``PAR1`` (a damaged one is still data: its footer read fails naming it);
- **skipped**: a name Spark and Hadoop skip or leave behind (a part starting with ``_`` or
  ``.``: ``_SUCCESS``, ``_temporary/``, ``.crc``; a copy in progress: ``*._COPYING_``,
  ``*.tmp``, ``*.crc``; see :func:`resources.filestore.not_data_name`), and, when the policy
  is ``skip``, a file that is not parquet or that repeats another;
- **not parquet**: any other file (CSV, JSON, a stray manifest), with what it looks like. Under
  the ``fail`` policy (the default) it fails the day, naming it;
- **duplicate**: a data file with the same bytes as another of the day (``part-00001
  (1).parquet``, a copy made by hand), or a second path to the same file. Its rows would be read
  twice, so under ``fail`` it fails the day naming both, and under ``skip`` it is skipped;
- **broken**: a link that is dangling, loops, or leaves the data root
  (:mod:`resources.landing_walk`). It fails the day naming it, whatever the policy.

Duplicates cost nothing on a normal day: only files of equal size are hashed, once per file
version.

A file named ``*.parquet`` is not sniffed: the name claims parquet, so a file that is not is
damaged and fails as unreadable, whatever the policy; this keeps a normal day free of extra
reads. Other names cost two small reads each, once per file version (see :class:`Sniffer`).

Each file's schema is checked on its own (:func:`check_schema`), so an error names the file and
the column, and a file that cannot be decoded is named with where it stops decoding
(:func:`locate_damage`).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from inference.engine.quarantine import QuarantinePlan
from inference.engine.streaming import is_naive_for
from resources.filestore import is_data
from resources.landing_walk import list_files

NOT_PARQUET_ENV = "NIGHTSHIFT_LANDING_NOT_PARQUET"
NOT_PARQUET_POLICIES = ("fail", "skip")
# Parquet's magic (``PARE``: an encrypted footer, still parquet to be judged by its reader).
MAGICS = (b"PAR1", b"PARE")
# Enough of a file's start to tell CSV from JSON from binary.
HEAD_BYTES = 4096
# Each sniff of an object store is two round trips: run them side by side.
SNIFF_THREADS = 16
# File versions whose verdict a store remembers (a short string each).
SNIFFED_KEPT = 200_000
# Read at once while hashing a file that may repeat another.
HASH_CHUNK = 1 << 20


def not_parquet_policy(value: str | None) -> str:
    """The policy for landing files that are not parquet: ``value`` (the storage resource's
    ``landing_not_parquet``), else ``$NIGHTSHIFT_LANDING_NOT_PARQUET``, else ``fail``.

    Raises:
        ValueError: any other value, naming the setting.
    """
    given = value or os.environ.get(NOT_PARQUET_ENV) or "fail"
    policy = given.strip().lower()
    if policy not in NOT_PARQUET_POLICIES:
        where = "the storage resource's landing_not_parquet" if value else NOT_PARQUET_ENV
        raise ValueError(
            f"{where} is {given!r}; expected one of {', '.join(NOT_PARQUET_POLICIES)} (what to "
            "do with a landing file that is not parquet)"
        )
    return policy


@dataclass(frozen=True)
class LandingListing:
    """A landing partition's files, each placed once: read, skipped, or not parquet.

    Attributes:
        files: the parquet files read as data, in path order.
        skipped: files never read, in path order: not-data names, and not-parquet files and
            duplicates when the policy is ``skip``.
        not_parquet: every file that is not parquet, with what it looks like.
        policy: ``fail`` or ``skip``.
        duplicates: every data file that repeats another -> the file it repeats (read once).
        broken: every link that cannot be read -> why (see :mod:`resources.landing_walk`).
    """

    files: list[pafs.FileInfo] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    not_parquet: dict[str, str] = field(default_factory=dict)
    policy: str = "fail"
    duplicates: dict[str, str] = field(default_factory=dict)
    broken: dict[str, str] = field(default_factory=dict)

    @property
    def paths(self) -> list[str]:
        return [f.path for f in self.files]

    @property
    def rejected(self) -> dict[str, str]:
        """The files that fail the day: not parquet, under the ``fail`` policy."""
        return self.not_parquet if self.policy == "fail" else {}

    @property
    def repeated(self) -> dict[str, str]:
        """The duplicates that fail the day, under the ``fail`` policy."""
        return self.duplicates if self.policy == "fail" else {}


@dataclass(frozen=True)
class LandingRead:
    """One listing of a landing partition, as a scoring step reads it: the fingerprint the
    landing sensor and the landing check compare, and the parquet files of that same listing,
    or why there are none to read (raised when they are asked for)."""

    fingerprint: str | None
    paths: list[str]
    problem: Exception | None = None
    # The landing stage's screening of exactly these files, where it kept one (see
    # DataStore.keep_screen): {"rules": ..., "rows": ..., "positions": [...], "reasons": [...]}.
    kept: Mapping[str, Any] | None = None

    @property
    def files(self) -> list[str]:
        if self.problem is not None:
            raise self.problem
        return self.paths

    def screened(self, rules: Mapping[str, Any]) -> QuarantinePlan | None:
        """The quarantine plan the landing stage kept for these files, where it screened them
        under ``rules`` (the screen's version and limits); else None, and the day is screened
        again."""
        if self.kept is None or self.kept.get("rules") != json.loads(json.dumps(rules)):
            return None
        return QuarantinePlan(
            int(self.kept["rows"]),
            np.asarray(self.kept["positions"], np.int64),
            np.asarray(self.kept["reasons"], object),
        )


def looks_like(head: bytes, size: int) -> str:
    """What a file that is not parquet looks like, from its first bytes, for an error or log."""
    if size == 0:
        return "looks like an empty file (0 bytes), not parquet"
    for magic, kind in _BINARY_KINDS:
        if head.startswith(magic):
            return f"looks like {kind}, not parquet"
    text = _as_text(head)
    if text is None:
        return f"looks like binary data, not parquet (starts with 0x{head[:8].hex()})"
    stripped = text.lstrip()
    if stripped[:1] in ("{", "["):
        lines = [line for line in stripped.splitlines() if line.strip()]
        if len(lines) > 1 and all(line.lstrip().startswith("{") for line in lines[:-1]):
            return "looks like JSON lines text, not parquet"
        return "looks like JSON, not parquet"
    if _delimited(text):
        return "looks like CSV text, not parquet"
    return "looks like plain text, not parquet"


_BINARY_KINDS = (
    (b"\x1f\x8b", "gzip-compressed data"),
    (b"PK\x03\x04", "a ZIP archive"),
    (b"ORC", "ORC"),
    (b"Obj\x01", "Avro"),
    (b"ARROW1", "an Arrow IPC file"),
    (b"\x28\xb5\x2f\xfd", "zstd-compressed data"),
    (b"BZh", "bzip2-compressed data"),
)


def _as_text(head: bytes) -> str | None:
    """The bytes as text when they are printable UTF-8 (a multi-byte character cut at the end
    of the head allowed)."""
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError as exc:
        if exc.start < len(head) - 3:
            return None
        text = head[: exc.start].decode("utf-8")
    text = text.removeprefix("\ufeff")
    printable = sum(c.isprintable() or c in "\r\n\t" for c in text)
    return text if text and printable >= 0.95 * len(text) else None


def _delimited(text: str) -> bool:
    """Whether the text's first lines split on one delimiter into the same number of fields."""
    lines = [line for line in text.splitlines()[:6] if line.strip()]
    if len(lines) > 2:
        lines = lines[:-1]  # the last line may be cut at HEAD_BYTES
    for delimiter in (",", "\t", ";", "|"):
        counts = {line.count(delimiter) for line in lines}
        if len(counts) == 1 and counts.pop() > 0:
            return True
    return False


class Sniffer:
    """Tells parquet from other files by their first and last bytes, remembering each file
    version's verdict (keyed on path, size and modification time) for the store's life: the
    steps of a run list the same partition several times.

    Args:
        fs: the files' filesystem.
    """

    def __init__(self, fs: pafs.FileSystem):
        self.fs = fs
        self._verdicts: dict[tuple, str | None] = {}

    def verdicts(self, files: list[pafs.FileInfo]) -> list[str | None]:
        """For each file, None when it is parquet, else what it looks like."""
        return self._remembered(files, "sniff", self._sniff)

    def digests(self, files: list[pafs.FileInfo]) -> list[str]:
        """Each file's SHA-256, remembered per file version as the verdicts are."""
        return [d or "" for d in self._remembered(files, "sha256", self._digest)]

    def _remembered(self, files: list[pafs.FileInfo], kind: str, read) -> list:
        """``read(file)`` for each file, remembered per file version (path, size, mtime); the
        files not yet read are read on threads where each read is a round trip."""
        keys = [(kind, f.path, f.size, f.mtime_ns) for f in files]
        todo = [(f, k) for f, k in zip(files, keys, strict=True) if k not in self._verdicts]
        if len(self._verdicts) + len(todo) > SNIFFED_KEPT:
            self._verdicts.clear()
        remote = not isinstance(self.fs, pafs.LocalFileSystem)
        if remote and len(todo) > 1:
            with ThreadPoolExecutor(min(SNIFF_THREADS, len(todo))) as pool:
                found = list(pool.map(read, [f for f, _ in todo]))
        else:
            found = [read(f) for f, _ in todo]
        for (_, key), value in zip(todo, found, strict=True):
            self._verdicts[key] = value
        return [self._verdicts[key] for key in keys]

    def _digest(self, info: pafs.FileInfo) -> str:
        digest = hashlib.sha256()
        with self.fs.open_input_stream(info.path) as stream:
            while chunk := stream.read(HASH_CHUNK):
                digest.update(chunk)
        return digest.hexdigest()

    def _sniff(self, info: pafs.FileInfo) -> str | None:
        size = info.size or 0
        if size == 0:
            return looks_like(b"", 0)
        with self.fs.open_input_file(info.path) as f:
            head = f.read_at(min(HEAD_BYTES, size), 0)
            tail = head[-4:] if size <= HEAD_BYTES else f.read_at(4, size - 4)
        if head[:4] in MAGICS or tail in MAGICS:
            return None
        return looks_like(head, size)


def claims_parquet(name: str) -> bool:
    """Whether a file's name says it is parquet (then its content is not sniffed)."""
    return name.lower().endswith(".parquet")


def list_landing(
    fs: pafs.FileSystem, path: str, policy: str, sniffer: Sniffer, root: str
) -> LandingListing:
    """Places every file below a landing partition folder (see the module docstring); ``root``
    is the data root no link may leave."""
    if fs.get_file_info(path).type == pafs.FileType.NotFound:
        return LandingListing(policy=policy)
    walked = list_files(fs, path, root, is_data)
    listing = classify(walked.files, len(path) + 1, policy, sniffer)
    repeats = same_bytes(listing.files, sniffer)
    aliases = {path: repeats.get(first, first) for path, first in walked.aliases.items()}
    duplicates = {**aliases, **repeats}
    if not duplicates and not walked.broken:
        return listing
    files = [f for f in listing.files if f.path not in duplicates]
    skipped = listing.skipped + list(duplicates) if policy == "skip" else listing.skipped
    return LandingListing(
        files, sorted(skipped), listing.not_parquet, policy, duplicates, walked.broken
    )


def same_bytes(files: list[pafs.FileInfo], sniffer: Sniffer) -> dict[str, str]:
    """Each file with the same bytes as another -> the one kept: the shortest path, then the
    first in path order, so ``part-00000 (1).parquet`` repeats ``part-00000.parquet``. Only
    files of equal size are hashed."""
    by_size: dict[int | None, list[pafs.FileInfo]] = {}
    for f in sorted(files, key=lambda f: (len(f.path), f.path)):
        by_size.setdefault(f.size, []).append(f)
    alike = [f for group in by_size.values() if len(group) > 1 for f in group]
    first: dict[tuple, str] = {}
    repeats = {}
    for f, digest in zip(alike, sniffer.digests(alike), strict=True):
        original = first.setdefault((f.size, digest), f.path)
        if original != f.path:
            repeats[f.path] = original
    return repeats


def classify(
    entries: Iterable[pafs.FileInfo], start: int, policy: str, sniffer: Sniffer
) -> LandingListing:
    """Places files of one partition folder; ``start`` is where their path below it begins."""
    named, unknown, skipped = [], [], []
    for f in sorted(entries, key=lambda e: e.path):
        relative = f.path[start:]
        if not is_data(relative):
            skipped.append(f.path)
        elif claims_parquet(relative):
            named.append(f)
        else:
            unknown.append(f)
    data, not_parquet = list(named), {}
    for f, verdict in zip(unknown, sniffer.verdicts(unknown), strict=True):
        if verdict is None:
            data.append(f)
        else:
            not_parquet[f.path] = verdict
    if policy == "skip":
        skipped.extend(not_parquet)
    return LandingListing(sorted(data, key=lambda f: f.path), sorted(skipped), not_parquet, policy)


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
) -> list[str]:
    """Raises LandingDataError naming the file and column that does not fit the contract, and
    the cast its writer would make so it fits.

    A timestamp without a time zone where the contract has one is accepted only with the
    dataset's landing timezone, which says whose wall-clock time it is; else it would be read
    as UTC, and a local evening's rows would land in the next day.

    Returns:
        the casts the file is read with that change how a value is held (see
        :func:`read_cast`), e.g. ``amount: decimal128(18, 2) -> double``.
    """
    casts = []
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
                f"{want.type}: write it with a time zone (cast {want.name} from {found} to "
                f"{want.type} where the file is written, if its times are UTC), or set the "
                "dataset's landing timezone "
                "(NIGHTSHIFT_LANDING_TIMEZONE or the storage resource's landing_timezone, e.g. "
                "'America/New_York') to read it as wall-clock time there"
            )
        if not _compatible(found, want.type):
            raise LandingDataError(
                f"{where}: column '{want.name}' has type {found}, expected {want.type}: "
                f"cast {want.name} from {found} to {want.type} where the file is written"
            )
        if cast := read_cast(found, want.type):
            casts.append(f"{want.name}: {cast}")
    return casts


def read_cast(found: pa.DataType, expected: pa.DataType) -> str | None:
    """The cast a column is read with when it changes how values are held, else None: Spark's
    ``decimal(p, s)`` read as the contract's float (the nearest one; a reader that writes the
    value out can ask for its exact text too, see inference.engine.streaming.exact_text), and a
    dictionary-encoded column (pandas' categoricals) read as its values' type. Widening an
    integer is not one."""
    if pa.types.is_decimal(found) or pa.types.is_dictionary(found):
        return f"{found} -> {expected}"
    return None


def _compatible(found: pa.DataType, expected: pa.DataType) -> bool:
    if found == expected:
        return True
    if pa.types.is_dictionary(found):
        # Dictionary-encoded timestamps would be cast as UTC, past the landing timezone's check.
        return not pa.types.is_timestamp(found.value_type) and _compatible(
            found.value_type, expected
        )
    if pa.types.is_decimal(found):
        return pa.types.is_floating(expected)
    checks = [pa.types.is_integer, pa.types.is_floating, pa.types.is_string, pa.types.is_timestamp]
    for check in checks:
        if check(expected):
            if check is pa.types.is_string:
                return pa.types.is_string(found) or pa.types.is_large_string(found)
            if check is pa.types.is_floating:
                return pa.types.is_floating(found) or pa.types.is_integer(found)
            return check(found)
    return False

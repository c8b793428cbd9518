"""What a store remembers of the landing files it has read, so the steps of a run (which list,
count, screen and score the same files several times) pay for them once: the files whose schema
passed a contract with their rows and footers, and the decoded rows of the last partition of
small files it read whole. Everything is keyed on the files' (path, size, mtime), so a changed
file is read afresh.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from inference.engine.streaming import THREADED_ROWS
from resources.landing_files import (
    HEAD_BYTES,
    MAGICS,
    LandingDataError,
    check_schema,
    looks_like,
)

# Footers and small files fetched at once from an object store, where each read is a round
# trip; a local disk reads footers at least as fast on the calling thread, so it uses none.
REMOTE_READ_THREADS = 16
# A parquet footer takes ~17 KiB in memory (8 columns, one row group): a store keeps those of
# partitions up to this many files (~34 MiB), so their readers need not read them again; in a
# larger partition each reader reads its own, and they are checked a chunk at a time.
FOOTERS_KEPT = 2_048
FOOTER_CHUNK = 256
# A partition made only of small files (each under THREADED_ROWS rows) is kept decoded for the
# next pass over it while it takes at most this much memory (a typical small-file day of
# transactions is far below it), so the fixed per-file work is paid once, not on every pass.
SMALL_FILES_CACHE_BYTES = 64 << 20
# Files whose contract check a store remembers (a row count each, a few hundred bytes).
CHECKED_KEPT = 200_000

Checked = list[tuple[str, int, pq.FileMetaData | None]]
Decoded = list[tuple[str, list[pa.RecordBatch]]]


class CheckedFiles:
    """The rows of landing files whose schema passed a contract, and their footers (see
    FOOTERS_KEPT).

    Args:
        fs: the files' filesystem.
        uri: how a path is named in an error.
    """

    def __init__(self, fs: pafs.FileSystem, uri: Callable[[str], str]):
        self.fs, self.uri = fs, uri
        # (file version, contract) -> its rows and the casts it is read with
        self._checked: dict[tuple, tuple[int, list[str]]] = {}
        self._footer_cache: dict[tuple, pq.FileMetaData] = {}

    def check(
        self,
        dataset: str,
        date: str,
        files: list[pafs.FileInfo],
        required: pa.Schema,
        timezone: str | None,
    ) -> tuple[tuple, Checked]:
        """The partition's files with their rows (and footers when kept), each file's schema
        checked against the contract, the first bad file in order named; with a key naming
        exactly these files (path, size, mtime) under this contract and time zone."""
        contract = (hash(required), timezone)
        keys = [(f.path, f.size, f.mtime_ns or f.mtime) for f in files]
        keep = len(files) <= FOOTERS_KEPT
        rows = [self._checked.get((key, contract), (None,))[0] for key in keys]
        footers = [self._footer_cache.get(key) if keep else None for key in keys]
        todo = [i for i in range(len(keys)) if rows[i] is None or (keep and footers[i] is None)]
        if keep and len(self._footer_cache) + len(todo) > FOOTERS_KEPT:
            self._footer_cache.clear()  # a long-lived store forgets older days' footers
        if len(self._checked) + len(todo) > CHECKED_KEPT:
            self._checked.clear()
        for start in range(0, len(todo), FOOTER_CHUNK):  # a chunk of footers in memory at once
            chunk = todo[start : start + FOOTER_CHUNK]
            read = self._read_footers([keys[i][0] for i in chunk])
            for i, footer in zip(chunk, read, strict=True):
                where = f"{self.uri(keys[i][0])} (dataset '{dataset}', date {date})"
                if isinstance(footer, Exception):
                    raise LandingDataError(
                        f"unreadable parquet file {self.uri(keys[i][0])} in dataset "
                        f"'{dataset}', date {date}{self._not_parquet(files[i])}: {footer}"
                    ) from footer
                casts = check_schema(
                    footer.schema.to_arrow_schema(), required, where, timezone=timezone
                )
                rows[i] = footer.num_rows
                self._checked[(keys[i], contract)] = (footer.num_rows, casts)
                if keep:
                    footers[i] = self._footer_cache[keys[i]] = footer
        checked = [(key[0], n, footer) for key, n, footer in zip(keys, rows, footers, strict=True)]
        return (dataset, date, tuple(keys), contract), checked

    def casts(self, key: tuple) -> dict[str, int]:
        """The casts the files of a :meth:`check` key are read with (``column: from -> to``),
        each with how many files need it."""
        _, _, keys, contract = key
        counts: dict[str, int] = {}
        for file in keys:
            for cast in self._checked.get((file, contract), (0, []))[1]:
                counts[cast] = counts.get(cast, 0) + 1
        return counts

    def _not_parquet(self, info: pafs.FileInfo) -> str:
        """ " (it looks like CSV text, not parquet)" for a file named parquet that does not
        start as parquet, else "": says what a damaged file is, where its reader cannot."""
        try:
            with self.fs.open_input_file(info.path) as f:
                head = f.read_at(min(HEAD_BYTES, info.size or 0), 0)
        except OSError:
            return ""
        return "" if head[:4] in MAGICS else f" (it {looks_like(head, len(head))})"

    def _read_footers(self, files: list[str]) -> list[pq.FileMetaData | Exception]:
        def read(file: str) -> pq.FileMetaData | Exception:
            try:
                return pq.read_metadata(file, filesystem=self.fs)
            except (pa.ArrowInvalid, OSError) as exc:
                return exc

        if len(files) > 1 and not isinstance(self.fs, pafs.LocalFileSystem):
            with ThreadPoolExecutor(min(REMOTE_READ_THREADS, len(files))) as pool:
                return list(pool.map(read, files))
        return [read(f) for f in files]


class DecodedPartitions:
    """The decoded rows of the last partition of small files read whole, keyed on its files'
    identities, the contract and time zone (the key of :meth:`CheckedFiles.check`)."""

    def __init__(self) -> None:
        self._small_files: dict[tuple, Decoded] = {}

    def get(self, key: tuple) -> Decoded | None:
        return self._small_files.get(key)

    def recording(self, key: tuple, checked: Checked) -> Recording | None:
        """A recording of a read of the partition when it is made only of small files (the
        previous partition is forgotten then: one at a time, a backfill moves on); else None."""
        if not all(rows < THREADED_ROWS for _, rows, _ in checked):
            return None
        self._small_files.clear()
        return Recording(self._small_files, key)


class Recording:
    """Keeps the batches of one read of a partition, file by file, while they fit
    SMALL_FILES_CACHE_BYTES; :meth:`finish` keeps the read for the next pass if they did."""

    def __init__(self, kept: dict[tuple, Decoded], key: tuple):
        self._kept, self._key = kept, key
        self._files: Decoded = []
        self._bytes = 0
        self._within = True

    def record(self, file: str, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """Passes a file's batches on, keeping them while the read is within the budget."""
        if not self._within:
            yield from batches
            return
        read = []
        for batch in batches:
            read.append(batch)
            yield batch
        self._bytes += sum(b.nbytes for b in read)
        self._within = self._bytes <= SMALL_FILES_CACHE_BYTES
        self._files.append((file, read))

    def finish(self) -> None:
        """Called once the read reached the end: the next pass is served from it."""
        if self._within:
            self._kept[self._key] = self._files

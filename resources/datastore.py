"""The data store: landing partitions listed, checked against the pipeline's contract and read,
over a data root that also publishes output partitions (:class:`OutputStore`: the checkpointed
writer's target for each, a whole partition written and committed in one step, and the
committed files read back)."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from inference.engine.batching import coalesce
from inference.engine.quarantine import QuarantinePlan
from inference.engine.streaming import (
    READ_AHEAD_THREADS,
    LandingTimezones,
    NonexistentTimeError,
    ParquetRead,
    exact_name,
    iter_parquet_files,
)
from policy.partitions import day_end
from resources.filestore import is_data
from resources.landing_cache import REMOTE_READ_THREADS, Checked, CheckedFiles, DecodedPartitions
from resources.landing_files import (
    NOT_PARQUET_ENV,
    LandingDataError,
    LandingListing,
    LandingRead,
    Sniffer,
    claims_parquet,
    classify,
    list_landing,
    locate_damage,
    not_parquet_policy,
)
from resources.landing_walk import list_files
from resources.outputstore import OutputStore

# How long after its day ends a generated demo day is dated as landed (see write_landing).
DEMO_LANDED_AFTER = dt.timedelta(minutes=30)


class DataStore(OutputStore):
    """Reads landing partitions and publishes output partitions under one data root.

    Args:
        root: a local folder or ``s3://bucket/prefix``.
        s3_endpoint: endpoint override for S3-compatible servers (``http://127.0.0.1:9000``).
        s3_region: S3 region.
        landing_timezone: whose wall-clock time landing timestamps without a time zone are:
            ``America/New_York`` (every dataset), ``transactions=America/New_York`` (one), or
            both, comma-separated; None rejects them (see inference/timestamps).
        landing_not_parquet: ``fail`` or ``skip`` a landing file that is not parquet; None
            reads ``$NIGHTSHIFT_LANDING_NOT_PARQUET``, else ``fail`` (see
            resources/landing_files).
        catalog: the output tables' catalog, ``sql``, ``glue`` or ``rest`` (see
            resources/outputstore); catalog_uri: its URI; catalog_namespace: the tables'
            namespace.
    """

    def __init__(
        self,
        root: str,
        s3_endpoint: str | None = None,
        s3_region: str | None = None,
        landing_timezone: str | None = None,
        landing_not_parquet: str | None = None,
        catalog: str | None = None,
        catalog_uri: str | None = None,
        catalog_namespace: str | None = None,
    ):
        # Parsed first, so a bad setting fails before a local data root is created.
        self.landing_timezones = LandingTimezones.parse(landing_timezone)
        self.not_parquet = not_parquet_policy(landing_not_parquet)
        super().__init__(root, s3_endpoint, s3_region, catalog, catalog_uri, catalog_namespace)
        self._sniffer = Sniffer(self.fs)
        self._checked = CheckedFiles(self.fs, self.uri)
        # The decoded rows of the last partition of small files read whole (see
        # iter_landing_files).
        self._decoded = DecodedPartitions()

    def landing_listing(self, dataset: str, date: str) -> LandingListing:
        """Every file below the partition folder, placed once: read as parquet data, skipped
        (not-data names; not-parquet files and duplicates under the ``skip`` policy), not
        parquet, a duplicate, or a broken link. Every reader of the partition (counting,
        screening, scoring, fingerprints) reads its files."""
        return list_landing(
            self.fs, self.landing_path(dataset, date), self.not_parquet, self._sniffer, self.base
        )

    def landing_files(self, dataset: str, date: str) -> list[str]:
        """The partition's parquet files; raises LandingDataError if there are none."""
        return self.landing_read(dataset, date).files

    def landing_fingerprint(self, dataset: str, date: str) -> str | None:
        """A short hash of the partition's data files (path, size, modification time) and of
        the files that fail it (not parquet, duplicates, broken links), or None when it has
        neither yet: any data file added, replaced, rewritten or removed changes it, and so does
        removing or mending a file that failed the day."""
        return self.landing_read(dataset, date).fingerprint

    def landing_read(self, dataset: str, date: str, kept: bool = False) -> LandingRead:
        """One listing of the partition: its fingerprint, and the parquet files a scoring step
        reads, so that the files scored are the files whose fingerprint was checked; with
        ``kept``, also the screening the landing stage kept for exactly these files
        (:meth:`keep_screen`)."""
        path = self.landing_path(dataset, date)
        listing = self.landing_listing(dataset, date)
        failing = {**listing.rejected, **listing.repeated, **listing.broken}
        fingerprint = None
        if listing.files or failing:
            digest = hashlib.sha256()
            for f in listing.files:
                digest.update(f"{f.path[len(path) :]}\t{f.size}\t{f.mtime_ns}\n".encode())
            for file, what in failing.items():
                digest.update(f"{file[len(path) :]}\t{what}\n".encode())
            fingerprint = digest.hexdigest()[:16]
        problem = self._unreadable(dataset, date, listing)
        screen = self._kept_screen(dataset, date, fingerprint) if kept and fingerprint else None
        return LandingRead(fingerprint, listing.paths, problem, screen)

    def keep_screen(
        self, dataset: str, date: str, plan: QuarantinePlan, rules: Mapping[str, Any]
    ) -> str:
        """Keeps the landing stage's quarantine plan of a day, made under ``rules`` (the
        screen's version and limits), for the scoring step to reuse instead of screening the
        day again; tied to the files listed now, so a file added or replaced after the
        screening voids it. Returns where it went."""
        record = {
            "rules": rules,
            "landing": self.landing_fingerprint(dataset, date),
            "rows": plan.rows,
            "positions": plan.positions.tolist(),
            "reasons": plan.reasons.tolist(),
        }
        path = self._screen_path(dataset, date)
        self.write_bytes(path, json.dumps(record).encode())
        return self.uri(path)

    def _kept_screen(self, dataset: str, date: str, fingerprint: str) -> dict[str, Any] | None:
        try:
            record = json.loads(self.read_bytes(self._screen_path(dataset, date)))
        except (FileNotFoundError, OSError, ValueError):
            return None
        return record if record.get("landing") == fingerprint else None

    def _screen_path(self, dataset: str, date: str) -> str:
        return self.path("screens", dataset, f"date={date}", "screen.json")

    def _landing_infos(self, dataset: str, date: str) -> list[pafs.FileInfo]:
        """The partition's parquet files, as :meth:`landing_listing` places them.

        Raises:
            LandingDataError: see :meth:`_unreadable`.
        """
        listing = self.landing_listing(dataset, date)
        if (problem := self._unreadable(dataset, date, listing)) is not None:
            raise problem
        return listing.files

    def _unreadable(
        self, dataset: str, date: str, listing: LandingListing
    ) -> LandingDataError | None:
        """Why the partition cannot be read, or None: a link is broken, naming it and why; a
        file repeats another, or is not parquet (under the ``fail`` policy), naming it and the
        file it repeats or what it looks like; or the partition has no parquet file."""
        path = self.landing_path(dataset, date)
        if listing.broken:
            return self._broken_error(dataset, date, listing.broken)
        if listing.repeated:
            return self._duplicate_error(dataset, date, listing.repeated)
        if listing.rejected:
            return self._not_parquet_error(dataset, date, listing.rejected)
        if not listing.files:
            return LandingDataError(
                f"landing partition missing: dataset '{dataset}', date {date}: "
                f"no parquet files under {self.uri(path)}{self._skipped_note(path, listing)}. "
                "To fix it, land the day's parquet files there, then run this day again"
            )
        return None

    def _not_parquet_error(
        self, dataset: str, date: str, rejected: dict[str, str], shown: int = 5
    ) -> LandingDataError:
        named = "; ".join(f"{self.uri(f)} ({what})" for f, what in list(rejected.items())[:shown])
        more = f"; and {len(rejected) - shown} more" if len(rejected) > shown else ""
        return LandingDataError(
            f"landing file(s) not parquet: dataset '{dataset}', date {date}: {len(rejected)} "
            f"file(s) that are not parquet: {named}{more}. The landing contract is parquet: "
            f"convert the file(s) to parquet or move them out of the partition folder, or set "
            f"{NOT_PARQUET_ENV}=skip (the storage resource's landing_not_parquet) to skip "
            "files that are not parquet, counted in landing_files_skipped"
        )

    def _broken_error(self, dataset: str, date: str, broken: dict[str, str]) -> LandingDataError:
        named = "; ".join(f"{self.uri(f)} ({why})" for f, why in broken.items())
        return LandingDataError(
            f"landing link(s) broken: dataset '{dataset}', date {date}: {len(broken)} link(s) "
            f"that cannot be read: {named}. Replace each link with the file it should point "
            "to, or remove it; a link is followed only to a file or folder inside the data root"
        )

    def _duplicate_error(
        self, dataset: str, date: str, repeated: dict[str, str], shown: int = 5
    ) -> LandingDataError:
        pairs = list(repeated.items())
        named = "; ".join(f"{self.uri(f)} repeats {self.uri(first)}" for f, first in pairs[:shown])
        more = f"; and {len(pairs) - shown} more" if len(pairs) > shown else ""
        return LandingDataError(
            f"landing file(s) duplicated: dataset '{dataset}', date {date}: {len(pairs)} "
            f"file(s) with the same bytes as another file of the day, whose rows would be read "
            f"twice: {named}{more}. Remove the copies, or set {NOT_PARQUET_ENV}=skip (the "
            "storage resource's landing_not_parquet) to skip them, counted in "
            "landing_files_skipped"
        )

    @staticmethod
    def _skipped_note(path: str, listing: LandingListing) -> str:
        """ " (3 not-data file(s) skipped; 1 not-parquet file(s) skipped: a.csv (...))", or ""."""
        foreign = listing.not_parquet if listing.policy == "skip" else {}
        copies = listing.duplicates if listing.policy == "skip" else {}
        notes = []
        if hive := len(listing.skipped) - len(foreign) - len(copies):
            notes.append(f"{hive} not-data file(s) skipped")
        if foreign:
            named = ", ".join(f"{f[len(path) + 1 :]} ({what})" for f, what in foreign.items())
            notes.append(f"{len(foreign)} not-parquet file(s) skipped: {named}")
        if copies:
            named = ", ".join(f[len(path) + 1 :] for f in copies)
            notes.append(f"{len(copies)} duplicate file(s) skipped: {named}")
        return f" ({'; '.join(notes)})" if notes else ""

    def _checked_landing(self, dataset: str, date: str, required: pa.Schema) -> Checked:
        """The partition's files with their rows (and footers when kept), each file's schema
        checked against the contract, the first bad file in order named."""
        return self._checked_landing_keyed(dataset, date, required)[1]

    def _checked_landing_keyed(
        self, dataset: str, date: str, required: pa.Schema
    ) -> tuple[tuple, Checked]:
        """:meth:`_checked_landing`, with a key naming exactly these files (path, size, mtime)
        under this contract and time zone."""
        files = self._landing_infos(dataset, date)
        return self._checked.check(dataset, date, files, required, self.landing_timezone(dataset))

    def landing_dataset(self, dataset: str, date: str, required: pa.Schema) -> ds.Dataset:
        """Opens a landing partition after checking every file has the required columns.

        Each file's schema is checked on its own, so an error names the file and column.
        Integer widths may differ (int32 where int64 is required); other types must match.
        """
        files = [f for f, _, _ in self._checked_landing(dataset, date, required)]
        return ds.dataset(files, schema=required, filesystem=self.fs, format="parquet")

    def iter_landing(
        self,
        dataset: str,
        date: str,
        required: pa.Schema,
        columns: list[str] | None = None,
        batch_size: int = 65_536,
        exact: Sequence[str] = (),
    ) -> Iterator[pa.RecordBatch]:
        """Streams a landing partition as record batches cast to the required schema.

        Each column named in ``exact`` (of ``columns``) is followed, after the others, by a
        ``<name>_exact`` column holding its values as stored, as text, where the cast may round
        them (a decimal read as float64; see inference.engine.streaming.exact_text), so the rows
        can be written out with their exact values.

        Files are read one at a time, in order, so a file whose data cannot be decoded (a
        corrupt page, a truncated column chunk) fails naming the file, and the row group,
        column and byte range where decoding failed. Batches of small files are joined up to
        ``batch_size`` rows: a day landed as 500 files of 200 rows reaches the model and the
        screening rules in two batches, not 500, each costing its own per-call overhead.
        """
        batches = self.iter_landing_files(dataset, date, required, columns, batch_size, exact)
        yield from coalesce((batch for _, batch in batches), batch_size)

    def iter_landing_files(
        self,
        dataset: str,
        date: str,
        required: pa.Schema,
        columns: list[str] | None = None,
        batch_size: int = 65_536,
        exact: Sequence[str] = (),
    ) -> Iterator[tuple[str, pa.RecordBatch]]:
        """Like :meth:`iter_landing`, with the file each batch comes from (for error messages);
        batches are not joined across files."""
        read_columns = list(columns or required.names)
        floats = {f.name for f in required if pa.types.is_floating(f.type)}
        if wrong := [name for name in exact if name not in read_columns or name not in floats]:
            raise ValueError(f"exact columns {wrong} are not float columns among those read")
        wanted = [*read_columns, *map(exact_name, exact)]
        key, checked = self._checked_landing_keyed(dataset, date, required)
        # A partition of small files only, read before by this store with exactly these files:
        # its decoded rows are served again instead of paying each file's fixed cost once more
        # (a fraud run reads the day three times: screening, the feature profile, scoring).
        cached = self._decoded.get(key)
        if cached is not None:
            for file, batches in cached:
                for batch in batches:
                    yield file, batch.select(wanted)
            return
        recording = self._decoded.recording(key, checked)
        # A read that may be kept decodes every column, for a later pass that wants others, and
        # keeps every float's exact text (a null column where the files hold floats).
        if recording:
            read_columns = list(required.names)
            exact = [f.name for f in required if pa.types.is_floating(f.type)]
        remote = not isinstance(self.fs, pafs.LocalFileSystem)
        # Pull-based readers: one row group of a large file in memory at a time (a dataset
        # scanner reads ahead while the model is busy; see inference/streaming), small files
        # read whole a batch's worth ahead, on more threads where each read is a round trip.
        read = ParquetRead(
            read_columns,
            batch_size,
            required,
            self.fs,
            self.landing_timezone(dataset),
            tuple(exact),
        )
        files = iter_parquet_files(
            [f for f, _, _ in checked],
            [rows for _, rows, _ in checked],
            read,
            footers=[footer for _, _, footer in checked],
            threads=REMOTE_READ_THREADS if remote else READ_AHEAD_THREADS,
            pre_buffer=remote,
        )
        for file, batches in files:
            try:
                for batch in recording.record(file, batches) if recording else batches:
                    yield file, batch.select(wanted)
            except NonexistentTimeError as exc:
                raise LandingDataError(
                    f"{self.uri(file)} (dataset '{dataset}', date {date}): {exc}"
                ) from exc
            except (pa.ArrowInvalid, OSError) as exc:
                where = locate_damage(self.fs, file, columns or required.names)
                raise LandingDataError(
                    f"unreadable parquet file {self.uri(file)} in dataset '{dataset}', "
                    f"date {date}{where}: {exc}"
                ) from exc
        if recording:  # read to the end: within the budget, the next pass is served from it
            recording.finish()

    def read_landing(
        self, dataset: str, date: str, required: pa.Schema, columns: list[str] | None = None
    ) -> pa.Table:
        # Through the same reader as scoring, so naive timestamps get the landing timezone.
        batches = list(self.iter_landing_files(dataset, date, required, columns))
        schema = pa.schema([required.field(name) for name in columns or required.names])
        return pa.Table.from_batches([b for _, b in batches], schema=schema)

    def landing_timezone(self, dataset: str) -> str | None:
        """The zone whose wall-clock time the dataset's naive timestamps are; None rejects them."""
        return self.landing_timezones.for_dataset(dataset)

    def landing_casts(self, dataset: str, date: str, required: pa.Schema) -> dict[str, int]:
        """The casts the partition's files are read with beyond widening (``amount:
        decimal128(18, 2) -> double``), each with how many files need it (see
        resources.landing_files.read_cast)."""
        return self._checked.casts(self._checked_landing_keyed(dataset, date, required)[0])

    def count_landing(self, dataset: str, date: str, required: pa.Schema) -> int:
        """Rows in a landing partition, from its files' footers (no data is read)."""
        return sum(rows for _, rows, _ in self._checked_landing(dataset, date, required))

    def write_landing(self, dataset: str, date: str, table: pa.Table, on_time: bool = False) -> str:
        """Replaces a landing partition with one file (used by the demo-data generators).

        ``on_time``: the file is dated as an upstream export that landed on time would be,
        ``DEMO_LANDED_AFTER`` after its UTC day ended (now, for a day not over yet), so a demo
        day generated long after the fact passes its landing deadline check as such a day
        does. Local data roots only: S3 keeps the time of the write.
        """
        path = self.landing_path(dataset, date)
        self._delete_dir(path)
        self.fs.create_dir(path, recursive=True)
        file = f"{path}/part-00000.parquet"
        pq.write_table(table, file, filesystem=self.fs)
        if on_time and isinstance(self.fs, pafs.LocalFileSystem):
            landed = min(time.time(), (day_end(date) + DEMO_LANDED_AFTER).timestamp())
            # The write's own sub-second part kept: a file's (size, mtime) is its identity to
            # the landing caches, and a day written again must not look unchanged.
            landed = int(landed) + (time.time_ns() % 10**9) / 1e9
            os.utime(file, (landed, landed))
        return self.uri(file)

    def landing_dates(self, dataset: str) -> list[str]:
        """Dates that have a landing partition with data for the dataset, oldest first.

        A date folder holding only files that are not data (a Spark write still under
        ``_temporary/``) is not a partition yet. One holding a file that is not parquet is
        one under the ``fail`` policy (its run fails naming the file), and not under ``skip``
        unless it holds parquet too: the same placing as :meth:`landing_listing`.
        """
        path = self.path("landing", dataset)
        if not self.exists(path):
            return []
        walked = list_files(self.fs, path, self.base, is_data)
        folders: dict[str, list[pafs.FileInfo]] = {}
        failing = set()  # a broken link or a second path fails its day's run, naming it
        entries = [(f.path, f) for f in walked.files] + [(p, None) for p in walked.broken]
        for file, entry in entries + [(p, None) for p in walked.aliases]:
            folder, _, rest = file[len(path) :].lstrip("/").partition("/")
            if folder.startswith("date=") and rest and is_data(rest):
                date = folder[len("date=") :]
                if entry is None:
                    failing.add(date)
                else:
                    folders.setdefault(date, []).append(entry)
        present = {d for d, files in folders.items() if self._has_data(dataset, d, files)}
        return sorted(present | failing)

    def _has_data(self, dataset: str, date: str, files: list[pafs.FileInfo]) -> bool:
        """Whether a date folder's data-named files make it a partition (see landing_dates)."""
        if self.not_parquet == "fail" or any(claims_parquet(f.path) for f in files):
            return True
        start = len(self.landing_path(dataset, date)) + 1
        return bool(classify(files, start, self.not_parquet, self._sniffer).files)

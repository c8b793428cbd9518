"""The data store: landing partitions listed, checked against the pipeline's contract and read,
over a data root that also publishes output partitions (``resources.outputs``)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from inference.batching import coalesce
from inference.streaming import READ_AHEAD_THREADS, iter_parquet_files
from inference.timestamps import LandingTimezones, NonexistentTimeError
from resources.filestore import Listing, is_data
from resources.landing_cache import REMOTE_READ_THREADS, Checked, CheckedFiles, DecodedPartitions
from resources.landing_checks import LandingDataError, locate_damage
from resources.outputs import OutputStore


class DataStore(OutputStore):
    """Reads landing partitions and publishes output partitions under one data root.

    Args:
        root: a local folder or ``s3://bucket/prefix``.
        s3_endpoint: endpoint override for S3-compatible servers (``http://127.0.0.1:9000``).
        s3_region: S3 region.
        landing_timezone: whose wall-clock time landing timestamps without a time zone are:
            ``America/New_York`` (every dataset), ``transactions=America/New_York`` (one), or
            both, comma-separated; None rejects them (see inference/timestamps).
    """

    def __init__(
        self,
        root: str,
        s3_endpoint: str | None = None,
        s3_region: str | None = None,
        landing_timezone: str | None = None,
    ):
        # Parsed first, so a bad setting fails before a local data root is created.
        self.landing_timezones = LandingTimezones.parse(landing_timezone)
        super().__init__(root, s3_endpoint, s3_region)
        self._checked = CheckedFiles(self.fs, self.uri)
        # The decoded rows of the last partition of small files read whole (see
        # iter_landing_files).
        self._decoded = DecodedPartitions()

    def landing_listing(self, dataset: str, date: str) -> Listing:
        """The partition's data files, and the not-data files below it that are skipped."""
        return self._listing(self.landing_path(dataset, date))

    def landing_files(self, dataset: str, date: str) -> list[str]:
        """The partition's parquet files; raises LandingDataError if there are none."""
        return [f.path for f in self._landing_infos(dataset, date)]

    def landing_fingerprint(self, dataset: str, date: str) -> str | None:
        """A short hash of the partition's data files (path, size, modification time), or None
        when it has none yet: any file added, replaced, rewritten or removed changes it."""
        path = self.landing_path(dataset, date)
        files = self.landing_listing(dataset, date).files
        if not files:
            return None
        digest = hashlib.sha256()
        for f in files:
            digest.update(f"{f.path[len(path) :]}\t{f.size}\t{f.mtime_ns}\n".encode())
        return digest.hexdigest()[:16]

    def _landing_infos(self, dataset: str, date: str) -> list[pafs.FileInfo]:
        path = self.landing_path(dataset, date)
        listing = self._listing(path)
        if not listing.files:
            n = len(listing.skipped)
            skipped = f" ({n} not-data file(s) skipped)" if n else ""
            raise LandingDataError(
                f"landing partition missing: dataset '{dataset}', date {date}: "
                f"no parquet files under {self.uri(path)}{skipped}"
            )
        return listing.files

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
    ) -> Iterator[pa.RecordBatch]:
        """Streams a landing partition as record batches cast to the required schema.

        Files are read one at a time, in order, so a file whose data cannot be decoded (a
        corrupt page, a truncated column chunk) fails naming the file, and the row group,
        column and byte range where decoding failed. Batches of small files are joined up to
        ``batch_size`` rows: a day landed as 500 files of 200 rows reaches the model and the
        screening rules in two batches, not 500, each costing its own per-call overhead.
        """
        batches = self.iter_landing_files(dataset, date, required, columns, batch_size)
        yield from coalesce((batch for _, batch in batches), batch_size)

    def iter_landing_files(
        self,
        dataset: str,
        date: str,
        required: pa.Schema,
        columns: list[str] | None = None,
        batch_size: int = 65_536,
    ) -> Iterator[tuple[str, pa.RecordBatch]]:
        """Like :meth:`iter_landing`, with the file each batch comes from (for error messages);
        batches are not joined across files."""
        wanted = columns or required.names
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
        # A read that may be kept decodes every column, for a later pass that wants others.
        wanted_here = list(required.names) if recording else wanted
        remote = not isinstance(self.fs, pafs.LocalFileSystem)
        # Pull-based readers: one row group of a large file in memory at a time (a dataset
        # scanner reads ahead while the model is busy; see inference/streaming), small files
        # read whole a batch's worth ahead, on more threads where each read is a round trip.
        files = iter_parquet_files(
            [f for f, _, _ in checked],
            [rows for _, rows, _ in checked],
            footers=[footer for _, _, footer in checked],
            columns=wanted_here,
            batch_size=batch_size,
            schema=required,
            filesystem=self.fs,
            timezone=self.landing_timezone(dataset),
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

    def count_landing(self, dataset: str, date: str, required: pa.Schema) -> int:
        """Rows in a landing partition, from its files' footers (no data is read)."""
        return sum(rows for _, rows, _ in self._checked_landing(dataset, date, required))

    def write_landing(self, dataset: str, date: str, table: pa.Table) -> str:
        """Replaces a landing partition with one file (used by the demo-data generator)."""
        path = self.landing_path(dataset, date)
        self._delete_dir(path)
        self.fs.create_dir(path, recursive=True)
        file = f"{path}/part-00000.parquet"
        pq.write_table(table, file, filesystem=self.fs)
        return self.uri(file)

    def landing_dates(self, dataset: str) -> list[str]:
        """Dates that have a landing partition with data for the dataset, oldest first.

        A date folder holding only files that are not data (a Spark write still under
        ``_temporary/``) is not a partition yet.
        """
        path = self.path("landing", dataset)
        if not self.exists(path):
            return []
        dates = set()
        for entry in self.fs.get_file_info(pafs.FileSelector(path, recursive=True)):
            folder, _, rest = entry.path[len(path) :].lstrip("/").partition("/")
            if (
                entry.type == pafs.FileType.File
                and folder.startswith("date=")
                and rest.endswith(".parquet")
                and is_data(rest)
            ):
                dates.add(folder[len("date=") :])
        return sorted(dates)

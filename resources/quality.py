"""Data-quality gates: Great Expectations 1.x suites run as Dagster asset checks.

``dagster-ge`` pins great-expectations<1, so nightshift calls GE directly: one ephemeral context
per process, a pandas data source, and ``batch.validate(suite)``. Validating every row of a
million-row partition with GE costs more than scoring it, so each suite has two parts:

- ``statistics``: expectations over one row of exact figures that the engine computed while the
  partition streamed through it (counts, nulls, extremes, conservation) — every row counts;
- ``sample``: row-level expectations over a bounded, seeded random sample of the published
  rows, whose size and seed are recorded in the check's metadata.

Suites live beside each domain as reviewable JSON (``assets/<domain>/suites/<asset>.json``), one
file per asset; each named suite in it is one Dagster check with its severity.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
from dagster import (
    AssetCheckResult,
    AssetCheckSeverity,
    AssetCheckSpec,
    Config,
    Failure,
    MetadataValue,
)
from pydantic import Field as PydanticField

from inference.quarantine import QuarantineRateExceeded, RowConservationError
from inference.shards import QUARANTINED_PREFIX, ShardReport
from resources.storage import DataStore

SEVERITIES = {"ERROR": AssetCheckSeverity.ERROR, "WARN": AssetCheckSeverity.WARN}
# Offending values shown per failed expectation: enough to recognise the problem in the UI.
EXAMPLES = 5
DEFAULT_SAMPLE_ROWS = 10_000
DEFAULT_SEED = 0
# The share of a partition's rows that may be quarantined before the run fails instead.
DEFAULT_MAX_QUARANTINE_RATE = 0.01


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


# -- running Great Expectations ---------------------------------------------------------------


def preload_great_expectations() -> None:
    """Starts importing great_expectations in a background thread.

    The import takes 2-3 s of mostly Python work, once per process; an asset calls this when it
    starts, so the import overlaps reading and scoring (which release the GIL) instead of
    adding to the run after them. Measured on a cold 1M-row fraud_scores run: 1.5-3 s saved.
    """
    threading.Thread(target=_preload, name="great-expectations-import", daemon=True).start()


def _preload() -> None:
    try:
        _frames()
    except Exception:  # the first validation builds it again, and raises there
        return


_FRAMES_LOCK = threading.Lock()


def _frames():
    """The process's GE batch definition over pandas frames, built once (thread-safe)."""
    with _FRAMES_LOCK:
        return _build_frames()


@cache
def _build_frames():
    """Imported here, not at module load: great_expectations takes seconds to import, which
    only a run that validates something should pay, and only once per process."""
    import great_expectations as gx
    from great_expectations.data_context.types.base import ProgressBarsConfig

    logging.getLogger("great_expectations").setLevel(logging.WARNING)
    context = gx.get_context(mode="ephemeral")
    # GE draws tqdm bars on stderr for every validation; they would flood the run's logs.
    context.variables.progress_bars = ProgressBarsConfig(globally=False, metric_calculations=False)
    asset = context.data_sources.add_pandas("nightshift").add_dataframe_asset("frame")
    return asset.add_batch_definition_whole_dataframe("whole")


def _validate(
    expectations: list[dict], frame: pd.DataFrame, parameters: dict, detail: str = "SUMMARY"
) -> list:
    import great_expectations as gx

    suite = gx.ExpectationSuite(name="nightshift", expectations=[dict(e) for e in expectations])
    batch = _frames().get_batch(batch_parameters={"dataframe": frame})
    result_format: dict[str, Any] = {"result_format": detail}
    if detail == "SUMMARY":
        result_format["partial_unexpected_count"] = EXAMPLES
    with _configurations_built_once():
        result = batch.validate(
            suite, expectation_parameters=parameters, result_format=result_format
        )
    return list(result.results)


_MEMO_LOCK = threading.Lock()


@contextmanager
def _configurations_built_once() -> Iterator[None]:
    """Builds each expectation's configuration once per validation instead of on every read.

    GE 1.x derives ``Expectation.configuration`` afresh (a pydantic ``.dict()`` and a new
    ExpectationConfiguration) each time it is read, about 40 times per expectation in one
    validation: 44% of the time of our validations in a profile. Nothing changes an expectation
    while it is validated, so within the call the first one built is reused. Measured (best of
    5, 1M-row fraud partition): fraud_scores suites 0.103 -> 0.075 s, transactions 0.143 ->
    0.122 s, every check result and its metadata identical (tests/test_quality.py compares
    them). If GE's class no longer has the property, this does nothing.
    """
    try:
        from great_expectations.expectations.expectation import Expectation

        derived = Expectation.__dict__["configuration"]
    except (ImportError, KeyError):
        yield
        return
    built: dict[int, tuple[Any, Any]] = {}

    def configuration(self):
        hit = built.get(id(self))
        if hit is None or hit[0] is not self:  # keyed by identity; the entry keeps it alive
            hit = built[id(self)] = (self, derived.fget(self))
        return hit[1]

    with _MEMO_LOCK:
        Expectation.configuration = property(configuration)
        try:
            yield
        finally:
            Expectation.configuration = derived


def _validate_passing_fast(expectations: list[dict], frame: pd.DataFrame, parameters: dict) -> list:
    """Validates with pass/fail results first, then again with details for the failures only.

    GE's cost here is per expectation, not per row: ``BOOLEAN_ONLY`` took 0.043 s against
    ``SUMMARY``'s 0.084 s for the 15 fraud_scores statistics expectations (best of 3), and a
    day normally passes, so the details (observed values, unexpected counts and examples) are
    only worked out for what failed.
    """
    numbered = [{**e, "meta": {**e.get("meta", {}), "at": i}} for i, e in enumerate(expectations)]
    results = _validate(numbered, frame, parameters, "BOOLEAN_ONLY")
    failed = [r.expectation_config.meta["at"] for r in results if not r.success]
    if not failed:
        return results
    detailed = {
        r.expectation_config.meta["at"]: r
        for r in _validate([numbered[i] for i in failed], frame, parameters)
    }
    return [detailed.get(r.expectation_config.meta["at"], r) for r in results]


@dataclass
class Evidence:
    """What one suite found on one partition."""

    partition: str
    evaluated: int = 0
    failures: list[dict[str, Any]] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return not self.failures


def validate(
    suites: Sequence[CheckSuite],
    partition: str,
    statistics: dict[str, Any],
    sample: pd.DataFrame | None = None,
    parameters: dict[str, Any] | None = None,
) -> dict[str, Evidence]:
    """Runs the suites over one partition's statistics and sample, two GE validations in all.

    Args:
        suites: the checks to run.
        partition: the partition's key, for the evidence.
        statistics: one value per statistic named in the suites' ``statistics`` part.
        sample: the sampled rows for the ``sample`` part (skipped when None or empty).
        parameters: values for ``{"$PARAMETER": name}`` placeholders in the suites.

    Returns:
        the evidence per suite name.
    """
    evidence = {
        s.name: Evidence(partition, figures=_plain({c: statistics.get(c) for c in s.columns}))
        for s in suites
    }
    frames = [("statistics", pd.DataFrame([statistics]))]
    if sample is not None and len(sample):
        frames.append(("sample", sample))
    for part, frame in frames:
        tagged = [
            {**e, "meta": {**e.get("meta", {}), "check": s.name, "part": part}}
            for s in suites
            for e in getattr(s, part)
        ]
        if not tagged:
            continue
        for result in _validate_passing_fast(tagged, frame, parameters or {}):
            config = result.expectation_config
            found = evidence[config.meta["check"]]
            found.evaluated += 1
            if not result.success:
                found.failures.append(_failure(part, config, result))
    return evidence


def _failure(part: str, config, result) -> dict[str, Any]:
    details = result.result or {}
    kwargs = {k: v for k, v in config.kwargs.items() if k != "batch_id"}
    if result.exception_info and result.exception_info.get("raised_exception"):
        details = {"error": str(result.exception_info.get("exception_message"))[:200]}
    return {
        "part": part,
        "expectation": config.type,
        "kwargs": kwargs,
        "unexpected_count": details.get("unexpected_count"),
        "unexpected_percent": details.get("unexpected_percent"),
        "examples": _plain(details.get("partial_unexpected_list", [])[:EXAMPLES]),
        "observed": _plain(details.get("observed_value")),
        "error": details.get("error"),
    }


def _plain(value: Any) -> Any:
    """JSON-safe values for metadata (numpy scalars, timestamps)."""
    return json.loads(
        json.dumps(value, default=lambda v: v.item() if hasattr(v, "item") else str(v))
    )


def check_result(
    suite: CheckSuite,
    evidence: Sequence[Evidence],
    metadata: dict[str, Any] | None = None,
    severity: str | None = None,
    description: str | None = None,
) -> AssetCheckResult:
    """The Dagster result of one suite over the run's partitions, with its evidence.

    Metadata: expectations evaluated and failed, the failures (expectation, column, unexpected
    count and percent, a few offending values) as a table, and whatever the caller adds (sample
    size and seed, the statistics behind it).
    """
    failures = [{**f, "partition": e.partition} for e in evidence for f in e.failures]
    meta: dict[str, Any] = {
        "expectations_evaluated": sum(e.evaluated for e in evidence),
        "expectations_failed": len(failures),
        "partitions_failed": sum(1 for e in evidence if not e.passed),
        "suite_version": suite.version,
    }
    if failures:
        meta["failures"] = MetadataValue.md(_failure_table(failures))
        first = failures[0]
        meta["unexpected_count"] = int(first["unexpected_count"] or 0)
        if first["unexpected_percent"] is not None:
            meta["unexpected_percent"] = round(float(first["unexpected_percent"]), 4)
    if len(evidence) == 1:
        # One partition: its figures as plain numbers, which the UI plots over partitions.
        meta.update({k: v for k, v in evidence[0].figures.items() if _number(v)})
    elif evidence:
        meta["statistics"] = MetadataValue.json({e.partition: e.figures for e in evidence})
    meta.update(metadata or {})
    return AssetCheckResult(
        check_name=suite.name,
        asset_key=suite.asset,
        passed=not failures,
        severity=SEVERITIES[severity or suite.severity],
        metadata=meta,
        description=description or suite.description or None,
    )


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _failure_table(failures: list[dict]) -> str:
    rows = [
        "| partition | part | expectation | column / arguments | unexpected | % | examples |",
        "|---|---|---|---|---|---|---|",
    ]
    for f in failures[:20]:
        args = f["kwargs"].get("column") or ", ".join(f"{k}={v}" for k, v in f["kwargs"].items())
        percent = "" if f["unexpected_percent"] is None else f"{f['unexpected_percent']:.3g}"
        shown = f["examples"] or f["observed"] or f["error"] or ""
        rows.append(
            f"| {f['partition']} | {f['part']} | {f['expectation']} | {args} | "
            f"{f['unexpected_count'] if f['unexpected_count'] is not None else ''} | {percent} | "
            f"{json.dumps(shown)[:120]} |"
        )
    return "\n".join(rows)


# -- samples of published partitions ----------------------------------------------------------


def sample_positions(rows: int, size: int, seed: int) -> np.ndarray:
    """``size`` distinct row positions out of ``rows``, sorted, the same for the same seed."""
    if size <= 0:
        return np.zeros(0, np.int64)
    if rows <= size:
        return np.arange(rows)
    return np.sort(np.random.default_rng(seed).choice(rows, size=size, replace=False))


class PositionCursor:
    """Walks sorted row positions along a stream read in order: for the next ``rows`` rows,
    :meth:`advance` gives the positions that fall in them, local to them."""

    def __init__(self, positions: np.ndarray):
        self.positions, self.seen = positions, 0

    def advance(self, rows: int) -> np.ndarray:
        lo, hi = np.searchsorted(self.positions, [self.seen, self.seen + rows])
        local = self.positions[lo:hi] - self.seen
        self.seen += rows
        return local


def sample_output(
    store: DataStore, asset: str, date: str, size: int, seed: int, columns: list[str] | None = None
) -> pd.DataFrame:
    """A seeded random sample of a published partition's rows, as pandas for GE.

    Row counts come from the files' footers; then one row group at a time is read and only its
    sampled rows are kept, so memory stays at a row group whatever the partition's size (a 10M
    row ``fraud_scores`` partition read whole took ~700 MB just to sample 10k rows from it).
    """
    files = store.output_files(asset, date)
    if not files:
        return pd.DataFrame(columns=columns or [])
    readers = [pq.ParquetFile(f, filesystem=store.fs, pre_buffer=False) for f in files]
    groups = [
        (r, g, r.metadata.row_group(g).num_rows) for r in readers for g in range(r.num_row_groups)
    ]
    cursor = PositionCursor(sample_positions(sum(n for _, _, n in groups), size, seed))
    taken = []
    for reader, group, rows in groups:
        local = cursor.advance(rows)
        if len(local):
            taken.append(reader.read_row_group(group, columns=columns).take(pa.array(local)))
    if not taken:
        empty = readers[0].schema_arrow.empty_table()
        return (empty.select(columns) if columns else empty).to_pandas()
    return pa.concat_tables(taken).to_pandas()


class StreamedSample:
    """The rows at :func:`sample_positions` of an output, taken while its batches stream past in
    order, so the checks need not read the published partition back: the same rows
    :func:`sample_output` would read (reading them back cost ~0.045 s of a 1M-row fraud
    partition's 1.4 s). Complete only when every output row went past, i.e. not on an attempt
    that resumed finished shards; :meth:`frame` is None then and the caller reads them back.
    """

    def __init__(self, rows: int, size: int, seed: int):
        self.rows = rows
        self._cursor = PositionCursor(sample_positions(rows, size, seed))
        self._parts: list[pa.Table] = []

    def add(self, out: pa.Table) -> None:
        local = self._cursor.advance(out.num_rows)
        if len(local):
            self._parts.append(out.take(pa.array(local)))

    def frame(self, rows_out: int) -> pd.DataFrame | None:
        if not self._parts or self._cursor.seen != rows_out or rows_out != self.rows:
            return None
        return pa.concat_tables(self._parts).to_pandas()


def published_rows(store: DataStore, asset: str, date: str) -> int:
    """Rows in a published partition, from its files' footers (no data is read)."""
    files = store.output_files(asset, date)
    if not files:
        return 0
    return ds.dataset(files, filesystem=store.fs, format="parquet").count_rows()


# -- failing fast -----------------------------------------------------------------------------


@contextmanager
def fail_fast_on_bad_rows() -> Iterator[None]:
    """Too many unscorable rows, or a model that loses rows, fails the step without retries:
    both would be the same on a retry, and nothing has been published."""
    try:
        yield
    except QuarantineRateExceeded as exc:
        raise Failure(
            description=str(exc),
            metadata={
                "quarantine_rate": round(exc.rate, 6),
                "quarantine_limit": exc.limit,
                "quarantine_reasons": MetadataValue.json(exc.reasons),
            },
            allow_retries=False,
        ) from exc
    except RowConservationError as exc:
        raise Failure(description=str(exc), allow_retries=False) from exc


def quarantine_metadata(shards: Sequence[ShardReport]) -> dict[str, Any]:
    """Materialisation metadata: how many rows were quarantined, why, and where they went."""
    reasons: Counter[str] = Counter()
    for report in shards:
        for name, n in report.stats.counts.items():
            if name.startswith(QUARANTINED_PREFIX) and n:
                reasons[name[len(QUARANTINED_PREFIX) :]] += n
    rows_in = sum(s.rows_in for s in shards)
    total = sum(s.rows_quarantined for s in shards)
    meta: dict[str, Any] = {
        "rows_quarantined": total,
        "quarantine_rate": round(total / rows_in, 6) if rows_in else 0.0,
        "quarantine_reasons": MetadataValue.json(dict(reasons.most_common())),
    }
    uris = [s.quarantine_uri for s in shards if s.quarantine_uri]
    if uris:
        meta["quarantine"] = MetadataValue.path(uris[-1])
    return meta


def landed_hours_after_day_end(store: DataStore, dataset: str, date: str) -> float:
    """How long after its UTC day ended a landing partition's last file was written, in hours
    (negative when it landed before the day was over)."""
    files = store.landing_files(dataset, date)
    latest = max(info.mtime.timestamp() for info in store.fs.get_file_info(files) if info.mtime)
    day_end = datetime.fromisoformat(date).replace(tzinfo=UTC) + timedelta(days=1)
    return round((latest - day_end.timestamp()) / 3600.0, 3)


def quarantine_limit(override: float | None = None) -> float:
    """The quarantine rate above which a run fails: the asset's config when set, else the
    deployment's ``NIGHTSHIFT_MAX_QUARANTINE_RATE``, else 1%. Read when a run starts, so the
    landing checks and the scoring step of one deployment apply the same limit."""
    if override is not None:
        return override
    raw = os.environ.get("NIGHTSHIFT_MAX_QUARANTINE_RATE")
    if not raw:
        return DEFAULT_MAX_QUARANTINE_RATE
    try:
        value = float(raw)
    except ValueError as exc:
        raise ValueError(f"NIGHTSHIFT_MAX_QUARANTINE_RATE={raw!r} is not a number") from exc
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"NIGHTSHIFT_MAX_QUARANTINE_RATE={raw!r} is not a rate in [0, 1]")
    return value


class QualityConfig(Config):
    """Data-quality settings every asset with quality gates takes in its run config."""

    max_quarantine_rate: float | None = PydanticField(
        default=None,
        ge=0.0,
        le=1.0,
        description="Share of a partition's rows that may be quarantined before the run fails "
        "and publishes nothing; default $NIGHTSHIFT_MAX_QUARANTINE_RATE, else 0.01.",
    )
    check_sample_rows: int = PydanticField(
        default=DEFAULT_SAMPLE_ROWS,
        ge=0,
        description="Rows of the seeded random sample that row-level expectations run on.",
    )
    check_seed: int = PydanticField(default=DEFAULT_SEED, description="The sample's seed.")

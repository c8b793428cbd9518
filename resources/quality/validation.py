"""Running the suites through Great Expectations: one partition's statistics and sample.

A ``statistics`` expectation reads one row of exact figures. For the two kinds the suites use
there, a figure between bounds and two figures equal, on plain finite numbers the answer is
one comparison, while GE spends milliseconds of Python building and resolving each
expectation, whatever the rows. Only a pass is answered without GE (``plainly_passes``): a
failure, a null, a flag, a bound that is not a plain number, or any other kind or argument goes
to GE, which judges it and explains each failure with its own result, so every verdict and its
evidence are GE's (tests/test_quality.py compares them with everything validated by GE).

Any conversion pandas or numpy makes on the way to GE rounds each side monotonically, so an
exact ``low <= value <= high`` or ``a == b`` here holds there too.
"""

from __future__ import annotations

import json
import logging
import math
import threading
from collections.abc import Collection, Mapping, Sequence
from functools import cache
from numbers import Integral, Real
from typing import Any

import pandas as pd
from dagster import AssetCheckResult

from inference.engine.output_partition import ShardReport
from inference.engine.work import quarantine_asset
from resources.quality.sampling import published_rows
from resources.quality.suites import CheckSuite, Evidence, check_result
from resources.storage import DataStore

# Offending values shown per failed expectation: enough to recognise the problem in the UI.
EXAMPLES = 5
BETWEEN = "expect_column_values_to_be_between"
PAIR_EQUAL = "expect_column_pair_values_to_be_equal"
# The arguments each kind may carry to be answered here; any other (mostly, strict_min, a row
# condition) goes to GE.
ARGUMENTS = {BETWEEN: {"column", "min_value", "max_value"}, PAIR_EQUAL: {"column_A", "column_B"}}
_UNKNOWN = object()


def preload_great_expectations() -> None:
    """Starts importing great_expectations in a background thread.

    The import takes seconds of mostly Python work, once per process; an asset calls this when
    it starts, so the import overlaps reading and scoring (which release the GIL) instead of
    adding to the run after them.
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
    result = batch.validate(suite, expectation_parameters=parameters, result_format=result_format)
    return list(result.results)


def _validate_passing_fast(expectations: list[dict], frame: pd.DataFrame, parameters: dict) -> list:
    """Validates with pass/fail results first, then again with details for the failures only.

    GE's cost here is per expectation, not per row, and ``BOOLEAN_ONLY`` costs about half of
    ``SUMMARY``; a day normally passes, so the details (observed values, unexpected counts and
    examples) are only worked out for what failed.
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


def validate(
    suites: Sequence[CheckSuite],
    partition: str,
    statistics: dict[str, Any],
    sample: pd.DataFrame | None = None,
    parameters: dict[str, Any] | None = None,
) -> dict[str, Evidence]:
    """Runs the suites over one partition's statistics and sample: one GE validation per part
    at most, and one more for the details of what failed.

    Statistics expectations that plainly pass on the exact figures are counted as evaluated
    without GE (:func:`plainly_passes`): GE's cost is per expectation, and those are
    most of them, while the verdicts and evidence stay GE's (``make bench-quality`` measures
    it, docs/benchmarks.md, "Data-quality gates", has the figures).

    Args:
        suites: the checks to run.
        partition: the partition's key, for the evidence.
        statistics: one value per statistic named in the suites' ``statistics`` part.
        sample: the sampled rows for the ``sample`` part (skipped when None or empty).
        parameters: values for ``{"$PARAMETER": name}`` placeholders in the suites.

    Returns:
        the evidence per suite name.
    """
    parameters = parameters or {}
    evidence = {
        s.name: Evidence(partition, figures=_plain({c: statistics.get(c) for c in s.columns}))
        for s in suites
    }
    parts = ["statistics"] + (["sample"] if sample is not None and len(sample) else [])
    for part in parts:
        tagged = []
        for s in suites:
            for e in getattr(s, part):
                if part == "statistics" and plainly_passes(e, statistics, parameters):
                    evidence[s.name].evaluated += 1
                else:
                    tagged.append({**e, "meta": {**e.get("meta", {}), "check": s.name}})
        if not tagged:
            continue
        frame = pd.DataFrame([statistics]) if part == "statistics" else sample
        for result in _validate_passing_fast(tagged, frame, parameters):
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


def plainly_passes(
    expectation: dict, figures: Mapping[str, Any], parameters: Mapping[str, Any]
) -> bool:
    """Whether a statistics expectation certainly passes on ``figures``; False means ask GE.

    Args:
        expectation: one expectation of a suite's ``statistics`` part, as in its JSON.
        figures: the partition's exact figures, the one row GE would validate.
        parameters: values for ``{"$PARAMETER": name}`` bounds.
    """
    kind = expectation.get("type")
    kwargs = expectation.get("kwargs", {})
    allowed = ARGUMENTS.get(kind, set())
    if set(expectation) - {"type", "kwargs", "meta"} or not set(kwargs) <= allowed:
        return False
    if kind == PAIR_EQUAL:
        a, b = (_finite(_figure(figures, kwargs.get(k))) for k in ("column_A", "column_B"))
        return a is not _UNKNOWN and b is not _UNKNOWN and bool(a == b)
    value = _finite(_figure(figures, kwargs.get("column")))
    low, high = (_bound(kwargs.get(k), parameters) for k in ("min_value", "max_value"))
    if _UNKNOWN in (value, low, high) or (low is None and high is None):
        return False
    return bool((low is None or low <= value) and (high is None or value <= high))


def _figure(figures: Mapping[str, Any], column: Any) -> Any:
    return figures.get(column, _UNKNOWN) if isinstance(column, str) else _UNKNOWN


def _bound(raw: Any, parameters: Mapping[str, Any]) -> Any:
    """A bound as a plain number, None when absent, _UNKNOWN for anything else."""
    if raw is None:
        return None
    if isinstance(raw, dict):
        if set(raw) != {"$PARAMETER"} or raw["$PARAMETER"] not in parameters:
            return _UNKNOWN
        raw = parameters[raw["$PARAMETER"]]
    return _finite(raw)


def _finite(value: Any) -> Any:
    """A finite, non-boolean real number as it is, else _UNKNOWN."""
    if value is _UNKNOWN or isinstance(value, bool) or not isinstance(value, Real):
        return _UNKNOWN  # numpy's booleans are not Real; its integers and floats are
    if isinstance(value, Integral):
        return value
    return value if math.isfinite(value) else _UNKNOWN


class SuiteRun:
    """A domain's suites over the partitions of one run: one validation a partition, one check
    result a suite."""

    def __init__(self, suites: Mapping[str, CheckSuite]) -> None:
        self.suites = suites
        self.evidence: dict[str, list[Evidence]] = {name: [] for name in suites}
        self.sampled = 0  # rows in the partitions' samples: a small day has fewer than asked

    def add(
        self,
        date: str,
        figures: dict[str, Any],
        sample: pd.DataFrame,
        parameters: dict[str, Any],
    ) -> None:
        """Validates one partition's exact figures and row sample against every suite."""
        self.sampled += 0 if sample is None else len(sample)
        found = validate(list(self.suites.values()), date, figures, sample, parameters)
        for name, e in found.items():
            self.evidence[name].append(e)

    def sample_figures(self, metadata: dict[str, Any]) -> dict[str, Any]:
        """``sample_rows`` as the rows actually sampled, the setting as ``sample_rows_limit``."""
        if "sample_rows" not in metadata:
            return metadata
        return {
            **metadata,
            "sample_rows": self.sampled,
            "sample_rows_limit": metadata["sample_rows"],
        }

    def failed(self, name: str) -> bool:
        return any(not e.passed for e in self.evidence[name])

    def results(
        self,
        metadata: dict[str, Any],
        extra: Mapping[str, dict[str, Any]] | None = None,
        warn: Collection[str] = (),
    ) -> list[AssetCheckResult]:
        """One result a suite, with the run's shared metadata and the suite's own ``extra``;
        the suites named in ``warn`` fail as WARN, whatever their severity."""
        metadata = self.sample_figures(metadata)
        return [
            check_result(
                suite,
                self.evidence[name],
                {**metadata, **(extra or {}).get(name, {})},
                "WARN" if name in warn else None,
            )
            for name, suite in self.suites.items()
        ]


def conservation_figures(
    store: DataStore, asset: str, date: str, shards: ShardReport, landed_rows: int
) -> dict[str, int]:
    """Rows in, scored and quarantined as the engine counted them (it refuses any model call
    that answers for more or fewer rows than it was given), beside what was landed and what the
    published files hold (their footers), for the row-conservation suite."""
    return {
        "rows_in": shards.rows_in,
        "landed_rows": landed_rows,
        "rows_scored": shards.rows_scored,
        "rows_quarantined": shards.rows_quarantined,
        "rows_scored_plus_quarantined": shards.rows_scored + shards.rows_quarantined,
        "rows_out": shards.rows_out,
        "published_rows": published_rows(store, asset, date),
        "published_quarantine_rows": published_rows(store, quarantine_asset(asset), date),
    }

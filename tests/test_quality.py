"""Quality gates: quarantine plans, checkpointed quarantine commits, GE suites, blocking vs WARN."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from dagster import AssetKey, DagsterInstance, Failure, materialize
from helpers import cpu_resources

from assets.day_metadata import day_entries
from assets.fraud.assets import fraud_alerts, fraud_model, fraud_scores, transactions
from assets.fraud.demo_data import generate_day
from assets.fraud.gates import SCORE_SUITES, score_figures
from assets.fraud.schemas import SCORES, SCORES_SCHEMA
from inference.engine.invariants import StreamStats, population_stability
from inference.engine.local_pool import run_local
from inference.engine.quarantine import (
    QuarantinePlan,
    QuarantineRateExceeded,
    RowConservationError,
    Screener,
    blank,
    invalid_utf8,
)
from inference.engine.shard_worker import ModelStep
from inference.engine.shard_writer import ShardedWriter, ShardFileTargets
from inference.engine.shards import Interrupted, Watch
from inference.engine.tables import OutputTables
from inference.tabular.tabular import TabularScorer
from resources.quality import (
    CheckSuite,
    StreamedSample,
    check_result,
    conservation_figures,
    fail_fast_on_bad_rows,
    load_suites,
    quarantine_limit,
    sample_output,
    validate,
)
from resources.storage import DataStore

SCHEMA = pa.schema([("id", pa.int64()), ("y", pa.float64())])
DAY = "2026-03-01"
SUITE_FILES = sorted(Path(__file__).parents[1].glob("assets/*/suites/*.json"))


# -- quarantine plans --------------------------------------------------------------------------


def test_screener_gives_each_row_its_first_reason_and_keeps_the_first_clean_duplicate() -> None:
    screener = Screener()
    ids = pa.array(["a", "b", "a", None, "c", "b", "c"])
    amount = np.array([1.0, np.nan, 2.0, 3.0, -1.0, 4.0, 5.0])
    screener.add(7, {"null_id": ids.is_null().to_numpy(False), "bad_amount": ~(amount >= 0)})
    screener.keys(ids, "duplicate_id")
    plan = screener.plan()
    # "b" first appears with a bad amount, so its later clean row is the one scored; "c" first
    # appears with a bad amount too; "a" keeps its first row.
    assert plan.positions.tolist() == [1, 2, 3, 4]
    assert plan.reasons.tolist() == ["bad_amount", "duplicate_id", "null_id", "bad_amount"]
    assert plan.counts() == {"bad_amount": 2, "duplicate_id": 1, "null_id": 1}
    good, held = plan.split(pa.record_batch({"id": ids}), 0)
    assert good["id"].to_pylist() == ["a", "b", "c"]
    assert held["row_number"].to_pylist() == [1, 2, 3, 4]
    good, held = plan.split(pa.record_batch({"id": ids.slice(5)}), 5)
    assert held is None and good.num_rows == 2


def test_rate_limit_names_the_rate_and_top_reasons() -> None:
    plan = QuarantinePlan(
        200, np.array([3, 8, 9]), np.array(["negative_amount", "null_ts", "negative_amount"])
    )
    plan.check_rate(0.02, "fraud_scores 2026-03-01")  # 1.5% is within 2%
    with pytest.raises(QuarantineRateExceeded) as err:
        plan.check_rate(0.01, "fraud_scores 2026-03-01")
    assert str(err.value).startswith(
        "fraud_scores 2026-03-01: 1.50% of rows (3 of 200) cannot be scored, above the 1.00% "
        "quarantine limit; nothing was published. Top reasons: negative_amount 2, null_ts 1"
    )
    with pytest.raises(Failure) as failed, fail_fast_on_bad_rows():
        plan.check_rate(0.01, "x")
    assert failed.value.metadata["quarantine_reasons"].data == {"negative_amount": 2, "null_ts": 1}
    assert not failed.value.allow_retries


def test_text_rules_find_broken_utf8_and_blank_text() -> None:
    raw = pa.array([b"fine", b"\xff\xfe", b"  ", None], pa.binary()).view(pa.string())
    broken = invalid_utf8(raw)
    assert broken.tolist() == [False, True, False, False]
    assert blank(raw, ~broken).tolist() == [False, False, True, True]


def test_quarantine_limit_comes_from_config_then_environment(monkeypatch) -> None:
    monkeypatch.delenv("NIGHTSHIFT_MAX_QUARANTINE_RATE", raising=False)
    assert quarantine_limit().rate == 0.01 and quarantine_limit(0.2).rate == 0.2
    monkeypatch.setenv("NIGHTSHIFT_MAX_QUARANTINE_RATE", "0.05")
    assert quarantine_limit().rate == 0.05
    monkeypatch.setenv("NIGHTSHIFT_MAX_QUARANTINE_RATE", "5")
    with pytest.raises(ValueError, match="not a rate"):
        quarantine_limit()


def test_stream_stats_merge_like_one_pass() -> None:
    values = np.random.default_rng(0).random(1000)
    whole, parts = StreamStats(), [StreamStats(), StreamStats()]
    for stats, chunk in ((whole, values), (parts[0], values[:400]), (parts[1], values[400:])):
        stats.count("n", len(chunk))
        stats.extremes("v", chunk)
        stats.histogram("v", chunk, 20, 0.0, 1.0)
    merged = StreamStats.from_json(json.loads(json.dumps(parts[0].to_json())))
    assert merged.merge(parts[1]) == whole
    assert population_stability(whole.histograms["v"], whole.histograms["v"]) == 0.0
    skewed = np.histogram(values**4, bins=20, range=(0, 1))[0]
    assert population_stability(whole.histograms["v"], skewed) > 0.25


# -- the engine: quarantine committed with the shards ------------------------------------------


def _plan(rows: int, positions: list[int]) -> QuarantinePlan:
    return QuarantinePlan(rows, np.array(positions), np.array(["bad"] * len(positions), object))


def _writer(store: DataStore, lineage: str = "run-a") -> ShardedWriter:
    where = ShardFileTargets(
        store.partition_target("out", DAY),
        SCHEMA,
        quarantine=store.partition_target("out_quarantine", DAY),
    )
    return ShardedWriter(where, "fp", 200, lineage)


class Doubler:
    def __init__(self, stop_after: int | None = None, drop: bool = False):
        self.rows, self.stop_after, self.drop = 0, stop_after, drop

    def __call__(self, batch: pa.RecordBatch, prepared) -> pa.Table:
        self.rows += batch.num_rows
        ids = batch["id"].to_numpy()[1:] if self.drop else batch["id"].to_numpy()
        return pa.table({"id": ids, "y": ids * 2.0})

    def stop(self) -> str | None:
        return "SIGTERM" if self.stop_after is not None and self.rows >= self.stop_after else None


def _observe(scored: pa.RecordBatch, out: pa.Table, stats: StreamStats) -> None:
    stats.count("y_sum", int(out["y"].to_numpy().sum()))


def _score(writer, batches, model, *, batch_size, stop=None, quarantine=None, observe=None):
    """The partition's row ranges scored in this process by the one engine loop."""
    watch = Watch(stop or (lambda: None))
    step = ModelStep(model, observe=observe)
    return run_local(writer, batches, step, batch_size, quarantine, watch)


def test_quarantined_rows_survive_a_resume_exactly_once(any_store: DataStore) -> None:
    store = any_store
    ids = np.arange(1000)
    batches = [pa.record_batch({"id": ids[i : i + 130]}) for i in range(0, 1000, 130)]
    bad = [5, 150, 420, 421, 999]  # in shards 0, 0, 2, 2 and 4
    first = Doubler(stop_after=500)
    with pytest.raises(Interrupted):
        _score(
            _writer(store), batches, first, batch_size=50, stop=first.stop,
            quarantine=_plan(1000, bad), observe=_observe,
        )  # fmt: skip
    assert not store.output_exists("out", DAY) and not store.output_exists("out_quarantine", DAY)
    retry = Doubler()
    report = _score(
        _writer(store), batches, retry, batch_size=64, quarantine=_plan(1000, bad), observe=_observe
    )
    held = store.read_output("out_quarantine", DAY)
    assert held["row_number"].to_pylist() == held["id"].to_pylist() == bad
    assert held["reason"].to_pylist() == ["bad"] * 5
    out = store.read_output("out", DAY)
    assert out.num_rows == 995 and not set(out["id"].to_pylist()) & set(bad)
    assert (report.rows_in, report.rows_scored, report.rows_quarantined) == (1000, 995, 5)
    assert report.shards_resumed == 2 and retry.rows == 1000 - 400 - 3
    # Statistics of resumed shards come from their checkpoints, not from this attempt.
    assert report.stats.counts["y_sum"] == 2 * (sum(range(1000)) - sum(bad))
    assert report.stats.counts["quarantined:bad"] == 5
    held_commit, main = (
        store.output_figures("out_quarantine", DAY),
        store.output_figures("out", DAY),
    )
    assert held_commit.commit == main.commit
    assert held_commit.value("rows") == main.value("rows_quarantined") == 5


def test_a_crash_between_the_two_commits_is_redone_whole(store: DataStore, monkeypatch) -> None:
    batches = [pa.record_batch({"id": np.arange(1000)})]
    writer = _writer(store)
    publish = OutputTables.publish

    def crash(self, name, *args, **kwargs):
        if name == "out":
            raise MemoryError("node vanished after the quarantine commit")
        return publish(self, name, *args, **kwargs)

    monkeypatch.setattr(OutputTables, "publish", crash)
    with pytest.raises(MemoryError):
        _score(writer, batches, Doubler(), batch_size=100, quarantine=_plan(1000, [7, 700]))
    monkeypatch.setattr(OutputTables, "publish", publish)
    assert store.output_exists("out_quarantine", DAY) and not store.output_exists("out", DAY)
    retry = Doubler()
    report = _score(
        _writer(store), batches, retry, batch_size=100, quarantine=_plan(1000, [7, 700])
    )
    assert retry.rows == 0 and report.shards_resumed == 5  # every shard was already done
    assert store.read_output("out_quarantine", DAY)["id"].to_pylist() == [7, 700]
    assert store.read_output("out", DAY).num_rows == 998


def test_a_model_call_that_loses_a_row_fails_and_commits_nothing(store: DataStore) -> None:
    batches = [pa.record_batch({"id": np.arange(500)})]
    with pytest.raises(RowConservationError, match="answered for 99 rows but was given 100"):
        _score(_writer(store), batches, Doubler(drop=True), batch_size=100)
    assert not store.output_exists("out", DAY) and not store.output_exists("out_quarantine", DAY)


# -- Great Expectations -------------------------------------------------------------------------


@pytest.mark.parametrize("path", SUITE_FILES, ids=lambda p: p.stem)
def test_every_suite_file_loads_and_names_real_expectations(path: Path) -> None:
    import great_expectations as gx

    suites = load_suites(path)
    assert suites and all(s.statistics or s.sample for s in suites.values())
    for suite in suites.values():
        # GE builds (and so validates) every expectation of the suite from its JSON.
        gx.ExpectationSuite(name=suite.name, expectations=[*suite.statistics, *suite.sample])


def test_suites_report_counts_percentages_and_offending_values(capfd) -> None:
    suite = CheckSuite(
        name="scores_in_unit_interval",
        asset="fraud_scores",
        severity="ERROR",
        description="",
        statistics=[
            {
                "type": "expect_column_values_to_be_between",
                "kwargs": {"column": "score_max", "max_value": 1},
            }
        ],
        sample=[
            {
                "type": "expect_column_values_to_be_between",
                "kwargs": {"column": "score", "min_value": 0, "max_value": {"$PARAMETER": "hi"}},
            }
        ],
    )
    import pandas as pd

    sample = pd.DataFrame({"score": [0.1, 1.5, 0.3, 2.0]})
    found = validate([suite], DAY, {"score_max": 2.0}, sample, {"hi": 1.0})
    result = check_result(suite, [found[suite.name]], {"sample_rows": 4, "sample_seed": 0})
    assert not result.passed and result.severity.value == "ERROR"
    meta = {k: getattr(v, "value", v) for k, v in result.metadata.items()}
    assert meta["expectations_evaluated"] == 2 and meta["expectations_failed"] == 2
    assert meta["score_max"] == 2.0 and meta["sample_seed"] == 0
    table = result.metadata["failures"].value
    assert (
        "| 2026-03-01 | sample | expect_column_values_to_be_between | score | 2 | 50 | [1.5, 2.0] |"
        in table
    )
    assert "Calculating Metrics" not in capfd.readouterr().err  # progress bars are off


def test_fraud_figures_hold_every_statistic_the_suites_read(store: DataStore) -> None:
    from assets.partitions import PartitionReport
    from inference.engine.metrics import BatchMetrics
    from inference.engine.output_partition import ShardReport
    from resources.storage import Published

    shards = ShardReport(rows_in=10, rows_out=9, rows_scored=9, rows_quarantined=1)
    conservation = conservation_figures(store, "fraud_scores", DAY, shards, 10)
    figures = score_figures(
        PartitionReport(
            DAY, BatchMetrics(), Published("", 9, 1), shards, conservation=conservation
        ),
        None,
    )
    needed = {c for s in SCORE_SUITES.values() for c in s.columns}
    assert needed <= set(figures)
    assert set(conservation_figures(store, "fraud_scores", DAY, shards, 10)) <= set(figures)


# -- blocking and WARN checks in real runs -----------------------------------------------------


@pytest.fixture(scope="module")
def fraud_world(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("quality")
    store = DataStore(str(root / "data"))
    for day in ("2026-03-01", "2026-03-02"):
        generate_day(store, day, scale=0.02)
    resources = cpu_resources(root / "data")
    with DagsterInstance.ephemeral() as instance:
        assert materialize([fraud_model], resources=resources, instance=instance).success
    return {"store": store, "resources": resources}


def _run(world: dict, day: str, raise_on_error: bool = False):
    with DagsterInstance.ephemeral() as instance:
        return materialize(
            [transactions, fraud_scores, fraud_alerts],
            partition_key=day,
            resources=world["resources"],
            instance=instance,
            raise_on_error=raise_on_error,
        )


def _materialized(result) -> set[str]:
    return {e.asset_key.to_user_string() for e in result.get_asset_materialization_events()}


def test_a_failing_error_check_stops_the_alerts(fraud_world, monkeypatch) -> None:
    real, calls = TabularScorer.score, []

    def broken(self, x, max_rows=None):
        scores = real(self, x, max_rows)
        if not calls:  # a numerically broken model: NaN scores, not an exception
            scores[:3] = np.nan
        calls.append(len(x))
        return scores

    monkeypatch.setattr(TabularScorer, "score", broken)
    result = _run(fraud_world, "2026-03-01")
    assert not result.success
    verdicts = {
        (c.asset_key.to_user_string(), c.check_name): c
        for c in result.get_asset_check_evaluations()
    }
    failed = verdicts[("fraud_scores", "scores_in_unit_interval")]
    assert not failed.passed and failed.metadata["score_not_finite"].value == 3
    assert _materialized(result) == {
        "transactions",
        "transaction_screens",
        "fraud_scores",
    }  # alerts never ran
    started = {e.step_key for e in result.all_events if e.event_type_value == "STEP_START"}
    assert started == {"transactions", "fraud_scores"}
    (failure,) = result.get_step_failure_events()
    assert failure.step_key == "fraud_scores"
    assert failure.step_failure_data.error.cls_name == "DagsterAssetCheckFailedError"


def test_a_failing_warn_check_does_not_stop_the_alerts(fraud_world) -> None:
    store, day = fraud_world["store"], "2026-03-02"
    # A week of history flagging half of all transactions: today's ~1% is far below it.
    for earlier in (f"2026-02-{d}" for d in range(22, 29)):
        figures = {"commit": f"seed{earlier}", "rows": 1000, "stats": {"counts": {"flagged": 500}}}
        staged = store.tables.stage(SCORES, earlier, SCORES_SCHEMA, [], figures)
        store.tables.publish(SCORES, earlier, staged)
    result = _run(fraud_world, day, raise_on_error=True)
    verdicts = {c.check_name: c for c in result.get_asset_check_evaluations()}
    drift = verdicts["flagged_rate_near_trailing_mean"]
    assert not drift.passed and drift.severity.value == "WARN"
    assert all(c.passed for c in verdicts.values() if c.severity.value == "ERROR")
    assert _materialized(result) == {
        "transactions",
        "transaction_screens",
        "fraud_scores",
        "fraud_alerts",
    }
    assert store.output_exists("fraud_alerts", day)
    meta = {
        k: v.value
        for e in result.get_asset_materialization_events()
        if e.asset_key == AssetKey("fraud_scores")
        for k, v in day_entries(e.event_specific_data.materialization.metadata).items()
    }
    assert meta["rows_quarantined"] == 0 and meta["quarantine_reasons"] == {}


def test_a_blank_summary_stops_the_digest(tmp_path, monkeypatch) -> None:
    from assets.documents.assets import documents
    from assets.documents.demo_data import generate_day as generate_documents
    from assets.summaries.digest import daily_digest

    # The package exports the asset under the module's name: fetch the module itself.
    module = importlib.import_module("assets.summaries.document_summaries")
    store = DataStore(str(tmp_path / "data"))
    generate_documents(store, DAY, scale=0.02)
    real = module.extractive_summaries

    def forgetful(*args, **kwargs):
        summaries, embedded = real(*args, **kwargs)
        return ["", *summaries[1:]], embedded  # the model "forgot" one document

    monkeypatch.setattr(module, "extractive_summaries", forgetful)
    resources = cpu_resources(tmp_path / "data", max_batch_size=64)
    with DagsterInstance.ephemeral() as instance:
        result = materialize(
            [documents, module.document_summaries, daily_digest],
            partition_key=DAY,
            resources=resources,
            instance=instance,
            raise_on_error=False,
        )
    verdicts = {c.check_name: c for c in result.get_asset_check_evaluations()}
    assert not verdicts["summaries_not_blank"].passed
    assert verdicts["summaries_not_blank"].metadata["summary_blank"].value == 1
    assert verdicts["summaries_cover_every_document"].passed  # nothing lost, just blank
    assert _materialized(result) == {"documents", "document_summaries"}
    assert not store.output_exists("daily_digest", DAY)


def test_the_cost_benchmark_measures_every_gate(tmp_path) -> None:
    # The benchmark as `make bench-quality` runs it, at a small size; it prints its figures.
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.quality", "--rows", "3000", "--threads", "1",
         "--batch-size", "1024", "--work", str(tmp_path / "bench")],
        cwd=Path(__file__).resolve().parents[1],
        capture_output=True,
        text=True,
        timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    figures = json.loads(done.stdout[done.stdout.index("{") :])
    assert figures["rows"] == 3000 and figures["sample_rows"] == 10_000
    parts = ("screening_extra_seconds", "streaming_statistics_seconds", "suites_seconds")
    assert figures["gates_seconds"] == pytest.approx(sum(figures[p] for p in parts), abs=0.002)
    assert figures["gates_share_of_scoring"] == pytest.approx(
        figures["gates_seconds"] / figures["scoring_seconds"], rel=0.02
    )  # the figures are rounded to milliseconds; the share is not
    assert figures["ge_import_seconds_once_per_process"] > 0
    assert figures["suites_seconds_all_through_ge"] > 0 < figures["transactions_suites_seconds"]


@pytest.mark.parametrize(
    "keys, repeats",
    [
        (["a", "b", "c", "d"], []),
        (["d", "b", "a", "c"], []),
        (["a", "b", "b", "c", "a"], [2, 4]),  # sorted-looking until it is not
        (["a", None, "a", None], [2]),  # nulls are never duplicates of each other
    ],
)
def test_duplicates_after_the_first_occurrence(keys, repeats) -> None:
    from inference.engine.quarantine import duplicates

    assert duplicates(pa.chunked_array([keys[:2], keys[2:]], pa.string())).tolist() == repeats


def test_ids_in_increasing_runs_with_disjoint_ranges_need_no_second_read() -> None:
    reads = []
    screener = Screener(lambda: reads.append(1) or pa.chunked_array([pa.array([], pa.string())]))
    for part in (["c-1", "c-2"], ["c-3", None], ["a-1", "a-2"], ["b-1"]):  # three files
        screener.add(len(part), {})
        screener.keys(pa.array(part, pa.string()), "duplicate_id")
    assert screener.plan().count == 0 and reads == []


@pytest.mark.parametrize(
    "parts",
    [
        [["a-1", "a-5"], ["a-3", "a-9"]],  # runs overlap: a-3 could repeat
        [["a-2", "a-1"], ["b-1"]],  # out of order within a batch
    ],
)
def test_ids_out_of_order_are_read_again_and_checked_exactly(parts) -> None:
    ids = [i for part in parts for i in part] + ["a-1"]
    screener = Screener(lambda: pa.chunked_array([pa.array(ids)]))
    for part in [*parts, ["a-1"]]:
        screener.add(len(part), {})
        screener.keys(pa.array(part), "duplicate_id")
    plan = screener.plan()
    assert plan.positions.tolist() == [len(ids) - 1]
    assert plan.reasons.tolist() == ["duplicate_id"]


def test_a_sample_taken_while_rows_stream_equals_the_one_read_back(tmp_path) -> None:
    store = DataStore(str(tmp_path))
    table = pa.table({"id": np.arange(5000), "y": np.linspace(0, 1, 5000)})
    batches = table.to_batches(max_chunksize=333)
    store.publish("out", DAY, batches, table.schema)
    streamed = StreamedSample(5000, 120, seed=7)
    for batch in batches:
        streamed.add(pa.Table.from_batches([batch]))
    read_back = sample_output(store, "out", DAY, 120, seed=7)
    assert streamed.frame(5000).equals(read_back) and len(read_back) == 120
    partial = StreamedSample(5000, 120, seed=7)
    partial.add(pa.Table.from_batches(batches[:3]))  # a resumed attempt sees only some rows
    assert partial.frame(5000) is None


def test_statistics_answered_from_the_figures_change_no_verdict_or_evidence(monkeypatch) -> None:
    import pandas as pd

    from resources.quality import validation
    from resources.quality.validation import plainly_passes

    statistics = {c: 0 for s in SCORE_SUITES.values() for c in s.columns}
    statistics.update(score_null=3, rows_in=10, landed_rows=11, flagged_rate=0.9)
    sample = pd.DataFrame(
        {
            "transaction_id": ["a", "b", "b"],
            "score": [0.2, 1.4, 0.9],
            "flagged": [False, True, True],
            "score_reaches_threshold": [False, True, True],
            "model_version": ["v1", "v1", None],
        }
    )
    parameters = {
        "flagged_rate_low": 0.0,
        "flagged_rate_high": 0.1,
        "max_psi": 0.25,
        "max_feature_psi": 0.25,
        "max_review_rate": 0.01,
        "model_versions": ["v1"],
    }

    def evidence() -> dict:
        found = validate(list(SCORE_SUITES.values()), DAY, statistics, sample, parameters)
        return {name: (e.evaluated, e.failures) for name, e in found.items()}

    answered = []

    def counted(*args) -> bool:
        answered.append(plainly_passes(*args))
        return answered[-1]

    monkeypatch.setattr(validation, "plainly_passes", counted)
    found = evidence()
    assert sum(answered) >= 10  # most statistics pass here without GE
    monkeypatch.setattr(validation, "plainly_passes", lambda *_: False)  # GE validates all
    assert evidence() == found
    assert sum(len(failures) for _, failures in found.values()) >= 4


BETWEEN, PAIR = "expect_column_values_to_be_between", "expect_column_pair_values_to_be_equal"


@pytest.mark.parametrize(
    "kind, kwargs, value, answered",
    [
        (BETWEEN, {"column": "x", "max_value": 0}, 0, True),
        (BETWEEN, {"column": "x", "min_value": 0, "max_value": 1}, 0.5, True),
        (BETWEEN, {"column": "x", "max_value": {"$PARAMETER": "high"}}, np.int64(3), True),
        (BETWEEN, {"column": "x", "max_value": 0}, 1, False),  # fails: GE explains it
        (BETWEEN, {"column": "x", "max_value": 0}, None, False),
        (BETWEEN, {"column": "x", "max_value": 1}, float("nan"), False),
        (BETWEEN, {"column": "x", "min_value": 0}, float("inf"), False),
        (BETWEEN, {"column": "x", "max_value": 1}, True, False),
        (BETWEEN, {"column": "x", "max_value": {"$PARAMETER": "missing"}}, 0, False),
        (BETWEEN, {"column": "x", "max_value": {"$PARAMETER": "none"}}, 0, False),
        (BETWEEN, {"column": "x", "max_value": 1, "mostly": 0.5}, 0, False),
        (BETWEEN, {"column": "x", "max_value": 1, "strict_max": True}, 0, False),
        (BETWEEN, {"column": "x", "min_value": 2, "max_value": 1}, 1, False),
        (BETWEEN, {"column": "x"}, 1, False),
        (BETWEEN, {"column": "absent", "max_value": 1}, 0, False),
        (PAIR, {"column_A": "x", "column_B": "y"}, 10, True),  # y is 10.0
        (PAIR, {"column_A": "x", "column_B": "y"}, 11, False),
        (PAIR, {"column_A": "x", "column_B": "y"}, None, False),
        ("expect_column_values_to_not_be_null", {"column": "x"}, 1, False),
    ],
)
def test_only_statistics_that_ge_passes_are_answered_without_it(kind, kwargs, value, answered):
    from resources.quality.validation import plainly_passes

    expectation = {"type": kind, "kwargs": kwargs}
    figures = {"x": value, "y": 10.0}
    parameters = {"high": 3.0, "none": None}
    assert plainly_passes(expectation, figures, parameters) is answered
    if answered:  # GE, asked directly, agrees
        suite = CheckSuite("c", "a", "ERROR", "", statistics=[expectation])
        assert validate([suite], DAY, figures, None, parameters)["c"].passed

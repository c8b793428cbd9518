"""A run's start-up priced in even shares to the days it scores: the ledger's arithmetic, a range
run of tests/tripled_world.py's asset, and that range interrupted and re-executed from failure."""

import json
import os

import pytest
from dagster import (
    Definitions,
    ReexecutionOptions,
    define_asset_job,
    execute_job,
    in_process_executor,
    reconstructable,
)
from helpers import cpu_resources
from tripled_world import DAY, PLAN, ROWS, SHARD_ROWS, materialize_tripled, tripled

from inference.engine.ledger import (
    Attempt,
    PartitionLedger,
    StartupShares,
    ledger_path,
    sum_figures,
)
from policy.partitions import daily_partitions
from policy.prices import NodePrices, node_prices
from resources.storage import DataStore

pytestmark = pytest.mark.usefixtures("no_prices")

RANGE = ("2026-03-01", DAY, "2026-03-03")
TAGS = {
    "dagster/asset_partition_range_start": RANGE[0],
    "dagster/asset_partition_range_end": RANGE[-1],
}
# Seconds the step spends before its first day, as a model load would: the start-up to share.
LOAD_S = 1.0
PRICES = NodePrices("test", spot_per_hour=3600.0, on_demand_per_hour=7200.0, source="test")


def _ledger(store: DataStore, date: str) -> PartitionLedger:
    path = ledger_path(store.partition_target("tripled", date))
    return PartitionLedger.from_json(json.loads(open(path).read()))


# -- the arithmetic ----------------------------------------------------------------------------


def test_each_day_takes_an_even_share_and_the_first_day_keeps_the_launch() -> None:
    shares = StartupShares(launched=100.0)
    assert shares.open(106.0, days_left=3) == (100.0, 2.0)
    assert shares.open(110.0, days_left=2) == (110.0, 2.0)
    assert shares.open(115.0, days_left=1) == (115.0, 2.0)


def test_the_day_a_run_leaves_on_takes_what_is_left() -> None:
    shares = StartupShares(launched=100.0)
    shares.open(106.0, days_left=3)
    _, second = shares.open(110.0, days_left=2)
    assert second + shares.rest() == 4.0
    assert shares.rest() == 0.0


def test_a_day_committed_before_hands_its_share_on() -> None:
    shares = StartupShares(launched=100.0)
    # The first day was committed by the run's lineage: the start-up runs on to the next.
    _, share = shares.open(106.0, days_left=3)
    shares.give_back(share)
    assert shares.open(109.0, days_left=2) == (100.0, 4.5)
    _, share = shares.open(112.0, days_left=1)
    assert share == 4.5
    # A later day committed before: its share goes to the days after it.
    shares = StartupShares(launched=100.0)
    shares.open(106.0, days_left=3)
    _, skipped = shares.open(107.0, days_left=2)
    shares.give_back(skipped)
    assert shares.open(108.0, days_left=1) == (108.0, 4.0)


def test_a_step_retried_on_the_same_node_has_no_start_up_to_price() -> None:
    shares = StartupShares(launched=None)
    assert shares.open(106.0, days_left=3) == (106.0, 0.0)
    assert shares.rest() == 0.0


def test_a_day_is_priced_at_its_share_and_the_policy_reads_the_real_start_up() -> None:
    first = Attempt("r", "spot", 100.0, 106.0, 108.0, rows=10, startup_share_s=2.0)
    later = Attempt("r", "spot", 108.5, 108.5, 110.5, rows=10, startup_share_s=2.0)
    assert first.node_s == 8.0 and first.priced_s == 4.0 and later.priced_s == 4.0
    one, two = (
        PartitionLedger("a", d, [a]).figures(PRICES) for d, a in (("1", first), ("2", later))
    )
    assert one["node_s_spot"] == two["node_s_spot"] == 4.0
    assert one["cost_usd"] == two["cost_usd"] == 4.0 and one["cost_on_demand_usd"] == 8.0
    assert PartitionLedger("a", "1", [first]).restart_overhead_s() == 6.0
    assert PartitionLedger("a", "2", [later]).restart_overhead_s() is None
    # A retry's restart is rework at the share the day is priced at.
    retry = Attempt("s", "on_demand", 200.0, 210.0, 212.0, rows=10, startup_share_s=5.0)
    ledger = PartitionLedger("a", "1", [first, retry])
    figures = ledger.figures(PRICES)
    assert ledger.rework_s == figures["rework_s"] == 5.0
    assert figures["node_s_on_demand"] == 7.0 and figures["cost_rework_usd"] == 10.0
    assert ledger.restart_overhead_s() == 8.0  # the mean of 6 s and 10 s


def test_a_ledger_written_before_shares_prices_each_attempt_at_its_own_node_time() -> None:
    stored = {
        "asset": "a",
        "date": "1",
        "committed": True,
        "attempts": [{"run_id": "r", "capacity": "spot", "started": 100.0,
                      "work_started": 106.0, "ended": 108.0}],
    }  # fmt: skip
    [attempt] = PartitionLedger.from_json(stored).attempts
    assert attempt.startup_share_s is None and attempt.priced_s == attempt.node_s == 8.0
    assert PartitionLedger.from_json(stored).figures(PRICES)["node_s_spot"] == 8.0


# -- a range run --------------------------------------------------------------------------------


def test_a_range_run_prices_each_day_a_third_of_its_start_up(data_root, store, instance) -> None:
    PLAN["load_s"] = LOAD_S
    result = materialize_tripled(data_root, instance, tags=TAGS, partition_key=None)
    assert result.success
    ledgers = [_ledger(store, date) for date in RANGE]
    attempts = [attempt for ledger in ledgers for attempt in ledger.attempts]
    assert len(attempts) == len(RANGE)
    launched = instance.get_run_record_by_id(result.run_id).start_time
    startup = attempts[0].overhead_s
    # The capacity policy still reads the run's whole start-up, on the day that waited for it.
    assert attempts[0].started == launched and startup > LOAD_S
    assert ledgers[0].restart_overhead_s() == pytest.approx(startup)
    assert [ledger.restart_overhead_s() for ledger in ledgers[1:]] == [None, None]

    figures = [ledger.figures(node_prices("g5.xlarge")) for ledger in ledgers]
    for attempt, day in zip(attempts, figures, strict=True):
        assert attempt.startup_share_s == pytest.approx(startup / 3)
        assert day["node_s_spot"] == pytest.approx(attempt.work_s + startup / 3, abs=1e-3)
    spot = [day["node_s_spot"] for day in figures]
    assert max(spot) - min(spot) < startup / 2, spot
    # Together the days are priced at the run's node time: its start-up and each day's scoring.
    total = sum_figures(figures)
    scoring = sum(attempt.work_s for attempt in attempts)
    assert total["node_s_spot"] == pytest.approx(startup + scoring, abs=3e-3)
    assert total["node_s_spot"] <= attempts[-1].ended - launched + 3e-3


def tripled_range_job():
    """``tripled`` alone over the test's data root, rebuilt by re-execution."""
    job = define_asset_job(
        "tripled_range",
        [tripled],
        partitions_def=daily_partitions,
        executor_def=in_process_executor,
    )
    resources = cpu_resources(os.environ["NIGHTSHIFT_DATA_ROOT"], shard_rows=SHARD_ROWS)
    return Definitions(assets=[tripled], jobs=[job], resources=resources).resolve_job_def(
        "tripled_range"
    )


def test_a_retried_range_shares_its_own_start_up_among_the_days_it_scores(
    data_root, store, instance
) -> None:
    PLAN.update(load_s=LOAD_S, kill=DAY)
    job = reconstructable(tripled_range_job)
    first = execute_job(job, instance=instance, tags=TAGS, raise_on_error=False)
    assert not first.success
    [done] = _ledger(store, RANGE[0]).attempts
    [stopped] = _ledger(store, DAY).attempts
    assert stopped.interrupted and not os.path.exists(
        ledger_path(store.partition_target("tripled", RANGE[-1]))
    )
    # The stopped day took its own third and the third of the day the run never reached.
    assert done.startup_share_s == pytest.approx(done.overhead_s / 3)
    assert stopped.startup_share_s == pytest.approx(2 * done.overhead_s / 3)

    retry = execute_job(
        job,
        instance=instance,
        reexecution_options=ReexecutionOptions.from_failure(first.run_id, instance),
        tags=TAGS,
    )
    assert retry.success
    assert store.read_output("tripled", DAY)["y"].to_pylist() == [3.0 * i for i in range(ROWS)]
    # The first day, committed by the first run, is left as it was.
    assert _ledger(store, RANGE[0]).attempts == [done]
    # The retry's start-up runs to its first scored day, and is shared by the two it scored.
    _, resumed = _ledger(store, DAY).attempts
    [last] = _ledger(store, RANGE[-1]).attempts
    restart = resumed.overhead_s
    assert resumed.started == instance.get_run_record_by_id(retry.run_id).start_time
    assert restart > LOAD_S and last.overhead_s == 0.0
    assert resumed.startup_share_s == pytest.approx(restart / 2)
    assert last.startup_share_s == pytest.approx(restart / 2)
    assert _ledger(store, DAY).restart_overhead_s() == pytest.approx(restart)

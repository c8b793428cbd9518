"""The deadline-aware capacity policy (every rule, on a hand-made night) and the shipped price table."""

from __future__ import annotations

import json

import numpy as np
import pytest

from orchestration.simulate.replay import IDLE, ON_DEMAND, SPOT, Job, replay
from policy import deadline as dl
from policy.capacity import (
    ON_DEMAND_PROVIDER,
    SPOT_PROVIDER,
    capacity_strategy,
    capacity_tags,
    tags_for_capacity,
)
from policy.prices import (
    DEFAULT_NODE_TYPE,
    ON_DEMAND_PRICE_SETTING,
    SPOT_PRICE_SETTING,
    node_prices,
    node_prices_from_env,
    price_table,
)
from policy.tags import CAPACITY_TAG, RUN_TASK_KWARGS_TAG

H, MIN = 3600.0, 60.0
NIGHT = dict(total_work_s=2 * H, window_s=6 * H, restart_overhead_s=10 * MIN, deadline="07:00")


def choose(**kwargs) -> dl.CapacityDecision:
    """Plain Uniform Progress (no pace floor) unless a test says otherwise."""
    return dl.choose_capacity(**{**NIGHT, "min_pace": 0.0, **kwargs})


def test_on_or_ahead_of_the_schedule_takes_spot():
    decision = choose(work_left_s=2 * H, time_left_s=6 * H)
    assert (decision.capacity, decision.rule) == (dl.SPOT, dl.AHEAD)
    assert not decision.cannot_make_it
    assert decision.reason.startswith("spot: about 2.0 h of work left, 6.0 h to 07:00")


def test_behind_the_schedule_goes_on_demand_when_spot_is_not_known_to_be_there():
    # A third of the work per hour is planned; 3 h before 07:00 the 2 h left are behind it.
    for spot_available in (None, False):
        decision = choose(work_left_s=2 * H, time_left_s=3 * H, spot_available=spot_available)
        assert (decision.capacity, decision.rule) == (dl.ON_DEMAND, dl.BEHIND)
    assert decision.reason.startswith("on-demand: about 2.0 h of work left, 3.0 h to 07:00")


def test_behind_the_schedule_takes_a_spot_that_is_there():
    decision = choose(work_left_s=2 * H, time_left_s=3 * H, spot_available=True)
    assert (decision.capacity, decision.rule) == (dl.SPOT, dl.TAKING_RISKS)


def test_hysteresis_holds_on_demand_until_ahead_of_the_schedule_at_t_plus_2d():
    # 3 h left at a third per hour: on schedule is 60 min left, at t + 2d it is 53.3 min.
    held = choose(
        work_left_s=55 * MIN, time_left_s=3 * H, current=dl.ON_DEMAND, spot_available=True
    )
    assert (held.capacity, held.rule) == (dl.ON_DEMAND, dl.HYSTERESIS)
    left = choose(
        work_left_s=50 * MIN, time_left_s=3 * H, current=dl.ON_DEMAND, spot_available=True
    )
    assert (left.capacity, left.rule) == (dl.SPOT, dl.LEAVE_ON_DEMAND)
    # Ahead, but no spot to go to: the on-demand node keeps the job rather than idling it.
    stay = choose(
        work_left_s=50 * MIN, time_left_s=3 * H, current=dl.ON_DEMAND, spot_available=False
    )
    assert (stay.capacity, stay.rule) == (dl.ON_DEMAND, dl.HYSTERESIS)


def test_safety_net_goes_on_demand_when_another_reclaim_would_be_too_many():
    # 2 h of work, 2 h 15 min left, d = 10 min: R < C + 2d, but R >= C + d.
    for spot_available in (None, True):
        decision = choose(
            work_left_s=2 * H, time_left_s=2 * H + 15 * MIN, spot_available=spot_available
        )
        assert (decision.capacity, decision.rule) == (dl.ON_DEMAND, dl.SAFETY_NET)
        assert not decision.cannot_make_it
    # The net also keeps an on-demand job from leaving for spot.
    kept = choose(
        work_left_s=2 * H, time_left_s=2 * H + 15 * MIN, current=dl.ON_DEMAND, spot_available=True
    )
    assert kept.rule == dl.SAFETY_NET


def test_cannot_make_it_says_so_and_runs_on_demand():
    decision = choose(work_left_s=2 * H, time_left_s=2 * H + 5 * MIN)
    assert decision.capacity == dl.ON_DEMAND and decision.cannot_make_it
    assert decision.rule == dl.CANNOT_MAKE_IT
    assert decision.reason == (
        "on-demand, and 07:00 cannot be met even so: about 2.0 h of work left, 2.1 h to 07:00 "
        "(the work left is more than the time left)"
    )
    # Already on on-demand, no restart is due: 2 h 5 min is enough for 2 h.
    running = choose(work_left_s=2 * H, time_left_s=2 * H + 5 * MIN, current=dl.ON_DEMAND)
    assert not running.cannot_make_it
    past = choose(work_left_s=30 * MIN, time_left_s=-10 * MIN)
    assert past.cannot_make_it and "07:00 passed 10 min ago" in past.reason


def test_count_based_switch_stays_an_upper_bound():
    ahead = dict(work_left_s=2 * H, time_left_s=6 * H, on_demand_after=2)
    assert choose(**ahead, interruptions=1).capacity == dl.SPOT
    bound = choose(**ahead, interruptions=2)
    assert (bound.capacity, bound.rule) == (dl.ON_DEMAND, dl.COUNT_BOUND)
    assert "2 interruptions reached on_demand_after" in bound.reason
    off = choose(work_left_s=2 * H, time_left_s=6 * H, interruptions=5, on_demand_after=None)
    assert off.capacity == dl.SPOT


def test_a_running_spot_node_is_kept_until_it_is_taken_back():
    decision = choose(work_left_s=2 * H, time_left_s=3 * H, current=dl.SPOT, spot_available=True)
    assert (decision.capacity, decision.rule) == (dl.SPOT, dl.EXPLOIT)


def test_the_pace_floor_waits_for_spot_on_a_loose_deadline():
    # Behind a 1/3 pace, but not behind a 0.8 floor: wait for spot instead of paying on-demand.
    plain = choose(work_left_s=2 * H, time_left_s=5 * H, spot_available=False)
    floored = choose(work_left_s=2 * H, time_left_s=5 * H, spot_available=False, min_pace=0.8)
    assert plain.rule == dl.BEHIND and floored.rule == dl.AHEAD
    # The floor never loosens the safety net.
    net = choose(work_left_s=2 * H, time_left_s=2 * H + 15 * MIN, min_pace=0.8)
    assert net.rule == dl.SAFETY_NET


def test_bad_inputs_are_named():
    with pytest.raises(ValueError, match="current capacity"):
        choose(work_left_s=H, time_left_s=H, current="reserved")
    with pytest.raises(ValueError, match="work_left_s must be > 0"):
        choose(work_left_s=0, time_left_s=H)
    with pytest.raises(ValueError, match="total_work_s"):
        choose(work_left_s=3 * H, time_left_s=6 * H)
    with pytest.raises(ValueError, match="rows_per_second"):
        dl.work_seconds(100, 0)
    assert dl.work_seconds(7200, 2.0) == 3600


def test_hand_made_night_walks_the_rules_in_order():
    """01:00-07:00 in 10-minute steps, 3 h of work, d = 10 min. Spot for the first hour, gone
    for two, back for the last three: the job starts on spot, is reclaimed, waits while it is
    ahead, goes on-demand once behind, holds it through hysteresis, goes back to spot when it
    is ahead again, and finishes before 07:00."""
    step = 10 * MIN
    available = np.array([1] * 6 + [0] * 12 + [1] * 18, dtype=bool)
    job = Job(work=18, length=36, overhead=1, step_seconds=step)
    names = {IDLE: dl.IDLE, SPOT: dl.SPOT, ON_DEMAND: dl.ON_DEMAND}
    seen: list[tuple[str, str]] = []

    def recording(s, done, mode, spot, interruptions):
        d = dl.choose_capacity(
            work_left_s=(job.work - done) * step,
            time_left_s=(job.length - s) * step,
            total_work_s=job.work * step,
            window_s=job.length * step,
            restart_overhead_s=job.overhead * step,
            current=names[mode],
            spot_available=spot,
            interruptions=interruptions,
            min_pace=0.0,
        )
        seen.append((names[mode], d.rule))
        return SPOT if d.capacity == dl.SPOT else ON_DEMAND

    outcome = replay(job, available, recording)
    assert outcome.met and outcome.interruptions == 1
    expected = (
        [(dl.IDLE, dl.AHEAD)]
        + [(dl.SPOT, dl.EXPLOIT)] * 5
        # 02:00, reclaimed with 5 of 18 steps done: ahead of half the work per hour, so wait.
        + [(dl.IDLE, dl.AHEAD)] * 5
        + [(dl.IDLE, dl.BEHIND)]
        + [(dl.ON_DEMAND, dl.HYSTERESIS)] * 6
        # 04:00, spot is back and 11 steps are done: ahead at t + 2d, back to spot.
        + [(dl.ON_DEMAND, dl.LEAVE_ON_DEMAND)]
        + [(dl.SPOT, dl.EXPLOIT)] * 7
    )
    assert seen == expected
    assert (outcome.spot_steps, outcome.on_demand_steps) == (14, 7)


def test_price_table_ships_the_instances_with_its_date_and_source():
    table = price_table()
    assert table["region"] == "us-east-1" and table["compiled"] and table["source"]
    for family in ("g4dn.", "g5.", "g6.", "p4d.", "p5."):
        entries = [v for k, v in table["instances"].items() if k.startswith(family)]
        assert entries, family
        for entry in entries:
            assert 0 < entry["spot"] < entry["on_demand"]
    assert f"{DEFAULT_NODE_TYPE}" in table["instances"]


def test_node_prices_default_and_overrides(monkeypatch):
    for name in ("NIGHTSHIFT_NODE_TYPE", SPOT_PRICE_SETTING, ON_DEMAND_PRICE_SETTING):
        monkeypatch.delenv(name, raising=False)
    entry = price_table()["instances"]["g5.xlarge"]
    default = node_prices_from_env()
    assert (default.node_type, default.spot_per_hour) == ("g5.xlarge", entry["spot"])
    assert default.label == "at g5.xlarge prices"
    monkeypatch.setenv("NIGHTSHIFT_NODE_TYPE", "p5.48xlarge")
    monkeypatch.setenv(SPOT_PRICE_SETTING, "20.5")
    mixed = node_prices_from_env()
    assert mixed.spot_per_hour == 20.5
    assert mixed.on_demand_per_hour == price_table()["instances"]["p5.48xlarge"]["on_demand"]
    assert "spot set by hand" in mixed.source
    with pytest.raises(ValueError, match="'x9.huge' is not in policy/prices.json"):
        node_prices("x9.huge")
    assert node_prices("x9.huge", spot_per_hour=1, on_demand_per_hour=3).on_demand_per_hour == 3
    monkeypatch.setenv(ON_DEMAND_PRICE_SETTING, "cheap")
    with pytest.raises(ValueError, match=ON_DEMAND_PRICE_SETTING):
        node_prices_from_env()


def test_a_decision_becomes_the_run_tags_the_ecs_launcher_reads():
    current = {RUN_TASK_KWARGS_TAG: json.dumps({"cluster": "night", "launchType": "EC2"})}
    behind = choose(work_left_s=2 * H, time_left_s=3 * H)
    tags = tags_for_capacity(behind.capacity, current)
    kwargs = json.loads(tags[RUN_TASK_KWARGS_TAG])
    assert kwargs == {
        "cluster": "night",
        "capacityProviderStrategy": capacity_strategy(ON_DEMAND_PROVIDER),
    }
    assert tags[CAPACITY_TAG] == "on-demand"
    # The same tags as the count-based switch gives once it is due.
    assert tags == capacity_tags(2, 2, current_tags=current)
    back = tags_for_capacity(dl.SPOT, tags)
    assert json.loads(back[RUN_TASK_KWARGS_TAG])["capacityProviderStrategy"] == capacity_strategy(
        SPOT_PROVIDER
    )
    assert back[CAPACITY_TAG] == "spot"
    with pytest.raises(ValueError, match="capacity must be"):
        tags_for_capacity("reserved")

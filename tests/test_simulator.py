"""`nightshift simulate`: trace reading, night replay, the offline optimum against brute force, and the real CLI."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from orchestration.simulate.optimum import optimum_costs
from orchestration.simulate.replay import (
    IDLE,
    ON_DEMAND,
    SPOT,
    Job,
    always_on_demand,
    always_spot,
    count_based,
    deadline_aware,
    replay,
)
from orchestration.simulate.traces import checksums, load_trace, nights, real_trace_paths, resample

BIN = Path(sys.executable).parent
RECORD_FIELDS = {"policy", "trace", "nights", "misses", "cost_vs_optimum"}


def _brute_force(job: Job, available: np.ndarray, spot: float, od: float) -> float:
    """Least cost over every sequence of requests (idle, spot, on-demand) that meets the deadline."""
    best = np.inf
    for seq in itertools.product((IDLE, SPOT, ON_DEMAND), repeat=job.length):
        out = replay(job, available, lambda s, *_, seq=seq: seq[s])
        if out.met:
            best = min(best, out.spot_steps * spot + out.on_demand_steps * od)
    return best


def test_optimum_matches_brute_force_on_tiny_traces():
    rng = np.random.default_rng(7)
    checked = 0
    while checked < 60:
        length = int(rng.integers(3, 8))
        work, overhead = int(rng.integers(1, length + 1)), int(rng.integers(0, 3))
        if work + overhead > length:
            continue
        available = rng.random(length) < 0.6
        job = Job(work, length, overhead, 60.0)
        dp = optimum_costs(job, available[None, :], 1.0, 2.5)[0]
        assert dp == pytest.approx(_brute_force(job, available, 1.0, 2.5)), (job, available)
        checked += 1


def test_optimum_on_a_hand_made_night():
    # 6 steps, 3 of work, d = 1. Spot only in steps 2-5: start it at step 2, done by step 5.
    job = Job(work=3, length=6, overhead=1, step_seconds=60.0)
    available = np.array([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1], [0, 0, 0, 0, 0, 0]], dtype=bool)
    costs = optimum_costs(job, available, 1.0, 3.0)
    assert costs.tolist() == [4.0, 4.0, 12.0]
    # No schedule fits 6 steps of work and a restart in 6 steps.
    assert np.isinf(optimum_costs(Job(6, 6, 1, 60.0), available[:1], 1.0, 3.0)[0])


def test_policies_on_a_night_without_spot():
    job = Job(work=10, length=30, overhead=2, step_seconds=60.0)
    none = np.zeros(30, dtype=bool)
    assert replay(job, none, always_on_demand()).on_demand_steps == 12
    greedy = replay(job, none, always_spot())
    assert not greedy.met and greedy.late_steps == 12  # finished on on-demand after 07:00
    smart = replay(job, none, deadline_aware(job))
    assert smart.met and smart.spot_steps == 0


def test_count_switch_moves_after_the_threshold():
    # Spot lasts 3 steps, then is gone for 1, over and over.
    pattern = np.tile([1, 1, 1, 0], 10).astype(bool)
    job = Job(work=20, length=40, overhead=1, step_seconds=60.0)
    out = replay(job, pattern, count_based(2))
    assert out.interruptions == 2 and out.met
    assert out.spot_steps == 6  # two spot runs of 3 steps, then on-demand to the end


def test_deadline_aware_meets_every_deadline_on_demand_meets_and_optimum_is_a_floor():
    rng = np.random.default_rng(3)
    for _ in range(40):
        length = 60
        job = Job(int(rng.integers(10, 50)), length, int(rng.integers(0, 6)), 60.0)
        if job.work + job.overhead > length:
            continue
        # Runs of availability and unavailability of random lengths.
        runs = rng.integers(1, 15, size=20)
        available = np.repeat(np.arange(20) % 2 == int(rng.integers(0, 2)), runs)[:length]
        available = np.pad(available, (0, length - len(available)))
        best = optimum_costs(job, available[None, :], 1.0, 2.5)[0]
        for min_pace in (0.0, 0.8):
            out = replay(job, available, deadline_aware(job, None, min_pace))
            assert out.met
            assert out.spot_steps + 2.5 * out.on_demand_steps >= best - 1e-9
        assert replay(job, available, always_on_demand()).on_demand_steps * 2.5 >= best


def test_trace_reading_names_the_file_and_field(tmp_path):
    good = tmp_path / "good.json"
    good.write_text(json.dumps({"metadata": {"gap_seconds": 600}, "data": [0, 1, 2]}))
    trace = load_trace(good)
    assert trace.available().tolist() == [False, True, True]
    assert trace.available(2).tolist() == [False, False, True]
    for doc, message in (
        ({"metadata": {"gap_seconds": 0}, "data": [1]}, "metadata.gap_seconds"),
        ({"metadata": {"gap_seconds": 60}, "data": []}, "'data' must be a non-empty list"),
        ({"metadata": {"gap_seconds": 60}, "data": [1, "x"]}, r"data\[1\]"),
        ({"metadata": {"gap_seconds": 60}, "data": [1, -1]}, "negative"),
        ([1, 2], "expected an object"),
    ):
        bad = tmp_path / "bad.json"
        bad.write_text(json.dumps(doc))
        with pytest.raises(ValueError, match=message) as err:
            load_trace(bad)
        assert str(bad) in str(err.value)


def test_resample_loses_a_step_to_a_reclaim_inside_it():
    # 90-second ticks on a 60-second grid: step 1 (60-120 s) overlaps ticks 0 and 1.
    available = np.array([True, False, True, True])
    assert resample(available, 90, 60).tolist() == [True, False, False, True, True, True]
    windows = nights(np.arange(10) % 2 == 0, night_steps=4, stride_steps=3)
    assert windows.shape == (3, 4)


def test_missing_cache_says_how_to_get_the_traces(tmp_path):
    assert len(checksums()) == 34
    with pytest.raises(FileNotFoundError, match="git clone https://github.com/skypilot-org"):
        real_trace_paths(tmp_path)


def _tiny_trace(path: Path) -> Path:
    # Three days at 10-minute ticks; spot is gone for two hours into every night.
    day = [1] * 12 + [0] * 12 + [1] * 120
    path.write_text(json.dumps({"metadata": {"gap_seconds": 600}, "data": day * 3}))
    return path


def test_simulate_json_through_the_real_cli(tmp_path):
    trace = _tiny_trace(tmp_path / "tiny.json")
    done = subprocess.run(
        [str(BIN / "nightshift"), "simulate", "--json", "--trace", str(trace)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)
    by_policy = {(r["policy"], r["trace"]): r for r in rows}
    policies = ("on-demand", "greedy-spot", "count-switch", "deadline-aware", "optimum")
    for policy in policies:
        for name in (str(trace), "all"):
            row = by_policy[(policy, name)]
            assert RECORD_FIELDS <= row.keys()
            assert row["nights"] == 3 * 7 * 2  # 3 nights x 7 fractions x 2 overheads
    assert by_policy[("optimum", "all")]["cost_vs_optimum"] == 1.0
    assert by_policy[("deadline-aware", "all")]["misses"] == 0
    assert by_policy[("on-demand", "all")]["misses"] == 0
    assert by_policy[("greedy-spot", "all")]["misses"] > 0
    assert by_policy[("deadline-aware", "all")]["cost_vs_optimum"] >= 1.0


def test_simulate_without_traces_exits_2_with_the_way_to_get_them(tmp_path):
    done = subprocess.run(
        [str(BIN / "nightshift"), "simulate", "--traces-dir", str(tmp_path / "none")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert "git clone https://github.com/skypilot-org/spot-traces" in done.stderr

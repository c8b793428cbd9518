"""The watchdog's backstop: a model call that holds the interpreter for ever gets its step killed
by a process beside it within the limit plus the grace, with one line naming the shard, the
batch and the wait; the retry counts the stall and publishes the clean day exactly once."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.fs as pafs
import pytest
from dagster import AssetKey, DagsterEventType, DagsterInstance, DagsterRunStatus, materialize
from helpers import cpu_resources

from inference.engine.backstop import (
    POLL_SECONDS,
    PULSE_SECONDS,
    KillNote,
    SharedBeat,
    encode_note,
)
from inference.engine.ledger import PartitionLedger, kill_note_path, ledger_path
from inference.engine.output_partition import PartitionIO
from inference.engine.watchdog import BACKSTOP_GRACE_FLOOR, StallLimit
from resources.storage import DataStore

TESTS = Path(__file__).parent
sys.path.insert(0, str(TESTS / "native_hang"))
from native_hang_job import DAY, ROWS, SHARD_ROWS, doubled  # noqa: E402

BIN = Path(sys.executable).parent
# Small limits keep the test fast: the batches take milliseconds, so the limit is the floor.
FLOOR, CEILING, GRACE = 3.0, 6.0, 2.0
# Python start-up, dagster's imports and the first shards, on a busy machine: not a speed
# figure, only how long the test waits for a run that has to end one way or the other.
START_S = 240.0


def _backstop(beat: SharedBeat, parent: int) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "inference.engine.backstop", beat.path, str(parent)],
        stdin=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=TESTS.parent,
    )


def _sleeper() -> subprocess.Popen:
    """The "step" the backstop watches: a process that sleeps."""
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])


def _for(seconds: float, each) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        each()
        time.sleep(0.05)


def test_the_backstop_stays_quiet_while_the_day_moves_or_the_interpreter_runs(tmp_path) -> None:
    """Beats keep it quiet; so does the pulse alone (the step's own watchdog acts then); once
    both stop for the limit plus the grace, the step is killed and the note names the shard,
    its last batch and the wait."""
    # Long enough that a busy machine does not leave a gap this long between two writes.
    limit, grace = 1.0, 1.0
    beat, parent = SharedBeat(str(tmp_path)), _sleeper()
    backstop = _backstop(beat, parent.pid)
    try:
        note_path = str(tmp_path / "date=2026-03-02.killed")
        backstop.stdin.write(encode_note(KillNote(pafs.LocalFileSystem(), note_path, "unit day")))
        backstop.stdin.flush()
        beat.limit(limit, grace)
        beats: list[tuple[int, float]] = []

        def one_beat() -> None:
            beats.append((len(beats) + 1, time.monotonic()))
            beat.moved(beats[-1][1], 2, beats[-1][0])

        _for(3 * (limit + grace), one_beat)
        assert parent.poll() is None and backstop.poll() is None
        last, last_beat = beats[-1]
        _for(3 * (limit + grace), beat.pulse)  # the interpreter runs, the day does not
        assert parent.poll() is None and backstop.poll() is None
        # The interpreter stops (neither beats nor pulses): the pulse's grace is what the
        # backstop waits for now, and two reads in a row must see the stall.
        silent = time.monotonic() - last_beat
        assert parent.wait(timeout=grace + 2 * POLL_SECONDS + 30) == -signal.SIGKILL
        assert backstop.wait(timeout=30) == 0
        line = backstop.stderr.read().decode()
        note = json.loads(Path(note_path).read_text())
    finally:
        parent.kill()
        parent.wait()
        backstop.kill()
        backstop.wait()
        beat.close()
    assert (note["shard"], note["batches"], note["pid"]) == (2, last, parent.pid)
    # The wait counts from the last beat; the pulses came after it, until ``silent`` seconds
    # after it less one pause between pulses (and the note rounds to a tenth).
    assert silent + grace - 0.2 <= note["waited_s"] <= silent + grace + 2 * POLL_SECONDS + 5
    assert f"unit day: stalled: no model call finished for {note['waited_s']:.1f} s" in line
    assert f"in shard 2 after its batch {last} (limit 1.0 s:" in line
    assert "killed (SIGKILL) because a native call held the interpreter" in line
    assert note["line"] in line


def test_the_backstop_exits_when_the_step_is_gone_or_done(tmp_path) -> None:
    beat, parent = SharedBeat(str(tmp_path)), _sleeper()
    backstop = _backstop(beat, parent.pid)
    try:
        beat.limit(0.5, 0.5)
        parent.kill()
        parent.wait()  # gone, not a zombie
        assert backstop.wait(timeout=30) == 0
    finally:
        backstop.kill()
        backstop.wait()
        beat.close()

    beat, parent = SharedBeat(str(tmp_path)), _sleeper()
    backstop = _backstop(beat, parent.pid)
    try:
        beat.limit(0.5, 0.5)
        beat.close()  # the step is done with the day: closed, its file removed
        assert backstop.wait(timeout=30) == 0
        assert parent.poll() is None  # not killed, though it never beat
        assert not Path(beat.path).exists()
    finally:
        parent.kill()
        parent.wait()
        backstop.kill()
        backstop.wait()


def test_the_grace_is_the_limit_at_least_the_floor_unless_set(monkeypatch) -> None:
    from orchestration.resources import engine_overrides
    from resources.inference import InferenceResource

    monkeypatch.setenv("NIGHTSHIFT_STALL_BACKSTOP_GRACE_SECONDS", "45")
    assert InferenceResource(**engine_overrides()).stall_limit().backstop_grace == 45.0
    assert StallLimit().grace(60.0) == max(BACKSTOP_GRACE_FLOOR, 60.0)
    assert StallLimit().grace(900.0) == 900.0
    assert StallLimit(backstop_grace=2.0).grace(900.0) == 2.0
    with pytest.raises(ValueError, match="stall backstop grace must be > 0 s, got 0"):
        StallLimit(backstop_grace=0)


def _execute(env: dict, home: Path) -> subprocess.CompletedProcess:
    command = [
        str(BIN / "dagster"), "job", "execute", "-m", "native_hang_job", "-j", "doubled_job",
        "--tags", json.dumps({"dagster/partition": DAY}),
    ]  # fmt: skip
    return subprocess.run(
        command, env={**env, "DAGSTER_HOME": str(home)}, capture_output=True, text=True,
        timeout=START_S + FLOOR + CEILING + GRACE, cwd=TESTS.parent,
    )  # fmt: skip


def _env(data_root: Path, tmp_path: Path) -> tuple[dict, Path]:
    """The job's environment (its data root and small stall settings) and its Dagster home."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    env = {
        **os.environ,
        "NIGHTSHIFT_DATA_ROOT": str(data_root),
        "PYTHONPATH": os.pathsep.join([str(TESTS / "native_hang"), str(TESTS), str(TESTS.parent)]),
        "NIGHTSHIFT_SHARD_ROWS": str(SHARD_ROWS),
        "NIGHTSHIFT_STALL_FLOOR_SECONDS": str(FLOOR),
        "NIGHTSHIFT_STALL_CEILING_SECONDS": str(CEILING),
        "NIGHTSHIFT_STALL_BACKSTOP_GRACE_SECONDS": str(GRACE),
    }
    return env, home


def _only_run(home: Path):
    with DagsterInstance.from_config(str(home)) as runs:
        [run] = runs.get_runs()
    return run


def test_a_call_holding_the_interpreter_gets_the_step_killed_and_the_retry_counts_the_stall(
    data_root, store, instance, tmp_path
) -> None:
    env, home = _env(data_root, tmp_path)
    killed = _execute({**env, "NIGHTSHIFT_TEST_HANG": "gil"}, home)
    said = killed.stdout[-3000:] + killed.stderr[-3000:]
    assert killed.returncode == -signal.SIGKILL, said
    [line] = [x for x in killed.stderr.splitlines() if x.startswith("nightshift backstop: ")]
    # The limit these batches give is the floor; the backstop acts once the grace has passed
    # too, at one of its two reads in a row that see it (not a speed figure: a step the
    # backstop missed would hang until the subprocess timeout, and one it killed early would
    # fail the lower bound).
    waited = float(re.search(r"no model call finished for ([\d.]+) s", line).group(1))
    assert FLOOR + GRACE <= waited <= FLOOR + GRACE + 2 * POLL_SECONDS + PULSE_SECONDS + 1.0
    assert "doubled 2026-03-02: stalled: " in line
    assert "in shard 2 after its batch 1 (limit 3.0 s: the step's limit, then 2.0 s of" in line
    assert "because a native call held the interpreter" in line
    assert not store.output_exists("doubled", DAY)
    target = store.partition_target("doubled", DAY)
    assert json.loads(store.read_bytes(kill_note_path(target)))["line"] in line
    # The killed run is failed in the instance, with the line: a run left "started" would
    # never be relaunched by the daemon's run retry. The backstop does it after the kill, when
    # the step's output pipe may be closed already: the test waits for it.
    deadline = time.monotonic() + 60
    while _only_run(home).status != DagsterRunStatus.FAILURE and time.monotonic() < deadline:
        time.sleep(0.2)
    run = _only_run(home)
    assert run.status == DagsterRunStatus.FAILURE
    with DagsterInstance.from_config(str(home)) as runs:
        failures = runs.get_records_for_run(run.run_id, of_type=DagsterEventType.RUN_FAILURE)
    [failure] = failures.records
    assert failure.event_log_entry.dagster_event.message.endswith(line.split(": ", 1)[1])

    retry = _execute(env, home)  # the failed run's tags, as its relaunch carries them
    assert retry.returncode == 0, retry.stdout[-3000:] + retry.stderr[-3000:]
    assert "the attempt before was killed by the watchdog's backstop: " in retry.stderr
    with DagsterInstance.from_config(str(home)) as runs:
        [record] = runs.fetch_materializations(AssetKey("doubled"), limit=1).records
    meta = {k: v.value for k, v in record.asset_materialization.metadata.items()}
    assert meta["shards_resumed"] == 2 and meta["rows_out"] == ROWS
    assert meta["stalls"] == 1 and meta["interruptions"] == 1
    assert meta["stalled_s"] >= FLOOR and meta["stall_killed"] in line
    [first, second] = _attempts(target)
    assert first.interrupted and first.stalled_s == pytest.approx(waited, abs=0.051)
    assert first.killed in line
    assert not second.interrupted and second.killed is None
    assert not target.fs.get_file_info(kill_note_path(target)).type == pafs.FileType.File

    published = store.read_output("doubled", DAY).sort_by("id")
    ids = published.column("id").to_pylist()
    assert len(ids) == len(set(ids)) == ROWS  # each row once
    assert published.equals(_clean_output(tmp_path, instance).sort_by("id"))


def test_with_the_interpreter_free_the_steps_own_watchdog_acts_and_the_backstop_does_not(
    data_root, store, tmp_path
) -> None:
    """A call stuck in Python leaves the interpreter free: the step fails with its own Stalled
    (a retryable failure with its message and figures), even with a grace far shorter than the
    step needs to leave, and nothing is killed."""
    env, home = _env(data_root, tmp_path)
    short = {"NIGHTSHIFT_TEST_HANG": "python", "NIGHTSHIFT_STALL_BACKSTOP_GRACE_SECONDS": "0.2"}
    failed = _execute({**env, **short}, home)
    said = failed.stdout[-3000:] + failed.stderr[-3000:]
    assert failed.returncode == 1, said
    assert "stalled: no model call finished for " in failed.stderr, said
    assert "in shard 2 after its batch 1 (limit 3.0 s: the floor;" in failed.stderr
    assert "nightshift backstop" not in failed.stderr and "SIGKILL" not in failed.stderr
    target = store.partition_target("doubled", DAY)
    assert target.fs.get_file_info(kill_note_path(target)).type == pafs.FileType.NotFound


def _attempts(target) -> list:
    """The day's attempts, from its ledger (closed by the commit)."""
    stored = PartitionIO(target).read_json(ledger_path(target))
    return PartitionLedger.from_json(stored).attempts


def _clean_output(tmp_path, instance):
    """The day as a run that never hung publishes it, in a data root of its own."""
    root = tmp_path / "clean"
    root.mkdir()
    resources = cpu_resources(root, shard_rows=SHARD_ROWS)
    assert materialize([doubled], partition_key=DAY, resources=resources, instance=instance).success
    return DataStore(str(root)).read_output("doubled", DAY)

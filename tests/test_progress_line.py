"""The live progress line of `nightshift run` (issue 40, point 4): on a terminal one line
rewritten in place after each shard, ending at the day's rows; elsewhere the first update, a
line a minute, and the last; and off with --no-progress."""

from __future__ import annotations

import io
import os
import pty
import re
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

from inference.engine.progress import ProgressLine
from orchestration.resources import engine_overrides

BIN = Path(sys.executable).parent
DATE = "2026-03-03"
ROWS = 2_000  # the fraud demo day at scale 0.02
SHARD_ROWS = 300


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_on_a_terminal_the_line_is_rewritten_in_place_and_ended_once() -> None:
    stream, now = _Terminal(), [0.0]
    line = ProgressLine(stream, "fraud_scores 2026-03-01", 1_000, clock=lambda: now[0])
    for rows in (200, 600, 1_000):
        now[0] += 2.0
        line(rows, 0, rows // 200)
    line.close()
    text = stream.getvalue()
    assert text.count("\n") == 1 and text.endswith("\n")
    updates = [u.removesuffix("\x1b[K") for u in text.rstrip("\n").split("\r")[1:]]
    assert updates == [
        "fraud_scores 2026-03-01: 200 of 1,000 rows (20%) in 1 shard, 100 rows/s, about 8 s to go",
        "fraud_scores 2026-03-01: 600 of 1,000 rows (60%) in 3 shards, 150 rows/s, about 3 s to go",
        "fraud_scores 2026-03-01: 1,000 of 1,000 rows (100%) in 5 shards, 167 rows/s",
    ]


def test_off_a_terminal_the_first_update_then_a_line_a_minute_then_the_last() -> None:
    stream, now = io.StringIO(), [0.0]
    line = ProgressLine(stream, "scores", None, every=60.0, clock=lambda: now[0])
    for second, rows in [(1, 10), (30, 300), (61, 610), (90, 900), (100, 1_000)]:
        now[0] = float(second)
        line(rows, 0, 1)
    line.close()
    assert stream.getvalue().splitlines() == [
        "scores: 10 rows in 1 shard, 10 rows/s",
        "scores: 610 rows in 1 shard, 10 rows/s",
        "scores: 1,000 rows in 1 shard, 10 rows/s",
    ]
    assert "\r" not in stream.getvalue()


def test_nothing_updated_nothing_written() -> None:
    for stream in (io.StringIO(), _Terminal()):
        ProgressLine(stream, "scores", 10).close()
        assert stream.getvalue() == ""


@pytest.mark.parametrize(("value", "on"), [("1", True), ("off", False), ("TRUE", True)])
def test_the_setting_is_on_or_off(monkeypatch, value: str, on: bool) -> None:
    monkeypatch.setenv("NIGHTSHIFT_PROGRESS_LINE", value)
    assert engine_overrides()["progress_line"] is on


def test_a_setting_neither_on_nor_off_is_a_clear_error(monkeypatch) -> None:
    monkeypatch.setenv("NIGHTSHIFT_PROGRESS_LINE", "sometimes")
    with pytest.raises(ValueError, match=r"NIGHTSHIFT_PROGRESS_LINE='sometimes' is not on or off"):
        engine_overrides()


def _env(tmp_path: Path) -> dict[str, str]:
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    env = {
        **os.environ,
        "NIGHTSHIFT_DATA_ROOT": str(tmp_path / "data"),
        "DAGSTER_HOME": str(home),
        "HF_HUB_OFFLINE": "1",
        "NIGHTSHIFT_SHARD_ROWS": str(SHARD_ROWS),
    }
    env.pop("NIGHTSHIFT_PROGRESS_LINE", None)
    return env


def _run_args(*extra: str) -> list[str]:
    return [
        str(BIN / "nightshift"),
        "run",
        "--date",
        DATE,
        "--generate-days",
        "3",
        "--scale",
        "0.02",
        "--jobs",
        "fraud_scoring_job",
        *extra,
    ]


def _on_a_terminal(args: list[str], env: dict[str, str], timeout: float = 300) -> tuple[int, str]:
    """Runs ``args`` with stderr on a pseudo-terminal; returns its exit status and what the
    terminal showed."""
    leader, follower = pty.openpty()
    process = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=follower)
    os.close(follower)
    shown = bytearray()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([leader], [], [], 1.0)
        if ready:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # the terminal closed: the command ended
                break
            if not chunk:
                break
            shown += chunk
        elif process.poll() is not None:
            break
    os.close(leader)
    return process.wait(timeout=30), shown.decode()


_UPDATE = re.compile(
    r"fraud_scores 2026-03-03: ([\d,]+) of 2,000 rows \(\d+%\) in (\d+) shards?, [\d,]+ rows/s"
)


def test_nightshift_run_on_a_terminal_shows_the_day_moving_to_its_last_row(tmp_path) -> None:
    status, shown = _on_a_terminal(_run_args(), _env(tmp_path))
    assert status == 0, shown[-3000:]
    # The terminal turns "\n" into "\r\n": the updates are the pieces between bare returns.
    pieces = shown.replace("\r\n", "\n").split("\r")
    updates = [_UPDATE.match(p) for p in pieces]
    rows = [int(m.group(1).replace(",", "")) for m in updates if m is not None]
    shards = [int(m.group(2)) for m in updates if m is not None]
    # One update a shard (several, at this shard size), each further on, the last at the
    # day's rows; and the line is ended once, after the last.
    assert len(rows) >= ROWS // SHARD_ROWS and rows[-1] == ROWS
    assert all(a < b for a, b in zip(rows, rows[1:], strict=False))
    assert shards == list(range(1, len(rows) + 1))
    last = next(p for p in reversed(pieces) if _UPDATE.match(p))
    assert last.endswith("\x1b[K") or last.endswith("\x1b[K\n")


def test_nightshift_run_off_a_terminal_writes_whole_lines_and_none_with_no_progress(
    tmp_path,
) -> None:
    started = time.monotonic()
    done = subprocess.run(
        _run_args(), env=_env(tmp_path), capture_output=True, text=True, timeout=300
    )
    minutes = (time.monotonic() - started) / 60
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [line for line in done.stderr.splitlines() if _UPDATE.match(line)]
    assert "\r" not in done.stderr
    # The first update and the last, and at most one a minute between.
    assert 2 <= len(lines) <= 2 + int(minutes)
    assert lines[-1].startswith("fraud_scores 2026-03-03: 2,000 of 2,000 rows (100%)")

    quiet = subprocess.run(
        _run_args("--no-progress"), env=_env(tmp_path), capture_output=True, text=True, timeout=300
    )
    assert quiet.returncode == 0, quiet.stderr[-3000:]
    assert not [line for line in quiet.stderr.splitlines() if _UPDATE.match(line)]

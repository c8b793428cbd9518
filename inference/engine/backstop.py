"""The progress watchdog's backstop: a process of its own that ends a step whose interpreter is
held by a stuck native call.

The step's own watchdog (inference/engine/watchdog.py) runs on the step's thread; a model call
that hangs in native code *holding* the interpreter (a C extension that never lets go of it, a
``ctypes.PyDLL`` call) stops every thread of the process, that one included, and no Python
signal handler can run either. So the local pool starts this small process beside the step
(``python -m inference.engine.backstop``, never a fork: the step has threads). The step mirrors
its heartbeat into a few bytes of a shared file (:class:`SharedBeat`): when a model call last
finished, in which shard, after how many batches, the day's current limit and grace, and a
pulse that a thread of the step writes every :data:`PULSE_SECONDS` while the interpreter runs.

The backstop acts only where the step's own watchdog could not: once no model call has
finished for the limit plus the grace *and* the pulse has stopped for the grace. It then writes
one line (the shard, its last batch, the wait) to its stderr, which is the step's, and to the
day's kill note beside its cost ledger (:class:`KillNote`; the next attempt counts it as a stall,
inference/engine/day_run.py), and SIGKILLs the step. The run's retry resumes from the finished
shards. The step arms it for each day's model calls and stands it down once they are over
(a zero limit), so nothing the step does between days is taken for a stuck call. It exits by
itself once the step closes the shared file, closes its pipe or is gone.
"""

from __future__ import annotations

import base64
import json
import mmap
import os
import pickle
import select
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inference.engine.faults import alive
from inference.engine.watchdog import Stall

# How often the step's pulse thread writes that its interpreter runs; the backstop reads it.
PULSE_SECONDS = 1.0
# How often the backstop reads the shared file.
POLL_SECONDS = 0.5
# How long the note's command may take (it opens the run's instance storage).
TELL_SECONDS = 60.0
# seq, last beat (CLOCK_MONOTONIC, system-wide on Linux), shard (-1: none), batches done,
# limit (0: not armed), grace, pulse, closed, seq again: a reader that sees two different seqs
# read the file while it was being written, and reads again.
LAYOUT = struct.Struct("<QdqqdddQQ")
NO_SHARD = -1


@dataclass(frozen=True)
class KillNote:
    """Where the backstop writes what it did for the day being scored: a file on the day's
    filesystem (``fs``, any pyarrow filesystem; it travels pickled), the day in words, and the
    attempt's run and capacity (the next attempt enters them in the day's ledger)."""

    fs: Any
    path: str
    where: str
    run_id: str = ""
    capacity: str = ""
    # A command run once the step is killed, the line on its stdin: the orchestration's, which
    # marks the run failed, since a killed process reports nothing and a run left "started"
    # is never retried (assets/killed_run.py).
    then: tuple[str, ...] = ()


@dataclass(frozen=True)
class Reading:
    """One consistent read of the shared file."""

    seq: int
    beat: float
    shard: int | None
    batches: int
    limit: float
    grace: float
    pulse: float
    closed: bool


class SharedBeat:
    """The step's side of the shared file: a heartbeat mirror written in place (no system
    call, a few hundred nanoseconds a write), read by the backstop process."""

    def __init__(self, folder: str | None = None):
        fd, self.path = tempfile.mkstemp(prefix="nightshift-beat-", dir=folder)
        try:
            os.ftruncate(fd, LAYOUT.size)
            self._map = mmap.mmap(fd, LAYOUT.size)
        finally:
            os.close(fd)
        now = time.monotonic()
        self._seq = 0
        # beat, shard, batches, limit, grace, pulse, closed
        self._values: list[Any] = [now, NO_SHARD, 0, 0.0, 0.0, now, 0]
        self._write()

    def _write(self) -> None:
        if self._map.closed:  # a stuck call returning after the step closed it
            return
        self._seq += 1
        try:
            LAYOUT.pack_into(self._map, 0, self._seq, *self._values, self._seq)
        except ValueError:  # closed just now, by the step's thread
            pass

    def moved(self, when: float, shard: int | None, batches: int) -> None:
        """The day moved (a model call finished, a shard began or ended) at ``when``."""
        values = self._values
        values[0], values[1], values[2] = when, NO_SHARD if shard is None else shard, batches
        self._write()

    def limit(self, limit: float, grace: float) -> None:
        """The day's current stall limit and the backstop's grace (a limit of 0: disarmed)."""
        if self._values[3] != limit or self._values[4] != grace:
            self._values[3], self._values[4] = limit, grace
            self._write()

    def pulse(self) -> None:
        self._values[5] = time.monotonic()
        self._write()

    def close(self) -> None:
        """The step is done with it: the backstop exits at its next read."""
        self._values[6] = 1
        self._write()
        self._map.close()
        _quietly(os.unlink, self.path)


def read(view: mmap.mmap) -> Reading:
    """A consistent reading of the shared file (read again while it is being written)."""
    while True:
        seq, beat, shard, batches, limit, grace, pulse, closed, again = LAYOUT.unpack_from(view)
        if seq == again:
            shard_or_none = None if shard == NO_SHARD else shard
            return Reading(seq, beat, shard_or_none, batches, limit, grace, pulse, bool(closed))
        time.sleep(0.001)


def judge(reading: Reading, now: float) -> Stall | None:
    """The stall the backstop acts on: no model call finished for the limit plus the grace,
    and the step's interpreter stopped for the grace (else the step's own watchdog acts)."""
    if reading.closed or reading.limit <= 0:
        return None
    waited = now - reading.beat
    if waited < reading.limit + reading.grace or now - reading.pulse < reading.grace:
        return None
    why = f"the step's limit, then {reading.grace:.1f} s of grace for its own watchdog"
    return Stall(reading.shard, reading.batches, waited, reading.limit, why)


def kill_line(stall: Stall, where: str, pid: int) -> str:
    """The one line an operator reads: the same words as the step's own stall, and why the
    process was killed rather than failed."""
    return (
        f"{where}: stalled: {stall.describe()}; process {pid} was killed (SIGKILL) because a "
        "native call held the interpreter, so the step's own watchdog could not fail it; the "
        "run's retry resumes from the finished shards"
    )


class Backstop:
    """The backstop process of one step and the step's side of it: the shared file, the pulse
    thread, and the pipe that tells the backstop each day's :class:`KillNote`."""

    def __init__(self, folder: str | None = None):
        self.beat = SharedBeat(folder)
        self._stop = threading.Event()
        # The step may have found this package through its working folder, which the
        # backstop's module path must not depend on.
        root = str(Path(__file__).resolve().parents[2])
        path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "inference.engine.backstop", self.beat.path, str(os.getpid())],
            stdin=subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": path},
            # Its own session: a Ctrl-C or a group signal meant for the step does not end it
            # first; it ends when the step does.
            start_new_session=True,
        )
        self._pulse = threading.Thread(target=self._beat, name="nightshift-backstop-pulse")
        self._pulse.daemon = True
        self._pulse.start()

    def _beat(self) -> None:
        while not self._stop.wait(PULSE_SECONDS):
            self.beat.pulse()

    def note(self, note: KillNote) -> None:
        """Where the backstop writes its line for the day now scored."""
        try:
            self.process.stdin.write(encode_note(note))
            self.process.stdin.flush()
        except (BrokenPipeError, ValueError):  # it is gone already; the step goes on
            pass

    def close(self) -> None:
        """The step is done: the pulse stops, and the backstop exits."""
        self._stop.set()
        self._pulse.join()
        self.beat.close()
        _quietly(self.process.stdin.close)
        try:
            self.process.wait(timeout=5 * POLL_SECONDS)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def encode_note(note: KillNote) -> bytes:
    """One line on the backstop's pipe: the note, pickled (its filesystem with it)."""
    return base64.b64encode(pickle.dumps(note)) + b"\n"


def _quietly(fn, *args) -> None:
    """``fn(*args)``, where what it undoes is already gone (a file removed, a pipe closed)."""
    try:
        fn(*args)
    except (FileNotFoundError, BrokenPipeError, ValueError):
        pass


# -- the backstop process ---------------------------------------------------------------------


def _write_note(note: KillNote, stall: Stall, line: str, pid: int) -> None:
    folder = note.path.rsplit("/", 1)[0]
    note.fs.create_dir(folder, recursive=True)
    body = {
        "line": line,
        "run_id": note.run_id,
        "capacity": note.capacity,
        "shard": stall.shard,
        "batches": stall.batches,
        "waited_s": round(stall.waited, 1),
        "limit_s": round(stall.limit, 1),
        "pid": pid,
        "killed_at": time.time(),
    }
    written = f"{note.path}.tmp"  # whole or not at all, for the next attempt that reads it
    with note.fs.open_output_stream(written) as out:
        out.write(json.dumps(body).encode())
    note.fs.move(written, note.path)


def act(stall: Stall, told: bytes | None, pid: int) -> None:
    """The line to stderr and to the day's note (``told``: as the step sent it), then the step
    killed, whatever fails before."""
    note: KillNote | None = None
    line = ""
    try:
        # Read only now: its filesystem would import pyarrow, which a backstop that never
        # acts need not load beside the step.
        note = pickle.loads(base64.b64decode(told)) if told else None
        line = kill_line(stall, note.where if note is not None else "nightshift", pid)
        print(f"nightshift backstop: {line}", file=sys.stderr, flush=True)
        if note is not None:
            _write_note(note, stall, line, pid)
    except Exception as exc:  # the kill matters more than the note
        print(f"nightshift backstop: the kill note was not written: {exc}", file=sys.stderr)
    finally:
        os.kill(pid, signal.SIGKILL)
    if note is not None and note.then:
        _tell(note.then, line)


def _tell(command: tuple[str, ...], line: str) -> None:
    """Runs the note's command with the kill's line on its stdin; a failure is said, not
    raised: the step is dead either way."""
    try:
        done = subprocess.run(
            command, input=line, text=True, capture_output=True, timeout=TELL_SECONDS
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        print(f"nightshift backstop, after the kill: did not run: {exc}", file=sys.stderr)
        return
    said = (done.stdout + done.stderr).strip()
    if said:
        print(f"nightshift backstop, after the kill: {said}", file=sys.stderr, flush=True)


def watch(path: str, pid: int, commands: int) -> int:
    """The backstop's loop over the shared file at ``path`` of the step ``pid``, which tells
    it each day's note on the pipe ``commands``; returns its exit status."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the step's Ctrl-C is the step's
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:  # the step was done with it before this process started
        return 0
    try:
        view = mmap.mmap(fd, LAYOUT.size, prot=mmap.PROT_READ)
    finally:
        os.close(fd)
    told: bytes | None = None  # the day's note, as the step sent it
    pending = b""
    seen: int | None = None  # the seq of the reading judged stalled the poll before
    while True:
        if select.select([commands], [], [], POLL_SECONDS)[0]:
            chunk = os.read(commands, 65536)
            if not chunk:
                return 0  # the step closed its end, or died
            pending += chunk
            *lines, pending = pending.split(b"\n")
            told = lines[-1] if lines else told
        if not alive(pid):
            return 0
        reading = read(view)
        if reading.closed:
            return 0
        stall = judge(reading, time.monotonic())
        if stall is None:
            seen = None
        elif seen == reading.seq:  # stalled at two reads in a row of the same write
            act(stall, told, pid)
            return 0
        else:
            seen = reading.seq


def main(argv: list[str]) -> int:
    path, pid = argv[0], int(argv[1])
    try:
        return watch(path, pid, sys.stdin.fileno())
    finally:
        _quietly(os.unlink, path)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

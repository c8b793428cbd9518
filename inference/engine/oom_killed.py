"""A step's own process that the kernel's OOM killer took, told by the day's next attempt.

With the local executor the model runs in the step's process. When the OOM killer takes that
process, nothing is left to say so: Dagster sees a process that died, and the daemon's run
retry relaunches the day as after a reclaimed spot node, into the same wall. So each attempt
enters in the day's ledger (inference/engine/ledger.py), as it starts, what its process is
(:class:`ProcessTrace`: host and pid, the memory cgroup's ``oom_kill`` count then, the batch
size), and its peak memory as it records shards; an attempt that ends in its own process
(committed, failed or interrupted) marks its trace left.

The next attempt at the day reads the previous attempt's trace before it takes the day's lease.
One that never left, whose process is gone from this machine while the cgroup's count rose
since it began, was the OOM killer's: the new attempt fails once with :class:`OomKilledAttempt`,
a device fault that is not retried, naming the shard the killed process was computing (its
``_running`` marker in staging names the process), the batch size and the memory figures. It
marks the trace reported first, so the day is not refused for ever: the next launch (the
operator's, after a fix or without one) resumes from the kept shards, as after any kill.

A previous attempt that died with the count unchanged (a reclaimed node, a plain SIGKILL, an
operator) is resumed, as before. A relaunch on another machine or in a fresh container (a new
ECS task) cannot read the count of the cgroup that is gone: it resumes, and the old task's stop
reason (ECS's ``OutOfMemoryError``) is where the kill shows.
"""

from __future__ import annotations

import os
import posixpath
import socket
from dataclasses import dataclass
from pathlib import Path

import pyarrow.fs as pafs

from inference.engine.faults import (
    GIB,
    OOM_KILLED_STEP,
    DeviceFault,
    OomKillCounter,
    alive,
    host_memory_figures,
)
from inference.engine.metrics import peak_rss_mb
from inference.engine.output_partition import PROGRESS
from inference.engine.shard_worker import RUNNING_DIR
from inference.engine.shard_writer import ShardedWriter


@dataclass
class ProcessTrace:
    """What an attempt's own process was, for the next attempt to tell an OOM kill by."""

    worker: str  # host:pid, as the shards' ``_running`` markers name it
    oom_kills: int  # the memory cgroup's oom_kill count when the attempt began
    events: str | None  # the file that count was read from; None: no counter here
    batch_size: int = 0
    peak_rss_mb: float = 0.0  # as of the attempt's latest ledger entry
    left: bool = False  # ended in its own process: committed, failed or interrupted
    reported: bool = False  # a later attempt failed once on it: later ones resume

    @classmethod
    def begin(cls, batch_size: int) -> ProcessTrace:
        counter = OomKillCounter()
        worker = f"{socket.gethostname()}:{os.getpid()}"
        return cls(worker, counter.baseline, counter.path, batch_size, peak_rss_mb())

    def seen(self) -> None:
        """Takes the process's peak memory so far."""
        self.peak_rss_mb = max(self.peak_rss_mb, peak_rss_mb())


class OomKilledAttempt(DeviceFault):
    """The previous attempt's process was the OOM killer's; ``day`` (asset and date) keeps
    ``shards_kept`` finished shards in staging for the launch after the fix."""

    def __init__(self, line: str, day: str, shards_kept: int):
        super().__init__(OOM_KILLED_STEP, line)
        self.day, self.shards_kept = day, shards_kept

    def __reduce__(self) -> tuple:
        return OomKilledAttempt, (self.line, self.day, self.shards_kept)


def oom_killed(
    trace: ProcessTrace, run_id: str, writer: ShardedWriter, day: str
) -> OomKilledAttempt | None:
    """The fault to fail on when ``trace`` (the previous attempt's, of run ``run_id``, at
    ``day``) is of a process the OOM killer took and not yet reported; else None."""
    if trace.left or trace.reported or trace.events is None:
        return None
    host, _, pid = trace.worker.rpartition(":")
    if host != socket.gethostname() or not pid.isdigit() or alive(int(pid)):
        return None  # another machine's cgroup, or the attempt still runs (the lease decides)
    kills = OomKillCounter(trace.events).count()
    if kills <= trace.oom_kills:
        return None
    shard, kept = _staged(writer, trace.worker)
    on = f"on shard {shard}" if shard is not None else "between shards"
    line = (
        f"device fault: the previous attempt (run {run_id}, process {trace.worker}) was killed "
        f"by the kernel's OOM killer {on}, batch size {trace.batch_size} (the oom_kill counter "
        f"of {trace.events} rose from {trace.oom_kills} to {kills} since it began; its peak RSS "
        f"at least {trace.peak_rss_mb * 2**20 / GIB:.1f} GiB; "
        f"{host_memory_figures(Path(trace.events).parent)})"
    )
    return OomKilledAttempt(line, day, kept)


def _staged(writer: ShardedWriter, worker: str) -> tuple[int | None, int]:
    """The shard ``worker`` had started and not finished (its marker names it), and how many
    finished shards the day's staging holds for this writer's settings."""
    staging = writer.target.staging_dir
    progress = writer.io.read_json(f"{staging}/{PROGRESS}") or {}
    # Progress of other inputs or settings is discarded by the next begin: nothing is kept.
    same = (
        progress.get("fingerprint") == writer.fp and progress.get("shard_rows") == writer.shard_rows
    )
    finished = set(progress.get("shards", {})) if same else set()
    selector = pafs.FileSelector(posixpath.join(staging, RUNNING_DIR), allow_not_found=True)
    started = []
    for info in writer.target.fs.get_file_info(selector):
        if not info.path.endswith(".json"):  # a marker's temporary file, left by the kill
            continue
        marker = writer.io.read_json(info.path) or {}
        if marker.get("worker") == worker and str(marker.get("shard")) not in finished:
            started.append(int(marker["shard"]))
    return max(started, default=None), len(finished)

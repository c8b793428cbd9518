"""Shards on Ray: a pool of actors, each loading its model once, and the Ray session around it.

``ray_session`` starts an in-process local Ray when no address is given (laptops and tests;
stopped when the session closes) or connects to an existing cluster (``auto``, or
``ray://head:10001`` through Ray Client). :class:`RayPool` keeps a fixed set of
:class:`ShardWorker` actors (``num_cpus`` and ``num_gpus`` each) and at most two shards queued
on each, so the next shard's rows travel while the current one computes.

A worker that dies (a reclaimed spot node, an operator's kill) is restarted by Ray and its
shard retried there (``max_restarts``, ``max_task_retries``); the shard's files are written
under fixed names, so the retry overwrites what the lost worker left. A worker the kernel's OOM
killer took would die again on the retry: it fails the day as a device fault instead
(inference/engine/faults.py). Each job (one partition's
program) is sent to each actor once and kept there by its object id.

The progress watchdog (inference/engine/watchdog.py) sees the actors' model calls through a
small actor of its own, :class:`Beats`: each worker tells it when a shard starts and, at most
every :data:`BEAT_SECONDS`, that its calls still finish; the driver reads it between its waits.
When the day stalls, the actors of the shards in flight are killed: their processes end, a
call stuck in native code with them, and the step fails for its retry. With straggler copies
on, the driver first asks :meth:`RayPool.replace` for a fresh actor in the stuck one's place
and hands its shards out again; :meth:`RayPool.copy` starts a straggler's second copy on an
idle actor, and :meth:`RayPool.drop` gives up the copy that lost (its actor, if it runs, is
replaced too: a running actor call cannot be cancelled, and nothing may land after the commit).
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, suppress
from typing import Any

from inference.engine.backstop import KillNote
from inference.engine.device import MALLOC_ARENAS
from inference.engine.faults import OomKillCounter, WorkerDeaths, ray_fault
from inference.engine.shard_worker import ShardInput, ShardJob, ShardResult, compute_shard
from inference.engine.watchdog import Heartbeat, StallLimit, Watchdog

# Restarts of one actor, and retries of one shard on a restarted actor, before the step fails.
MAX_RESTARTS = 3
# Shards queued per actor: one computing, one whose rows are on their way.
QUEUED_PER_WORKER = 2
# A worker's model calls are sent on once a second: the stall limit is a minute or more unless
# set lower, and an actor call per model call would cost the small ones.
BEAT_SECONDS = 1.0
# How long the driver waits for the beats it has not read yet.
BEATS_READ_SECONDS = 5.0
# The local Ray's shared-memory object store: shards' input rows wait there (tens of MB each).
LOCAL_OBJECT_STORE_BYTES = 512 * 1024 * 1024


def _ray():
    try:
        import ray
    except ImportError as exc:  # the extra is optional: the local executor does not need it
        raise RuntimeError(
            "executor 'ray' needs Ray: pip install 'nightshift[ray]' (ray==2.60.0), "
            "or set NIGHTSHIFT_EXECUTOR=local"
        ) from exc
    return ray


@contextmanager
def ray_session(address: str, num_cpus: float, num_gpus: float) -> Iterator[Any]:
    """Ray for one step: started here (empty ``address``) and stopped after, or connected to."""
    ray = _ray()
    # Ray's serialiser imports pydantic.v1 lazily on its first use; once, in a Dagster step,
    # that import failed with KeyError('pydantic.v1'). Imported here first, before any thread
    # of Ray's exists.
    try:
        import pydantic.v1.fields  # noqa: F401
    except ImportError:  # no pydantic (a bare GPU image): Ray's serialiser skips it too
        pass

    if ray.is_initialized():  # someone else's session (a test, a notebook): use it, keep it
        yield ray
        return
    if address:
        ray.init(address=address, log_to_driver=False)
    else:
        # A laptop or test Ray: no dashboard, no usage report (nothing may leave the machine).
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        # Its workers inherit this environment from their start, before Ray's own threads take
        # malloc arenas (inference/engine/device.py, MALLOC_ARENAS); a cluster's workers get
        # the cluster's environment (docs/operating.md).
        os.environ.setdefault("MALLOC_ARENA_MAX", str(MALLOC_ARENAS))
        ray.init(
            # "local": always a new Ray of our own, even where a cluster runs on this machine
            # (a bare init would join the one `ray start` last recorded in /tmp/ray).
            address="local",
            num_cpus=max(1, int(round(num_cpus))),
            num_gpus=num_gpus,
            include_dashboard=False,
            object_store_memory=LOCAL_OBJECT_STORE_BYTES,
            log_to_driver=False,
        )
    try:
        yield ray
    finally:
        ray.shutdown()


class Beats:
    """A Ray actor between the workers' model calls and the driver's watchdog: what happened
    since the driver last read, in order."""

    def __init__(self):
        self.events: list[tuple[str, int, int, list[float]]] = []

    def shard_started(self, shard: int) -> None:
        self.events.append(("started", shard, 0, []))

    def beat(self, shard: int, batches: int, seconds: list[float]) -> None:
        self.events.append(("beat", shard, batches, seconds))

    def take(self) -> list[tuple[str, int, int, list[float]]]:
        events, self.events = self.events, []
        return events


class _ToBeats:
    """A worker's heartbeat: its shards' starts sent on to :class:`Beats` at once, its model
    calls every :data:`BEAT_SECONDS` from a thread of its own, so a model call costs no actor
    call (and a call stuck holding the interpreter stops the beats too, as it should)."""

    def __init__(self):
        self.beats: Any = None
        self._lock = threading.Lock()
        self._pending: tuple[int, int] | None = None  # (shard, batches) not sent yet
        self._seconds: list[float] = []
        threading.Thread(target=self._send_every, name="nightshift-beats", daemon=True).start()

    def shard_started(self, shard: int) -> None:
        self._flush()
        if self.beats is not None:
            self.beats.shard_started.remote(shard)

    def beat(self, shard: int, batches: int, seconds: float | None) -> None:
        with self._lock:
            self._pending = (shard, batches)
            if seconds is not None:
                self._seconds.append(seconds)

    def _send_every(self) -> None:
        while True:
            time.sleep(BEAT_SECONDS)
            self._flush()

    def _flush(self) -> None:
        with self._lock:
            pending, seconds = self._pending, self._seconds
            self._pending, self._seconds = None, []
        if pending is not None and self.beats is not None:
            self.beats.beat.remote(*pending, seconds)


class ShardWorker:
    """One Ray actor: computes shards with the jobs it was sent, each deserialised once."""

    def __init__(self, cpu_threads: int):
        import torch

        torch.set_num_threads(max(1, cpu_threads))
        self.jobs: dict[str, ShardJob] = {}
        self.heartbeat = _ToBeats()

    def run(self, job_ref: list, index: int, rows, positions, beats: Any = None) -> ShardResult:
        # The job's ref comes wrapped in a list, so Ray hands it over unresolved and it is
        # fetched once per actor rather than with every shard.
        key = job_ref[0].hex()
        if key not in self.jobs:
            self.jobs = {key: _ray().get(job_ref[0])}  # one partition's job at a time
        self.heartbeat.beats = beats
        heartbeat = self.heartbeat if beats is not None else None
        return compute_shard(self.jobs[key], ShardInput(index, rows, positions), None, heartbeat)

    def pid(self) -> int:
        return os.getpid()

    def where(self) -> str:
        """This actor's process, named as its shards' results name it (``host:pid``)."""
        return f"{socket.gethostname()}:{os.getpid()}"


class RayPool:
    """``workers`` Ray actors computing shards for the driver loop (inference/engine/shards.py)."""

    in_process = False
    # The next shard is read while the actors compute.
    read_ahead = 1

    def __init__(
        self,
        ray: Any,
        workers: int,
        cpus_per_worker: float,
        gpus_per_worker: float,
        oom_kills: OomKillCounter | None = None,
    ):
        self.ray = ray
        self._actor = ray.remote(ShardWorker).options(
            num_cpus=cpus_per_worker,
            num_gpus=gpus_per_worker,
            max_restarts=MAX_RESTARTS,
            max_task_retries=MAX_RESTARTS,
        )
        self._threads = max(1, int(cpus_per_worker))
        self.actors = [self._actor.remote(self._threads) for _ in range(workers)]
        self.slots = QUEUED_PER_WORKER * workers
        self._job: ShardJob | None = None  # the partition being computed, and its object
        self._job_ref: Any = None
        self._load: dict[Any, int] = {}
        self._rows: dict[Any, int] = {}
        self._busy = [0] * workers
        # Each actor's shards in the order given (an actor runs them one at a time, in that
        # order), and when the first of them began, as the driver saw it: when it was handed
        # out, or when the one before it on the same actor came back.
        self._queues: list[list[Any]] = [[] for _ in range(workers)]
        self._since: dict[Any, float] = {}
        self.replaced = 0  # actors killed and started afresh (stuck, or a straggler's loser)
        self.heartbeat = Heartbeat()
        self._beats: Any = None  # the Beats actor, while a watchdog reads it
        # Which worker the kernel's OOM killer took (inference/engine/faults.py): each actor's
        # process, asked now and answered while shards run, then named by each shard it returns.
        self.deaths = WorkerDeaths(oom_kills or OomKillCounter())
        self._where = {a.where.remote(): slot for slot, a in enumerate(self.actors)}

    def pids(self) -> list[int]:
        """The actors' process ids (tests kill one to play a lost spot worker)."""
        return self.ray.get([a.pid.remote() for a in self.actors])

    def submit(self, job: ShardJob, shard: ShardInput) -> Any:
        slot = min(range(len(self.actors)), key=self._busy.__getitem__)
        return self._submit_to(slot, job, shard)

    def _submit_to(self, slot: int, job: ShardJob, shard: ShardInput) -> Any:
        if job is not self._job:  # the job itself is held, so the comparison is by identity
            self._job, self._job_ref = job, self.ray.put(job)
        handle = self.actors[slot].run.remote(
            [self._job_ref], shard.index, self.ray.put(shard.rows), shard.positions, self._beats
        )
        self._busy[slot] += 1
        self._load[handle] = slot
        self._queues[slot].append(handle)
        if len(self._queues[slot]) == 1:
            self._since[handle] = time.monotonic()
        self.deaths.submitted(handle, slot, shard.index, job.batch_size)
        self._rows[handle] = shard.rows.num_rows
        return handle

    def running_for(self, handle: Any) -> float | None:
        """Seconds since ``handle``'s shard began on its actor, as the driver saw it; None
        while it waits behind another shard."""
        since = self._since.get(handle)
        return None if since is None else time.monotonic() - since

    def copy(self, job: ShardJob, shard: ShardInput, of: Any) -> Any | None:
        """A second copy of ``of``'s shard on an idle actor other than its own (a straggler's
        copy, inference/engine/shards.py); None when no actor is idle."""
        mine = self._load.get(of)
        idle = [s for s in range(len(self.actors)) if s != mine and self._busy[s] == 0]
        return self._submit_to(idle[0], job, shard) if idle else None

    def drop(self, handle: Any) -> list[Any]:
        """Gives up on ``handle`` (the copy that lost): cancelled while it waits; while it
        runs, its actor is killed and started afresh, so nothing it does lands after the day
        is committed (an actor's running call cannot be cancelled). Returns the other shards
        that actor held, for the driver to hand out again."""
        slot = self._load.get(handle)
        if slot is None:
            return []
        if self._queues[slot][0] != handle:
            self._forget(handle)
            self.ray.cancel(handle)
            return []
        return [h for h in self.replace([handle]) if h is not handle]

    def replace(self, handles: list[Any]) -> list[Any]:
        """Kills the actors computing ``handles`` (stuck, or SIGSTOPped with their node) and
        starts a fresh actor in each one's place, so the pool keeps its size. Returns every
        shard those actors held, queued ones too, for the driver to hand out again."""
        slots = sorted({self._load[h] for h in handles if h in self._load})
        lost: list[Any] = []
        for slot in slots:
            held = list(self._queues[slot])
            for handle in held:
                self._forget(handle)
            lost += held
            self.ray.kill(self.actors[slot], no_restart=True)
            self.deaths.forget(slot)
            self.actors[slot] = self._actor.remote(self._threads)
            self._where[self.actors[slot].where.remote()] = slot
            self.replaced += 1
        return lost

    def _forget(self, handle: Any, deaths: bool = True) -> int:
        """``handle`` is done or given up: its actor's next shard begins now. Returns its
        rows; ``deaths``: whether the OOM watch forgets it too (a result tells it itself)."""
        slot = self._load.pop(handle)
        self._busy[slot] -= 1
        rows = self._rows.pop(handle, 0)
        self._since.pop(handle, None)
        if deaths:
            self.deaths.finished(handle)
        queue = self._queues[slot]
        first = queue[0] == handle
        queue.remove(handle)
        if first and queue:
            self._since[queue[0]] = time.monotonic()
        return rows

    def wait(self, handles: list[Any], timeout: float) -> list[Any]:
        """The shards finished: waits up to ``timeout`` for the first, then takes all ready."""
        self._check_deaths()
        self._read_beats()
        done, _ = self.ray.wait(handles, num_returns=1, timeout=timeout)
        if done and len(handles) > 1:
            done, _ = self.ray.wait(handles, num_returns=len(handles), timeout=0)
        return done

    def result(self, handle: Any) -> ShardResult:
        self._check_deaths()  # before the shard's redo is taken for its first try
        shard = self.deaths.shard(handle)
        self._forget(handle, deaths=False)
        try:
            result = self.ray.get(handle)
        except self.ray.exceptions.RayTaskError as exc:
            # The shard's own error (bad data, a model that drops rows), not Ray's wrapper.
            cause = exc.cause if isinstance(exc.cause, BaseException) else None
            raise (cause or exc) from None
        except self.ray.exceptions.RayError as exc:
            # The worker died: for memory (a device fault), or otherwise (raised as it is).
            fault = ray_fault(self.ray, exc, *shard) if shard else None
            if fault is None:
                raise
            raise fault from exc
        # A finished shard is progress, whichever of its beats were not sent.
        self.heartbeat.shard_done(result.index, result.metrics.batches)
        self.deaths.finished(handle, result.worker)
        return result

    def _check_deaths(self) -> None:
        """Raises the fault of a worker the OOM killer took (see ``deaths``)."""
        if self._where:
            ready, _ = self.ray.wait(list(self._where), num_returns=len(self._where), timeout=0)
            for ref in ready:
                slot = self._where.pop(ref)
                with suppress(self.ray.exceptions.RayError):  # died first: Ray redoes its shard
                    self.deaths.watch(slot, self.ray.get(ref))
        self.deaths.check()

    def watchdog(self, limit: StallLimit, note: KillNote | None = None) -> Watchdog:
        """The day's watchdog, fed by the workers' beats (none are sent when it is off). No
        backstop (``note`` is unused): the driver runs no model call, and a stuck worker is
        killed from here."""
        if limit.off:
            self._beats = None
        elif self._beats is None:
            self._beats = self.ray.remote(Beats).options(num_cpus=0).remote()
        else:
            self.ray.get(self._beats.take.remote())  # the day before's last beats
        return Watchdog(self.heartbeat, limit)

    def _read_beats(self) -> None:
        """Replays the workers' beats since the last read on the driver's heartbeat."""
        if self._beats is None:
            return
        try:
            events = self.ray.get(self._beats.take.remote(), timeout=BEATS_READ_SECONDS)
        except self.ray.exceptions.GetTimeoutError:
            return  # read at the next wait; meanwhile the day counts as not moving
        for kind, shard, batches, seconds in events:
            if kind == "started":
                self.heartbeat.shard_started(shard)
                continue
            for call in seconds[:-1]:
                self.heartbeat.beat(shard, batches, call)
            self.heartbeat.beat(shard, batches, seconds[-1] if seconds else None)

    def stop(self, handles: list[Any], abandon: bool = False) -> tuple[list[ShardResult], int]:
        """Cancels the shards not finished; those finished are returned, the others' rows
        are the work lost. With ``abandon`` (the day stalled) the actors computing them are
        killed, so a call stuck in native code ends with its process; the pool then has
        fewer actors, and the step that owns it fails."""
        if not handles:
            return [], 0
        done, running = self.ray.wait(handles, num_returns=len(handles), timeout=0)
        lost, stuck = 0, set()
        for handle in running:
            slot = self._load[handle]
            lost += self._forget(handle)
            if abandon:
                stuck.add(slot)
            else:
                self.ray.cancel(handle)
        for slot in sorted(stuck):
            self.ray.kill(self.actors[slot], no_restart=True)
        return [self.result(handle) for handle in done], lost

    def close(self) -> None:
        for actor in self.actors:
            self.ray.kill(actor)
        self.actors = []
        if self._beats is not None:
            self.ray.kill(self._beats)
            self._beats = None


def open_ray_pool(
    resources: ExitStack,
    address: str,
    workers: int,
    cpus_per_worker: float,
    gpus_per_worker: float,
) -> RayPool:
    """A pool of ``workers`` actors in a Ray session, both closed with ``resources``."""
    ray = resources.enter_context(
        ray_session(address, workers * cpus_per_worker, workers * gpus_per_worker)
    )
    pool = RayPool(ray, workers, cpus_per_worker, gpus_per_worker)
    resources.callback(pool.close)
    return pool

"""Faults of the device or the node that no retry of the same work mends, named in one line.

A shard that runs out of memory at the smallest batch size, a CUDA device error (an illegal
memory access, a device-side assert, an uncorrectable ECC error) and a worker the kernel's OOM
killer took would meet the same wall on a retry with the same batch floor on the same kind of
node: retried as an interruption, the night spends its relaunches on them and still fails,
later. Each becomes a :class:`DeviceFault` instead, whose message is one line naming the kind
of fault, the shard, the batch size and the memory figures where it happened, e.g.

    device fault: CUDA out of memory at the floor batch size 1 on shard 3, a call of 512 rows
    (allocated 70.1 GiB, reserved 71.0 GiB of 79.6 GiB)

The step fails on it without a retry (assets/checkpointing.py); the shards finished before it
stay in staging, so a rerun after the fix (a lower floor, a bigger node) resumes from them.

A worker killed with SIGKILL is, on its own, a reclaimed node and its shard is redone. It is
the OOM killer's when the memory cgroup's ``oom_kill`` counter rose meanwhile
(:class:`OomKillCounter`, read from ``memory.events`` under /sys/fs/cgroup, or cgroup v1's
``memory.oom_control``); on a Ray cluster, when Ray says so (``ray.exceptions.OutOfMemoryError``
from its memory monitor, or a worker death whose message names out-of-memory).
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from inference.engine.adaptive import BatchTooLargeError, is_out_of_memory

# The kinds of fault, as the step's metadata names them.
OOM_AT_FLOOR = "out_of_memory_at_floor"
OUT_OF_MEMORY = "out_of_memory"
DEVICE_ERROR = "device_error"
OOM_KILLED = "oom_killed"
# The step's own process (the local executor), told by the next attempt (oom_killed.py).
OOM_KILLED_STEP = "step_oom_killed"

# What CUDA, cuBLAS and cuDNN put in the messages of errors that leave the device (or its
# context) unusable: a retry on the same device meets them again, or worse.
DEVICE_ERROR_MARKERS = (
    "cuda error",
    "device-side assert triggered",
    "an illegal memory access was encountered",
    "cublas_status_",
    "cudnn error",
    "cudnn_status_",
    "uncorrectable ecc error",
)

# Where the kernel counts the OOM killer's kills in this process's memory cgroup: cgroup v2
# (a container sees its own cgroup at the root), then cgroup v1's memory controller.
MEMORY_EVENTS_SETTING = "NIGHTSHIFT_CGROUP_MEMORY_EVENTS"
MEMORY_EVENTS_PATHS = ("/sys/fs/cgroup/memory.events", "/sys/fs/cgroup/memory/memory.oom_control")

GIB = 1024**3
# How Ray's death messages name memory as the cause.
_NAMES_OOM = re.compile(
    r"out[ _]of[ _]memory|\bOOM\b|memory monitor|low on memory|OutOfMemory", re.IGNORECASE
)


class DeviceFault(RuntimeError):
    """A fault a retry of the same work on the same kind of node cannot mend; its message is
    the one line that names it (``kind`` is one of the constants above)."""

    def __init__(self, kind: str, line: str):
        super().__init__(line)
        self.kind, self.line = kind, line

    def __reduce__(self) -> tuple:  # crosses from a Ray worker to the driver intact
        return DeviceFault, (self.kind, self.line)


def fault_kind(exc: BaseException) -> str | None:
    """Which device fault ``exc`` is, or None when it is not one."""
    if isinstance(exc, DeviceFault):
        return exc.kind
    if isinstance(exc, BatchTooLargeError):
        return OOM_AT_FLOOR
    if is_out_of_memory(exc):
        return OUT_OF_MEMORY
    if is_device_error(exc):
        return DEVICE_ERROR
    return None


def is_device_error(exc: BaseException) -> bool:
    """Whether ``exc`` is a CUDA (or other accelerator) error: ``torch.AcceleratorError``
    where torch has it, else a ``RuntimeError`` whose message names one."""
    import torch

    accelerator = getattr(torch, "AcceleratorError", None)
    if accelerator is not None and isinstance(exc, accelerator):
        return True
    message = str(exc).lower()
    return isinstance(exc, RuntimeError) and any(m in message for m in DEVICE_ERROR_MARKERS)


@contextmanager
def device_faults(shard: int, rows: int) -> Iterator[None]:
    """Turns a device fault raised inside (one model call of ``rows`` rows of ``shard``) into
    a :class:`DeviceFault`; any other error passes unchanged."""
    try:
        yield
    except DeviceFault:
        raise
    except Exception as exc:
        kind = fault_kind(exc)
        if kind is None:
            raise
        raise DeviceFault(kind, fault_line(kind, exc, shard, rows)) from exc


def fault_line(kind: str, exc: BaseException, shard: int, rows: int) -> str:
    """The one line for a fault raised by a model call of ``rows`` rows of ``shard``."""
    cuda = _cuda_in_use()
    device = "CUDA " if cuda else ""
    where = f"on shard {shard}, a call of {rows} rows"
    if kind == OOM_AT_FLOOR:
        size, floor = getattr(exc, "size", None), getattr(exc, "minimum", None)
        if size is not None and floor is not None and size > floor:  # one item alone
            at = f"on a single item of size {size}, the floor of one item,"
        else:
            at = f"at the floor batch size {size if size is not None else floor}"
        what = f"{device}out of memory {at} {where}"
    elif kind == OUT_OF_MEMORY:
        what = f"{device}out of memory {where} (outside any batch back-off)"
    else:
        what = f"{_first_line(exc)} {where}"
    return f"device fault: {what} ({memory_figures(cuda)})"


def oom_killed_line(worker: str, shard: int | None, batch_size: int, events: str) -> str:
    """The one line for a worker the kernel's OOM killer took while computing ``shard``."""
    on = f"on shard {shard}" if shard is not None else "between shards"
    return (
        f"device fault: worker {worker} killed by the kernel's OOM killer {on}, "
        f"batch size {batch_size} (the oom_kill counter of {events} rose; "
        f"{host_memory_figures(Path(events).parent)})"
    )


def memory_figures(cuda: bool | None = None) -> str:
    """The device's memory in use and its size (CUDA), else this process's RSS and the
    memory its cgroup or machine has left."""
    if cuda is None:
        cuda = _cuda_in_use()
    if cuda:
        import torch

        device = torch.cuda.current_device()
        total = torch.cuda.get_device_properties(device).total_memory
        return (
            f"allocated {torch.cuda.memory_allocated(device) / GIB:.1f} GiB, "
            f"reserved {torch.cuda.memory_reserved(device) / GIB:.1f} GiB of {total / GIB:.1f} GiB"
        )
    return f"process RSS {_rss_bytes() / GIB:.1f} GiB, {host_memory_figures()}"


def host_memory_figures(cgroup: Path | None = None) -> str:
    """What is left to allocate: the cgroup's limit less its usage where it has a limit, else
    the machine's available memory."""
    limit = cgroup_limit(cgroup)
    if limit is not None:
        used, cap = limit
        return f"cgroup uses {used / GIB:.1f} GiB of its {cap / GIB:.1f} GiB limit"
    available = _meminfo("MemAvailable")
    total = _meminfo("MemTotal")
    if available is None or total is None:
        return "machine memory unknown"
    return f"machine has {available / GIB:.1f} GiB available of {total / GIB:.1f} GiB"


def cgroup_limit(cgroup: Path | None = None) -> tuple[int, int] | None:
    """(bytes used, byte limit) of the memory cgroup (v2, then v1), or None without a limit."""
    pairs = [("memory.current", "memory.max"), ("memory.usage_in_bytes", "memory.limit_in_bytes")]
    roots = [Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/memory")]
    folders = [cgroup] if cgroup is not None else roots
    for folder in folders:
        for used_name, cap_name in pairs:
            used, cap = _read_int(folder / used_name), _read_int(folder / cap_name)
            # cgroup v1 writes an unlimited cgroup's limit as a page-rounded huge number.
            if used is not None and cap is not None and cap < 1 << 60:
                return used, cap
    return None


def _cuda_in_use() -> bool:
    import torch

    return torch.cuda.is_available() and torch.cuda.is_initialized()


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def _rss_bytes() -> int:
    value = _status("VmRSS:")
    return value if value is not None else 0


def _status(key: str) -> int | None:
    try:
        with open("/proc/self/status") as handle:
            for line in handle:
                if line.startswith(key):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _meminfo(key: str) -> int | None:
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith(f"{key}:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def memory_events_path() -> str | None:
    """The file the kernel counts OOM kills in for this process's cgroup: the setting
    ``NIGHTSHIFT_CGROUP_MEMORY_EVENTS`` where set (an unusual mount), else the first that
    exists of :data:`MEMORY_EVENTS_PATHS`; None where there is none (not Linux)."""
    configured = os.environ.get(MEMORY_EVENTS_SETTING)
    if configured:
        return configured
    return next((p for p in MEMORY_EVENTS_PATHS if os.path.exists(p)), None)


@dataclass
class OomKillCounter:
    """The cgroup's ``oom_kill`` count, and whether it rose since this was made."""

    path: str | None = field(default_factory=memory_events_path)
    baseline: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        self.baseline = self.count()

    def count(self) -> int:
        """The kills counted so far (0 where there is no counter to read)."""
        if self.path is None:
            return 0
        try:
            text = Path(self.path).read_text()
        except OSError:
            return 0
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill" and value.strip().isdigit():
                return int(value)
        return 0

    def rose(self) -> bool:
        return self.count() > self.baseline


@dataclass(frozen=True)
class _Shard:
    slot: int
    index: int
    batch_size: int


class WorkerDeaths:
    """Tells a worker the OOM killer took from one killed otherwise, for a pool of worker
    processes (the Ray actors), by the shards handed to each slot and each slot's process.

    A worker of this machine (the local Ray's) that is gone while the cgroup's OOM kill count
    rose was the OOM killer's: :meth:`check` raises a :class:`DeviceFault` naming the shard it
    was computing. One found gone while the count had not risen was killed otherwise (a
    reclaimed node, an operator): the pool redoes its shard, as before. Workers of other
    machines are Ray's to judge (:func:`ray_fault`)."""

    def __init__(self, counter: OomKillCounter):
        self.counter = counter
        self._here = socket.gethostname()
        self._workers: dict[int, tuple[str, int]] = {}  # slot -> its process (host, pid)
        self._shards: dict[Any, _Shard] = {}  # handle -> the shard it computes, in order given
        self._killed_otherwise: set[tuple[str, int]] = set()

    def watch(self, slot: int, worker: str) -> None:
        """``slot``'s process is ``worker`` (``host:pid``), from now on."""
        host, _, pid = worker.rpartition(":")
        if pid.isdigit():
            self._workers[slot] = (host, int(pid))

    def forget(self, slot: int) -> None:
        """``slot``'s process was killed on purpose (the pool replaces it): not a death."""
        self._workers.pop(slot, None)

    def submitted(self, handle: Any, slot: int, index: int, batch_size: int) -> None:
        self._shards[handle] = _Shard(slot, index, batch_size)

    def shard(self, handle: Any) -> tuple[int, int] | None:
        """The shard ``handle`` computes and its batch size, if it was handed out here."""
        shard = self._shards.get(handle)
        return (shard.index, shard.batch_size) if shard else None

    def finished(self, handle: Any, worker: str | None = None) -> None:
        """``handle`` is done (or cancelled); ``worker`` computed it, so its slot's process."""
        shard = self._shards.pop(handle, None)
        if shard is not None and worker:
            self.watch(shard.slot, worker)

    def check(self) -> None:
        """Raises a :class:`DeviceFault` when a watched worker of this machine is gone and the
        OOM kill count rose."""
        gone = {
            slot: (host, pid)
            for slot, (host, pid) in self._workers.items()
            if host == self._here and (host, pid) not in self._killed_otherwise and not alive(pid)
        }
        if not gone:
            return
        if not self.counter.rose():
            self._killed_otherwise.update(gone.values())
            return
        slot, (host, pid) = next(iter(gone.items()))
        shard = next((s for s in self._shards.values() if s.slot == slot), None)
        raise DeviceFault(
            OOM_KILLED,
            oom_killed_line(
                f"{host}:{pid}",
                shard.index if shard else None,
                shard.batch_size if shard else 0,
                self.counter.path or "the memory cgroup",
            ),
        )


def alive(pid: int) -> bool:
    """Whether process ``pid`` of this machine still runs (a zombie does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process took the number: ours is gone
        return False
    return _state(pid) != "Z"


def _state(pid: int) -> str:
    """The process's state letter (``Z``: a zombie, dead but not yet reaped)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return text.rsplit(")", 1)[-1].split()[0] if ")" in text else ""


def ray_fault(ray: Any, exc: BaseException, shard: int, batch_size: int) -> DeviceFault | None:
    """The device fault a Ray error of a shard's task is, if it is one: Ray's memory monitor
    killed the worker (``OutOfMemoryError``), or the worker died and Ray names out-of-memory
    as the reason."""
    errors = ray.exceptions
    if isinstance(exc, errors.OutOfMemoryError):
        pass
    elif isinstance(exc, errors.RayActorError | errors.WorkerCrashedError):
        if not _NAMES_OOM.search(str(exc)):
            return None
    else:
        return None
    lines = [line.strip() for line in str(exc).splitlines()]
    why = next((line for line in lines if _NAMES_OOM.search(line)), _first_line(exc))
    return DeviceFault(
        OOM_KILLED,
        f"device fault: a Ray worker was killed for memory on shard {shard}, batch size "
        f"{batch_size} ({why})",
    )

"""Choosing the device, precision and CPU threads the engine runs on.

torch is imported by the functions that use it, not by this module: the resource and the asset
definitions import this module, and code servers, sensors and the CLI load those definitions
without running a model, so they need not pay torch's import time and memory
(tests/test_wiring.py checks that the definitions load without it).
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

DEVICES = ("auto", "cpu", "cuda", "mps")
PRECISIONS = ("auto", "fp32", "bf16", "fp16")

# glibc gives each thread that allocates its own malloc arena (up to 8 per core), and an arena
# keeps the pages its thread freed. The engine runs a shard's model calls, the next shard's
# profile and the features of both on different threads, so with an arena each the step's
# resident memory grew with every shard a day has; two arenas share the freed pages out
# (docs/benchmarks.md, "Malloc arenas and the fraud cut"). A MALLOC_ARENA_MAX the user set is kept.
MALLOC_ARENAS = 2
_M_ARENA_MAX = -8  # mallopt's parameter number, from glibc's malloc.h


@dataclass(frozen=True)
class Runtime:
    """Where and in which precision models run."""

    device: torch.device
    # Models run in this precision throughout (weights and activations; scores and pooled
    # vectors are read back in fp32), rather than under torch.autocast: bf16 keeps fp32's range.
    dtype: torch.dtype

    def describe(self) -> str:
        import torch

        name = str(self.device)
        if self.device.type == "cuda":
            name = f"{name} ({torch.cuda.get_device_name(self.device)})"
        return f"{name}, {str(self.dtype).removeprefix('torch.')}"


def resolve_device(spec: str = "auto") -> torch.device:
    """Turns ``auto|cpu|cuda|cuda:N|mps`` into a device, failing clearly if it is absent.

    Args:
        spec: the configured device; ``auto`` picks CUDA, then MPS, then CPU.
    """
    import torch

    kind = spec.split(":", 1)[0]
    if kind not in DEVICES:
        raise ValueError(f"unknown device '{spec}': expected one of auto, cpu, cuda, cuda:N, mps")
    if spec == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    if kind == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(f"device '{spec}' requested but CUDA is not available on this machine")
    if kind == "mps" and not torch.backends.mps.is_available():
        raise RuntimeError(f"device '{spec}' requested but MPS is not available on this machine")
    return torch.device(spec)


def resolve_dtype(precision: str, device: torch.device) -> torch.dtype:
    """Picks the compute precision: ``auto`` is bf16 on GPUs that support it, else fp32.

    CPU stays fp32 under ``auto``: bf16 matmuls on CPUs without AMX are slower, not faster.
    """
    import torch

    if precision not in PRECISIONS:
        raise ValueError(
            f"unknown precision '{precision}': expected one of {', '.join(PRECISIONS)}"
        )
    if precision == "fp32":
        return torch.float32
    if precision == "bf16":
        return torch.bfloat16
    if precision == "fp16":
        return torch.float16
    if device.type == "cuda" and torch.cuda.is_bf16_supported():
        return torch.bfloat16
    return torch.float32


def to_device(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor on ``device``; on CUDA through page-locked memory, without blocking.

    The copy is queued behind the model's work on the current stream and the host returns at
    once, so it can prepare the next batch while the GPU runs; torch's pinned-memory cache
    reuses the page-locked block only after the copy that read it has finished. Callers read
    results back with one synchronising ``.cpu()`` per call, not per batch. On the CPU the
    tensor itself is returned (no copy).
    """
    if device.type != "cuda":
        return tensor.to(device)
    if not tensor.is_pinned():
        tensor = tensor.pin_memory()
    return tensor.to(device, non_blocking=True)


def limit_malloc_arenas(arenas: int = MALLOC_ARENAS) -> bool:
    """Caps glibc's malloc arenas for the threads created from now on (see
    :data:`MALLOC_ARENAS`); False where the C library is not glibc or the user chose a cap."""
    if "MALLOC_ARENA_MAX" in os.environ:
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (AttributeError, OSError):
        return False
    return bool(mallopt(_M_ARENA_MAX, arenas))


def configure_cpu_threads(threads: int | None = None) -> int:
    """Sets torch's intra-op threads to the cores this process may use, and returns it."""
    import torch

    if threads is None:
        try:
            threads = len(os.sched_getaffinity(0))
        except AttributeError:
            threads = os.cpu_count() or 1
    torch.set_num_threads(max(1, threads))
    return torch.get_num_threads()


def make_runtime(device: str = "auto", precision: str = "auto") -> Runtime:
    resolved = resolve_device(device)
    return Runtime(device=resolved, dtype=resolve_dtype(precision, resolved))

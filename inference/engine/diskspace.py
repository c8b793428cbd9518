"""Writes that run out of space: an error that names the file and the space left."""

from __future__ import annotations

import errno
import os
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager


class StorageFullError(OSError):
    """A write failed for lack of space; the message names the file and the space left."""


def no_space(exc: OSError) -> bool:
    """Whether a write failed because the device is full (pyarrow keeps only the message)."""
    return exc.errno == errno.ENOSPC or "No space left on device" in str(exc)


def free_space(path: str) -> str:
    """``" (0 B free of 2.0 MiB on /mnt/out)"`` for a local path; "" when it cannot be told."""
    folder = os.path.dirname(path)
    while folder and not os.path.isdir(folder):
        folder = os.path.dirname(folder)
    try:
        usage = shutil.disk_usage(folder or "/")
    except OSError:
        return ""
    return f" ({_size(usage.free)} free of {_size(usage.total)} on {folder})"


@contextmanager
def writing(
    path: str,
    where: str | None = None,
    cleanup: Callable[[], None] | None = None,
    local: bool = True,
) -> Iterator[None]:
    """Around a write of ``path``: on failure runs ``cleanup`` (remove the temporary file), and
    turns running out of space into a StorageFullError naming ``where`` (default ``path``) and,
    for a local path, the free space."""
    try:
        yield
    except OSError as exc:
        if cleanup is not None:
            try:
                cleanup()
            except OSError:
                pass  # the original error says more than a failed clean-up
        if no_space(exc) and not isinstance(exc, StorageFullError):
            space = free_space(path) if local else ""
            raise StorageFullError(
                errno.ENOSPC,
                f"no space left on device writing {where or path}{space}; nothing was published",
            ) from exc
        raise


def _size(n: float) -> str:
    if n < 1024:
        return f"{n:,.0f} B"
    for unit in ("KiB", "MiB", "GiB"):
        n /= 1024
        if n < 1024 or unit == "GiB":
            break
    return f"{n:,.1f} {unit}"

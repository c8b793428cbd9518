"""Errors a retry cannot mend, turned into one failure that says what is wrong, where, and how
to fix it, instead of spending the retry budget (and its back-off) on them.

Permanent: missing or malformed landing data, no trained model, a model version whose files
are missing or damaged, an unusable checkpoint, and a storage layout the job cannot write to
(a file where a folder must be, a folder where a file must be, a folder it may not write).
A retry would read the same bytes or meet the same folder. So would the faults of the device or
the node (inference/engine/faults.py): out of memory at the batch floor, a CUDA device error, a
worker the kernel's OOM killer took; :func:`device_fault_failure` names them the same way.
"""

from __future__ import annotations

import getpass
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from dagster import Failure

from assets.wiring import TRAINED_BY
from inference.engine.faults import (
    DEVICE_ERROR,
    OOM_AT_FLOOR,
    OOM_KILLED,
    OOM_KILLED_STEP,
    OUT_OF_MEMORY,
    DeviceFault,
)
from inference.generation.generate import CheckpointError
from inference.models.modelstore import ModelNotFoundError, ModelUnusableError
from resources.storage import LandingDataError

# What the storage refuses for good: no retry moves a file or changes a folder's permissions.
STORAGE_LAYOUT_ERRORS = (NotADirectoryError, IsADirectoryError, PermissionError)

PERMANENT_INPUT_ERRORS = (
    LandingDataError,
    ModelNotFoundError,
    ModelUnusableError,
    CheckpointError,
    *STORAGE_LAYOUT_ERRORS,
)

# pyarrow names the path in its message ("Cannot create directory '/x/y'") but not in
# OSError.filename.
_QUOTED_PATH = re.compile(r"'([^']+)'")


@contextmanager
def fail_fast_on_bad_input() -> Iterator[None]:
    """Fails the step at once with the reason, instead of spending the retry budget on it."""
    try:
        yield
    except PERMANENT_INPUT_ERRORS as exc:
        raise Failure(description=str(exc) + how_to_fix(exc), allow_retries=False) from exc


def how_to_fix(exc: Exception) -> str:
    """What the operator does about it, where the message alone does not say."""
    if isinstance(exc, ModelNotFoundError):
        train = "".join(f", or run `{job}`" for job in _training_jobs(exc.name)[:1])
        return (
            f". To fix it, train the model once: materialise the `{exc.name}` asset (Materialize "
            f"on its page in the UI, or `dagster asset materialize -m orchestration.definitions "
            f"--select {exc.name}`){train}; then run this again"
        )
    if isinstance(exc, ModelUnusableError):
        retrain = " or ".join(
            [f"`{job}`" for job in _training_jobs(exc.name)]
            + [f"materialise `{exc.name}` with `retrain: true`"]
        )
        return (
            f". A retry reads the same files. To fix it, retrain with {retrain} and make the "
            f"new version the champion with `nightshift promote {exc.name} --force --reason "
            f'"..."` (the gate cannot compare it with a damaged champion), or restore the model '
            f"folder {exc.folder} from a backup; then run this again"
        )
    if isinstance(exc, STORAGE_LAYOUT_ERRORS):
        return _storage_fix(exc)
    return ""


def _training_jobs(model: str) -> list[str]:
    """The jobs the domains declare to retrain ``model``."""
    return TRAINED_BY.get(model, [])


def _storage_fix(exc: OSError) -> str:
    """Names the file or folder in the way, found from the path the storage refused."""
    path = exc.filename or next(iter(_QUOTED_PATH.findall(str(exc))), None)
    if path is None:
        return (
            ". A retry meets the same storage. To fix it, check the data root's folders "
            "(NIGHTSHIFT_DATA_ROOT); then run this again"
        )
    elsewhere = "or point NIGHTSHIFT_DATA_ROOT at another data root; then run this again"
    blocker = _existing_ancestor(path)
    if isinstance(exc, NotADirectoryError):
        return (
            f". A retry meets the same storage: {blocker} is a file where nightshift keeps a "
            f"folder. To fix it, move that file away or delete it (nightshift recreates the "
            f"folder), {elsewhere}"
        )
    if isinstance(exc, IsADirectoryError):
        return (
            f". A retry meets the same storage: {path} is a folder where nightshift writes a "
            f"file. To fix it, move that folder away, {elsewhere}"
        )
    return (
        f". A retry meets the same storage: {_user()} may not write to {blocker}. To fix it, "
        f"make it writable (`chmod -R u+w {blocker}`, and `chattr -R -i {blocker}` where it "
        f"was made immutable), {elsewhere}"
    )


def _existing_ancestor(path: str) -> str:
    """The path itself, or its nearest parent that exists: what is in the way of writing it."""
    if "://" in path:  # an object store: there is no local folder to inspect
        return path
    here = Path(path)
    while not os.path.lexists(here) and here != here.parent:
        here = here.parent
    return str(here)


def _user() -> str:
    try:
        return f"the user running the job ({getpass.getuser()})"
    except (KeyError, OSError):
        return "the user running the job"


# What the operator does about each device fault: a retry meets the same batch on the same kind
# of node, so each says what to change before the rerun.
_DEVICE_FIXES = {
    OOM_AT_FLOOR: (
        "a retry meets the same rows on the same device. To fix it, run the day on a device "
        "with more memory, or make one batch at the floor smaller (a lower precision: the "
        "inference resource's `precision` bf16 or fp16; or a smaller model)"
    ),
    OUT_OF_MEMORY: (
        "a retry meets the same batch on the same device. To fix it, lower the batch size "
        "(NIGHTSHIFT_MAX_BATCH_SIZE or the spec's batch size) or run on a device with more "
        "memory"
    ),
    DEVICE_ERROR: (
        "a CUDA error leaves the process's device context unusable. To fix it, check the node "
        "(nvidia-smi, and Xid errors in dmesg) and replace it if it reports ECC or Xid errors; "
        "a device-side assert is usually an input the model indexes out of range"
    ),
    OOM_KILLED: (
        "the workers need more memory than the node has. To fix it, lower the rows per shard "
        "(NIGHTSHIFT_SHARD_ROWS), the batch size or the workers per node "
        "(NIGHTSHIFT_RAY_WORKERS), or run on a node with more memory"
    ),
    OOM_KILLED_STEP: (
        "its relaunch would meet the same wall. To fix it, lower the batch size "
        "(NIGHTSHIFT_MAX_BATCH_SIZE or the spec's batch size) or the rows per shard "
        "(NIGHTSHIFT_SHARD_ROWS; a changed shard size starts the day over), or give the run "
        "more memory (a bigger node, or the run's `ecs/memory` tag on ECS); the kill is "
        "reported once, and the next launch proceeds"
    ),
}


def device_fault_failure(exc: DeviceFault, day: str | None, shards_kept: int) -> Failure:
    """The step's failure for a device fault: its one line, where (``day``: asset and date),
    what to change, and that the finished shards wait in staging for the rerun; not retried,
    and not an interruption the daemon relaunches."""
    where = f"{day}: " if day else ""
    shards = "shard is" if shards_kept == 1 else "shards are"
    kept = (
        f"{shards_kept} finished {shards} kept: the rerun resumes from them"
        if shards_kept
        else "No shard had finished"
    )
    return Failure(
        description=f"{where}{exc.line}. Not retried: {_DEVICE_FIXES[exc.kind]}; then run "
        f"the day again. {kept}.",
        metadata={"device_fault": exc.kind, "fault": exc.line, "shards_kept": shards_kept},
        allow_retries=False,
    )

"""Model aliases on the model store: which version scores (``champion``) and which waits for
promotion (``challenger``), with the history of every move.

The conventions are MLflow's: a name has versions, an alias names one version, and
``models:/<name>@<alias>`` or ``models:/<name>/<version>`` names a model. The store is the one
``inference/models/modelstore.py`` writes (safetensors, manifest, content hash per version); beside the
versions of ``<models>/<name>/`` live

- ``CURRENT``: the champion's version. It keeps the name it had before aliases existed, so a
  store written then reads its ``CURRENT`` as champion, and ``load_model`` without a version
  loads the champion;
- ``CHALLENGER``: the challenger's version (absent or empty: none);
- ``aliases.json``: every alias move, oldest first (who, when, why, forced or measured).

The history is written before the pointer it explains, so a pointer never moves unrecorded.
Given the store's compare-and-swap (``cas``), every move holds the name's lease
(``_aliases.lease``) from reading the history to writing the pointer, so two moves at once (two
retrains, a retrain and a promotion) never lose one another's history entry or pointer.
Nothing here moves the champion except ``promote``; ``register`` saves a version as the
challenger, or as the champion when the name has none yet (nothing to compare it with).
"""

from __future__ import annotations

import getpass
import json
import os
import re
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from inference.engine.leases import CasStore, PartitionLeasedError, acquire_lease
from inference.models import mlflow_registry
from inference.models.modelstore import (
    ModelNotFoundError,
    ReadBytes,
    WriteBytes,
    current_version,
    save_model,
)

if TYPE_CHECKING:
    import torch

CHAMPION = "champion"
CHALLENGER = "challenger"
ALIASES = (CHAMPION, CHALLENGER)
FIRST_VERSION_REASON = "first version of the model: no champion to compare it with"

# How long a move waits for another move of the same name's aliases (each takes milliseconds),
# and how long the lease lasts if its holder dies mid-move.
LOCK_WAIT_SECONDS = 30.0
LOCK_LEASE_SECONDS = 60.0

_URI = re.compile(r"^models:/(?P<name>[^/@]+)(?:@(?P<alias>[\w-]+)|/(?P<version>[\w.-]+))$")


@dataclass(frozen=True)
class AliasChange:
    """One move of an alias. ``version`` None: the alias was removed (a challenger promoted).

    Attributes:
        alias: ``champion`` or ``challenger``.
        version: the version it names from then on, or None once removed.
        at: when, ISO-8601 in UTC (``2026-12-01T23:40:05+00:00``).
        by: who or what moved it (a user, ``run <id>``).
        reason: why, in words (a gate's figures, a ``--force`` reason).
        forced: moved by hand past the promotion gate.
    """

    alias: str
    version: str | None
    at: str
    by: str
    reason: str
    forced: bool = False


@dataclass(frozen=True)
class ModelUri:
    """A parsed ``models:/name@alias`` or ``models:/name/version``."""

    name: str
    alias: str | None = None
    version: str | None = None


def parse_model_uri(uri: str) -> ModelUri:
    """``models:/fraud_model@champion`` -> ModelUri("fraud_model", alias="champion")."""
    match = _URI.match(uri)
    if not match:
        raise ValueError(
            f"'{uri}' is not a model URI: expected models:/<name>@<alias> or "
            "models:/<name>/<version>"
        )
    return ModelUri(match["name"], match["alias"], match["version"])


def resolve(read: ReadBytes, models_dir: str, uri: str) -> str:
    """The version a model URI names; raises ModelNotFoundError when its alias names none."""
    parsed = parse_model_uri(uri)
    if parsed.version:
        return parsed.version
    if parsed.alias == CHAMPION:
        return champion_version(read, models_dir, parsed.name)
    if parsed.alias == CHALLENGER:
        version = challenger_version(read, models_dir, parsed.name)
        if version is None:
            raise ModelNotFoundError(f"model '{parsed.name}' has no challenger", parsed.name)
        return version
    raise ValueError(f"'{uri}': unknown alias '{parsed.alias}' (known: {', '.join(ALIASES)})")


def champion_version(read: ReadBytes, models_dir: str, name: str) -> str:
    """The version that scores; raises ModelNotFoundError when the name has none."""
    return current_version(read, models_dir, name)


def challenger_version(read: ReadBytes, models_dir: str, name: str) -> str | None:
    """The version waiting for promotion, or None."""
    try:
        version = read(f"{models_dir}/{name}/CHALLENGER").decode().strip()
    except (FileNotFoundError, OSError):
        return None
    return version or None


def alias_history(read: ReadBytes, models_dir: str, name: str) -> list[AliasChange]:
    """Every alias move of the name, oldest first (empty for a store older than aliases)."""
    path = f"{models_dir}/{name}/aliases.json"
    try:
        raw = read(path)
    except (FileNotFoundError, OSError):
        return []
    try:
        return [AliasChange(**entry) for entry in json.loads(raw)["history"]]
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"model '{name}': {path} is not an alias history ({exc})") from exc


def champion_on(read: ReadBytes, models_dir: str, name: str, date: str) -> str | None:
    """The version that was champion at the end of UTC day ``date`` (``YYYY-MM-DD``), or None
    when none was yet, or the store has no history (it predates aliases)."""
    version = None
    for change in alias_history(read, models_dir, name):
        if change.alias == CHAMPION and change.at[:10] <= date:
            version = change.version
    return version


def trained_window(manifest: dict[str, Any]) -> tuple[str, str] | None:
    """The first and last day of data a version trained on, from its manifest, or None when
    the manifest does not say (a model saved by hand without its window)."""
    window = manifest.get("trained_window")
    if window:
        return window["from"], window["through"]
    trained_on = manifest.get("trained_on") or {}
    if trained_on.get("dates"):
        dates = sorted(trained_on["dates"])
        return dates[0], dates[-1]
    if trained_on.get("first_date") and trained_on.get("last_date"):
        return trained_on["first_date"], trained_on["last_date"]
    return None


def window_of(dates: list[str]) -> dict[str, str]:
    """The manifest entry recording a training window: ``{"from": first, "through": last}``."""
    if not dates:
        raise ValueError("a model trains on at least one day of data")
    return {"from": min(dates), "through": max(dates)}


def default_actor() -> str:
    """Who moves an alias when the caller does not say: ``$NIGHTSHIFT_USER``, else the login."""
    try:
        return os.environ.get("NIGHTSHIFT_USER") or getpass.getuser()
    except (KeyError, OSError):
        return "unknown"


def register(
    read: ReadBytes,
    write: WriteBytes,
    models_dir: str,
    name: str,
    tensors: dict[str, torch.Tensor],
    manifest: dict,
    by: str | None = None,
    cas: CasStore | None = None,
) -> tuple[str, str]:
    """Saves a new version and makes it the challenger, or the champion when the name has none.

    ``cas``: the store's compare-and-swap, to hold the name's aliases while they move.

    Returns:
        (version, the alias it now holds: ``champion`` or ``challenger``). Retraining to the
        very version that is champion moves nothing and returns ``champion``.
    """
    version = save_model(write, models_dir, name, tensors, manifest)
    by = by or default_actor()
    mirror = mlflow_registry.from_env()
    if mirror is not None:
        folder, window = f"{models_dir}/{name}/{version}", trained_window(manifest)
        trained = f"trained on {window[0]}..{window[1]}" if window else "training window unknown"
        mirror.register_version(name, version, folder, f"nightshift {name} {version}, {trained}")
    with aliases_locked(cas, models_dir, name):
        try:
            champion = champion_version(read, models_dir, name)
        except ModelNotFoundError:
            _promote(read, write, models_dir, name, version, by, FIRST_VERSION_REASON, False)
            return version, CHAMPION
        if champion == version:
            return version, CHAMPION
        reason = f"trained to replace champion {champion}; waits for the promotion gate"
        change = AliasChange(CHALLENGER, version, _now(), by, reason)
        _record(read, write, models_dir, name, change)
        write(f"{models_dir}/{name}/CHALLENGER", version.encode())
    return version, CHALLENGER


def promote(
    read: ReadBytes,
    write: WriteBytes,
    models_dir: str,
    name: str,
    version: str,
    by: str | None = None,
    reason: str = "",
    forced: bool = False,
    cas: CasStore | None = None,
) -> AliasChange:
    """Makes ``version`` the champion; the challenger alias is removed if it named it.

    The version's files must exist (its manifest is read first), so an alias never names a
    version that was never saved. ``cas``: as for :func:`register`.
    """
    with aliases_locked(cas, models_dir, name):
        return _promote(read, write, models_dir, name, version, by, reason, forced)


def _promote(
    read: ReadBytes,
    write: WriteBytes,
    models_dir: str,
    name: str,
    version: str,
    by: str | None,
    reason: str,
    forced: bool,
) -> AliasChange:
    try:
        read(f"{models_dir}/{name}/{version}/manifest.json")
    except (FileNotFoundError, OSError) as exc:
        raise ModelNotFoundError(
            f"model '{name}' has no version {version} under {models_dir}/{name}", name
        ) from exc
    change = AliasChange(CHAMPION, version, _now(), by or default_actor(), reason, forced)
    _record(read, write, models_dir, name, change)
    write(f"{models_dir}/{name}/CURRENT", version.encode())
    if challenger_version(read, models_dir, name) == version:
        cleared = AliasChange(CHALLENGER, None, change.at, change.by, f"promoted to {CHAMPION}")
        _record(read, write, models_dir, name, cleared)
        write(f"{models_dir}/{name}/CHALLENGER", b"")
    return change


class AliasesBusyError(RuntimeError):
    """Another move of the same name's aliases held them for longer than a move takes."""


@contextmanager
def aliases_locked(cas: CasStore | None, models_dir: str, name: str) -> Iterator[None]:
    """Holds ``name``'s alias lease while the body moves its aliases (no lease when ``cas`` is
    None); waits up to :data:`LOCK_WAIT_SECONDS` for a move in progress elsewhere.

    Raises:
        AliasesBusyError: the lease stayed held by another live holder all that time.
    """
    if cas is None:
        yield
        return
    path = f"{models_dir}/{name}/_aliases.lease"
    lineage = f"aliases-{uuid.uuid4().hex}"  # this move only: never takes over another's
    deadline = time.monotonic() + LOCK_WAIT_SECONDS
    while True:
        try:
            lease = acquire_lease(cas, path, lineage, LOCK_LEASE_SECONDS)
            break
        except PartitionLeasedError as busy:
            if time.monotonic() > deadline:
                raise AliasesBusyError(
                    f"the aliases of model '{name}' stayed held by another move for "
                    f"{LOCK_WAIT_SECONDS:.0f} s ({busy}); retry once it is done, or delete "
                    f"{path} if its holder is gone"
                ) from busy
            time.sleep(0.05)
    try:
        yield
    finally:
        lease.release()


def _record(
    read: ReadBytes, write: WriteBytes, models_dir: str, name: str, change: AliasChange
) -> None:
    """Appends the move to the history, making it on MLflow first when mirrored, so a move
    MLflow refuses is made nowhere."""
    mirror = mlflow_registry.from_env()
    if mirror is not None:
        _mirror(mirror, models_dir, name, change)
    history = [*alias_history(read, models_dir, name), change]
    body = {"name": name, "history": [asdict(c) for c in history]}
    write(f"{models_dir}/{name}/aliases.json", json.dumps(body, indent=2).encode())


def _mirror(
    mirror: mlflow_registry.MlflowRegistry, models_dir: str, name: str, change: AliasChange
) -> None:
    """The alias move on MLflow, with who, why and whether forced as tags of the version (a
    version saved before the mirror was set up is registered first)."""
    if change.version is None:
        mirror.delete_alias(name, change.alias)
        return
    folder = f"{models_dir}/{name}/{change.version}"
    mirror.register_version(name, change.version, folder, f"nightshift {name} {change.version}")
    moved = {"by": change.by, "reason": change.reason, "forced": str(change.forced).lower()}
    tags = {f"nightshift.{change.alias}_{k}": v for k, v in moved.items()}
    mirror.set_alias(name, change.alias, change.version, tags)


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")

"""What a downstream asset reads: its parents' days at the snapshots their materialisations
recorded, not whatever main holds when it runs.

A parent's materialisation of a day records, under :data:`SNAPSHOTS`, the snapshot that put the
day on main in each table it published (the output and its companions). A downstream asset pins
its reads of those days to them (``OutputStore.pinned``): every read in its step sees one
consistent version of each parent day, even while another run or node re-publishes it, and the
figures it records match what it read. ``nightshift outputs rollback`` records a materialisation
of the day it rolled back, so the next downstream run reads the restored day.

A check on an asset reads the same way: the asset's own day at the snapshots its
materialisation published, and what the asset read at the snapshots it read
(``digest_covers_every_document``).

A parent day with no recorded snapshot (materialised before they were recorded, or refused by
its checks, which leaves main as it was) is read as main holds it; so is one whose snapshot
upkeep has expired, with a warning.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from dagster import AssetCheckExecutionContext, AssetExecutionContext, MetadataValue

from assets.days import latest_materialization
from resources.storage import DataStore

SNAPSHOTS, READ = "table_snapshots", "read_snapshots"


def snapshot_metadata(snapshots: Mapping[str, int]) -> dict[str, Any]:
    """The metadata entry that hands a day's snapshots to the assets downstream."""
    return {SNAPSHOTS: MetadataValue.json(dict(snapshots))} if snapshots else {}


def handed(
    context: AssetExecutionContext | AssetCheckExecutionContext,
    store: DataStore,
    parents: Sequence[str],
    date: str,
    entry_name: str = SNAPSHOTS,
) -> dict[tuple[str, str], int]:
    """``(table, date) -> snapshot`` of every table the parents' latest materialisations of
    ``date`` published (with ``entry_name`` :data:`READ`: every table they read), for
    ``store.pinned``."""
    pins: dict[tuple[str, str], int] = {}
    for parent in parents:
        found = latest_materialization(context, parent, date)
        materialization = found.asset_materialization if found is not None else None
        entry = materialization.metadata.get(entry_name) if materialization else None
        for table, snapshot_id in (entry.value if entry is not None else {}).items():
            if store.tables.snapshot(table, int(snapshot_id)) is None:
                context.log.warning(
                    f"{table} {date}: snapshot {snapshot_id}, which {parent}'s materialisation "
                    "handed on, has expired; reading the day as main holds it"
                )
                continue
            pins[(table, date)] = int(snapshot_id)
    return pins


def read_at(pins: Mapping[tuple[str, str], int]) -> dict[str, Any]:
    """The metadata entry that says which snapshots a downstream day read."""
    return {READ: MetadataValue.json({t: s for (t, _), s in pins.items()})} if pins else {}

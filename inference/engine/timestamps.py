"""Timestamps written without a time zone, read as wall-clock time in a zone the data owner names.

A parquet timestamp without a time zone (Arrow ``timestamp[us]``, Parquet
``isAdjustedToUTC=false``) is a clock reading, not an instant. Casting it to
``timestamp[us, tz=UTC]`` reads it as UTC, which moves a local day's evening rows into the next
UTC day. Landing contracts therefore reject such columns unless the dataset's landing timezone
says whose clock it is; this module turns the readings into instants in that zone.

At a daylight-saving change a reading may not name one instant:

- ambiguous (the hour repeated when clocks go back): the earlier instant, still summer time,
  as Python's ``fold=0`` and Java's ``ZonedDateTime`` choose; the reading cannot say which.
- nonexistent (the hour skipped when clocks go forward): an error naming the column and the
  first such reading, since a clock in that zone never shows it: the data is not that zone's
  wall-clock time.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc


class NonexistentTimeError(ValueError):
    """A wall-clock reading that the zone's clocks skip (the change to summer time)."""


@dataclass(frozen=True)
class LandingTimezones:
    """The zone whose wall-clock time each landing dataset's naive timestamps are.

    Args:
        default: the zone for every dataset not named in ``per_dataset``; None rejects them.
        per_dataset: dataset name -> zone.
    """

    default: str | None = None
    per_dataset: dict[str, str] = field(default_factory=dict)

    @classmethod
    def parse(cls, spec: str | None) -> LandingTimezones:
        """Reads ``America/New_York`` (every dataset), ``transactions=America/New_York,
        documents=Europe/Paris`` (per dataset) or both mixed; empty or None: none.

        Raises:
            ValueError: an unknown zone, an empty entry or two defaults, naming the entry.
        """
        default, per_dataset = None, {}
        for entry in (spec or "").split(","):
            entry = entry.strip()
            if not entry:
                continue
            dataset, _, zone = entry.rpartition("=")
            zone, dataset = check_zone(zone.strip(), entry), dataset.strip()
            if dataset:
                per_dataset[dataset] = zone
            elif default is not None:
                raise ValueError(
                    f"landing timezone {spec!r}: two zones for every dataset ({default}, {zone}); "
                    "name the dataset for one of them (dataset=Zone)"
                )
            else:
                default = zone
        return cls(default, per_dataset)

    def for_dataset(self, dataset: str) -> str | None:
        return self.per_dataset.get(dataset, self.default)


def check_zone(zone: str, entry: str | None = None) -> str:
    """Returns ``zone`` if Arrow's time zone database knows it, else raises ValueError."""
    try:
        pc.assume_timezone(pa.array([0], pa.timestamp("us")), zone)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise ValueError(
            f"landing timezone {entry or zone!r}: unknown time zone {zone!r} "
            "(expected an IANA name such as America/New_York, or UTC)"
        ) from exc
    return zone


def is_naive_for(found: pa.DataType, expected: pa.DataType) -> bool:
    """Whether ``found`` is a timestamp without a time zone where ``expected`` has one."""
    return (
        pa.types.is_timestamp(found)
        and pa.types.is_timestamp(expected)
        and found.tz is None
        and expected.tz is not None
    )


def localize(batch: pa.RecordBatch, target: pa.Schema, zone: str) -> pa.RecordBatch:
    """Reads the batch's naive timestamp columns that ``target`` wants with a time zone as
    ``zone``'s wall-clock time; a cast to ``target`` then keeps the instants.

    Raises:
        NonexistentTimeError: a reading the zone's clocks skip, naming the column and the first.
    """
    columns = list(batch.columns)
    for i, name in enumerate(batch.schema.names):
        if name in target.names and is_naive_for(columns[i].type, target.field(name).type):
            columns[i] = _assume(columns[i], name, zone)
    return pa.RecordBatch.from_arrays(columns, names=batch.schema.names)


def _assume(column: pa.Array, name: str, zone: str) -> pa.Array:
    try:
        return pc.assume_timezone(column, zone, ambiguous="earliest", nonexistent="raise")
    except pa.ArrowInvalid:
        early = pc.assume_timezone(column, zone, ambiguous="earliest", nonexistent="earliest")
        late = pc.assume_timezone(column, zone, ambiguous="earliest", nonexistent="latest")
        skipped = pc.fill_null(pc.not_equal(early, late), False)
        gaps = column.filter(skipped)
        if not len(gaps):
            raise
        raise NonexistentTimeError(
            f"column '{name}' holds {len(gaps)} wall-clock time(s) that do not exist in {zone}, "
            f"the first {gaps[0].as_py()}: its clocks skip them when summer time starts, so "
            f"these timestamps are not wall-clock time in {zone}"
        ) from None

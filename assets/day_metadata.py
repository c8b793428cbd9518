"""How a scored day's metadata is laid out in the UI: what an operator reads first, what is
plotted, and one table with the rest.

The UI lists a materialisation's metadata in the order it is given and plots every top-level
number over partitions and time. A scored day carries some fifty figures; laid out flat, the
row count and the output path sit halfway down and the Plots tab shows forty charts. Here the
headline comes first (rows, output, quarantine, model version, throughput, cost, interruptions,
rework), its numbers are the only plotted series, and every other figure is a row of one
``detail`` table (kept in full: :func:`day_entries` and :func:`day_figures` read a day's figures
back, headline and detail alike).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dagster import (
    BoolMetadataValue,
    FloatMetadataValue,
    IntMetadataValue,
    MetadataValue,
    TableColumn,
    TableMetadataValue,
    TableRecord,
    TableSchema,
    TextMetadataValue,
)

DETAIL = "detail"

# The plotted series, in the order the Overview lists them: how much, how bad, which model,
# how fast, how long, what it cost, how often the node was taken away and what that redid.
PLOTTED = (
    "dagster/row_count",
    "quarantine_rate",
    "model_version_changed",
    "rows_per_second",
    "seconds",
    "cost_usd",
    "interruptions",
    "rows_redone",
)

# The headline, in order: the plotted numbers with what explains them (where the output and
# the quarantined rows are, why rows were quarantined, which model, a readable summary).
HEADLINE = (
    "dagster/row_count",
    "output",
    "quarantine_rate",
    "quarantine",
    "quarantine_reasons",
    "model_version",
    "model_version_changed",
    "rows_per_second",
    "seconds",
    "cost",
    "cost_usd",
    "interruptions",
    "rows_redone",
    "summary",
)

# The detail table's first rows: where the day's rows went (the table runs to some fifty rows,
# and rows_quarantined sat at its bottom).
DETAIL_FIRST = ("rows_in", "rows_out", "rows_quarantined", "rows_scored", "commit")

DETAIL_SCHEMA = TableSchema(
    columns=[
        TableColumn("figure", "string", description="the metadata key"),
        TableColumn("value", "string", description="its value for this day"),
    ]
)

Scalar = str | int | float | bool


def day_metadata(figures: Mapping[str, Any]) -> dict[str, Any]:
    """A scored day's figures laid out for the UI: the headline in :data:`HEADLINE` order,
    then one ``detail`` table of every other scalar figure (numbers and texts; those of
    :data:`DETAIL_FIRST` first, the rest in the order given), then the remaining tables and
    structured values (never plotted).

    A number outside :data:`PLOTTED` is never a top-level entry, so the Plots tab shows only
    the series an operator reads.
    """
    if "cost_usd" in figures and "cost" not in figures:
        figures = {**figures, "cost": MetadataValue.text(cost_text(figures))}
    headline = {key: figures[key] for key in HEADLINE if key in figures}
    detail: list[TableRecord] = []
    structured: dict[str, Any] = {}
    first = [key for key in DETAIL_FIRST if key in figures]
    for key in [*first, *(k for k in figures if k not in first)]:
        value = figures[key]
        if key in headline:
            continue
        scalar = _scalar(value)
        if scalar is None:
            structured[key] = value
        else:
            detail.append(TableRecord({"figure": key, "value": scalar}))
    return {
        **headline,
        DETAIL: MetadataValue.table(records=detail, schema=DETAIL_SCHEMA),
        **structured,
    }


def cost_text(figures: Mapping[str, Any]) -> str:
    """The day's cost with its unit and basis, as a person reads it: the UI shows a number
    with its key only (``cost_usd 0.000979``), and plots that one."""
    usd = float(getattr(figures["cost_usd"], "value", figures["cost_usd"]))
    basis = getattr(figures.get("cost_basis"), "value", figures.get("cost_basis"))
    return f"${usd:,.6f} (USD{f', {basis}' if basis else ''})"


def day_entries(metadata: Mapping[str, Any]) -> dict[str, Any]:
    """Every entry of a materialisation's metadata by name, each row of the ``detail`` table as
    the metadata value it was (int, float, text, bool): what a test, a benchmark or the CLI
    reads back. Metadata without a detail table (landing, alerts, models) reads unchanged."""
    entries: dict[str, Any] = {}
    for key, value in metadata.items():
        if key == DETAIL and isinstance(value, TableMetadataValue):
            entries.update({r.data["figure"]: _entry(r.data["value"]) for r in value.records})
        else:
            entries[key] = value
    return entries


def day_figures(metadata: Mapping[str, Any]) -> dict[str, Any]:
    """Every figure of a materialisation's metadata by name, as plain values."""
    return {key: getattr(v, "value", v) for key, v in day_entries(metadata).items()}


def _entry(value: Scalar) -> MetadataValue:
    if isinstance(value, bool):
        return MetadataValue.bool(value)
    if isinstance(value, int):
        return MetadataValue.int(value)
    if isinstance(value, float):
        return MetadataValue.float(value)
    return MetadataValue.text(value)


def _scalar(value: Any) -> Scalar | None:
    """The value as a table cell, or None for what is not one scalar (a table, a path, JSON,
    markdown: those stay entries of their own, rendered as such)."""
    scalars = IntMetadataValue | FloatMetadataValue | TextMetadataValue | BoolMetadataValue
    if isinstance(value, scalars):
        return value.value
    if isinstance(value, bool | int | float | str):
        return value
    return None

"""One partition's scoring as a domain describes it to the engine: its input, its model
program, its output and its sizes. The engine owns what follows from them: shards, the
checkpoint's fingerprint, quarantine, the exactly-once commit."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import pyarrow as pa

from inference.engine.quarantine import QuarantinePlan
from inference.engine.shard_worker import ModelStep, ShardInput, ShardProgram

# Input rows per shard unless the asset or the resource says otherwise.
DEFAULT_SHARD_ROWS = 50_000


def quarantine_asset(asset: str) -> str:
    """Where an asset's quarantined rows are published: ``outputs/<asset>_quarantine/``."""
    return f"{asset}_quarantine"


class Sample(Protocol):
    """Where output rows go as they stream: the output checks' sample."""

    def add(self, rows: pa.Table) -> None: ...


ROW_RANGES = {"shard_layout": "row_ranges"}


@dataclass
class Input:
    """A partition's input: its rows, how they are cut into shards, what is set aside.

    Args:
        batches: the input stream in a deterministic order, cut into row ranges of the
            partition's shard rows.
        shards: instead, the domain's own cut, called once staging is settled: each shard
            carries every row its state depends on (fraud: all rows of a set of accounts).
        quarantine: rows to set aside, never scored, published to
            ``outputs/<asset>_quarantine/``; the runner fails the day above its limit.
        files: the input files, whose identity is part of the checkpoint's fingerprint
            (the runner's default: the spec's dataset's landing files of the day).
        layout: what decides which rows a shard holds; part of the fingerprint, so progress
            of another layout is never mixed in.
    """

    batches: Iterable[pa.RecordBatch] = ()
    shards: Callable[[], Iterable[ShardInput]] | None = None
    quarantine: QuarantinePlan | None = None
    files: list[str] | None = None
    layout: dict = field(default_factory=lambda: dict(ROW_RANGES))


@dataclass(frozen=True)
class Output:
    """What a partition publishes.

    Args:
        schema: the output schema.
        side: ``(asset, schema)`` of a side output published in the same commit, its rows
            picked by the model step's ``side``.
        sample: take the output checks' row sample as the rows stream (True, or the columns
            to keep), where shards run in this process; else the checks read it back.
    """

    schema: pa.Schema
    side: tuple[str, pa.Schema] | None = None
    sample: bool | tuple[str, ...] = False


@dataclass(frozen=True)
class Sizes:
    """Rows per model call and per checkpointed shard.

    Args:
        batch_size: rows per model call (default: the resource's ``max_batch_size``).
        shard_rows: rows per shard for this run (e.g. from the asset's config); ignored when
            the resource turns checkpointing off.
        default_shard_rows: rows per shard when neither ``shard_rows`` nor the resource sets
            it: cheap rows (a tabular score) want bigger shards than expensive ones.
        batch_timeout_multiple: this spec's per-call deadline in multiples of its shard's
            median call, 0 for none (default: the resource's ``batch_timeout_multiple``;
            inference/engine/batch_timeout.py).
    """

    batch_size: int | None = None
    shard_rows: int | None = None
    default_shard_rows: int = DEFAULT_SHARD_ROWS
    batch_timeout_multiple: float | None = None


@dataclass
class Work:
    """One partition's scoring, as a domain describes it to the spot-safe engine.

    Args:
        input: the rows, their shards and quarantine.
        program: builds each shard's model step where the shard runs (its model through
            ``worker_model``); a :class:`ModelStep` when it needs nothing from the shard.
        output: the schema, side output and sample.
        depends_on: whatever else decides the output (model version, settings); a change
            discards old progress instead of mixing outputs.
        sizes: rows per model call and per shard.
    """

    input: Input
    program: ShardProgram | ModelStep
    output: Output
    depends_on: Any
    sizes: Sizes = field(default_factory=Sizes)


@dataclass(frozen=True)
class SampledProgram:
    """A program whose steps also hand their output to the checks' sample (in this process)."""

    program: ShardProgram
    sample: Sample
    columns: tuple[str, ...] | None

    def __call__(self, rows: pa.Table) -> ModelStep:
        step = self.program(rows)
        observe, sample, columns = step.observe, self.sample, self.columns

        def sampled(scored: pa.RecordBatch, out: pa.Table, stats) -> None:
            if observe is not None:
                observe(scored, out, stats)
            sample.add(out.select(list(columns)) if columns else out)

        return replace(step, observe=sampled)

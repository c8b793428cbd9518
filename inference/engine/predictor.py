"""The one object a model is to the engine: a :class:`Predictor` that loads once per process or
Ray actor and answers a batch of rows with its output columns, and the shard program that runs
it wherever a shard runs (the step's process, or a Ray actor). The public module
(``nightshift``) declares pipelines around it; this module has no Dagster import.
"""

from __future__ import annotations

import hashlib
import inspect
import json
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, get_origin, get_type_hints

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from inference.engine.device import resolve_device
from inference.engine.invariants import StreamStats
from inference.engine.metrics import BatchMetrics
from inference.engine.quarantine import QuarantinePlan
from inference.engine.shard_worker import ModelStep, Observe, ShardInput, worker_model
from inference.generation.checkpoints import load_weights, safetensors_folder, weights_version

VERSION_COLUMN = "model_version"


class Predictor:
    """Your model: ``load(device)`` runs once per process (or Ray actor) before its first batch,
    and ``__call__(batch)`` returns the output's columns for a ``pyarrow.RecordBatch`` of the
    day's screened rows, one value per row.

    Class annotations are settings: each is a field of the scoring asset's config (the
    Launchpad, ``--config-json``), set on the instance before ``load``. A setting whose name ends
    in ``_path`` names the weights, a ``.safetensors`` file or a Hugging Face folder: its
    content hash is the model version recorded on every row, and a missing or pickled one fails
    the day before any input is read.

    A model whose version is known only once it is loaded (a packaged model whose settings
    change its answers) sets ``loaded_in_step``: the step loads it too, on its own device,
    before any input is read, and asks that one its ``version()`` and ``describe(stats)``;
    shards run in the step's process use it.
    """

    _settings: ClassVar[dict[str, tuple[type, Any]]] = {}
    loaded_in_step: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        hints = get_type_hints(cls)
        cls._settings = {
            name: (hint, getattr(cls, name, ...))
            for name, hint in hints.items()
            if not name.startswith("_")
            and name in cls.__annotations__
            and get_origin(hint) is not ClassVar
        }

    def __init__(self, **settings: Any) -> None:
        for name, value in settings.items():
            setattr(self, name, value)

    # Where it runs and how big its model calls may be, the inference resource's: set before
    # ``load``. The engine cuts batches of ``max_batch_size`` rows; a text model that buckets
    # them by length keeps each call under ``max_batch_tokens`` (None: sized to the device).
    device: ClassVar[str] = "cpu"
    precision: ClassVar[str] = "auto"
    max_batch_size: ClassVar[int] = 4096
    max_batch_tokens: ClassVar[int | None] = None

    def load(self, device: str) -> None:
        """Loads the model onto ``device`` (``cpu``, ``cuda``, ``cuda:1``), also ``self.device``."""

    def __call__(self, batch: pa.RecordBatch) -> Mapping[str, Any]:
        raise NotImplementedError(f"{type(self).__name__} must define __call__(batch)")

    def prepare(self, batch: pa.RecordBatch) -> Any:
        """CPU-side work on a batch (parsing, normalising text), run on threads ahead of the
        model so that it never waits for it. A predictor that defines it is called as
        ``__call__(batch, prepared)``."""
        return None

    def observe(self, rows: pa.RecordBatch, output: pa.Table, stats: StreamStats) -> None:
        """Adds exact figures of the call just made, its rows against the output as written
        (key and ``model_version`` included), to the shard's statistics: for figures that
        depend on the predictor's settings (a length cap, a mode), where ``Output.observe``
        knows only the model version."""

    def record(self, stats: StreamStats) -> None:
        """Adds the model's own figures of the call just made (model calls, a token budget's
        back-offs) to the shard's statistics, which come back from wherever the shard ran."""

    def measure(self, metrics: BatchMetrics) -> None:
        """Adds what the model measured in the call just made to the shard's batch metrics,
        which the day's metadata and Prometheus metrics are made from: a text model its
        tokens (``metrics.tokens``), a generation model also each request's time to its first
        token (``metrics.record_first_tokens``)."""

    def describe(self, stats: StreamStats) -> Mapping[str, Any]:
        """The model's figures in the day's metadata, from its shards' summed statistics."""
        return {}

    def choose(self, store: Any, version: str | None) -> None:
        """A model of the model registry settles which version the run scores with, before any
        input is read: its champion in ``store``, or ``version`` where the run chose another (a
        backfill's champion of the day, the shadow's challenger); it reads here what the run
        reads once (a training reference). A predictor that defines it is loaded in the step,
        and its ``version()`` is the one chosen."""

    def shard(self, rows: pa.Table, context: Any) -> Predictor:
        """The predictor for one shard of a custom cut (:class:`ShardCut`), given the shard's
        rows and the cut's ``context`` before its first batch, where the shard runs: a model
        whose features depend on other rows of the shard (an account's history) returns a copy
        holding them. Default: itself."""
        return self

    def version(self) -> str:
        """What changes exactly when the model's answers may: the weights files' content
        hashes, else the class and its settings."""
        files = [_weights(getattr(self, n)) for n in self._settings if n.endswith("_path")]
        if files:
            return "+".join(files)
        values = json.dumps({n: str(getattr(self, n, "")) for n in self._settings}, sort_keys=True)
        code = _source(type(self))
        digest = hashlib.sha256(f"{code}\n{values}".encode()).hexdigest()[:12]
        return f"{type(self).__name__}@{digest}"

    def load_weights(self, module: Any, path: str | Path) -> Any:
        """``module`` with the weights of a ``.safetensors`` file (never unpickled)."""
        return load_weights(module, path)


@dataclass(frozen=True)
class ShardCut:
    """A day cut into shards by the model's own rule instead of row ranges: each shard holds
    every row its answers depend on (fraud: all of an account's rows).

    Args:
        inputs: the day's screened-in and quarantined rows, in input order -> its shards, each
            with its rows' input positions (run once the step holds the day).
        layout: what decides which rows a shard holds; part of the checkpoint's fingerprint.
        context: handed with each shard's rows to ``Predictor.shard`` where the shard runs
            (figures of the whole day that ``inputs`` fills in, say).
        plan: where the day answers for rows of the cut's own, not the landed ones (the day's
            audience of users): their quarantine plan; ``inputs`` then cuts them, given no
            landed rows, and the day's conservation counts them.
        files: the files the day reads, where they are more than the landed day's (several
            days of history), for the landing sensor's fingerprint.
        figures: the day's own figures for its metadata (and a sixth argument of
            ``Checks.results``).
        committed: what the cut records once the day is committed.
    """

    inputs: Callable[[Iterable[pa.RecordBatch]], Iterator[ShardInput]]
    layout: Mapping[str, Any]
    context: Any = None
    plan: QuarantinePlan | None = None
    files: Sequence[str] | None = None
    figures: Mapping[str, Any] = field(default_factory=dict)
    committed: Callable[[], None] | None = None


@dataclass(frozen=True)
class PredictorLoader:
    """Loads the predictor where its shards run: once per process or Ray actor."""

    predictor: Predictor
    device: str

    def __call__(self) -> Predictor:
        device = str(resolve_device(self.device))
        self.predictor.device = device
        self.predictor.load(device)
        return self.predictor


@dataclass(frozen=True)
class PredictorProgram:
    """A shard's model step, built where the shard runs (picklable: the predictor travels
    unloaded, and loads once per worker)."""

    key: str
    loader: PredictorLoader
    id_column: str
    schema: pa.Schema
    version: str
    counts: Mapping[str, Callable[[Mapping[str, np.ndarray]], int]]
    # Given the model version, an observer of each model call (its rows, its output).
    observer: Callable[[str], Observe] | None = None
    # (a call's rows, its output) -> the rows of a side output published with it.
    side: Callable[[pa.RecordBatch, pa.Table], pa.Table] | None = None
    # A custom cut's context, handed to each shard's predictor (Predictor.shard).
    context: Any = None
    # The predictor answers a row with several (a top-K list), the key among its columns.
    lists: bool = False

    def __call__(self, rows: pa.Table) -> ModelStep:
        predictor = worker_model(self.key, self.loader).shard(rows, self.context)
        fields = [f for f in self.schema if f.name not in (self.id_column, VERSION_COLUMN)]
        prepares = type(predictor).prepare is not Predictor.prepare
        observer = self.observer(self.version) if self.observer is not None else None

        def transform(batch: pa.RecordBatch, prepared: Any) -> pa.RecordBatch:
            answered = predictor(batch, prepared) if prepares else predictor(batch)
            keys = answered[self.id_column] if self.lists else batch[self.id_column]
            version = pa.repeat(pa.scalar(self.version), len(keys))
            # In the schema's order: the key first, the version where the schema puts it.
            columns = []
            for f in self.schema:
                if f.name == self.id_column:
                    columns.append(_column(keys, f))
                elif f.name == VERSION_COLUMN:
                    columns.append(version)
                elif f.name in answered:
                    columns.append(_column(answered[f.name], f))
                else:
                    raise ValueError(f"{type(predictor).__name__} returned no column {f.name!r}")
            return pa.record_batch(columns, self.schema)

        def observe(scored: pa.RecordBatch, out: pa.Table, stats: StreamStats) -> None:
            # Each column read out of Arrow once, for its figures and the counts alike.
            wanted = fields if self.counts else [f for f in fields if numeric(f)]
            values = {f.name: out[f.name].to_numpy(zero_copy_only=False) for f in wanted}
            for f in fields:
                if numeric(f):
                    column = values[f.name].astype(np.float64)
                    stats.extremes(f.name, column)
                    stats.count(f"{f.name}_non_finite", (~np.isfinite(column)).sum())
            for count, fn in self.counts.items():
                stats.count(count, int(fn(values)))
            if observer is not None:
                observer(scored, out, stats)
            predictor.observe(scored, out, stats)
            predictor.record(stats)

        prepare = predictor.prepare if prepares else None
        answers = self._keys_answered if self.lists else None
        measures = type(predictor).measure is not Predictor.measure
        measure = predictor.measure if measures else None
        return ModelStep(transform, prepare, answers, observe, side=self.side, measure=measure)

    def _keys_answered(self, out: pa.Table) -> int:
        """Input rows a call's lists answer for: its distinct keys."""
        return int(pc.count_distinct(out[self.id_column]).as_py()) if out.num_rows else 0


def _column(values: Any, f: pa.Field) -> pa.Array:
    """An answered column as ``f``'s type: an Arrow array as it is, a matrix as fixed-size
    lists (a vector per row), anything else through numpy."""
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    if isinstance(values, pa.Array):
        return values.cast(f.type)
    array = np.asarray(values)
    if array.ndim == 2 and pa.types.is_fixed_size_list(f.type):
        flat = pa.array(np.ascontiguousarray(array).reshape(-1)).cast(f.type.value_type)
        return pa.FixedSizeListArray.from_arrays(flat, array.shape[1])
    return pa.array(array).cast(f.type)


def _weights(path: str | Path) -> str:
    """``<name>@<content hash>`` of a weights file, or of a Hugging Face folder's config,
    tokenizer and safetensors; refuses pickled weights, saying how to convert them."""
    if not Path(path).is_dir():
        return weights_version(path)
    from inference.text.encoder import folder_fingerprint

    config = Path(path) / "config.json"
    architectures = json.loads(config.read_text()).get("architectures") if config.exists() else 0
    folder = safetensors_folder(path, architectures[0] if architectures else "AutoModel")
    return f"{folder.name}@{folder_fingerprint(folder)}"


def numeric(f: pa.Field) -> bool:
    """A column whose minimum, maximum and non-finite count the checks can read."""
    return pa.types.is_integer(f.type) or pa.types.is_floating(f.type)


def _source(cls: type) -> str:
    """The class's source, or its name where there is none (defined in a REPL, say)."""
    try:
        return inspect.getsource(cls)
    except (OSError, TypeError):
        return cls.__name__

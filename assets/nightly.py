"""Pipelines declared from a :class:`Predictor`, what it reads (:class:`Landing`), what it writes
(:class:`Output`) and how a day is judged (:class:`Checks`): :func:`nightly` builds the landing
and scoring assets and their wiring on the scoring runner. The four shipped domains declare
themselves here; the public module (``nightshift``) exports the same names to a user, and adds
the Definitions that run a pipeline on its own.

Everything a day needs besides the model is the engine's, the same code for every pipeline:
screening and quarantine from the declarations, checkpointed shards and resume after an
interruption, the exactly-once commit, row conservation (the ``row_count_matches_input``
check every pipeline gets), the ``model_version`` column, the landing fingerprints, progress,
cost and each day's metadata.
"""

import copy
import inspect
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
from dagster import (
    AssetCheckResult,
    AssetCheckSpec,
    AssetExecutionContext,
    AssetsDefinition,
    AssetSpec,
    Definitions,
)
from pydantic import Field, create_model

from assets.checkpointing import SpotSafeRun
from assets.days import daily_assets
from assets.landing import LandedDay, land_files
from assets.partitions import PartitionReport
from assets.runner import Day, Model, ScoringSpec, score, scoring_asset
from assets.wiring import DemoDay, DomainWiring, Pipeline
from inference.engine.invariants import StreamStats
from inference.engine.predictor import (
    VERSION_COLUMN,
    Predictor,
    PredictorLoader,
    PredictorProgram,
    ShardCut,
    numeric,
)
from inference.engine.quarantine import QuarantinePlan
from inference.engine.screen import screen_required
from inference.engine.shard_worker import Observe
from inference.engine.work import Input, Sizes, Work
from inference.engine.work import Output as WorkOutput
from resources.inference import InferenceResource
from resources.quality import CheckSuite, QualityConfig, SuiteRun, load_suites, locate_in_landing
from resources.storage import DataStore, StorageResource

CONSERVATION = "row_count_matches_input"
# What a pipeline's hooks (Landing.screen, Checks.results, and nightly's sizes, depends_on and
# shards) are handed: each names, as its parameters, the ones it needs.
HANDED = {
    "store": "the data store (DataStore)",
    "date": "the day, YYYY-MM-DD",
    "config": "the scoring asset's config",
    "inference": "the inference resource",
    "model": "the predictor the step loaded",
    "version": "its model version",
    "landed": "the day's landing listing the step scores (files, fingerprint, and the "
    "landing stage's kept screening: landed.screened(rules))",
}
# Handed to one hook only besides those.
SHARDS_HANDED = {"plan": "the day's quarantine plan", "shard_rows": "rows a shard should hold"}
RESULTS_HANDED = {"report": "the day's PartitionReport", "figures": "ShardCut.figures"}


@dataclass(frozen=True)
class Landing:
    """The day's input: ``landing/<dataset>/date=D/*.parquet`` with ``schema``.

    Rows with no ``key``, a repeated ``key``, or a null or non-finite value in a ``required``
    column (default: every column but the key) go to ``<name>_quarantine`` with the reason.

    A dataset that other pipelines read too has a landing asset already: ``asset`` is it, and
    the pipeline depends on it instead of declaring its own. ``screen``: a hook (see
    :data:`HANDED`) that returns the quarantine plan of the day's rows in the order they are
    read, replacing the key and required-column screen (the engine locates each quarantined
    row in its landing file). ``columns``: the only columns the predictor reads (default:
    all). ``exact``: columns the predictor reads beside their landed text (``<name>_exact``),
    where the cast to ``schema`` may round them, to be written out as they came.
    """

    dataset: str
    schema: pa.Schema
    key: str
    required: Sequence[str] | None = None
    description: str = ""
    asset: AssetsDefinition | None = None
    screen: Callable[..., QuarantinePlan] | None = None
    columns: Sequence[str] | None = None
    exact: Sequence[str] = ()

    @property
    def reads(self) -> list[str]:
        if self.required is not None:
            return list(self.required)
        return [n for n in self.schema.names if n != self.key]


@dataclass(frozen=True)
class Output:
    """The columns the predictor returns (the engine adds the key first and ``model_version``
    last, or where ``schema`` names it: an existing table's column order), and counts of the
    day's rows recorded in its metadata: ``name -> fn(columns)``.

    ``observe``: given the model version, ``fn(rows, output, stats)`` that adds exact figures of
    each model call to the day's statistics (what custom ``Checks.results`` read). ``sample``:
    the columns of a seeded sample of the day's rows, taken as they stream, for the checks
    (True: every column). ``side``: ``(asset, schema, fn(rows, output))``, a side output
    published in the same commit, ``fn`` picking each model call's rows of it. ``lists``: the
    predictor answers a row with several (a user's top-K list), the key among its columns; a
    call's input rows are counted as its distinct keys.
    """

    schema: pa.Schema
    counts: Mapping[str, Callable[[Mapping[str, np.ndarray]], int]] = field(default_factory=dict)
    description: str = ""
    observe: Callable[[str], Observe] | None = None
    sample: Sequence[str] | bool = ()
    side: tuple[str, pa.Schema, Callable[[pa.RecordBatch, pa.Table], pa.Table]] | None = None
    lists: bool = False


@dataclass(frozen=True)
class Checks:
    """How a day is judged before it is published: a Great Expectations suite file over the
    day's figures (a relative path is read from the predictor's folder), and custom checks, ``fn(figures) -> bool``, each a blocking check named
    after its function. The figures: rows in, out and quarantined, and for each numeric output
    column its ``_min``, ``_max`` and ``_non_finite`` count.

    ``results``: a hook (see :data:`HANDED`, with ``report`` and ``figures``) that returns
    the check results: the suite's from figures of the pipeline's own (``Output.observe``,
    ``Output.sample``) in place of these; the suite then checks row conservation itself (no
    ``row_count_matches_input``). ``described``: blocking checks beside the suite's, ``name ->
    description``, whose results ``results`` returns.
    """

    suite: str | Path | None = None
    custom: Sequence[Callable[[Mapping[str, Any]], bool]] = ()
    results: Callable[..., Sequence[AssetCheckResult]] | None = None
    described: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class NightlyPipeline:
    """What :func:`nightly` builds: the two assets, and the wiring that makes it a domain beside
    the shipped ones (``assets/domains.py``); the public module's ``nightly`` adds Definitions
    that run it on its own (``nightshift.NightlyPipeline.defs``)."""

    landing_asset: AssetsDefinition
    scoring_asset: AssetsDefinition
    wiring: DomainWiring
    # The scoring runner's spec of the asset: what a shadow of it (assets/shadow/) runs again.
    spec: ScoringSpec | None = None


def nightly(
    name: str,
    predictor: type[Predictor],
    landing: Landing,
    output: Output,
    checks: Checks = Checks(),
    *,
    hour_utc: int = 4,
    description: str = "",
    demo: DemoDay | None = None,
    group: str | None = None,
    config: type[QualityConfig] | None = None,
    sizes: Callable[..., Sizes] | None = None,
    depends_on: Callable[..., Mapping[str, Any]] | None = None,
    deps: Sequence[Any] = (),
    kinds: set[str] | None = None,
    shards: Callable[..., ShardCut] | None = None,
) -> NightlyPipeline:
    """The Dagster definitions of a nightly pipeline: the landing asset, the scoring asset
    ``name`` with its checks, the job ``<name>_job``, its schedule at ``hour_utc`` (UTC, for
    the day that just ended) and its landing trigger (``landing_sensor``, off by default, as the
    shipped one); as a domain, its place in the code location's landing sensor instead. The
    job, schedule and trigger come from the wiring: the code location builds them for a listed
    domain, and ``nightshift``'s ``NightlyPipeline.defs`` for a pipeline run on its own.

    ``demo``: ``(store, date, scale, seed) -> {dataset: rows}``, one seeded day of demo landing
    data, which ``nightshift generate`` writes once the pipeline's wiring is listed in
    ``assets/domains.py``. ``group``: the assets' group in the UI (default: ``name``).
    ``config``: the scoring asset's config class (default: the quality settings and the
    predictor's settings), which must hold the predictor's settings.

    The hooks below, ``Landing.screen`` and ``Checks.results`` are functions that name, as their
    parameters, what they are handed of the day (:data:`HANDED`: ``store``, ``date``,
    ``config``, ``inference``, ``model``, ``version``, ``landed``), as ``def sizes(config,
    model)``; a name outside them fails here. ``sizes``: the rows per model call and per shard
    (default: the inference resource's). ``depends_on``: what else decides the answers besides
    the model version (settings that are not part of it, the output's columns, a threshold
    stored with the model): a day's checkpointed progress made under others is discarded, not
    resumed.

    ``deps``: assets the scoring asset depends on besides its landing (a model asset).
    ``kinds``: its kinds in the UI (default: pytorch, parquet). ``shards``: the model's own cut
    of a day into shards (:class:`ShardCut`) instead of row ranges, also handed ``plan`` (the
    day's quarantine plan) and ``shard_rows`` (the rows a shard should hold); a cut of rows of
    its own, as an audience, returns them with ``ShardCut.plan``."""
    scores = _scores_schema(landing, output)
    suites = {} if checks.results is not None else {CONSERVATION: _conservation_suite(name)}
    if checks.suite is not None:
        suites |= load_suites(Path(inspect.getfile(predictor)).parent / checks.suite)
    custom = [AssetCheckSpec(c.__name__, asset=name, blocking=True) for c in checks.custom]
    custom += [
        AssetCheckSpec(n, asset=name, description=text, blocking=True)
        for n, text in checks.described.items()
    ]
    config = config or _config_class(name, predictor)
    for hook, fn, more in (
        ("Landing.screen", landing.screen, {}),
        ("Checks.results", checks.results, RESULTS_HANDED),
        ("sizes", sizes, {}),
        ("depends_on", depends_on, {}),
        ("shards", shards, SHARDS_HANDED),
    ):
        if fn is not None:
            _check_hook(name, hook, fn, {**HANDED, **more})
    missing = [n for n in predictor._settings if n not in config.model_fields]
    if missing:
        raise TypeError(f"{config.__name__} has no field for {predictor.__name__}'s {missing}")

    registered = predictor.choose is not Predictor.choose

    def chosen(
        store: DataStore, inference: InferenceResource, settings: Any, version: str | None
    ) -> Model:
        """The model the run scores with: ``version``, for a registered one, where it was chosen."""
        model = predictor(**{n: getattr(settings, n) for n in predictor._settings})
        model.precision = inference.precision
        model.max_batch_size = inference.max_batch_size
        model.max_batch_tokens = inference.max_batch_tokens
        # The value: how shards load the model, and the instance the day's figures ask.
        shards = PredictorLoader(model, inference.device)
        if not (predictor.loaded_in_step or registered):
            version = model.version()  # a missing or pickled weights file fails here
            return Model(version, f"{name}:{version}", (shards, model))
        model.choose(store, version)  # before the copies: they travel with the choice
        # The step's own copy, on the step's device (the CPU where Ray workers score): the one
        # sent to workers travels unloaded.
        key = f"{name}:{predictor.__name__}:{_settings(model)}"
        if registered:
            key = f"{key}:{model.version()}"
        loaded = PredictorLoader(copy.copy(model), str(inference.runtime.device))
        here = inference.model(key, lambda runtime: loaded())
        return Model(here.version(), key, (shards, here))

    if registered:

        def load(
            store: DataStore,
            inference: InferenceResource,
            settings: Any,
            version: str | None = None,
        ) -> Model:
            """The registry's champion, or ``version`` where the run chose another."""
            return chosen(store, inference, settings, version)

    else:

        def load(store: DataStore, inference: InferenceResource, settings: Any) -> Model:
            return chosen(store, inference, settings, None)

    def day(run: SpotSafeRun, landed: LandedDay, model: Model, settings: Any, limit: float) -> Day:
        store, date = run.store, landed.date
        loader, here = model.value
        handed = dict(
            store=store,
            date=date,
            config=settings,
            inference=run.inference,
            model=here,
            version=model.version,
            landed=landed.read,
        )
        columns = list(landing.columns) if landing.columns is not None else None
        exact = tuple(landing.exact)
        rows = lambda: store.iter_landing(  # noqa: E731
            landing.dataset, date, landing.schema, columns, exact=exact
        )
        if landing.screen is not None:
            screened = _given(landing.screen, handed)
            plan = locate_in_landing(screened, store, landed.read.files)
        else:
            plan = screen_required(rows(), landing.key, landing.reads)
        sized = _given(sizes, handed) if sizes is not None else Sizes()
        shard_rows = run.shard_rows(sized.default_shard_rows, sized.shard_rows)
        cut = None
        if shards is not None:
            cut = _given(shards, {**handed, "plan": plan, "shard_rows": shard_rows})
        program = PredictorProgram(
            model.key,
            loader,
            landing.key,
            scores,
            model.version,
            output.counts,
            output.observe,
            output.side[2] if output.side is not None else None,
            cut.context if cut is not None else None,
            output.lists,
        )
        if cut is not None and cut.plan is not None:  # rows of its own: no landed row is read
            files = None if cut.files is None else list(cut.files)
            day_input = Input(
                shards=lambda: cut.inputs(()),
                quarantine=cut.plan,
                files=files,
                layout=dict(cut.layout),
            )
        elif cut is not None:
            day_input = Input(
                shards=lambda: cut.inputs(rows()), quarantine=plan, layout=dict(cut.layout)
            )
        else:
            day_input = Input(rows(), quarantine=plan)
        figured = dict(cut.figures) if cut is not None else {}
        sample = output.sample if isinstance(output.sample, bool) else tuple(output.sample)
        work = Work(
            day_input,
            program,
            WorkOutput(scores, side=output.side and output.side[:2], sample=sample),
            # New weights (or settings it depends on): old progress is discarded.
            depends_on={
                "model": model.version,
                **(_given(depends_on, handed) if depends_on is not None else {}),
            },
            sizes=sized,
        )

        def judged(report: PartitionReport) -> list[AssetCheckResult]:
            figures = {
                **report.conservation,
                **_column_figures(report.shards.stats, output.schema),
            }
            own = [
                AssetCheckResult(check_name=c.__name__, asset_key=name, passed=bool(c(figures)))
                for c in checks.custom
            ]
            if checks.results is not None:
                results = _given(checks.results, {**handed, "report": report, "figures": figured})
                return [*results, *own]
            run_ = SuiteRun(suites)
            run_.add(date, figures, None, {})
            return [*run_.results({}), *own]

        def counted(report: PartitionReport) -> dict[str, Any]:
            stats = report.shards.stats
            return {
                **here.describe(stats),
                **figured,
                **{n: stats.counts.get(n, 0) for n in output.counts},
            }

        if cut is None:
            return Day(work, judged, counted)
        committed = cut.committed
        return Day(
            work,
            judged,
            counted,
            on_commit=None if committed is None else lambda report: committed(),
            # The day's output answers for the cut's rows (an audience), not the landed ones.
            input_rows=None if cut.plan is None else cut.plan.rows,
        )

    spec = ScoringSpec(name, landing.dataset, suites, load, day, checks=custom)
    landed = landing.asset or _landing_asset(landing, group or name)

    def scored(context: AssetExecutionContext, config, storage, inference):
        yield from score(context, spec, config, storage, inference)

    scored.__name__ = scored.__qualname__ = name
    scored.__doc__ = description or output.description or f"{predictor.__name__}'s answers."
    scored.__annotations__ = {
        "context": AssetExecutionContext,
        "config": config,
        "storage": StorageResource,
        "inference": InferenceResource,
    }
    scoring = scoring_asset(spec, deps=[landed, *deps], group=group or name, kinds=kinds)(scored)
    pipeline = Pipeline(
        job=f"{name}_job",
        assets=(landing.dataset, name),
        hour_utc=hour_utc,
        landing=(landing.dataset,),
        scored=name,
    )
    # A landing asset of the pipeline's own is registered with it; a shared one, by its owner.
    owned = [scoring] if landing.asset is not None else [landed, scoring]
    wiring = DomainWiring(Definitions(assets=owned), (pipeline,), demo_day=demo)
    return NightlyPipeline(landed, scoring, wiring, spec)


def _given(fn: Callable[..., Any], handed: Mapping[str, Any]) -> Any:
    """A hook called with what it names of ``handed``."""
    return fn(**{n: handed[n] for n in inspect.signature(fn).parameters})


def _check_hook(asset: str, hook: str, fn: Callable[..., Any], handed: Mapping[str, str]) -> None:
    """Fails the declaration where a hook names a parameter it would not be handed."""
    parameters = inspect.signature(fn).parameters.values()
    unknown = [p.name for p in parameters if p.name not in handed]
    if unknown:
        offered = ", ".join(f"{n} ({what})" for n, what in handed.items())
        name = getattr(fn, "__qualname__", repr(fn))
        raise TypeError(
            f"{asset}: {hook} {name} takes {', '.join(unknown)}, which it would not be handed; "
            f"a hook names, as its parameters, any of: {offered}"
        )


def _landing_asset(landing: Landing, group: str) -> AssetsDefinition:
    """The landing asset of a dataset no other pipeline lands."""

    def landed(context: AssetExecutionContext, storage: StorageResource):
        yield from land_files(context, storage, landing.dataset, landing.schema)

    landed.__name__ = landed.__qualname__ = landing.dataset  # the op's name is the asset's
    spec = AssetSpec(landing.dataset, group_name=group, description=landing.description)
    return daily_assets(spec)(landed)


def _settings(model: Predictor) -> str:
    """The predictor's settings, as a key of the model the step loads under them."""
    return json.dumps({n: str(getattr(model, n)) for n in model._settings}, sort_keys=True)


def _scores_schema(landing: Landing, output: Output) -> pa.Schema:
    key = landing.schema.field(landing.key)
    if VERSION_COLUMN in output.schema.names:
        return pa.schema([key, *output.schema])
    return pa.schema([key, *output.schema, pa.field(VERSION_COLUMN, pa.string())])


def _column_figures(stats: StreamStats, schema: pa.Schema) -> dict[str, float | int]:
    figures: dict[str, float | int] = {}
    for f in schema:
        if numeric(f):
            figures[f"{f.name}_min"] = stats.minima.get(f.name, float("nan"))
            figures[f"{f.name}_max"] = stats.maxima.get(f.name, float("nan"))
            figures[f"{f.name}_non_finite"] = stats.counts.get(f"{f.name}_non_finite", 0)
    return figures


def _conservation_suite(asset: str) -> CheckSuite:
    """The engine's own check of every day: each landed row is scored or quarantined, and the
    published files hold exactly those rows."""
    pairs = [
        ("rows_in", "landed_rows"),
        ("rows_in", "rows_scored_plus_quarantined"),
        ("rows_out", "published_rows"),
        ("rows_quarantined", "published_quarantine_rows"),
    ]
    return CheckSuite(
        name=CONSERVATION,
        asset=asset,
        severity="ERROR",
        description="Row conservation: rows landed = rows scored + rows quarantined, and the "
        "published files hold exactly those rows; no row lost or scored twice.",
        statistics=[
            {
                "type": "expect_column_pair_values_to_be_equal",
                "kwargs": {"column_A": a, "column_B": b},
            }
            for a, b in pairs
        ],
        version="engine",
    )


def _config_class(name: str, predictor: type[Predictor]) -> type[QualityConfig]:
    """The scoring asset's config: the quality settings every pipeline has, and the
    predictor's settings."""
    fields = {
        setting: (hint, Field(default=default, description=f"{predictor.__name__}.{setting}"))
        for setting, (hint, default) in predictor._settings.items()
    }
    camel = "".join(part.title() for part in name.split("_"))
    return create_model(f"{camel}Config", __base__=QualityConfig, **fields)

"""Shadow scoring: the challenger scores each night beside the champion, into
``outputs/<asset>_shadow/``, and the day records how far the two agree.

A ``Shadow`` names a gated scoring asset's spec; :func:`shadow_asset` makes its daily
``<asset>_shadow`` asset. It runs the champion's own spec through the same runner (the same
input, screening, program, shards and commit), with the challenger's version loaded instead of
the champion's and every output renamed: the scores to ``<asset>_shadow``, a side output (fraud's
flagged details) to ``<side>_shadow``, quarantine to ``<asset>_shadow_quarantine``. Nothing reads
those: no asset depends on a shadow, and alerts and digests read the champion's paths.

It is opt-in (``$NIGHTSHIFT_SHADOW``, or the asset's ``enabled`` config), because it doubles the
night's scoring; off, or without a challenger, the step logs why and materialises nothing.
It runs after the champion's day and what it feeds (``after``: fraud's alerts), so it never
delays them, and a shadow that fails is logged as an error and recorded as a night that is not
clean, never failing the run: the champion's outputs are already published and stand. An
interruption of the node is not a shadow failure: it leaves the step as any scoring step does,
so the relaunched run resumes the shadow from its shards.
"""

import inspect
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace

from dagster import (
    AssetCheckResult,
    AssetCheckSeverity,
    AssetCheckSpec,
    AssetExecutionContext,
    AssetKey,
    AssetMaterialization,
    AssetObservation,
    AssetsDefinition,
    AssetSpec,
    Config,
    Failure,
    RetryRequested,
)
from pydantic import Field

from assets.days import daily_assets
from assets.handed import handed, read_at
from assets.landing import LandedDay
from assets.partitions import partition_dates
from assets.runner import Day, ScoringSpec, score
from assets.shadow.nights import record_night
from assets.staleness import CHAMPION_CHOICE, model_choice
from inference.engine.shards import Interrupted
from inference.models.agreement import Agreement, Limit, breaches
from inference.models.registry import challenger_version, champion_version
from inference.models.shadow_nights import ShadowNight
from policy.automation import GPU_POOL
from resources.inference import InferenceResource
from resources.quality import QualityConfig
from resources.storage import DataStore, StorageResource

SHADOW_ENV = "NIGHTSHIFT_SHADOW"
AGREES_CHECK = "shadow_agrees_with_champion"
# Marks a shadow asset in the UI and for code that must leave shadows out (a re-score).
SHADOW_TAG = "nightshift/shadow"
_ON, _OFF = {"1", "true", "yes", "on"}, {"", "0", "false", "no", "off"}


def shadow_name(asset: str) -> str:
    """Where a scored asset's shadow goes: ``<asset>_shadow``."""
    return f"{asset}_shadow"


@dataclass(frozen=True)
class Shadow:
    """A gated scoring asset scored in the shadow by its model's challenger.

    Attributes:
        scoring: the champion's scoring spec, run unchanged but for the version and names.
        model: the model's name in the store (the gate's ``model``).
        config: the scoring asset's config class: the shadow takes the champion op's config
            of the same run, so both score with the same settings.
        agreement: the day's figures from (champion's table, challenger's table).
        limits: what a clean day's figures stay within.
        group: the asset group in the UI.
        after: assets of the pipeline the champion's day feeds, which run before the shadow.
    """

    scoring: ScoringSpec
    model: str
    config: type[QualityConfig]
    agreement: Agreement
    limits: Sequence[Limit]
    group: str
    after: Sequence[str] = field(default_factory=tuple)

    @property
    def asset(self) -> str:
        return shadow_name(self.scoring.asset)


class ShadowConfig(Config):
    enabled: bool | None = Field(
        default=None,
        description=f"Shadow-score the challenger this run; unset: ${SHADOW_ENV} (1/true to turn "
        "it on), read when the run starts. Off by default: it doubles the night's scoring.",
    )


def shadow_enabled(config: ShadowConfig) -> bool:
    """The run's choice, else the setting; an unreadable setting fails naming its values."""
    if config.enabled is not None:
        return config.enabled
    raw = os.environ.get(SHADOW_ENV, "").strip().lower()
    if raw not in _ON | _OFF:
        # A typo fails the step loudly (a retry would read the same setting).
        raise Failure(
            f"${SHADOW_ENV}={raw!r}: expected one of 1, true, 0, false (or unset)",
            allow_retries=False,
        )
    return raw in _ON


def shadow_asset(shadow: Shadow) -> AssetsDefinition:
    """The daily ``<asset>_shadow`` asset: the challenger's scores of the champion's days."""
    spec = AssetSpec(
        shadow.asset,
        deps=[shadow.scoring.asset, *shadow.after],
        description=_description(shadow),
        group_name=shadow.group,
        kinds={"parquet"},
        tags={SHADOW_TAG: "true"},
    )
    check = AssetCheckSpec(
        AGREES_CHECK,
        asset=shadow.asset,
        blocking=False,
        description="The challenger's day agrees with the champion's within the shadow's "
        f"limits: {', '.join(_limit_text(limit) for limit in shadow.limits)}.",
    )

    def compute(
        context: AssetExecutionContext,
        config: ShadowConfig,
        storage: StorageResource,
        inference: InferenceResource,
    ) -> Iterator:
        yield from shadow_score(context, shadow, config, storage, inference)

    compute.__name__ = shadow.asset
    return daily_assets(spec, checks=[check], pool=GPU_POOL)(compute)


def shadow_keys(assets_defs: Iterable[AssetsDefinition]) -> set[AssetKey]:
    """The shadow assets among ``assets_defs``."""
    return {
        spec.key for a in assets_defs for spec in a.specs if spec.tags.get(SHADOW_TAG) == "true"
    }


def shadow_score(
    context: AssetExecutionContext,
    shadow: Shadow,
    config: ShadowConfig,
    storage: StorageResource,
    inference: InferenceResource,
) -> Iterator:
    """Scores the run's days with the challenger, unless there is nothing to shadow."""
    store, dates = storage.store(), partition_dates(context)
    challenger, why_not = _challenger(context, shadow, config, store, dates)
    if challenger is None:
        context.log.info(f"{shadow.asset}: not shadow-scored: {why_not}")
        return
    champion = champion_version(store.read_bytes, store.models_dir, shadow.model)
    context.log.info(
        f"{shadow.asset}: challenger {challenger} scores {_span(dates)} in the shadow of "
        f"champion {champion}"
    )
    spec = _shadow_spec(shadow, store, challenger, champion, context.run_id)
    settings = _champion_settings(context, shadow)
    recorded: set[str] = set()  # days whose shadow materialisation went out
    key = AssetKey(shadow.asset)
    try:
        for event in score(context, spec, settings, storage, inference):
            if isinstance(event, AssetMaterialization) and event.asset_key == key:
                recorded.add(event.partition or "")
            yield event
    except Exception as exc:
        if isinstance(exc, RetryRequested) or isinstance(exc.__cause__, Interrupted):
            raise
        yield from _failed(context, shadow, store, challenger, champion, dates, recorded, exc)


def _challenger(
    context: AssetExecutionContext,
    shadow: Shadow,
    config: ShadowConfig,
    store: DataStore,
    dates: list[str],
) -> tuple[str | None, str]:
    """The version to shadow, or None and why there is none to shadow this run."""
    if not shadow_enabled(config):
        return None, f"shadow scoring is off (set ${SHADOW_ENV}=1 or the `enabled` config)"
    if model_choice(context.run.tags) != CHAMPION_CHOICE:
        return None, "the run re-scores history with the champion of each day, not tonight's"
    challenger = challenger_version(store.read_bytes, store.models_dir, shadow.model)
    if challenger is None:
        return None, f"{shadow.model} has no challenger waiting for promotion"
    unscored = [d for d in dates if not store.output_exists(shadow.scoring.asset, d)]
    if unscored:
        return None, f"{shadow.scoring.asset} has no published output for {', '.join(unscored)}"
    return challenger, ""


def _shadow_spec(
    shadow: Shadow, store: DataStore, challenger: str, champion: str, run_id: str
) -> ScoringSpec:
    """The champion's spec with the challenger's version and the shadow's names."""
    base = shadow.scoring

    def load(store_: DataStore, inference: InferenceResource, config: QualityConfig):
        return base.load(store_, inference, config, version=challenger)

    def day(run, landed: LandedDay, model, config: QualityConfig, limit: float) -> Day:
        date = landed.date
        inner = base.day(run, landed, model, config, limit)
        side = inner.work.output.side
        if side is not None:
            inner.work.output = replace(inner.work.output, side=(shadow_name(side[0]), side[1]))
        nights: list[ShadowNight] = []
        read: dict[tuple[str, str], int] = {}

        def on_commit(report) -> None:
            # The champion's day as its materialisation handed it on (assets/handed.py).
            read.update(handed(run.context, store, [base.asset], date))
            with store.pinned(read):
                nights.append(_compare(shadow, store, date, challenger, champion, run_id))

        def checks(report) -> list[AssetCheckResult]:
            return [_check_result(nights[-1])]

        def metadata(report) -> dict:
            night = nights[-1]
            figures = {"champion_version": champion, "clean": night.clean, **night.figures}
            return {**inner.metadata(report), **figures, **read_at(read)}

        # The champion's own checks and on_commit are left out: they judge and publish the
        # champion's asset; the shadow is judged by its agreement with it.
        return Day(inner.work, checks, metadata, on_commit)

    return replace(base, asset=shadow.asset, load=load, day=day)


def _compare(
    shadow: Shadow, store: DataStore, date: str, challenger: str, champion: str, run_id: str
) -> ShadowNight:
    """The day's agreement, recorded as a shadow night of the challenger."""
    theirs = store.read_output(shadow.scoring.asset, date)
    ours = store.read_output(shadow.asset, date)
    figures = shadow.agreement(theirs, ours)
    night = ShadowNight(
        date,
        shadow.asset,
        challenger,
        champion,
        figures=figures,
        breaches=breaches(figures, shadow.limits),
        run_id=run_id,
    )
    record_night(store, shadow.model, night)
    return night


def _check_result(night: ShadowNight) -> AssetCheckResult:
    return AssetCheckResult(
        check_name=AGREES_CHECK,
        passed=night.clean,
        severity=AssetCheckSeverity.WARN,
        description=night.describe(),
        metadata={"challenger": night.challenger, "champion": night.champion, **night.figures},
    )


def _failed(
    context: AssetExecutionContext,
    shadow: Shadow,
    store: DataStore,
    challenger: str,
    champion: str,
    dates: list[str],
    recorded: set[str],
    exc: Exception,
) -> Iterator[AssetObservation]:
    """A shadow failure: logged as an error and recorded as a night that is not clean for each
    day it did not finish; the run goes on, since the champion's outputs are published."""
    error = f"{type(exc).__name__}: {exc}"
    context.log.error(
        f"{shadow.asset}: challenger {challenger} failed to shadow-score; the champion's "
        f"outputs stand and the night is not clean: {error}"
    )
    for date in (d for d in dates if d not in recorded):
        night = ShadowNight(
            date, shadow.asset, challenger, champion, error=error, run_id=context.run_id
        )
        record_night(store, shadow.model, night)
        yield AssetObservation(
            shadow.asset,
            partition=date,
            metadata={"shadow_error": error, "challenger": challenger, "champion": champion},
        )


def _champion_settings(context: AssetExecutionContext, shadow: Shadow) -> QualityConfig:
    """The scoring asset's config as this run gave it, so both versions score alike."""
    ops = (context.run_config or {}).get("ops", {})
    return shadow.config(**ops.get(shadow.scoring.asset, {}).get("config", {}))


def _description(shadow: Shadow) -> str:
    return inspect.cleandoc(
        f"""The challenger of {shadow.model} scoring each day of {shadow.scoring.asset} in the
        shadow of the champion, when shadow scoring is on (${SHADOW_ENV}=1) and a challenger
        waits. Nothing reads it: it is evidence for the promotion gate. Each day records its
        agreement with the champion and whether it was clean
        ({", ".join(_limit_text(limit) for limit in shadow.limits)}); a gate with
        `clean_nights` N promotes only after the last N nights were clean."""
    )


def _limit_text(limit: Limit) -> str:
    bounds = []
    if limit.at_least is not None:
        bounds.append(f"{limit.metric} >= {limit.at_least}")
    if limit.at_most is not None:
        bounds.append(f"{limit.metric} <= {limit.at_most}")
    return " and ".join(bounds)


def _span(dates: list[str]) -> str:
    return dates[0] if len(dates) == 1 else f"{dates[0]}..{dates[-1]}"

"""The promotion gate in Dagster: a blocking check on every training asset whose domain declares
a ``Gate`` (``TrainingJob.gate``), and ``promote_model_job``, which promotes by hand.

The check measures only a challenger trained in the same run: in a nightly scoring run the
model asset reuses the champion, so the check passes and never stops the champion scoring,
even while a rejected challenger waits.
"""

import os

from dagster import (
    AssetCheckExecutionContext,
    AssetCheckResult,
    AssetChecksDefinition,
    Config,
    Failure,
    OpExecutionContext,
    asset_check,
    job,
    op,
)
from pydantic import Field

from assets.domains import TRAINING_JOBS
from assets.model_asset import champion_materialization, materialized_in_run
from assets.promotion import judge
from inference.models.gate import CannotJudgeError, Gate, Verdict, parse_tolerances
from inference.models.registry import (
    AliasChange,
    challenger_version,
    champion_version,
    default_actor,
    promote,
)
from resources.inference import InferenceResource
from resources.storage import DataStore, StorageResource

GATE_CHECK = "challenger_not_worse_than_champion"
PROMOTE_JOB = "promote_model_job"
TOLERANCE_ENV = "NIGHTSHIFT_PROMOTION_TOLERANCE"
CLEAN_NIGHTS_ENV = "NIGHTSHIFT_PROMOTION_CLEAN_NIGHTS"
# Run tags a by-hand promotion carries, so the run list says who moved a champion and why.
TAG_MODEL, TAG_BY, TAG_FORCED, TAG_REASON = (
    f"nightshift/promotion_{k}" for k in ("model", "by", "forced", "reason")
)


class PromotionGateConfig(Config):
    tolerances: dict[str, float] = Field(
        default_factory=dict,
        description="Per metric, how far below the champion a challenger may measure and "
        f"still be promoted; unnamed metrics take ${TOLERANCE_ENV}, else the gate's own.",
    )
    clean_nights: int | None = Field(
        default=None,
        ge=0,
        description="How many of the challenger's last shadow nights must be clean before it "
        f"is promoted (0: none); unset: ${CLEAN_NIGHTS_ENV}, else the gate's own.",
    )


def tolerances(gate: Gate, config: PromotionGateConfig) -> dict[str, float]:
    """The gate's tolerances, overridden by the setting (read when the run starts), then by
    the run config."""
    setting = parse_tolerances(os.environ.get(TOLERANCE_ENV, ""), gate.metrics)
    return {**gate.tolerances, **setting, **config.tolerances}


def clean_nights(gate: Gate, config: PromotionGateConfig) -> int:
    """The shadow nights the gate requires: the run config's, else the setting (read when the
    run starts), else the gate's own."""
    if config.clean_nights is not None:
        return config.clean_nights
    raw = os.environ.get(CLEAN_NIGHTS_ENV, "").strip()
    if not raw:
        return gate.clean_nights
    if not raw.isdigit():
        raise Failure(
            f"${CLEAN_NIGHTS_ENV}={raw!r}: expected a number of nights (0 or more)",
            allow_retries=False,
        )
    return int(raw)


def gate_check(gate: Gate) -> AssetChecksDefinition:
    """The blocking check on ``gate.model`` that judges the challenger its run trained."""

    @asset_check(asset=gate.model, name=GATE_CHECK, blocking=True)
    def check(
        context: AssetCheckExecutionContext,
        config: PromotionGateConfig,
        storage: StorageResource,
        inference: InferenceResource,
    ) -> AssetCheckResult:
        """A retrained model replaces the champion only when it measures at least as well
        (within the tolerance) on the most recent labelled days neither trained on."""
        store = storage.store()
        challenger = challenger_version(store.read_bytes, store.models_dir, gate.model)
        if challenger is None or challenger != materialized_in_run(context, gate.model):
            return _nothing_to_judge(store, gate.model, challenger)
        try:
            by = f"run {context.op_execution_context.run_id}"
            verdict = judge(
                store,
                gate,
                inference.runtime,
                challenger,
                by,
                tolerances(gate, config),
                clean_nights(gate, config),
            )
        except CannotJudgeError as exc:
            return AssetCheckResult(
                passed=False, description=str(exc), metadata={"challenger": challenger}
            )
        context.log.info(verdict.summary())
        if verdict.change is not None:  # promoted: the scored days' model has changed
            run_id = context.op_execution_context.run_id
            context.op_execution_context.log_event(
                champion_materialization(gate.model, verdict.change, run_id)
            )
        return _result(verdict)

    return check


def _nothing_to_judge(store: DataStore, model: str, challenger: str | None) -> AssetCheckResult:
    champion = champion_version(store.read_bytes, store.models_dir, model)
    waiting = f"; challenger {challenger} waits" if challenger else ""
    return AssetCheckResult(
        passed=True,
        description=f"no challenger trained in this run: champion {champion} scores{waiting}",
        metadata={"champion": champion, "challenger": challenger or "", "evaluated": False},
    )


def _result(verdict: Verdict) -> AssetCheckResult:
    return AssetCheckResult(
        passed=verdict.promoted,
        description=verdict.summary(),
        metadata={**verdict.metadata(), "evaluated": True},
    )


GATES: dict[str, Gate] = {t.model: t.gate for t in TRAINING_JOBS if t.gate is not None}
promotion_checks = [gate_check(g) for g in GATES.values()]


class PromoteConfig(Config):
    model: str = Field(description=f"The model to promote: one of {', '.join(GATES)}.")
    version: str = Field(default="", description="The version to promote (default the challenger).")
    force: bool = Field(default=False, description="Promote without the gate (needs a reason).")
    reason: str = Field(default="", description="Why: recorded in the alias history.")
    by: str = Field(default="", description="Who (default $NIGHTSHIFT_USER or the login).")


@op
def promote_model(
    context: OpExecutionContext,
    config: PromoteConfig,
    storage: StorageResource,
    inference: InferenceResource,
) -> str:
    """Promotes a version of a model to champion: through the promotion gate, or past it with
    ``force`` and a reason, recorded in the alias history and on this run's tags."""
    by = config.by or default_actor()
    change = promote_by_hand(
        storage.store(), inference, config.model, config.version, config.force, config.reason, by
    )
    context.log_event(champion_materialization(config.model, change, context.run_id))
    tags = promotion_tags(config.model, by, change.forced, config.reason)
    missing = {k: v for k, v in tags.items() if k not in context.run.tags}
    if missing:  # launched from the UI or by API rather than `nightshift promote`
        context.instance.add_run_tags(context.run_id, missing)
    line = f"{config.model}: {change.version} is champion ({change.reason})"
    context.log.info(line)
    return line


@job(name=PROMOTE_JOB, description="Promotes a model version to champion, through the gate "
     "or past it with force and a reason.")  # fmt: skip
def promote_model_job() -> None:
    promote_model()


def promotion_tags(model: str, by: str, forced: bool, reason: str) -> dict[str, str]:
    """The run tags of a promotion by hand: who and which model; why, when forced."""
    tags = {TAG_MODEL: model, TAG_BY: by}
    if forced:
        tags.update({TAG_FORCED: "true", TAG_REASON: reason})
    return tags


def promote_by_hand(
    store: DataStore,
    inference: InferenceResource,
    model: str,
    version: str,
    force: bool,
    reason: str,
    by: str,
) -> AliasChange:
    """What ``nightshift promote`` and the promotion job do; fails naming both figures when the
    gate refuses, and refuses ``force`` without a reason."""
    read = store.read_bytes
    version = version or challenger_version(read, store.models_dir, model) or ""
    if not version:
        raise Failure(f"{model} has no challenger to promote: name a version", allow_retries=False)
    if force:
        if not reason.strip():
            raise Failure("a forced promotion needs a reason", allow_retries=False)
        return promote(
            read,
            store.write_bytes,
            store.models_dir,
            model,
            version,
            by,
            reason,
            forced=True,
            cas=store.cas(),
        )
    if model not in GATES:
        raise Failure(
            f"{model} has no promotion gate (known: {', '.join(GATES)}): promote it with "
            "force and a reason",
            allow_retries=False,
        )
    try:
        gate, settings = GATES[model], PromotionGateConfig()
        verdict = judge(
            store,
            gate,
            inference.runtime,
            version,
            by,
            tolerances(gate, settings),
            clean_nights(gate, settings),
        )
    except CannotJudgeError as exc:
        raise Failure(str(exc), allow_retries=False) from exc
    if verdict.change is None:
        raise Failure(verdict.summary(), metadata=verdict.metadata(), allow_retries=False)
    return verdict.change

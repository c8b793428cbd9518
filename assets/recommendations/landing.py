"""The recommendations' landing asset, ``interactions``: each day's events checked against the
contract, its unusable rows quarantined."""

from dagster import AssetExecutionContext, AssetSpec, MetadataValue

from assets.days import daily_assets
from assets.landing import LandingSpec, deadline, land
from assets.recommendations.gates import INTERACTION_SUITES, INTERACTIONS_GATE
from assets.recommendations.quality import (
    INTERACTIONS_QUARANTINE,
    QUARANTINE_SCHEMA,
    screen_interactions,
)
from assets.recommendations.schemas import GROUP, INTERACTIONS, INTERACTIONS_SCHEMA
from resources.quality import QualityConfig
from resources.storage import DataStore, StorageResource


class InteractionsConfig(QualityConfig):
    deadline_hours: float = deadline(3.0, "the recommendations schedule runs at 03:00")


@daily_assets(
    AssetSpec(INTERACTIONS, group_name=GROUP, kinds={"parquet"}),
    checks=[suite.spec() for suite in INTERACTION_SUITES.values()],
)
def interactions(
    context: AssetExecutionContext, config: InteractionsConfig, storage: StorageResource
):
    """Every view, click and purchase users made on the catalogue during one UTC day, as
    landed by the event pipeline. Materialising it checks each file against the contract
    (user_id, item_id, ts, event, weight; no interaction without its ids), counts the day's
    events, and warns when events fall outside the day or the day landed late. A row with an
    unknown event type or a null, non-finite or negative weight is quarantined to
    `interactions_quarantine` with its reason and never used as history; above the quarantine
    limit the day's check fails, naming the rate and the top reasons."""
    yield from land(context, INTERACTIONS_LANDING, config, storage)


def _screen(store: DataStore, date: str, config: InteractionsConfig, limit: float):
    return screen_interactions(
        store, date, config.check_sample_rows, config.check_seed, max_rate=limit
    )


def _publish_quarantine(store: DataStore, date: str, screen, config, limit: float) -> dict:
    """The day's unusable rows, with their reasons, in ``interactions_quarantine``."""
    plan = screen.plan
    metadata = {
        "rows_used": screen.figures["rows_used"],
        "rows_quarantined": plan.count,
        "quarantine_rate": round(plan.count / max(1, plan.rows), 6),
    }
    if screen.quarantined is not None and not limit.exceeded(plan.count, plan.rows):
        # Published even when empty, so a re-run after a fix replaces yesterday's rows.
        held = store.publish(INTERACTIONS_QUARANTINE, date, [screen.quarantined], QUARANTINE_SCHEMA)
        metadata["quarantine"] = MetadataValue.path(held.uri)
    return {INTERACTIONS: metadata}


INTERACTIONS_LANDING = LandingSpec(
    INTERACTIONS,
    INTERACTIONS_SCHEMA,
    INTERACTIONS_GATE,
    screen=_screen,
    publish=_publish_quarantine,
    config=InteractionsConfig,
)

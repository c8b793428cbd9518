"""``transactions``: the day's card transactions as the payments platform lands them, screened
against the contract, and the settings the landing checks and ``fraud_scores`` share."""

from dagster import AssetExecutionContext, AssetSpec, MetadataValue
from pydantic import Field

from assets.days import daily_assets
from assets.fraud.gates import LANDING_SUITES, TRANSACTIONS_GATE
from assets.fraud.quality import save_screen, screen_transactions
from assets.fraud.schemas import AMOUNT_CEILING, GROUP, SCREENS, TRANSACTIONS, TRANSACTIONS_SCHEMA
from assets.landing import LandingSpec, deadline, land
from resources.quality import QualityConfig
from resources.storage import DataStore, StorageResource


class FraudQualityConfig(QualityConfig):
    amount_ceiling: float = Field(
        default=AMOUNT_CEILING,
        description="The data contract's largest amount, in the transaction's currency units: "
        "a larger amount is quarantined as `amount_above_ceiling`, never scored. Give "
        "`transactions` and `fraud_scores` the same value.",
    )


class TransactionsConfig(FraudQualityConfig):
    deadline_hours: float = deadline(2.0, "the fraud schedule scores it at 02:00")


@daily_assets(
    AssetSpec(TRANSACTIONS, group_name=GROUP, kinds={"parquet"}),
    AssetSpec(
        SCREENS,
        deps=[TRANSACTIONS],
        group_name=GROUP,
        kinds={"json"},
        description="Each day's screening of the landed transactions against the contract: "
        "which rows scoring will quarantine and why, tied to the exact files it was made from. "
        "fraud_scores reuses it instead of screening the day again.",
    ),
    checks=[suite.spec() for suite in LANDING_SUITES.values()],
)
def transactions(
    context: AssetExecutionContext, config: TransactionsConfig, storage: StorageResource
):
    """Yesterday's card transactions as the payments platform lands them.

    Materialising checks that every landing file carries the agreed columns and types, counts
    the rows, and screens every row against the contract (ids present and unique, amounts
    finite and not negative, timestamps inside the day, landed on time), so scoring never
    starts on a day that is missing, malformed or has more bad rows than may be quarantined.
    """
    yield from land(context, TRANSACTIONS_LANDING, config, storage)


def _screen(store: DataStore, date: str, config: TransactionsConfig, limit: float):
    return screen_transactions(
        store,
        date,
        sample_rows=config.check_sample_rows,
        seed=config.check_seed,
        amount_ceiling=config.amount_ceiling,
    )


def _save(store: DataStore, date: str, screen, config: TransactionsConfig, limit: float) -> dict:
    """The day's screen, kept for fraud_scores as the day's transaction_screens partition."""
    saved = save_screen(store, date, screen, config.amount_ceiling)
    return {SCREENS: {"rows_to_quarantine": screen.plan.count, "output": MetadataValue.path(saved)}}


TRANSACTIONS_LANDING = LandingSpec(
    TRANSACTIONS,
    TRANSACTIONS_SCHEMA,
    TRANSACTIONS_GATE,
    screen=_screen,
    publish=_save,
    config=TransactionsConfig,
)

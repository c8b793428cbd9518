"""``fraud_scores_shadow``: the fraud model's challenger scores each night's transactions beside
the champion (assets/shadow/), agreeing on whom to flag and on the spread of scores."""

from functools import partial

from assets.fraud.landing import FraudQualityConfig
from assets.fraud.schemas import ALERTS, MODEL_NAME
from assets.fraud.scoring import FRAUD_SCORES
from assets.shadow.asset import Shadow, shadow_asset
from inference.models.agreement import Limit, flagged_agreement

FRAUD_SHADOW_LIMITS = (
    # Both read the same screened input: a transaction scored by one version only is a fault.
    Limit("rows_unmatched", at_most=0),
    # At least half of the transactions either version flags, both flag: a better model
    # changes some alerts, not most of the fraud team's queue.
    Limit("flagged_jaccard", at_least=0.5),
    # Above 0.25 is the usual reading of a large shift, as in the drift check against training.
    Limit("score_psi", at_most=0.25),
)

FRAUD_SHADOW = Shadow(
    scoring=FRAUD_SCORES,
    model=MODEL_NAME,
    config=FraudQualityConfig,
    agreement=partial(flagged_agreement, id_column="transaction_id"),
    limits=FRAUD_SHADOW_LIMITS,
    group="fraud",
    # After the alerts: the fraud team's queue is never waiting on the shadow.
    after=(ALERTS,),
)
fraud_scores_shadow = shadow_asset(FRAUD_SHADOW)

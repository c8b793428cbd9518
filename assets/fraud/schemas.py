"""The fraud domain's data contracts: landing datasets and published outputs."""

import pyarrow as pa

from inference.engine.streaming import exact_name

# The fraud assets' group in the UI.
GROUP = "fraud"
TRANSACTIONS = "transactions"
# Each day's screening of the landed transactions (its quarantine plan), which fraud_scores reuses.
SCREENS = "transaction_screens"
TRANSACTIONS_LABELLED = "transactions_labelled"
MODEL_NAME = "fraud_model"
SCORES = "fraud_scores"
ALERTS = "fraud_alerts"
# fraud_scores' side output: the landing details of the transactions it flagged, committed with
# the scores, so fraud_alerts publishes exactly what was scored and never re-reads landing.
FLAGGED = "fraud_scores_flagged"

TRANSACTIONS_SCHEMA = pa.schema(
    [
        ("transaction_id", pa.string()),
        ("account_id", pa.string()),
        ("merchant_id", pa.string()),
        ("amount", pa.float64()),
        ("currency", pa.string()),
        ("ts", pa.timestamp("us", tz="UTC")),
        ("channel", pa.string()),
        ("country", pa.string()),
    ]
)

# Labels arrive later (chargebacks, analyst decisions); one partition per transaction day.
LABELLED_SCHEMA = TRANSACTIONS_SCHEMA.append(pa.field("is_fraud", pa.int8()))

# The data contract's largest amount: above it a transaction is quarantined as
# `amount_above_ceiling`, never scored (an amount of 1e12 is an upstream error, not a purchase).
# In the transaction's own currency units; set `amount_ceiling` on the assets' config for
# currencies with small units.
AMOUNT_CEILING = 1_000_000.0

SCORES_SCHEMA = pa.schema(
    [
        ("transaction_id", pa.string()),
        ("score", pa.float32()),
        ("flagged", pa.bool_()),
        # A feature was beyond the model's training range and was clamped to it: the score is
        # the model's answer for the nearest value it knows, so a person should look.
        ("needs_review", pa.bool_()),
        ("model_version", pa.string()),
    ]
)

# Landing columns scored as float64 whose landed decimals (Spark's decimal(18,2)) are also kept
# exactly, as text in `<name>_exact`, wherever a transaction is written out: alerts, quarantine.
EXACT_COLUMNS = ["amount"]

# An alert is a flagged transaction's landing details with its score, review flag and model;
# `amount_exact` is the amount as landed when it was a decimal, null when it was a float.
ALERTS_SCHEMA = pa.schema(
    [
        SCORES_SCHEMA.field("transaction_id"),
        SCORES_SCHEMA.field("score"),
        *(f for f in TRANSACTIONS_SCHEMA if f.name != "transaction_id"),
        *(pa.field(exact_name(name), pa.string()) for name in EXACT_COLUMNS),
        SCORES_SCHEMA.field("needs_review"),
        SCORES_SCHEMA.field("model_version"),
    ]
)

# fraud_alerts publishes the side output as it is: it has the alerts' columns.
FLAGGED_SCHEMA = ALERTS_SCHEMA

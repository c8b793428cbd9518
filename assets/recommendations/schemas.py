"""The recommendations domain's data contracts: landing input and published output."""

import pyarrow as pa

GROUP = "recommendations"
INTERACTIONS = "interactions"
USER_RECOMMENDATIONS = "user_recommendations"
RECOMMENDATION_MODEL = "recommendation_model"

INTERACTIONS_SCHEMA = pa.schema(
    [
        ("user_id", pa.int64()),
        ("item_id", pa.int64()),
        ("ts", pa.timestamp("us", tz="UTC")),
        ("event", pa.string()),  # view | click | purchase
        ("weight", pa.float32()),
    ]
)

RECOMMENDATIONS_SCHEMA = pa.schema(
    [
        ("user_id", pa.int64()),
        ("rank", pa.int16()),
        ("item_id", pa.int64()),
        ("score", pa.float32()),
        ("model_version", pa.string()),
    ]
)

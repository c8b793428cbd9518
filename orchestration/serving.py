"""The serving code location: the publish steps, their jobs and trigger, and the serving
target the settings choose.

A location of its own (workspace.yaml) rather than more assets in orchestration.definitions:
the serving store is another system whose settings, outages and schedule are the product's,
and a store that is down fails the publish step there without touching the scoring jobs. Its
publish assets depend on the scored assets of the other location by key.
"""

from __future__ import annotations

import os

from dagster import (
    AssetSelection,
    AutomationConditionSensorDefinition,
    Definitions,
    define_asset_job,
)

from assets.serving import PUBLISH_JOBS
from assets.serving import defs as serving_assets
from orchestration.resources import build_resources
from policy.partitions import daily_partitions
from policy.retries import ERROR_RETRY_POLICY
from resources.serving import serving_from_env

publish_jobs = [
    define_asset_job(
        publish.job,
        selection=AssetSelection.assets(publish.asset),
        partitions_def=daily_partitions,
        op_retry_policy=ERROR_RETRY_POLICY,
        description=f"Serves the day {publish.after} published: {publish.asset}.",
    )
    for publish in PUBLISH_JOBS
]

# A publish asset runs by itself once its parent's day is materialised and the parent's
# blocking checks passed (policy/automation.py), as the alerts follow the scores.
serving_automation_sensor = AutomationConditionSensorDefinition(
    "serving_automation_sensor",
    target=AssetSelection.assets(*(p.asset for p in PUBLISH_JOBS)),
)


def build_serving_definitions(env: str = "local") -> Definitions:
    return Definitions.merge(
        serving_assets,
        Definitions(
            jobs=publish_jobs,
            sensors=[serving_automation_sensor],
            resources={"storage": build_resources(env)["storage"], "serving": serving_from_env()},
        ),
    )


def publish_jobs_after(job: str) -> list[str]:
    """The publish jobs that follow the pipeline job ``job``."""
    return [p.job for p in PUBLISH_JOBS if p.after == job]


defs = build_serving_definitions(os.environ.get("NIGHTSHIFT_ENV", "local"))

"""The one Definitions object the workspace loads: every domain, plus cross-cutting policy."""

from __future__ import annotations

import os

from dagster import Definitions

from assets import serving
from assets.domains import DOMAINS
from inference.engine.device import limit_malloc_arenas
from orchestration.automation import automation_condition_sensor, run_failure_sensor
from orchestration.jobs import pipeline_jobs, training_jobs
from orchestration.promotion import promote_model_job, promotion_checks
from orchestration.rescore import sensors as rescore_sensors
from orchestration.resources import build_resources
from orchestration.schedules import schedules
from orchestration.sensors import landing_sensor
from orchestration.serving import publish_jobs
from orchestration.upkeep import outputs_upkeep_job, outputs_upkeep_job_schedule

# Every Dagster process that runs steps (a run worker, `dagster job execute`, the CLI) loads
# this module before it starts a thread: capped here, the cap covers every thread of the run.
limit_malloc_arenas()


def build_definitions(env: str = "local") -> Definitions:
    """Merges the domains' assets and checks, and the publish steps that serve their days, with
    the jobs, schedules and sensors built from their wiring, and the environment's resources."""
    return Definitions.merge(
        *(domain.defs for domain in DOMAINS),
        serving.defs,
        Definitions(
            asset_checks=promotion_checks,
            jobs=[
                *pipeline_jobs,
                *training_jobs,
                *publish_jobs,
                promote_model_job,
                outputs_upkeep_job,
            ],
            schedules=[*schedules, outputs_upkeep_job_schedule],
            sensors=[
                landing_sensor,
                run_failure_sensor,
                automation_condition_sensor,
                *rescore_sensors,
            ],
            resources=build_resources(env),
        ),
    )


# The environment is chosen once, when the code location loads.
defs = build_definitions(os.environ.get("NIGHTSHIFT_ENV", "local"))

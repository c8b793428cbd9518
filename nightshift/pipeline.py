"""Your own model as a nightly pipeline: a :class:`Predictor`, what it reads (:class:`Landing`),
what it writes (:class:`Output`), how the day is judged (:class:`Checks`), and :func:`nightly`,
which builds its Dagster definitions: the landing asset, the scoring asset with its checks, its
job, schedule and landing trigger.

The declarations are the Dagster layer's (``assets/nightly.py``), where the shipped domains
declare themselves with the same names; this module adds the Definitions that run a pipeline
on its own, which need the orchestration layer above it.
"""

from dataclasses import fields
from functools import cached_property, wraps

from dagster import Definitions

from assets.nightly import Checks, Landing, Output, Predictor
from assets.nightly import NightlyPipeline as Built
from assets.nightly import nightly as build
from orchestration.jobs import pipeline_job
from orchestration.resources import build_resources
from orchestration.schedules import nightly_schedule
from orchestration.sensors import build_landing_sensor

__all__ = ["Checks", "Landing", "NightlyPipeline", "Output", "Predictor", "nightly"]


class NightlyPipeline(Built):
    """What :func:`nightly` builds, with Definitions that run the pipeline on its own."""

    @cached_property
    def defs(self) -> Definitions:
        """The pipeline on its own: its assets, job, schedule, landing trigger and the local
        resources."""
        [pipeline] = self.wiring.pipelines
        job = pipeline_job(pipeline)
        return Definitions(
            assets=[self.landing_asset, self.scoring_asset],
            jobs=[job],
            schedules=[nightly_schedule(pipeline, job)],
            sensors=[build_landing_sensor([pipeline], [job])],
            resources=build_resources(),
        )


@wraps(build)
def nightly(*args, **kwargs) -> NightlyPipeline:
    built = build(*args, **kwargs)
    return NightlyPipeline(**{f.name: getattr(built, f.name) for f in fields(built)})

"""What a domain declares about how it runs: its definitions, nightly pipelines, training jobs.

Each domain package (``assets/<domain>/__init__.py``) exports one ``DomainWiring``, and
``assets/domains.py`` lists them. The root (``orchestration/``) builds every job, schedule and
the landing sensor from that list and applies the cross-cutting policy (retries, tags, the
executor) once, so no module outside a domain names its jobs, hours or landing datasets.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dagster import Definitions

if TYPE_CHECKING:
    from inference.models.gate import Gate
    from resources.storage import DataStore

# ``(store, date, scale, seed) -> {dataset: rows written}``: one seeded day of a domain's demo
# landing data (``nightshift generate``, ``make run``); same arguments, same bytes.
DemoDay = Callable[["DataStore", str, float, int], dict[str, int]]


@dataclass(frozen=True)
class Pipeline:
    """A nightly job that scores one daily partition (or a range in one run).

    Attributes:
        job: The job's name (``<domain>_<what>_job``); its schedule is ``<job>_schedule``.
        assets: The asset keys the job materialises, in the order its description lists them.
        hour_utc: The hour (UTC) its schedule scores the day that just ended.
        landing: The landing datasets it reads for a day: a new or changed landing partition of
            any of them launches it (the landing sensor), and the CLI refuses a day without them.
        scored: The asset whose materialisation of a day means "the job scored that day".
    """

    job: str
    assets: tuple[str, ...]
    hour_utc: int
    landing: tuple[str, ...]
    scored: str

    def __post_init__(self) -> None:
        if not 0 <= self.hour_utc <= 23:
            raise ValueError(f"{self.job}: hour_utc {self.hour_utc} is not an hour of the day")
        if not self.landing:
            raise ValueError(f"{self.job}: a pipeline reads at least one landing dataset")
        outside = [key for key in (*self.landing, self.scored) if key not in self.assets]
        if outside:
            raise ValueError(f"{self.job}: {', '.join(outside)} not among its assets")


@dataclass(frozen=True)
class TrainingJob:
    """An on-demand job that retrains ``model`` (an asset key) into a challenger.

    Attributes:
        job: the job's name (``<domain>_training_job``).
        model: the model asset, whose key is also the model's name in the store.
        gate: how its versions are measured against each other (``inference/models/gate.py``): with
            one, the job runs the blocking promotion check, which promotes a challenger that is
            at least as good as the champion; without, versions are promoted by hand.
    """

    job: str
    model: str
    gate: Gate | None = None

    def __post_init__(self) -> None:
        jobs = TRAINED_BY.setdefault(self.model, [])
        if self.job not in jobs:
            jobs.append(self.job)


# The jobs that retrain each model asset, filled as the domains declare them (at import), so
# that a failure deep in a domain's step can name them without importing the list of domains.
TRAINED_BY: dict[str, list[str]] = {}


@dataclass(frozen=True)
class DomainWiring:
    """One domain: its assets and checks, the pipelines that run them, the models' retraining,
    and, optionally, how to write a day of demo landing data for the datasets it lands."""

    defs: Definitions
    pipelines: tuple[Pipeline, ...]
    training: tuple[TrainingJob, ...] = ()
    demo_day: DemoDay | None = None

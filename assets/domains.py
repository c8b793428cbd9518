"""The domains this code location runs. A new pipeline is a new folder under assets/ that
exports a ``wiring`` (see assets/wiring.py), and one line here."""

from __future__ import annotations

from assets import embeddings, fraud, recommendations, summaries
from assets.wiring import DomainWiring, Pipeline, TrainingJob

# The order is the order of the jobs, schedules and landing triggers in the UI and the CLI.
DOMAINS: tuple[DomainWiring, ...] = (
    fraud.wiring,
    recommendations.wiring,
    summaries.wiring,
    embeddings.wiring,
)

PIPELINES: tuple[Pipeline, ...] = tuple(p for d in DOMAINS for p in d.pipelines)
TRAINING_JOBS: tuple[TrainingJob, ...] = tuple(t for d in DOMAINS for t in d.training)

_JOB_NAMES = [*(p.job for p in PIPELINES), *(t.job for t in TRAINING_JOBS)]
if len(set(_JOB_NAMES)) != len(_JOB_NAMES):
    raise ValueError(f"two domains declare a job of the same name: {sorted(_JOB_NAMES)}")

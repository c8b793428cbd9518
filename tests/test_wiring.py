"""Each domain's wiring becomes its jobs, schedules and landing triggers; a new domain is one entry."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from dagster import AssetKey, Definitions

from assets.domains import DOMAINS, PIPELINES, TRAINING_JOBS, training_jobs_for
from assets.wiring import DomainWiring, Pipeline
from examples import churn_scores as churn
from orchestration.definitions import defs
from orchestration.jobs import landing_inputs, pipeline_job
from orchestration.schedules import nightly_schedule
from orchestration.sensors import landing_sensor

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "your-own-model.md"
DOC_PASSAGE = "To run it nightly with the other domains"


def _keys(job_name: str, definitions: Definitions = defs) -> set[str]:
    job = definitions.resolve_job_def(job_name)
    return {k.to_user_string() for k in job.asset_layer.selected_asset_keys}


@pytest.mark.parametrize("pipeline", PIPELINES, ids=lambda p: p.job)
def test_a_declared_pipeline_gets_its_job_schedule_and_landing_trigger(pipeline) -> None:
    assert _keys(pipeline.job) == set(pipeline.assets)
    schedule = defs.resolve_schedule_def(f"{pipeline.job}_schedule")
    assert schedule.job_name == pipeline.job
    assert schedule.cron_schedule == f"0 {pipeline.hour_utc} * * *"
    assert pipeline.job in {t.job_name for t in landing_sensor.targets}
    assert landing_inputs(pipeline.job) == list(pipeline.landing)


def test_a_declared_training_job_retrains_its_model() -> None:
    assert {t.job for t in TRAINING_JOBS} == {"fraud_training_job", "recommendations_training_job"}
    for training in TRAINING_JOBS:
        assert _keys(training.job) == {training.model}
        assert training_jobs_for(training.model) == [training.job]
    assert training_jobs_for("document_summaries") == []


def test_every_domain_asset_and_check_is_in_the_root() -> None:
    graph = defs.get_repository_def().asset_graph
    for domain in DOMAINS:
        for asset in domain.defs.assets:
            assert set(asset.keys) <= graph.get_all_asset_keys()
            assert set(asset.check_keys) <= graph.asset_check_keys
        for check in domain.defs.asset_checks or ():
            assert set(check.check_keys) <= graph.asset_check_keys


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"scored": "elsewhere"}, "elsewhere not among its assets"),
        ({"landing": ("other",)}, "other not among its assets"),
        ({"landing": ()}, "at least one landing dataset"),
        ({"hour_utc": 24}, "hour_utc 24 is not an hour of the day"),
    ],
)
def test_a_pipeline_that_cannot_run_is_refused_where_it_is_declared(change, message) -> None:
    fields = dict(job="x_job", assets=("a", "b"), hour_utc=1, landing=("a",), scored="b")
    with pytest.raises(ValueError, match=message):
        Pipeline(**{**fields, **change})


def _documented_wiring() -> DomainWiring:
    """The wiring docs/your-own-model.md gives the churn example, run as written."""
    text = DOC.read_text()
    block = re.search(r"```python\n(.*?)```", text[text.index(DOC_PASSAGE) :], re.S).group(1)
    namespace = {**vars(churn), "DomainWiring": DomainWiring, "Pipeline": Pipeline}
    exec(block, namespace)
    return namespace["wiring"]


def test_the_documented_new_domain_loads_beside_the_others() -> None:
    wiring = _documented_wiring()
    [pipeline] = wiring.pipelines
    job = pipeline_job(pipeline)
    merged = Definitions.merge(
        defs, wiring.defs, Definitions(jobs=[job], schedules=[nightly_schedule(pipeline, job)])
    )
    Definitions.validate_loadable(merged)
    assert _keys("churn_scoring_job", merged) == {"customers", "churn_scores"}
    schedule = merged.resolve_schedule_def("churn_scoring_job_schedule")
    assert schedule.cron_schedule == "0 4 * * *"
    assert merged.resolve_job_def("churn_scoring_job").tags == job.tags
    assert AssetKey("fraud_scores") in merged.get_repository_def().asset_graph.get_all_asset_keys()


def test_the_definitions_and_the_cli_load_without_torch() -> None:
    """Code servers, sensors, schedules and the CLI load the definitions without running a
    model: torch (and transformers) are imported by the code that runs one, so those processes
    start without torch's import time and memory."""
    probe = (
        "import sys, orchestration.definitions, orchestration.cli; "
        "print(sorted(m for m in ('torch', 'transformers', 'safetensors.torch') if m in sys.modules))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", f"imported at load: {done.stdout.strip()}"

"""Each domain's wiring becomes its jobs, schedules and landing triggers; a new domain is one entry."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from dagster import AssetKey, Definitions

from assets.domains import DOMAINS, PIPELINES, TRAINING_JOBS
from assets.wiring import TRAINED_BY, Pipeline
from examples import churn_scores as churn
from orchestration.definitions import defs
from orchestration.jobs import landing_inputs, pipeline_job
from orchestration.schedules import nightly_schedule
from orchestration.sensors import landing_sensor

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "your-own-model.md"


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
        assert TRAINED_BY[training.model] == [training.job]
    assert "document_summaries" not in TRAINED_BY


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


def test_the_documented_new_domain_loads_beside_the_others() -> None:
    """docs/your-own-model.md: adding the example's ``churn.wiring`` to the domains gives it its
    job and schedule beside the shipped ones (built here as orchestration/ builds every
    domain's), and its own ``defs`` hold the same job."""
    assert "add `churn.wiring` to\n`DOMAINS`" in DOC.read_text()
    wiring = churn.churn.wiring
    [pipeline] = wiring.pipelines
    job = pipeline_job(pipeline)
    merged = Definitions.merge(
        defs, wiring.defs, Definitions(jobs=[job], schedules=[nightly_schedule(pipeline, job)])
    )
    Definitions.validate_loadable(merged)
    assert _keys("churn_scores_job", merged) == {"customers", "churn_scores"}
    schedule = merged.resolve_schedule_def("churn_scores_job_schedule")
    assert schedule.cron_schedule == "0 4 * * *"
    assert merged.resolve_job_def("churn_scores_job").tags == job.tags
    assert churn.defs.resolve_job_def("churn_scores_job").tags == job.tags
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


def test_demo_data_is_what_each_domain_declares_and_the_cli_names_no_domain(
    tmp_path: Path,
) -> None:
    """`nightshift generate` writes every domain's declared demo day, in the domains' order; a
    new pipeline with demo data is its folder and its line in assets/domains.py, nothing in the
    CLI (issue 45)."""
    import ast

    from orchestration.cli import generate
    from resources.storage import DataStore

    written = generate(DataStore(str(tmp_path / "cli")), "2026-03-01", 1, 0.01, 0)
    expected = []
    for domain in DOMAINS:
        if domain.demo_day is not None:
            rows = domain.demo_day(DataStore(str(tmp_path / "own")), "2026-03-01", 0.01, 0)
            expected += [(dataset, "2026-03-01", n) for dataset, n in rows.items()]
    assert written == expected and {d for d, _, _ in written} >= {"transactions", "documents"}

    packages = [p.parent.name for p in (REPO / "assets").glob("*/__init__.py")]
    domains = [name for name in packages if "wiring = DomainWiring(" in _init(name)]
    assert len(domains) == len(DOMAINS), domains
    tree = ast.parse((REPO / "orchestration" / "cli.py").read_text())
    imported = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module]
    named = [m for m in imported if m.split(".")[:2] in (["assets", d] for d in domains)]
    assert not named, named


def _init(package: str) -> str:
    return (REPO / "assets" / package / "__init__.py").read_text()

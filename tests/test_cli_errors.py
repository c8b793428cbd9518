"""`nightshift run` when a day cannot be scored (one line per job, traces in a log file) and simultaneous `nightshift` commands on a fresh DAGSTER_HOME."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
from dagster import DagsterInstance, DagsterRunStatus

from orchestration.cli import LOCAL_INSTANCE_YAML
from orchestration.jobs import PIPELINES, landing_inputs
from orchestration.run_report import RUN_LOGS
from resources.storage import DataStore

BIN = Path(sys.executable).parent
REPO = Path(__file__).resolve().parent.parent
DATE = "2026-03-03"


def _env(data_root: Path, home: Path) -> dict[str, str]:
    return {
        **os.environ,
        "NIGHTSHIFT_DATA_ROOT": str(data_root),
        "DAGSTER_HOME": str(home),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
    }


def _nightshift(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(BIN / "nightshift"), *args], env=env, capture_output=True, text=True, timeout=300
    )


def test_a_day_without_landing_data_is_one_line_per_job_and_no_run(
    data_root: Path, tmp_path: Path
) -> None:
    home = tmp_path / "fresh_home"  # not created: the command initialises it
    done = _nightshift("run", "--date", DATE, env=_env(data_root, home))
    assert done.returncode == 1, done.stderr[-3000:]
    store = DataStore(str(data_root))
    lines = done.stderr.splitlines()
    expected = []
    for job in PIPELINES:
        dataset = landing_inputs(job)[0]
        path = store.uri(store.landing_path(dataset, DATE))
        expected.append(
            f"{job} {DATE}: not run: no landing data for {dataset} at {path} (land it there, "
            f"or generate demo data with `nightshift generate --date {DATE}`)"
        )
    assert lines == [*expected, f"4 of 4 job(s) did not score {DATE}"], done.stderr[-3000:]
    assert "Traceback" not in done.stderr and "Stack Trace" not in done.stderr
    assert "running" not in done.stdout
    with DagsterInstance.from_config(str(home)) as instance:
        assert instance.get_runs() == []


def _land_interactions_without_columns(data_root: Path) -> None:
    DataStore(str(data_root)).write_landing("interactions", DATE, pa.table({"user": [1, 2]}))


def test_a_failed_run_is_one_line_naming_the_step_and_its_log(
    data_root: Path, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    _land_interactions_without_columns(data_root)
    done = _nightshift(
        "run", "--date", DATE, "--jobs", "recommendations_job", env=_env(data_root, home)
    )
    assert done.returncode == 1, done.stderr[-3000:]
    *failed, summary = done.stderr.splitlines()
    assert summary == f"1 of 1 job(s) did not score {DATE}"
    [line] = failed
    assert line.startswith(f"recommendations_job {DATE}: failed in run "), line
    assert ": interactions: " in line and "user_id" in line, line
    assert "Traceback" not in done.stderr and "Stack Trace" not in done.stderr
    # The full traces are kept, in the file the line names.
    log = Path(line.split("(full traces: ", 1)[1].split(";", 1)[0])
    assert log.parent == home / RUN_LOGS and log.is_file()
    text = log.read_text()
    assert "step interactions:" in text and "Stack Trace:" in text and "user_id" in text
    with DagsterInstance.from_config(str(home)) as instance:
        [run] = instance.get_runs()
        assert run.status == DagsterRunStatus.FAILURE and run.run_id in log.name


def test_verbose_prints_the_traces_as_the_run_goes(data_root: Path, tmp_path: Path) -> None:
    _land_interactions_without_columns(data_root)
    env = _env(data_root, tmp_path / "home")
    done = _nightshift("run", "--date", DATE, "--jobs", "recommendations_job", "--verbose", env=env)
    assert done.returncode == 1
    assert "STEP_FAILURE" in done.stderr and "Stack Trace" in done.stderr


def test_an_unknown_job_is_a_one_line_usage_error(data_root: Path, tmp_path: Path) -> None:
    done = _nightshift("run", "--jobs", "fraud_job", env=_env(data_root, tmp_path / "home"))
    assert done.returncode == 2
    (line,) = done.stderr.splitlines()
    assert "argument --jobs: not a pipeline job: 'fraud_job' (choose from fraud_scoring_job" in line


# Imports first (the code location too), then waits for the agreed moment: both commands reach
# the instance together.
AT_THE_SAME_MOMENT = """
import os, sys, time
import orchestration.definitions
from orchestration.cli import main
time.sleep(max(0.0, float(os.environ["START_AT"]) - time.time()))
sys.exit(main(sys.argv[1:]))
"""


def test_two_nightshift_runs_at_the_same_moment_on_a_fresh_home_both_succeed(
    tmp_path: Path,
) -> None:
    """Each `nightshift` command that opens the instance initialises it under the init lock
    first: two runs started together on a home with its config but no storage yet both score
    their day, and the instance they leave holds both runs. Each has a data root of its own,
    so the instance is all they share. Without the lock one of them failed in two of three
    tries here ("table alembic_version already exists")."""
    from assets.recommendations.demo_data import generate_day

    roots = [tmp_path / "data_a", tmp_path / "data_b"]
    for root in roots:
        for day in ("2026-03-01", "2026-03-02", DATE):
            generate_day(DataStore(str(root)), day, scale=0.02, seed=0)
    home = tmp_path / "fresh_home"
    home.mkdir()
    shutil.copyfile(LOCAL_INSTANCE_YAML, home / "dagster.yaml")
    env = {**_env(roots[0], home), "START_AT": str(time.time() + 8)}
    run = ["run", "--date", DATE, "--jobs", "recommendations_job", "--data-root"]
    starts = [
        subprocess.Popen(
            [sys.executable, "-c", AT_THE_SAME_MOMENT, *run, str(root)],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for root in roots
    ]
    outputs = [p.communicate(timeout=300)[0] for p in starts]
    assert [p.returncode for p in starts] == [0, 0], "\n".join(o[-3000:] for o in outputs)
    assert "alembic" not in "".join(outputs)
    with DagsterInstance.from_config(str(home)) as instance:
        runs = instance.get_runs()
        assert [r.job_name for r in runs] == ["recommendations_job"] * 2
        assert {r.status for r in runs} == {DagsterRunStatus.SUCCESS}
    for root in roots:
        assert DataStore(str(root)).output_exists("user_recommendations", DATE)

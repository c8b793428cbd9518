"""Operating nightshift from the UI: scoring before any model was trained, simultaneous first runs on a fresh instance, and stopping `dagster dev` mid-run."""

from __future__ import annotations

import importlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from dagster import DagsterEventType, DagsterInstance, DagsterRunStatus, materialize
from ui_stack import (
    REPO,
    REPOSITORIES,
    DagsterStack,
    completed_days,
    start_dagster_dev,
    wait_for,
    wait_until_serving,
)

from orchestration.automation import classify_failure, failure_observations
from orchestration.dev_server import EXIT_SITE, dagster_dev_environment

BIN = Path(sys.executable).parent
DAY = "2026-03-01"


def _failure_text(result) -> str:
    failures = result.get_step_failure_events()
    assert failures, "expected a failed step"
    return "\n".join(e.step_failure_data.error.to_string() for e in failures)


@pytest.mark.parametrize(
    ("domain", "asset", "model", "training_job"),
    [
        ("fraud", "fraud_scores", "fraud_model", "fraud_training_job"),
        (
            "recommendations",
            "user_recommendations",
            "recommendation_model",
            "recommendations_training_job",
        ),
    ],
)
def test_scoring_before_the_model_was_trained_says_how_to_train_it(
    domain, asset, model, training_job, store, resources, instance
) -> None:
    """A backfill of the scoring asset alone (as from the asset graph) on a fresh instance."""
    generate_day = importlib.import_module(f"assets.{domain}.demo_data").generate_day
    scoring = getattr(importlib.import_module(f"assets.{domain}"), asset)
    generate_day(store, DAY, scale=0.01, seed=0)
    result = materialize(
        [scoring], partition_key=DAY, resources=resources, instance=instance, raise_on_error=False
    )
    assert not result.success
    text = _failure_text(result)
    assert f"model '{model}' has not been trained" in text
    assert f"materialise the `{model}` asset" in text and f"--select {model}" in text
    assert f"or run `{training_job}`" in text

    # What the run failure sensor records on the day's page carries the same advice, not only
    # the raw "model ... has not been trained" of the exception under it.
    report = classify_failure(instance, instance.get_run_by_id(result.run_id))
    [observation] = failure_observations(report)
    assert (observation.asset_key.to_user_string(), observation.partition) == (asset, DAY)
    detail = observation.metadata["failure_detail"].value
    assert detail.startswith(f"Failure: model '{model}' has not been trained"), detail
    assert f"train the model once: materialise the `{model}` asset" in detail, detail
    assert f"or run `{training_job}`; then run this again" in detail, detail


# Imports first, then waits for the agreed moment: both processes reach the instance together.
SIMULTANEOUS_INIT = """
import os, sys, time
import dagster
from orchestration.cli import main
time.sleep(max(0.0, float(os.environ["START_AT"]) - time.time()))
sys.exit(main(["init"]))
"""


def test_two_first_runs_at_the_same_moment_leave_a_working_instance(tmp_path: Path) -> None:
    """`nightshift init` (what `make run`, `make ui` and CI do before any run) started twice at
    once on a fresh DAGSTER_HOME; without its lock this broke SQLite in most attempts here
    ("alembic_version has more than one head present"), so it is tried three times."""
    for attempt in range(3):
        home = tmp_path / f"dagster_home_{attempt}"
        env = {**os.environ, "DAGSTER_HOME": str(home), "START_AT": str(time.time() + 6)}
        starts = [
            subprocess.Popen(
                [sys.executable, "-c", SIMULTANEOUS_INIT],
                cwd=REPO,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            for _ in range(2)
        ]
        outputs = [p.communicate(timeout=120)[0] for p in starts]
        assert [p.returncode for p in starts] == [0, 0], "\n".join(outputs)
        later = subprocess.run(
            [str(BIN / "dagster"), "run", "list"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert later.returncode == 0, later.stderr[-3000:]
        with DagsterInstance.from_config(str(home)) as instance:
            assert instance.get_runs() == []


LAUNCH_RUN = """
mutation Launch($params: ExecutionParams!) {
  launchRun(executionParams: $params) {
    __typename
    ... on LaunchRunSuccess { run { runId } }
    ... on PythonError { message }
    ... on Error { message }
  }
}
"""

RUN_STEPS = """
query Run($id: ID!) {
  runOrError(runId: $id) { ... on Run { status stepStats { stepKey status } } }
}
"""


def _group_processes(group: int) -> list[str]:
    """The live (not zombie) processes of a process group, as `pid command`."""
    alive = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == group and fields[0] != "Z":
            alive.append(f"{stat.parent.name} {(stat.parent / 'cmdline').read_bytes()[:120]!r}")
    return alive


def _logged(home: Path, run_id: str, text: str) -> bool:
    """Whether the run's event log holds a message containing ``text``."""
    with DagsterInstance.from_config(str(home)) as instance:
        return any(text in (record.message or "") for record in instance.all_logs(run_id))


# Garbage only the collector can free (a reference cycle), whose finaliser says when it ran.
CYCLE_AT_EXIT = """
class Cyclic:
    def __del__(self):
        print("collected at exit", flush=True)
held = Cyclic()
held.self = held
try:
    import sitecustomize
    print(sitecustomize.__file__, flush=True)
except ImportError:
    print("no sitecustomize", flush=True)
"""


def test_processes_started_by_nightshift_ui_skip_the_last_garbage_collection() -> None:
    """Each process of the `nightshift ui` tree imports orchestration/dev_site, whatever else
    is on PYTHONPATH, and exits without CPython's final collection (what made the tree outlive
    a stop signal); outside the tree the collection runs as usual."""
    plain = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env = dagster_dev_environment({**plain, "PYTHONPATH": "/elsewhere"})
    assert env["PYTHONPATH"].split(os.pathsep) == [str(EXIT_SITE), "/elsewhere"]

    def lines(environment: dict[str, str]) -> list[str]:
        done = subprocess.run(
            [sys.executable, "-c", CYCLE_AT_EXIT],
            env=environment,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout.splitlines()

    assert lines(env) == [str(EXIT_SITE / "sitecustomize.py")]
    assert lines(plain)[-1] == "collected at exit"


# `nightshift ui` as a shell starts a script's background job (SIGINT ignored), with `dagster
# dev` swapped for a probe of what the exec'd process inherits.
PROBE = """
import os, signal
print(signal.getsignal(signal.SIGINT) is signal.default_int_handler)
print(os.getcwd())
print(os.environ["PYTHONPATH"].split(os.pathsep)[0])
os.kill(os.getpid(), signal.SIGTERM)
"""
EXEC_WITH_SIGINT_IGNORED = f"""
import signal, sys
signal.signal(signal.SIGINT, signal.SIG_IGN)
from orchestration import dev_server
dev_server.dagster_dev_command = lambda host, port: [sys.executable, "-c", {PROBE!r}]
dev_server.exec_dagster_dev("127.0.0.1", 3000)
"""


def test_nightshift_ui_execs_dagster_dev_able_to_stop(tmp_path: Path) -> None:
    """What `dagster dev` starts with under `nightshift ui`, even from a script's background
    job: SIGINT raising KeyboardInterrupt (each Dagster process gives SIGTERM the same handler,
    so an ignored SIGINT would have made the tree ignore SIGTERM too), SIGTERM not ignored, the
    repository as working directory and the exit site first on PYTHONPATH."""
    done = subprocess.run(
        [sys.executable, "-c", EXEC_WITH_SIGINT_IGNORED],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == -signal.SIGTERM, done.stderr
    assert done.stdout.splitlines() == ["True", str(REPO), str(EXIT_SITE)]


# How long the tree may take to be gone: a hang never ends, while a healthy stop's time depends
# on the machine's load (docs/benchmarks.md, "The dagster dev stop-signal test"). A 10 s bound failed in the whole suite
# once the run's steps commit to Iceberg tables, cause not found (docs/benchmarks.md, "The stop-signal test after Iceberg outputs").
STOP_BOUND_S = 30


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_dagster_dev_exits_soon_after_a_stop_signal_during_a_run(
    stop: signal.Signals, tmp_path: Path
) -> None:
    """Ctrl-C (SIGINT to the whole group) or SIGTERM while a run trains the fraud model: every
    process of `dagster dev`, the run's own included, has exited STOP_BOUND_S later, and the run
    failed as interrupted instead of retrying the step in its process and carrying on.

    Dagster can lose a signal that lands inside one of its own capture windows (its
    capture_interrupts clears a captured signal when the window closes: read in
    dagster/_utils/interrupts.py); the run then carries on to SUCCESS. Seen in fresh-clone CIs
    on a loaded machine, never alone (docs/benchmarks.md, "Fresh-clone CI runs"). A run that read SUCCESS
    is therefore tried once more, on a new instance: a stop that does not work fails both."""
    status = _stop_during_a_run(stop, tmp_path / "first")
    if status == DagsterRunStatus.SUCCESS:
        status = _stop_during_a_run(stop, tmp_path / "again")
    assert status == DagsterRunStatus.FAILURE, status


def _stop_during_a_run(stop: signal.Signals, tmp_path: Path) -> DagsterRunStatus:
    """Sends ``stop`` to `dagster dev`'s group while its run trains; asserts every process is
    gone STOP_BOUND_S later and the step was not retried in its process; returns the run's
    status."""
    tmp_path.mkdir()
    home, data_root = tmp_path / "dagster_home", tmp_path / "data"
    env = {
        **os.environ,
        "DAGSTER_HOME": str(home),
        "NIGHTSHIFT_DATA_ROOT": str(data_root),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
    }
    day = completed_days(1, ending_days_ago=3)[0]
    generate = [str(BIN / "nightshift"), "generate", "--date", day, "--days", "3"]
    done = subprocess.run(
        [*generate, "--scale", "0.3"], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert subprocess.run([str(BIN / "nightshift"), "init"], env=env, timeout=120).returncode == 0

    log = tmp_path / "dagster_dev.log"
    process, url = start_dagster_dev(env, log)
    stack = DagsterStack(url, home, data_root, log, process)
    try:
        wait_until_serving(stack)
        # Nothing at start-up that reads as something to fix (issue 44: Dagster's "dev_command
        # is superseded, use dg dev" printed at every start).
        assert "superseded" not in log.read_text(errors="replace"), stack.log_tail()
        [repo] = stack.graphql(REPOSITORIES)["repositoriesOrError"]["nodes"]
        params = {
            "selector": {
                "repositoryLocationName": repo["location"]["name"],
                "repositoryName": repo["name"],
                "jobName": "fraud_scoring_job",
            },
            "executionMetadata": {"tags": [{"key": "dagster/partition", "value": day}]},
            # Trained one row at a time, so that the step is still training when the signal
            # lands: at the default batch the whole run could end between the poll that saw
            # training start and the signal, on a loaded machine (the run then read SUCCESS;
            # seen in a fresh-clone CI, docs/benchmarks.md, "Fresh-clone CI runs").
            "runConfigData": {"ops": {"fraud_model": {"config": {"batch_size": 1}}}},
        }
        launched = stack.graphql(LAUNCH_RUN, params=params)["launchRun"]
        assert launched["__typename"] == "LaunchRunSuccess", launched
        run_id = launched["run"]["runId"]

        def training() -> bool:
            run = stack.graphql(RUN_STEPS, id=run_id)["runOrError"]
            steps = {s["stepKey"]: s["status"] for s in run["stepStats"]}
            return steps.get("fraud_model") == "IN_PROGRESS"

        wait_for(training, 180, "the run to start training fraud_model", every=0.3)
        # Inside the step's own code. A signal that lands while Dagster is still starting the
        # step can be lost: its capture_interrupts clears a captured signal when its window
        # closes (read in dagster/_utils/interrupts.py). Seen once, on a loaded machine: the run
        # carried on to success and the processes outlived the bound.
        wait_for(lambda: _logged(home, run_id, "labelled history"), 120, "training to read")
        os.killpg(process.pid, stop)
        stopped = time.monotonic()
        while _group_processes(process.pid) and time.monotonic() - stopped < STOP_BOUND_S:
            time.sleep(0.2)
        left = _group_processes(process.pid)
        gone = round(time.monotonic() - stopped, 1)
        assert not left, f"alive {gone} s after {stop.name}: {left}\n{stack.log_tail()}"
    finally:
        if _group_processes(process.pid):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=30)

    with DagsterInstance.from_config(str(home)) as instance:
        run = instance.get_run_by_id(run_id)
        assert run is not None
        restarted = instance.get_records_for_run(run_id, of_type=DagsterEventType.STEP_RESTARTED)
        assert not restarted.records, "the interrupted step was retried in the run's process"
        return run.status

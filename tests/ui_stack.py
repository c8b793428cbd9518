"""The real Dagster stack for the UI tests: `dagster dev` (webserver, daemon, code server) on
loopback over a temp instance and data root, a GraphQL client, and a backfill launched as the UI
launches one.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
SCALE = "0.01"
# What the browser tests see, as screenshots (docs/operating.md shows some).
ARTIFACTS = Path(__file__).parent / "artifacts"

T = TypeVar("T")


def completed_days(count: int, ending_days_ago: int) -> list[str]:
    """`count` consecutive UTC dates ending `ending_days_ago` days before today, oldest first."""
    today = dt.datetime.now(dt.UTC).date()
    last = today - dt.timedelta(days=ending_days_ago)
    return [(last - dt.timedelta(days=n)).isoformat() for n in range(count - 1, -1, -1)]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for(probe: Callable[[], T | None], timeout: float, what: str, every: float = 1.0) -> T:
    """Polls until `probe` returns something truthy; fails naming what it waited for."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(every)


@dataclass
class DagsterStack:
    """A running `dagster dev` and the folders it works in."""

    url: str
    home: Path
    data_root: Path
    log: Path
    process: subprocess.Popen
    location: str = ""
    repository: str = ""
    facts: dict[str, Any] = field(default_factory=dict)

    def graphql(self, query: str, **variables: Any) -> dict[str, Any]:
        body = json.dumps({"query": query, "variables": variables}).encode()
        request = urllib.request.Request(
            f"{self.url}/graphql", data=body, headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                payload = json.load(response)
        except urllib.error.HTTPError as exc:
            raise AssertionError(f"GraphQL {exc.code}: {exc.read().decode()[:2000]}") from None
        if payload.get("errors"):
            raise AssertionError(f"GraphQL errors: {payload['errors']}")
        return payload["data"]

    def selector(self, kind: str, name: str) -> dict[str, str]:
        """A sensor or schedule selector (`kind` is 'sensor' or 'schedule')."""
        return {
            "repositoryName": self.repository,
            "repositoryLocationName": self.location,
            f"{kind}Name": name,
        }

    def log_tail(self, lines: int = 60) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return "\n".join(text.splitlines()[-lines:])


def _server_up(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/server_info", timeout=2) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


def start_dagster_dev(env: dict[str, str], log: Path) -> tuple[subprocess.Popen, str]:
    """Starts `nightshift ui` (what `make ui` runs: the instance's config refreshed, then
    `dagster dev`) on a free loopback port, as the leader of its own process group, so that
    a test can signal the whole tree as a terminal's Ctrl-C does. Returns it and its URL."""
    port = free_port()
    with log.open("wb") as out:
        process = subprocess.Popen(
            [str(BIN / "nightshift"), "ui", "--host", "127.0.0.1", "--port", str(port)],
            cwd=REPO,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return process, f"http://127.0.0.1:{port}"


def _became_dagster_dev(process: subprocess.Popen) -> bool:
    """Whether `nightshift ui` (its instance initialised) has exec'd `dagster dev`, or exited."""
    if process.poll() is not None:
        return True
    try:
        return b"dagster\x00dev\x00" in Path(f"/proc/{process.pid}/cmdline").read_bytes()
    except OSError:
        return True


def wait_until_serving(stack: DagsterStack, timeout: float = 120) -> None:
    """Waits for `nightshift ui` to become `dagster dev`, then for the webserver to answer
    (each within ``timeout``); fails with the log's tail if it exited."""
    process = stack.process
    wait_for(lambda: _became_dagster_dev(process), timeout, "nightshift ui to exec dagster dev")
    wait_for(lambda: process.poll() is not None or _server_up(stack.url), timeout, "dagster dev")
    assert process.poll() is None, f"dagster dev exited:\n{stack.log_tail()}"


def _stop(process: subprocess.Popen) -> None:
    """Stops `dagster dev` and every process it started (its whole session)."""
    if process.poll() is not None:
        return
    try:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=10)
    except ProcessLookupError:
        pass


@contextmanager
def dagster_dev(workdir: Path) -> Iterator[DagsterStack]:
    """Generates demo data, trains the fraud model, and runs `dagster dev` until the block ends.

    The instance is deploy/local/dagster.yaml as shipped; the landing data covers three completed
    days ending three days ago, so the day after is free for a "new landing partition". Yesterday
    is left without data on purpose: the schedules run by default, and a real 02:00/03:00/05:00
    tick during the test would otherwise score that day a second time.
    """
    home, data_root, log = workdir / "dagster_home", workdir / "data", workdir / "dagster_dev.log"
    home.mkdir()
    shutil.copyfile(REPO / "deploy" / "local" / "dagster.yaml", home / "dagster.yaml")
    env = {
        **os.environ,
        "DAGSTER_HOME": str(home),
        "NIGHTSHIFT_DATA_ROOT": str(data_root),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        # The landing test waits for the tick after the sensor's run: an operator's setting
        # spares it most of the default minute.
        "NIGHTSHIFT_LANDING_SENSOR_INTERVAL_S": "15",
    }
    days = completed_days(3, ending_days_ago=3)
    generate = [str(BIN / "nightshift"), "generate", "--date", days[-1], "--days", "3"]
    done = subprocess.run(
        [*generate, "--scale", SCALE], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    _train_fraud_model(home, data_root)

    process, url = start_dagster_dev(env, log)
    stack = DagsterStack(url, home, data_root, log, process, facts={"days": days})
    try:
        wait_until_serving(stack)
        [repo] = stack.graphql(REPOSITORIES)["repositoriesOrError"]["nodes"]
        stack.repository, stack.location = repo["name"], repo["location"]["name"]
        yield stack
    finally:
        _stop(process)


def _train_fraud_model(home: Path, data_root: Path) -> None:
    """Trains the fraud model in this process, into the stack's instance, as a person would
    materialise `fraud_model` once before backfilling scores (it is not partitioned)."""
    from dagster import DagsterInstance, materialize

    from assets.fraud import fraud_model
    from resources.inference import InferenceResource
    from resources.storage import StorageResource

    resources = {
        "storage": StorageResource(data_root=str(data_root)),
        "inference": InferenceResource(device="cpu", precision="fp32"),
    }
    with DagsterInstance.from_config(str(home)) as instance:
        result = materialize([fraud_model], resources=resources, instance=instance)
    assert result.success


REPOSITORIES = """
{ repositoriesOrError { ... on RepositoryConnection { nodes { name location { name } } } } }
"""

LAUNCH_BACKFILL = """
mutation Launch($params: LaunchBackfillParams!) {
  launchPartitionBackfill(backfillParams: $params) {
    __typename
    ... on LaunchBackfillSuccess { backfillId }
    ... on PythonError { message stack }
    ... on Error { message }
  }
}
"""

BACKFILL = """
query Backfill($id: String!) {
  partitionBackfillOrError(backfillId: $id) {
    ... on PartitionBackfill {
      status
      runs { runId status tags { key value } }
      error { message }
    }
  }
}
"""

DONE = {"COMPLETED", "COMPLETED_SUCCESS", "COMPLETED_FAILED", "FAILED", "CANCELED"}


def launch_asset_backfill(stack: DagsterStack, asset: str, start: str, end: str) -> str:
    """Launches a partition-range backfill of one asset with the mutation the UI sends."""
    params = {
        "partitionsByAssets": [
            {"assetKey": {"path": [asset]}, "partitions": {"range": {"start": start, "end": end}}}
        ],
        "title": f"{asset} {start}...{end}",
    }
    result = stack.graphql(LAUNCH_BACKFILL, params=params)["launchPartitionBackfill"]
    assert result["__typename"] == "LaunchBackfillSuccess", result
    return result["backfillId"]


def wait_for_backfill(
    stack: DagsterStack, backfill_id: str, timeout: float = 240, runs_only: bool = False
) -> dict:
    """Waits until the backfill's runs finished and (unless `runs_only`) the daemon closed it."""

    def finished() -> dict | None:
        backfill = stack.graphql(BACKFILL, id=backfill_id)["partitionBackfillOrError"]
        runs = backfill["runs"]
        runs_done = runs and all(r["status"] in {"SUCCESS", "FAILURE", "CANCELED"} for r in runs)
        return backfill if runs_done and (runs_only or backfill["status"] in DONE) else None

    try:
        return wait_for(finished, timeout, f"backfill {backfill_id}", every=2)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{stack.log_tail()}") from None


SET_CURSOR = """
mutation SetCursor($selector: SensorSelector!, $cursor: String) {
  setSensorCursor(sensorSelector: $selector, cursor: $cursor) {
    __typename
    ... on PythonError { message }
  }
}
"""

START_SENSOR = """
mutation Start($selector: SensorSelector!) {
  startSensor(sensorSelector: $selector) {
    __typename
    ... on Sensor { sensorState { status } }
    ... on PythonError { message }
  }
}
"""


def set_sensor_cursor(stack: DagsterStack, sensor: str, cursor: str) -> None:
    """What an operator does with the sensor page's "Set cursor"."""
    result = stack.graphql(SET_CURSOR, selector=stack.selector("sensor", sensor), cursor=cursor)
    assert result["setSensorCursor"]["__typename"] == "Sensor", result


def start_operating(stack: DagsterStack) -> None:
    """Launches the 3-day fraud_scores backfill and starts the landing sensor, as a person would
    from the UI, so both queue together: the GPU limit lets only one run at a time.

    The landing sensor is told (through its cursor) that the generated days were already
    scored, and yesterday's transactions land as the one new partition.
    """
    from assets.fraud.demo_data import generate_day
    from resources.storage import DataStore

    days = stack.facts["days"]
    stack.facts["backfill_id"] = launch_asset_backfill(stack, "fraud_scores", days[0], days[-1])

    landed = completed_days(1, ending_days_ago=2)[0]
    seen = json.dumps({d: days for d in ("documents", "interactions", "transactions")})
    set_sensor_cursor(stack, "landing_sensor", seen)
    store = DataStore(str(stack.data_root))
    generate_day(store, landed, scale=float(SCALE), seed=1)
    # The sensor's run key names the job and the landed files' fingerprint.
    fingerprint = store.landing_fingerprint("transactions", landed)
    stack.facts["landed_run_key"] = f"fraud_scoring_job:transactions:{landed}:{fingerprint}"
    result = stack.graphql(START_SENSOR, selector=stack.selector("sensor", "landing_sensor"))
    assert result["startSensor"]["sensorState"]["status"] == "RUNNING", result
    stack.facts.update(landed=landed, cursor_before_landing=seen)


RUN = """
query Run($id: ID!) {
  runOrError(runId: $id) { ... on Run { status jobName tags { key value } } }
}
"""

FINISHED = {"SUCCESS", "FAILURE", "CANCELED"}


def wait_for_run(stack: DagsterStack, run_id: str, timeout: float = 300) -> dict:
    """Waits for a run (queued behind others in the GPU pool, perhaps) to finish; returns it."""

    def finished() -> dict | None:
        run = stack.graphql(RUN, id=run_id)["runOrError"]
        return run if run.get("status") in FINISHED else None

    try:
        return wait_for(finished, timeout, f"run {run_id}", every=2)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{stack.log_tail()}") from None

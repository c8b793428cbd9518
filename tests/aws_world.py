"""The AWS world of the ECS tests on loopback: a throwaway PostgreSQL for RDS, moto for ECS, EC2
and S3, the environment deploy/aws/dagster.yaml reads, and the real dagster-daemon.

Registered as a plugin in conftest.py, so each module that requests these fixtures gets a world of
its own (module scope), and imports the plain helpers from here.
"""

from __future__ import annotations

import json
import os
import pwd
import signal
import socket
import string
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import boto3
import pytest
from dagster import DagsterInstance, DagsterRun, RunsFilter

from policy.capacity import ON_DEMAND_PROVIDER, SPOT_PROVIDER

REPO = Path(__file__).resolve().parents[1]
DEPLOY = REPO / "deploy" / "aws"
BIN = Path(sys.executable).parent
CLUSTER = "nightshift-gpu"
REGION = "us-east-1"
T = TypeVar("T")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _pg_bin(name: str) -> str:
    """A PostgreSQL server binary: on PATH, else Debian's versioned folder."""
    for folder in [
        *os.environ.get("PATH", "").split(os.pathsep),
        *map(str, sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True)),
    ]:
        if (Path(folder) / name).is_file():
            return str(Path(folder) / name)
    raise RuntimeError(
        f"PostgreSQL server binary '{name}' not found (`make test` installs it: "
        "`bash deploy/local/install-postgres.sh`); this test installs nothing"
    )


@pytest.fixture(scope="module")
def postgres_port() -> Iterator[int]:
    """A throwaway PostgreSQL server on loopback, standing in for the RDS instance."""
    # Not under pytest's tmp folder: that is private to root, and as root the server must run
    # as another user (initdb and postgres refuse root): the Debian package's user owns it.
    with tempfile.TemporaryDirectory(prefix="nightshift-pg-") as folder:
        root = Path(folder)
        user = "postgres" if os.geteuid() == 0 else None
        if user:
            entry = pwd.getpwnam(user)
            os.chown(root, entry.pw_uid, entry.pw_gid)
        yield from _serve_postgres(root, user)


def _serve_postgres(root: Path, user: str | None) -> Iterator[int]:
    import psycopg2

    data = root / "data"
    done = subprocess.run(
        [_pg_bin("initdb"), "-D", str(data), "-A", "trust", "-U", "dagster", "--no-sync"],
        user=user,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, f"initdb failed: {done.stderr}"
    port = _free_port()
    server = subprocess.Popen(
        [
            _pg_bin("postgres"),
            "-D",
            str(data),
            "-h",
            "127.0.0.1",
            "-p",
            str(port),
            "-k",
            str(root),
            "-F",
        ],
        user=user,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:

        def ready() -> bool:
            assert server.poll() is None, "postgres exited at start"
            try:
                psycopg2.connect(
                    host="127.0.0.1", port=port, user="dagster", dbname="postgres"
                ).close()
            except psycopg2.OperationalError:
                return False
            return True

        wait_for(ready, 30, "postgres to accept connections")
        yield port
    finally:
        server.send_signal(signal.SIGINT)  # fast shutdown: no need to wait for clients
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


@pytest.fixture(scope="module")
def aws_endpoint() -> Iterator[str]:
    """moto serving ECS, EC2 and S3 over HTTP on loopback."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    # moto's backends live in this process, not in the server: another module's world (its
    # task definitions, clusters, buckets) would still be there, so each world starts empty.
    urllib.request.urlopen(
        urllib.request.Request(f"http://{host}:{port}/moto-api/reset", method="POST")
    ).close()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


@pytest.fixture(scope="module")
def aws_env(
    aws_endpoint: str, postgres_port: int, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, str]]:
    """The environment deploy/aws/dagster.yaml reads, pointed at the local stand-ins.

    The cluster, GPU container instances, capacity providers, the task definition from
    deploy/aws/task-definition.json and the compute-log bucket are created on the local endpoint,
    as the README's deployment steps create them on AWS.
    """
    env = {
        # boto3 takes AWS_ENDPOINT_URL for every client: the launcher, S3 logs, this test.
        "AWS_ENDPOINT_URL": aws_endpoint,
        "AWS_ACCESS_KEY_ID": "test",
        "AWS_SECRET_ACCESS_KEY": "test",
        "AWS_REGION": REGION,
        "AWS_DEFAULT_REGION": REGION,
        "DAGSTER_PG_HOST": "127.0.0.1",
        "DAGSTER_PG_PORT": str(postgres_port),
        "DAGSTER_PG_DB": "postgres",
        "DAGSTER_PG_USERNAME": "dagster",
        "DAGSTER_PG_PASSWORD": "",
        "NIGHTSHIFT_ECS_CLUSTER": CLUSTER,
        "NIGHTSHIFT_ECS_TASK_DEFINITION": "nightshift-gpu",
        "NIGHTSHIFT_COMPUTE_LOG_BUCKET": "nightshift-logs",
        # An empty data root: the landing sensor, if running, finds nothing to launch.
        "NIGHTSHIFT_DATA_ROOT": str(tmp_path_factory.mktemp("data")),
        # The retry daemon reads run failures every second instead of every five.
        "DAGSTER_EVENT_LOG_CONSUMER_DAEMON_INTERVAL_SECONDS": "1",
    }
    with pytest.MonkeyPatch.context() as mp:
        for key, value in env.items():
            mp.setenv(key, value)
        _create_ecs_world()
        boto3.client("s3").create_bucket(Bucket="nightshift-logs")
        yield env


def _create_ecs_world() -> None:
    ecs, ec2 = boto3.client("ecs"), boto3.client("ec2")
    for name in (SPOT_PROVIDER, ON_DEMAND_PROVIDER):
        asg = f"arn:aws:autoscaling:{REGION}:123456789012:autoScalingGroup:0:autoScalingGroupName/{name}"
        ecs.create_capacity_provider(
            name=name, autoScalingGroupProvider={"autoScalingGroupArn": asg}
        )
    ecs.create_cluster(clusterName=CLUSTER, capacityProviders=[SPOT_PROVIDER, ON_DEMAND_PROVIDER])
    ami = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    nodes = ec2.run_instances(ImageId=ami, MinCount=3, MaxCount=3, InstanceType="g5.xlarge")
    for node in nodes["Instances"]:
        document = json.dumps({"instanceId": node["InstanceId"]})
        ecs.register_container_instance(cluster=CLUSTER, instanceIdentityDocument=document)
    # The file is written for envsubst; substitute() fails on any placeholder left unfilled.
    template = string.Template((DEPLOY / "task-definition.json").read_text())
    role = "arn:aws:iam::123456789012:role/nightshift"
    definition = template.substitute(
        ECS_EXECUTION_ROLE_ARN=role,
        NIGHTSHIFT_TASK_ROLE_ARN=role,
        NIGHTSHIFT_IMAGE="123456789012.dkr.ecr.us-east-1.amazonaws.com/nightshift:test",
        NIGHTSHIFT_DATA_ROOT="s3://nightshift-data/nightshift",
        AWS_REGION=REGION,
        DAGSTER_PG_HOST="db.internal",
        DAGSTER_PG_DB="dagster",
        DAGSTER_PG_USERNAME="dagster",
        DAGSTER_PG_PASSWORD_SECRET_ARN=f"arn:aws:secretsmanager:{REGION}:123456789012:secret:pg",
        NIGHTSHIFT_COMPUTE_LOG_BUCKET="nightshift-logs",
        NIGHTSHIFT_ECS_CLUSTER=CLUSTER,
    )
    ecs.register_task_definition(**json.loads(definition))


@pytest.fixture(scope="module")
def aws_home(aws_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A DAGSTER_HOME holding deploy/aws/dagster.yaml byte for byte."""
    home = tmp_path_factory.mktemp("dagster_home_aws")
    (home / "dagster.yaml").write_bytes((DEPLOY / "dagster.yaml").read_bytes())
    return home


@pytest.fixture(scope="module")
def aws_instance(aws_home: Path) -> Iterator[DagsterInstance]:
    with DagsterInstance.from_config(str(aws_home)) as instance:
        yield instance


def stop_process_group(process: subprocess.Popen, timeout: float = 30) -> None:
    """Stops a server started as the leader of its own process group: SIGTERM to the group,
    SIGKILL to it if it is still there ``timeout`` seconds later."""
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def wait_for(
    probe: Callable[[], T | None],
    timeout: float,
    what: str,
    log: Path | None = None,
    explain: Callable[[], str] | None = None,
) -> T:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if result := probe():
            return result
        time.sleep(0.25)
    tail = log.read_text()[-4000:] if log and log.exists() else ""
    told = explain() if explain else ""
    raise AssertionError(f"gave up waiting for {what}\n{told}\n{tail}")


# How long the daemon may take to retry a failed run. It bounds liveness, not speed: the
# daemon's run_retries create the retry and its queue launches it, each on a loop of its own,
# and the suite's neighbours on a loaded machine have made that outlast a tighter bound while
# the retry itself was right (docs/benchmarks.md, "The daemon's retry under load").
DAEMON_RETRY_S = 300


def daemon_retry(instance: DagsterInstance, parent: DagsterRun, log: Path) -> DagsterRun:
    """The daemon's retry of ``parent``, once launched. The retry copies every parent tag,
    ecs/task_arn included, until its own launch replaces it: launched means a task ARN of its
    own. If it never comes, the message says how far the daemon got, from the parent's events."""
    parent_task = parent.tags["ecs/task_arn"]

    def retry_launched() -> DagsterRun | None:
        children = instance.get_runs(RunsFilter(tags={"dagster/parent_run_id": parent.run_id}))
        return launched(instance, children[0].run_id, parent_task) if children else None

    def how_far() -> str:
        events = [
            f"{time.strftime('%H:%M:%S', time.gmtime(e.timestamp))} "
            f"{e.dagster_event_type}: {e.message}"
            for e in instance.all_logs(parent.run_id)
        ]
        children = instance.get_runs(RunsFilter(tags={"dagster/parent_run_id": parent.run_id}))
        kids = [f"{c.run_id} {c.status.value} {c.tags.get('ecs/task_arn')}" for c in children]
        return "parent's events:\n" + "\n".join(events[-12:]) + f"\nretries: {kids}"

    return wait_for(retry_launched, DAEMON_RETRY_S, "the daemon's retry run", log, how_far)


def task_of(run: DagsterRun) -> dict[str, Any]:
    tasks = boto3.client("ecs").describe_tasks(
        cluster=CLUSTER, tasks=[run.tags["ecs/task_arn"]], include=["TAGS"]
    )
    return tasks["tasks"][0]


def launched(
    instance: DagsterInstance, run_id: str, not_task: str | None = None
) -> DagsterRun | None:
    run = instance.get_run_by_id(run_id)
    task = run.tags.get("ecs/task_arn") if run else None
    return run if task and task != not_task else None


@contextmanager
def dagster_daemon(env: dict[str, str], log: Path) -> Iterator[None]:
    """The real dagster-daemon on this workspace, its output in ``log``, stopped on exit."""
    with log.open("w") as out:
        process = subprocess.Popen(
            [BIN / "dagster-daemon", "run", "-w", "workspace.yaml"],
            cwd=REPO,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        yield
    finally:
        stop_process_group(process)

"""deploy/aws: the instance config loads as is; its ECS launcher's run_task calls on a local ECS API
(the world of tests/aws_world.py); capacity_tags."""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest
from aws_world import BIN, REPO, daemon_retry, dagster_daemon, launched, task_of, wait_for
from dagster import DagsterInstance
from dagster_aws.ecs import EcsRunLauncher
from dagster_aws.s3.compute_log_manager import S3ComputeLogManager

from policy.capacity import ON_DEMAND_PROVIDER, SPOT_PROVIDER, capacity_strategy, capacity_tags
from policy.tags import CAPACITY_TAG, RUN_TASK_KWARGS_TAG

# -- the instance config ------------------------------------------------------------------------


def test_aws_dagster_yaml_loads_as_a_real_instance(aws_instance: DagsterInstance) -> None:
    launcher = aws_instance.run_launcher
    assert isinstance(launcher, EcsRunLauncher)
    # The launcher resolved the task definition name on the ECS endpoint to its registered ARN.
    assert launcher.task_definition.endswith(":task-definition/nightshift-gpu:1")
    assert launcher.run_task_kwargs["capacityProviderStrategy"] == capacity_strategy(SPOT_PROVIDER)
    assert launcher.secrets_tags == []  # no secretsmanager:ListSecrets on every launch
    assert isinstance(aws_instance.compute_log_manager, S3ComputeLogManager)
    assert aws_instance.run_retries_enabled and aws_instance.run_retries_max_retries == 5
    assert aws_instance.run_retries_retry_on_asset_or_op_failure is False
    assert aws_instance.run_monitoring_enabled
    assert aws_instance.run_monitoring_max_resume_run_attempts == 0
    # One GPU node per run: the laptop's one-run-per-GPU tag limit must not throttle the fleet.
    queue = aws_instance.get_concurrency_config().run_queue_config
    assert queue.max_concurrent_runs == 16
    assert [limit["key"] for limit in queue.tag_concurrency_limits] == [CAPACITY_TAG]
    # Postgres, which the daemon test below shares between this process, the CLI and the daemon.
    assert type(aws_instance.run_storage).__name__ == "PostgresRunStorage"


# -- the run_task calls, through the real daemon ------------------------------------------------


def test_daemon_launches_on_gpu_spot_and_retries_an_interrupted_run_on_demand(
    aws_env: dict[str, str], aws_home: Path, aws_instance: DagsterInstance, tmp_path: Path
) -> None:
    env = {**os.environ, **aws_env, "DAGSTER_HOME": str(aws_home)}
    log = tmp_path / "daemon.log"
    with dagster_daemon(env, log):
        run_id = str(uuid.uuid4())
        gpu = [{"type": "GPU", "value": "1"}]
        tags = {
            "dagster/partition": "2026-03-01",
            "ecs/cpu": "2048",
            "ecs/memory": "8192",
            "ecs/container_overrides": json.dumps({"resourceRequirements": gpu}),
        }
        # The CLI queues the run (QueuedRunCoordinator); the daemon dequeues and launches it.
        launch = [BIN / "dagster", "job", "launch", "-w", "workspace.yaml"]
        launch += ["-j", "fraud_scoring_job", "--run-id", run_id, "--tags", json.dumps(tags)]
        done = subprocess.run(
            launch, cwd=REPO, env=env, capture_output=True, text=True, timeout=180
        )
        assert done.returncode == 0, done.stderr[-4000:]
        run = wait_for(lambda: launched(aws_instance, run_id), 120, "the ECS launch", log)

        task = task_of(run)
        assert task["capacityProviderName"] == SPOT_PROVIDER
        assert "launchType" not in task or not task["launchType"]
        assert task["taskDefinitionArn"] == aws_instance.run_launcher.task_definition
        container = task["overrides"]["containerOverrides"][0]
        assert container["name"] == "nightshift"
        assert container["command"][:3] == ["dagster", "api", "execute_run"]
        assert container["resourceRequirements"] == gpu
        assert (container["cpu"], container["memory"]) == (2048, 8192)
        assert (task["overrides"]["cpu"], task["overrides"]["memory"]) == ("2048", "8192")
        ecs_tags = {t["key"]: t["value"] for t in task["tags"]}
        assert ecs_tags["dagster/run_id"] == run_id
        assert ecs_tags["dagster/partition"] == "2026-03-01"

        # The spot node goes away: the interruption path tags the run, then the run fails.
        aws_instance.add_run_tags(
            run_id, capacity_tags(1, on_demand_after=1, current_tags=run.tags)
        )
        aws_instance.report_run_failed(aws_instance.get_run_by_id(run_id), "spot node reclaimed")

        retry = daemon_retry(aws_instance, run, log)
        assert retry.tags["dagster/retry_number"] == "1"  # the daemon's run_retries made it
        assert retry.tags[CAPACITY_TAG] == "on-demand"
        retry_task = task_of(retry)
        assert retry_task["capacityProviderName"] == ON_DEMAND_PROVIDER
        # Everything else the parent run asked for travelled with the inherited tags.
        retry_container = retry_task["overrides"]["containerOverrides"][0]
        assert retry_container["resourceRequirements"] == gpu
        assert (retry_container["cpu"], retry_container["memory"]) == (2048, 8192)
        retry_ecs_tags = {t["key"]: t["value"] for t in retry_task["tags"]}
        assert retry_ecs_tags["dagster/run_id"] == retry.run_id
        assert retry_ecs_tags[CAPACITY_TAG] == "on-demand"


# -- capacity_tags --------------------------------------------------------------------------------


@pytest.mark.parametrize(("interruptions", "on_demand_after"), [(0, 2), (1, 2), (0, 1)])
def test_capacity_tags_keep_spot_below_the_threshold(
    interruptions: int, on_demand_after: int
) -> None:
    assert capacity_tags(interruptions, on_demand_after) == {}


@pytest.mark.parametrize(("interruptions", "on_demand_after"), [(2, 2), (5, 2), (0, 0)])
def test_capacity_tags_move_to_on_demand_from_the_threshold(
    interruptions: int, on_demand_after: int
) -> None:
    tags = capacity_tags(interruptions, on_demand_after)
    assert tags[CAPACITY_TAG] == "on-demand"
    assert json.loads(tags[RUN_TASK_KWARGS_TAG]) == {
        "capacityProviderStrategy": [
            {"capacityProvider": ON_DEMAND_PROVIDER, "weight": 1, "base": 0}
        ]
    }


def test_capacity_tags_take_provider_names() -> None:
    tags = capacity_tags(3, 1, spot_provider="g6-spot", on_demand_provider="g6-od")
    strategy = json.loads(tags[RUN_TASK_KWARGS_TAG])["capacityProviderStrategy"]
    assert [s["capacityProvider"] for s in strategy] == ["g6-od"]


def test_capacity_tags_keep_other_run_task_kwargs_and_drop_the_clobbering_ones() -> None:
    current = {
        RUN_TASK_KWARGS_TAG: json.dumps(
            {
                "placementConstraints": [
                    {"type": "memberOf", "expression": "attribute:gpu == a10g"}
                ],
                "launchType": "EC2",
                "capacityProviderStrategy": capacity_strategy(SPOT_PROVIDER),
                # The launcher applies the tag with dict.update: these would replace the run
                # command and the dagster/run_id task tag.
                "overrides": {"containerOverrides": []},
                "tags": [{"key": "team", "value": "ml"}],
            }
        )
    }
    kwargs = json.loads(capacity_tags(1, 1, current_tags=current)[RUN_TASK_KWARGS_TAG])
    assert kwargs == {
        "placementConstraints": [{"type": "memberOf", "expression": "attribute:gpu == a10g"}],
        "capacityProviderStrategy": capacity_strategy(ON_DEMAND_PROVIDER),
    }


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"interruptions": -1, "on_demand_after": 1}, "interruptions must be >= 0"),
        ({"interruptions": 1, "on_demand_after": -1}, "on_demand_after must be >= 0"),
        (
            {"interruptions": 1, "on_demand_after": 1, "on_demand_provider": SPOT_PROVIDER},
            "both 'gpu-spot'",
        ),
        (
            {"interruptions": 1, "on_demand_after": 1, "current_tags": {RUN_TASK_KWARGS_TAG: "[]"}},
            "JSON object",
        ),
    ],
)
def test_capacity_tags_reject_nonsense(args: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        capacity_tags(**args)

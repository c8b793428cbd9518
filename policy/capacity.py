"""Which ECS capacity the next attempt of an interrupted run lands on: spot, or on-demand.

A spot GPU is cheap until the same partition keeps losing its node. After a few interruptions
the next attempt should go to on-demand capacity and finish. `EcsRunLauncher` reads the run tag
``ecs/run_task_kwargs`` (JSON) at launch and applies it on top of the instance's
``run_task_kwargs`` (deploy/aws/dagster.yaml), and the daemon's ``run_retries`` copies the
failed run's tags onto the retry run. So the swap is: add these tags to the interrupted run
before it is marked failed, and the daemon's retry launches on the other capacity provider.

Nothing here talks to AWS or Dagster: plain functions, so the scoring step's interruption path
(assets/checkpointing.py) and the tests can call them anywhere.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from policy.tags import CAPACITY_TAG, ON_DEMAND, RUN_TASK_KWARGS_TAG

# The capacity provider names deploy/aws/dagster.yaml and deploy/aws/README.md use.
SPOT_PROVIDER = "gpu-spot"
ON_DEMAND_PROVIDER = "gpu-on-demand"

# Keys that must never travel in the tag: the launcher applies the tag with a shallow
# dict.update after building the call, so "overrides" would drop the run command and GPU
# override, and "tags" would drop the dagster/run_id task tag that run monitoring relies on.
_CLOBBERING_KEYS = ("overrides", "tags", "taskDefinition")


def capacity_strategy(provider: str) -> list[dict[str, Any]]:
    """The boto3 ``capacityProviderStrategy`` that puts every task on one capacity provider."""
    return [{"capacityProvider": provider, "weight": 1, "base": 0}]


def capacity_tags(
    interruptions: int,
    on_demand_after: int,
    *,
    spot_provider: str = SPOT_PROVIDER,
    on_demand_provider: str = ON_DEMAND_PROVIDER,
    current_tags: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """Run tags that send the next attempt of a run to on-demand capacity once it is due.

    Args:
        interruptions: how many times this partition's runs have been interrupted so far,
            including the one being handled now.
        on_demand_after: the interruption count from which attempts go on-demand (0: always).
        spot_provider: name of the spot capacity provider; it must differ from the on-demand
            one, else the swap would be a no-op that still burns the interruption budget.
        on_demand_provider: name of the on-demand capacity provider.
        current_tags: the interrupted run's tags; any other keys in its ``ecs/run_task_kwargs``
            (a cluster, placement constraints) are kept, only the strategy is replaced.

    Returns:
        ``{}`` while spot is still allowed (the run keeps whatever capacity it has, by default
        the spot strategy of the instance config); otherwise the ``ecs/run_task_kwargs`` tag
        with the on-demand strategy and ``nightshift/capacity: on-demand``. Add them to the
        interrupted run (``instance.add_run_tags``) before its run failure is recorded: the
        daemon copies the failed run's tags when it creates the retry.
    """
    if interruptions < 0:
        raise ValueError(f"interruptions must be >= 0, got {interruptions}")
    if on_demand_after < 0:
        raise ValueError(f"on_demand_after must be >= 0, got {on_demand_after}")
    if on_demand_provider == spot_provider:
        raise ValueError(f"spot and on-demand providers are both '{spot_provider}'")
    if interruptions < on_demand_after:
        return {}
    return tags_for_capacity(ON_DEMAND, current_tags, provider=on_demand_provider)


def tags_for_capacity(
    capacity: str, current_tags: Mapping[str, str] | None = None, *, provider: str | None = None
) -> dict[str, str]:
    """Run tags that put a run's next attempt on ``capacity``, whoever chose it.

    The deadline-aware policy (policy/deadline.py) chooses per attempt, in both directions:
    on-demand when a partition falls behind, spot again once it is ahead. The tags are the
    same mechanism as the count-based switch's: ``ecs/run_task_kwargs`` with that capacity
    provider's strategy, and ``nightshift/capacity``.

    Args:
        capacity: ``on-demand``/``on_demand`` or ``spot``.
        current_tags: the run's tags; their other ``ecs/run_task_kwargs`` keys are kept.
        provider: the capacity provider's name; default this module's for that capacity.
    """
    if capacity in (ON_DEMAND, "on_demand"):
        capacity, provider = ON_DEMAND, provider or ON_DEMAND_PROVIDER
    elif capacity == "spot":
        provider = provider or SPOT_PROVIDER
    else:
        raise ValueError(f"capacity must be 'spot' or 'on-demand', got {capacity!r}")
    kwargs = _current_run_task_kwargs(current_tags or {})
    kwargs["capacityProviderStrategy"] = capacity_strategy(provider)
    # A launchType left in the tag would make ECS reject the strategy; the launcher only drops
    # the instance-level one.
    kwargs.pop("launchType", None)
    return {
        RUN_TASK_KWARGS_TAG: json.dumps(kwargs, sort_keys=True),
        CAPACITY_TAG: capacity,
    }


def _current_run_task_kwargs(tags: Mapping[str, str]) -> dict[str, Any]:
    raw = tags.get(RUN_TASK_KWARGS_TAG)
    if not raw:
        return {}
    kwargs = json.loads(raw)
    if not isinstance(kwargs, dict):
        raise ValueError(f"tag {RUN_TASK_KWARGS_TAG} must hold a JSON object, got: {raw}")
    return {k: v for k, v in kwargs.items() if k not in _CLOBBERING_KEYS}

"""The Dagster names this project needs that Dagster does not export: the only place that
imports ``dagster._``. tests/test_dagster_private.py pins each to dagster 1.13.27 and fails,
naming this module, when an upgrade moves or changes one.

Each is here because no public API of 1.13 gives the same result:

- ``AssetCheckEvaluationTargetMaterializationData``: a day's check result, recorded as it is
  evaluated (assets/days.py), points at that day's materialisation, so the UI shows it beside
  the day it checked. ``AssetCheckResult`` has no ``partition`` in 1.13, so the public way
  records one result for a whole range backfill; the per-day ``AssetCheckEvaluation`` (public)
  takes its target only as this private record.
- ``NO_ASSET_EVENTS`` (``SYSTEM_METADATA_KEY_SOURCE_ASSET_OBSERVATION``): an ``Output`` whose
  metadata holds this key yields no asset events (dagster/_core/execution/plan/execute_step.py).
  Each day was already recorded as its own ``AssetMaterialization(partition=D)``; the step
  still has to yield its outputs so that downstream steps of the same run go ahead, and without
  this key Dagster records one more materialisation per partition of the range. Not yielding
  the outputs skips the downstream steps; no public metadata or option suppresses the events.
- ``DagsterAssetCheckFailedError``: the error Dagster raises when a blocking check fails. A
  step whose blocking check failed on some day raises it too, so that the run fails the way a
  public blocking check fails it, and the automation (orchestration/automation.py) and the
  operators read one error class for both. Dagster exports no such error.
- ``LaunchRunContext``: what ``RunLauncher.launch_run`` receives. The deadline-aware ECS
  launcher (orchestration/deadline_launcher.py) subclasses the public ``EcsRunLauncher`` and
  hands the parent a context carrying the re-tagged run; Dagster exports the launcher but not
  its context type.
"""

from __future__ import annotations

from dagster._core.definitions.asset_checks.asset_check_evaluation import (
    AssetCheckEvaluationTargetMaterializationData,
)
from dagster._core.definitions.source_asset import (
    SYSTEM_METADATA_KEY_SOURCE_ASSET_OBSERVATION as NO_ASSET_EVENTS,
)
from dagster._core.errors import DagsterAssetCheckFailedError
from dagster._core.launcher import LaunchRunContext

__all__ = [
    "NO_ASSET_EVENTS",
    "AssetCheckEvaluationTargetMaterializationData",
    "DagsterAssetCheckFailedError",
    "LaunchRunContext",
]

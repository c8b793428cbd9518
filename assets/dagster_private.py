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
- The data version tags (``DATA_VERSION_TAG``, ``DATA_VERSION_IS_USER_PROVIDED_TAG``,
  ``CODE_VERSION_TAG``, ``input_data_version_tag``, ``input_event_pointer_tag``,
  ``NULL_EVENT_POINTER``, ``DEFAULT_DATA_VERSION``, ``data_version_of``): Dagster writes
  them on the materialisations of an asset's own outputs, and reads the UI's "Unsynced"
  badge from them. A day recorded as
  its own ``AssetMaterialization`` (assets/days.py) gets none, and every day then read as
  unsynced after any new materialisation of a parent; a promotion recorded on the model asset
  (assets/model_asset.py) must carry its new data version the same way. The public
  ``AssetMaterialization`` takes tags but exports none of these names.
- ``stale_status_resolver``: what the UI computes a partition's badge and its causes with,
  for tests that assert what a person would see without a browser.
- ``launchpad_defaults``: the config the Launchpad scaffolds for a job (every default), for
  tests that the scaffold launches as it is.
- ``LaunchRunContext``: what ``RunLauncher.launch_run`` receives. The deadline-aware ECS
  launcher (orchestration/deadline_launcher.py) subclasses the public ``EcsRunLauncher`` and
  hands the parent a context carrying the re-tagged run; Dagster exports the launcher but not
  its context type.
"""

from __future__ import annotations

from dagster._core.definitions.asset_checks.asset_check_evaluation import (
    AssetCheckEvaluationTargetMaterializationData,
)
from dagster._core.definitions.data_version import (
    CODE_VERSION_TAG,
    DATA_VERSION_IS_USER_PROVIDED_TAG,
    DATA_VERSION_TAG,
    DEFAULT_DATA_VERSION,
    NULL_EVENT_POINTER,
    CachingStaleStatusResolver,
)
from dagster._core.definitions.data_version import (
    extract_data_version_from_entry as data_version_of,
)
from dagster._core.definitions.data_version import (
    get_input_data_version_tag as input_data_version_tag,
)
from dagster._core.definitions.data_version import (
    get_input_event_pointer_tag as input_event_pointer_tag,
)
from dagster._core.definitions.source_asset import (
    SYSTEM_METADATA_KEY_SOURCE_ASSET_OBSERVATION as NO_ASSET_EVENTS,
)
from dagster._core.errors import DagsterAssetCheckFailedError
from dagster._core.launcher import LaunchRunContext

__all__ = [
    "CODE_VERSION_TAG",
    "DATA_VERSION_IS_USER_PROVIDED_TAG",
    "DATA_VERSION_TAG",
    "DEFAULT_DATA_VERSION",
    "NO_ASSET_EVENTS",
    "NULL_EVENT_POINTER",
    "AssetCheckEvaluationTargetMaterializationData",
    "DagsterAssetCheckFailedError",
    "LaunchRunContext",
    "data_version_of",
    "input_data_version_tag",
    "input_event_pointer_tag",
    "launchpad_defaults",
    "stale_status_resolver",
]


def stale_status_resolver(instance, asset_graph) -> CachingStaleStatusResolver:
    """The resolver the UI reads an asset partition's "Unsynced" badge and its causes from,
    over ``asset_graph`` (``Definitions.resolve_asset_graph()``) at the current time."""
    from dagster._core.asset_graph_view.asset_graph_view import AssetGraphView, TemporalContext
    from dagster._time import get_current_datetime

    now = TemporalContext(effective_dt=get_current_datetime(), last_event_id=None)
    view = AssetGraphView(temporal_context=now, instance=instance, asset_graph=asset_graph)
    return CachingStaleStatusResolver(instance, asset_graph, view)


def launchpad_defaults(job) -> dict:
    """The run config the Launchpad scaffolds for ``job``: every field at its default."""
    from dagster._core.snap.snap_to_yaml import default_values_from_type_snap

    snap = job.get_job_snapshot()
    schema = snap.config_schema_snapshot
    [mode] = snap.mode_def_snaps
    return default_values_from_type_snap(schema.get_config_snap(mode.root_config_key), schema)

"""The Dagster names that Dagster does not export still exist and behave as assets/dagster_private.py
says, on the pinned Dagster, and no other module reaches into Dagster's private modules."""

from __future__ import annotations

import inspect
import re
import tomllib
from importlib.metadata import version
from pathlib import Path

import pytest
from dagster import (
    AssetCheckEvaluation,
    AssetCheckResult,
    AssetCheckSpec,
    AssetKey,
    DagsterError,
    DagsterEventType,
    Output,
    asset,
    materialize,
)
from dagster_aws.ecs import EcsRunLauncher

from assets.dagster_private import (
    CODE_VERSION_TAG,
    DATA_VERSION_IS_USER_PROVIDED_TAG,
    DATA_VERSION_TAG,
    DEFAULT_DATA_VERSION,
    NO_ASSET_EVENTS,
    NULL_EVENT_POINTER,
    AssetCheckEvaluationTargetMaterializationData,
    DagsterAssetCheckFailedError,
    LaunchRunContext,
    input_data_version_tag,
    input_event_pointer_tag,
)
from orchestration.automation import CHECK_FAILED_ERROR

ROOT = Path(__file__).resolve().parents[1]
MODULE = ROOT / "assets" / "dagster_private.py"
SCANNED = (
    "assets",
    "orchestration",
    "resources",
    "inference",
    "policy",
    "tests",
    "benchmarks",
    "evaluation",
)
# Built in two parts so that this file's own pattern is not a hit.
PRIVATE = re.compile("dagster" + r"\._")


def _changed(name: str) -> str:
    return f"dagster {version('dagster')} changed {name}: re-check assets/dagster_private.py"


def _pinned(package: str) -> str:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    [pin] = [d for d in project["dependencies"] if d.startswith(f"{package}==")]
    return pin.removeprefix(f"{package}==")


def test_the_installed_dagster_is_the_pinned_one() -> None:
    pinned = _pinned("dagster")
    assert version("dagster") == pinned, (
        f"dagster {version('dagster')} is installed, pyproject pins {pinned}: "
        "re-check assets/dagster_private.py before moving the pin"
    )


def test_the_data_version_tags_are_the_ones_dagster_writes_and_reads() -> None:
    """A day recorded on its own and a promotion carry these (assets/days.py,
    assets/model_asset.py); tests/test_promotion.py reads them back through the resolver."""
    names = (DATA_VERSION_TAG, DATA_VERSION_IS_USER_PROVIDED_TAG, CODE_VERSION_TAG)
    assert names == (
        "dagster/data_version",
        "dagster/data_version_is_user_provided",
        "dagster/code_version",
    ), _changed("the data version tags")
    model = AssetKey("fraud_model")
    assert input_data_version_tag(model) == "dagster/input_data_version/fraud_model"
    assert input_event_pointer_tag(model) == "dagster/input_event_pointer/fraud_model"
    assert (NULL_EVENT_POINTER, DEFAULT_DATA_VERSION.value) == ("NULL", "INITIAL")


def test_no_asset_events_key_suppresses_an_outputs_asset_events() -> None:
    assert NO_ASSET_EVENTS == "__source_asset_observation__", _changed("NO_ASSET_EVENTS")

    @asset
    def recorded_elsewhere():
        yield Output(None, metadata={NO_ASSET_EVENTS: True})

    @asset(deps=[recorded_elsewhere])
    def downstream() -> None:
        return None

    result = materialize([recorded_elsewhere, downstream])
    assert result.success
    materialised = {e.asset_key for e in result.get_asset_materialization_events()}
    # The downstream step ran in the same run, and only its own output was recorded.
    assert materialised == {AssetKey("downstream")}, _changed("NO_ASSET_EVENTS")


def test_dagster_fails_a_blocking_check_with_the_error_days_raise() -> None:
    assert issubclass(DagsterAssetCheckFailedError, DagsterError)
    # orchestration/automation.py and the tests read the class by name in stored errors.
    assert DagsterAssetCheckFailedError.__name__ == CHECK_FAILED_ERROR

    @asset(check_specs=[AssetCheckSpec("never_passes", asset="checked", blocking=True)])
    def checked():
        yield Output(None)
        yield AssetCheckResult(passed=False)

    result = materialize([checked], raise_on_error=False)
    failures = [e for e in result.all_events if e.event_type == DagsterEventType.STEP_FAILURE]
    assert [f.step_failure_data.error.cls_name for f in failures] == [CHECK_FAILED_ERROR], _changed(
        "DagsterAssetCheckFailedError"
    )


def test_a_days_check_evaluation_points_at_its_materialisation() -> None:
    target = AssetCheckEvaluationTargetMaterializationData(
        storage_id=7, run_id="run", timestamp=1.0
    )
    evaluation = AssetCheckEvaluation(
        asset_key=AssetKey("scores"),
        check_name="in_unit_interval",
        passed=True,
        target_materialization_data=target,
        partition="2026-01-01",
    )
    got = evaluation.target_materialization_data
    assert (got.storage_id, got.run_id, got.timestamp) == (7, "run", 1.0), _changed(
        "AssetCheckEvaluationTargetMaterializationData"
    )
    assert evaluation.partition == "2026-01-01", _changed("AssetCheckEvaluation")


def test_no_public_per_day_check_result_yet() -> None:
    """Where this fails, a public way to the per-day check results may exist."""
    params = inspect.signature(AssetCheckResult).parameters
    assert "partition" not in params, (
        f"dagster {version('dagster')} gave AssetCheckResult a partition: "
        "assets/days.py may record each day's checks without assets/dagster_private.py"
    )


def test_launch_run_context_carries_the_run_and_workspace() -> None:
    assert LaunchRunContext._fields == ("dagster_run", "workspace"), _changed("LaunchRunContext")
    assert list(inspect.signature(EcsRunLauncher.launch_run).parameters) == [
        "self",
        "context",
    ], _changed("EcsRunLauncher.launch_run")


def _hits(path: Path) -> list[str]:
    text = path.read_text(encoding="utf-8")
    return [
        f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
        for n, line in enumerate(text.splitlines(), 1)
        if PRIVATE.search(line)
    ]


def test_the_module_is_where_dagsters_private_names_come_from() -> None:
    assert _hits(MODULE), "assets/dagster_private.py names no private Dagster module"


@pytest.mark.parametrize("folder", SCANNED)
def test_nothing_else_reaches_into_dagster_private_modules(folder: str) -> None:
    """No import of, nor any reference to, a private Dagster module outside the one module."""
    files = sorted(p for p in (ROOT / folder).rglob("*.py") if p != MODULE)
    hits = [hit for p in files for hit in _hits(p)]
    assert not hits, "import these through assets/dagster_private.py:\n" + "\n".join(hits)

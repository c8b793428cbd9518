"""A promoted challenger's re-scored days are served like any other (issue 38): fraud alerts
served with the champion, a challenger promoted with `nightshift promote`, the stale days
re-scored by the rescore sensor's runs, and the automation sensor's publish runs serving them."""

from __future__ import annotations

from dagster import (
    AssetKey,
    AssetSelection,
    DagsterInstance,
    Definitions,
    build_sensor_context,
    evaluate_automation_conditions,
)
from helpers import asset_metadata, run_job

from assets.fraud.demo_data import generate_day
from assets.fraud.schemas import ALERTS, MODEL_NAME, SCORES
from assets.serving import PUBLISH_JOBS
from assets.staleness import window
from inference.models.registry import challenger_version, champion_version
from orchestration.cli import main
from orchestration.definitions import build_definitions
from orchestration.promotion import GATE_CHECK
from orchestration.rescore import rescore_stale_sensor
from policy.partitions import daily_partitions
from policy.tags import PARTITION_RANGE_END_TAG, PARTITION_RANGE_START_TAG
from resources.serving import SqliteTarget
from resources.storage import DataStore, StorageResource

SCALE = 0.02
[PUBLISH] = [p for p in PUBLISH_JOBS if p.asset == f"{ALERTS}_serving"]


class Automation:
    """The automation sensor's ticks over the project's definitions, for the alerts' publish
    step: each tick says which days it requests, and ``serve`` runs them in one run of the
    publish job, as the sensor launches them (the step's backfill policy is one run)."""

    def __init__(self, defs: Definitions, instance: DagsterInstance):
        self.defs, self.instance = defs, instance
        self.cursor = None

    def tick(self) -> list[str]:
        """The days requested of the publish step, oldest first; the cursor moves on."""
        result = evaluate_automation_conditions(
            defs=self.defs,
            instance=self.instance,
            asset_selection=AssetSelection.assets(PUBLISH.asset),
            cursor=self.cursor,
        )
        self.cursor = result.cursor
        return sorted(result.get_requested_partitions(AssetKey(PUBLISH.asset)))

    def serve(self, days: list[str]) -> dict[str, dict]:
        """One publish run over ``days``; each day's publish figures."""
        span = {PARTITION_RANGE_START_TAG: days[0], PARTITION_RANGE_END_TAG: days[-1]}
        result = self.defs.resolve_job_def(PUBLISH.job).execute_in_process(
            instance=self.instance,
            **({"partition_key": days[0]} if len(days) == 1 else {"tags": span}),
        )
        assert result.success
        return {day: asset_metadata(result, PUBLISH.asset, day) for day in days}


def _checks_on(result, asset: str) -> dict[str, bool]:
    """Whether each check on ``asset`` passed in the run ``result``."""
    evaluations = result.get_asset_check_evaluations()
    return {c.check_name: c.passed for c in evaluations if c.asset_key == AssetKey(asset)}


def test_a_promoted_challengers_rescored_day_is_served_and_rolls_back_to_the_champions(
    data_root, instance, capsys
) -> None:
    store = DataStore(str(data_root))
    serving = SqliteTarget()  # the default target under the data root, as `nightshift run`'s
    days = window(daily_partitions.get_last_partition_key(), 2)
    earlier, last = days
    for day in days:
        generate_day(store, day, scale=SCALE, seed=0)
    defs = build_definitions("local")
    automation = Automation(defs, instance)
    # The sensor was ticking before the days were scored: it serves what is updated after.
    assert automation.tick() == []
    for day in days:  # the first run trains the champion
        assert run_job("fraud_scoring_job", instance, day=day).success
    champion = champion_version(store.read_bytes, store.models_dir, MODEL_NAME)
    assert automation.tick() == days
    first = automation.serve(days)
    assert [first[d]["current_version"] for d in days] == [1, 2]
    before = serving.current(ALERTS)
    assert (before.version, before.partition, before.model_version) == (2, last, champion)
    assert before.checks and all(before.checks.values())
    champions_rows = serving.read_current(ALERTS)
    assert automation.tick() == []

    # A retrain waits as challenger (no day is held out of both models for the gate to judge
    # on); a person promotes it with the CLI, as the gate's description says.
    config = {"ops": {MODEL_NAME: {"config": {"retrain": True, "seed": 7}}}}
    retrained = run_job("fraud_training_job", instance, config)
    [gate] = [c for c in retrained.get_asset_check_evaluations() if c.check_name == GATE_CHECK]
    assert not retrained.success and not gate.passed and "--force" in gate.description
    challenger = challenger_version(store.read_bytes, store.models_dir, MODEL_NAME)
    assert challenger is not None and challenger != champion
    reason = "retrained with another seed; no held-out day to judge on yet"
    assert main(["promote", MODEL_NAME, "--force", "--reason", reason, "--by", "ana"]) == 0
    assert f"{challenger} is champion" in capsys.readouterr().out
    assert champion_version(store.read_bytes, store.models_dir, MODEL_NAME) == challenger

    # The rescore sensor's runs, newest first; the automation sensor ticks after each.
    storage = StorageResource(data_root=str(data_root))
    sensor_context = build_sensor_context(instance=instance, resources={"storage": storage})
    requests = rescore_stale_sensor(sensor_context).run_requests
    assert [r.partition_key for r in requests] == [last, earlier]
    scoring = defs.resolve_job_def(requests[0].job_name)
    served, alert_checks = {}, {}
    for request in requests:
        day = request.partition_key
        rescored = scoring.execute_in_process(
            partition_key=day,
            tags=request.tags,
            asset_selection=request.asset_selection,
            instance=instance,
        )
        assert rescored.success
        assert asset_metadata(rescored, SCORES)["model_version"] == challenger
        alert_checks[day] = _checks_on(rescored, ALERTS)
        assert automation.tick() == [day]
        served |= automation.serve([day])

    # The re-scored last day is current: the challenger's model, a new commit, its rows, and
    # the check results its re-score recorded (the alerts' commit carries none).
    current = serving.current(ALERTS)
    published = store.output_figures(ALERTS, last)
    assert (current.version, current.partition) == (3, last)
    assert current.model_version == challenger
    assert current.commit == published.commit != before.commit
    assert current.checks == alert_checks[last] and all(current.checks.values())
    rows = serving.read_current(ALERTS)
    assert rows.equals(store.read_output(ALERTS, last))
    assert set(rows["model_version"].to_pylist()) == {challenger}
    assert (served[last]["current_version"], served[last]["previous_version"]) == (3, 2)
    assert served[last]["commit"] == published.commit
    # The earlier day, re-scored after it, does not put the product back a day.
    assert f"v3 serves a later day, {last}" in served[earlier]["not_current"]
    assert serving.current(ALERTS).version == 3

    # The champion's version of the day is kept, and rollback returns to it.
    kept = {v.version: v for v in serving.versions(ALERTS)}
    assert sorted(kept) == [1, 2, 3]
    assert (kept[2].partition, kept[2].model_version, kept[2].commit) == (
        last, champion, before.commit,
    )  # fmt: skip
    restored = serving.rollback(ALERTS, last)
    assert (restored.version, restored.model_version) == (2, champion)
    assert serving.read_current(ALERTS).equals(champions_rows)

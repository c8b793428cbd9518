"""The promotion-gate benchmark on the card sample: its pseudo-days, and a small run of the real job."""

from __future__ import annotations

from datetime import date

import pandas as pd
import pytest

from assets.fraud.schemas import LABELLED_SCHEMA
from evaluation.promotion import CREDITCARD, labelled_table, pseudo_days, run
from evaluation.promotion_report import blocks, rule_table

FRAME = pd.read_csv(CREDITCARD, index_col=0)


def test_pseudo_days_cut_the_sample_by_time_oldest_first() -> None:
    days = pseudo_days(FRAME, 12)

    assert sum(len(d) for d in days.values()) == len(FRAME)
    assert list(days) == sorted(days) and len(days) == 12
    frames = list(days.values())
    for older, newer in zip(frames, frames[1:], strict=False):
        assert older["Time"].max() < newer["Time"].min()


def test_a_pseudo_day_keeps_the_contract_the_time_of_day_and_unique_ids() -> None:
    rows = FRAME.iloc[[0, 0, 5]]  # a row drawn twice, as a bootstrap draws it
    table = labelled_table(rows, "2026-03-04", tag="r0")

    assert table.schema == LABELLED_SCHEMA
    assert len(set(table["transaction_id"].to_pylist())) == 3
    assert len(set(table["account_id"].to_pylist())) == 3
    stamps = table["ts"].to_pylist()
    assert {s.date() for s in stamps} == {date(2026, 3, 4)}
    assert [s.hour * 3600 + s.minute * 60 + s.second for s in stamps] == [
        int(t) % 86_400 for t in rows["Time"]
    ]
    assert table["is_fraud"].to_pylist() == rows["Class"].tolist()


@pytest.fixture(scope="module")
def small_cut() -> dict:
    return run(CREDITCARD, windows=4, seeds=2, bad_seeds=1, resampled_pairs=1, reps=3)


def test_the_gate_judges_on_days_newer_than_any_training_day(small_cut) -> None:
    assert small_cut["held_out_days"] == ["2026-03-03", "2026-03-04"]
    assert small_cut["held_out_frauds"] > 100
    for trial in small_cut["trials"]:
        assert trial["gate"]["evaluation_days"] == ", ".join(small_cut["held_out_days"])
        assert trial["training_days"] <= small_cut["history_days"]


def test_shuffled_labels_are_blocked_on_real_data(small_cut) -> None:
    [shuffled] = [t for t in small_cut["trials"] if t["scenario"] == "shuffled labels"]
    assert shuffled["passed"] is False
    assert shuffled["gate"]["margin_auprc"] < -shuffled["gate"]["tolerance_auprc"]


def test_the_replayed_rule_agrees_with_every_verdict_of_the_gate(small_cut) -> None:
    for trial in small_cut["trials"]:
        gate = trial["gate"]
        tolerances = (gate["tolerance_auprc"], gate["tolerance_recall_at_champion_alerts"])
        assert blocks(trial, *tolerances, "budget") is not trial["passed"]
    assert "| 0.025 | budget, tolerance 0.075 |" in rule_table([small_cut])


def test_the_figures_beside_the_gate_score_as_the_gate_does(small_cut) -> None:
    for trial in small_cut["trials"]:
        # Both versions' recall at the champion's alert count, as the gate measured it; for
        # the champion that is its recall at its own threshold.
        budget, gate = trial["budget_recall"], trial["gate"]
        for version in ("challenger", "champion"):
            measured = gate[f"{version}_recall_at_champion_alerts"]
            assert budget[version] == pytest.approx(measured, abs=1e-6)
        assert budget["threshold"]["champion"] == pytest.approx(budget["champion"], abs=1e-6)
    [resampled] = [t for t in small_cut["trials"] if t["bootstrap"]]
    errors = resampled["bootstrap"]
    assert errors["reps"] == 3 and errors["auprc"]["champion_se"] > 0

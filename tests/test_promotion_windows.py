"""The gate's days and settings as plain functions: the evaluation window never overlaps either
version's training, a retrain trains only before its held-out days, tolerances parse."""

from __future__ import annotations

import pytest

from inference.models.gate import evaluation_days, parse_tolerances, training_days

DAYS = [f"2026-03-{d:02d}" for d in range(1, 13)]


@pytest.mark.parametrize(
    ("windows", "n", "expected"),
    [
        # The usual retrain: both trained before the last two days.
        ([("2026-03-01", "2026-03-10"), ("2026-03-02", "2026-03-10")], 2, DAYS[10:]),
        # A champion trained through the last day leaves only days before both windows.
        ([("2026-03-04", "2026-03-12"), ("2026-03-05", "2026-03-10")], 2, DAYS[1:3]),
        # Nothing is free of both.
        ([("2026-03-01", "2026-03-12"), ("2026-03-01", "2026-03-10")], 2, []),
        # A version that did not record its window could have trained on any day.
        ([("2026-03-01", "2026-03-10"), None], 2, []),
        ([("2026-03-01", "2026-03-09")], 5, DAYS[9:]),
    ],
)
def test_evaluation_days_are_free_of_every_training_window(windows, n, expected) -> None:
    days = evaluation_days(DAYS, windows, n)
    assert days == expected
    for window in filter(None, windows):
        assert not [d for d in days if window[0] <= d <= window[1]]


@pytest.mark.parametrize(
    ("held_out", "history_days", "expected"),
    [
        (DAYS[10:], 28, DAYS[:10]),
        (DAYS[10:], 3, DAYS[7:10]),
        ([], 28, DAYS),
        (DAYS[:1], 28, []),
    ],
)
def test_a_retrain_trains_only_before_its_held_out_days(held_out, history_days, expected) -> None:
    assert training_days(DAYS, held_out, history_days) == expected


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("", {}),
        ("0.05", {"auprc": 0.05, "recall_at_threshold": 0.05}),
        ("auprc=0.03", {"auprc": 0.03}),
        # Another model's metric is ignored, so one setting serves every gate.
        ("auprc=0.03, recall_at_10=0.2", {"auprc": 0.03}),
    ],
)
def test_tolerances_parse_as_the_setting_writes_them(raw, expected) -> None:
    assert parse_tolerances(raw, ("auprc", "recall_at_threshold")) == expected


@pytest.mark.parametrize(("raw", "message"), [("auprc=high", "not a number"), ("-0.1", "negative")])
def test_a_bad_tolerance_is_refused_naming_it(raw, message) -> None:
    with pytest.raises(ValueError, match=message):
        parse_tolerances(raw, ("auprc",))

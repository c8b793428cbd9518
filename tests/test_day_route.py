"""One fraud day's route through the project (tests/day_route.py): where it starts, that it is
published once, and that it never goes back to landing once the engine has it; a day on the
public module enters at most ten project files and returns to a file it left at most five
times (issue 45)."""

from __future__ import annotations

from day_route import one_churn_day, one_fraud_day


def test_a_day_is_landed_then_scored_then_published_once():
    route = one_fraud_day()
    print(route.describe())
    stays = [(path, functions) for path, functions in route.stays]
    assert stays[0] == ("assets/runner.py", ["score"])
    published = [
        n
        for n, (path, fns) in enumerate(stays)
        if path == "inference/engine/tables.py" and "StagedDay.publish" in fns
    ]
    assert len(published) == 1
    engine = next(n for n, (_, fns) in enumerate(stays) if "SpotSafeRun.partition" in fns)
    landing = [n for n, (path, _) in enumerate(stays) if path == "assets/landing.py"]
    assert landing and max(landing) < engine
    # The day is recorded after it is published, and nothing is published after its record.
    recorded = max(n for n, (_, fns) in enumerate(stays) if "DayRecorder.record" in fns)
    assert published[0] < recorded


def test_a_day_on_the_public_module_enters_ten_files_and_comes_back_at_most_five_times():
    route = one_churn_day()
    print(route.describe())
    assert len(route.files) <= 10
    assert route.returns <= 5
    assert route.stays[0] == ("assets/runner.py", ["score"])


def test_a_fraud_day_with_its_own_screen_and_checks_stays_within_the_same_bounds():
    route = one_fraud_day()
    print(route.describe())
    assert len(route.files) <= 10
    assert route.returns <= 5
    # Its screen takes the plan the landing checks kept for the files the step scores: the
    # day is not screened again, nor its files listed a third time.
    screening = [fns for path, fns in route.stays if path == "assets/fraud/quality.py"]
    assert screening == []

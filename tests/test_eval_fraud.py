"""`make eval`'s fraud harness and its driver: they run on the committed card sample and print the table."""

from __future__ import annotations

from evaluation import fraud as eval_fraud
from evaluation import run as eval_driver


def test_fraud_evaluation_scores_both_methods_and_the_amount_sweep() -> None:
    rows = eval_fraud.evaluate(seeds=[0])
    by = {(r["method"], r["metric"]): r for r in rows}
    for method in ("nightshift (MLP, guarded)", "logistic regression"):
        assert 0.0 < by[(method, "auprc")]["value"] <= 1.0
        assert by[(method, "auprc")]["n"] == 517  # 30% of 1,722, stratified
    # The guard never lets an absurd amount score low unmarked (a quality property, not a
    # threshold on outside data: the sample is committed).
    assert by[("nightshift (guarded)", "silent_low_share")]["value"] == 0.0
    text = eval_fraud.table(rows)
    assert "| logistic regression |" in text and "silent_low_share" in text


def test_the_driver_prints_each_domain_and_reports_missing_data(capsys, monkeypatch) -> None:
    def missing() -> str:
        raise FileNotFoundError("ml-100k/u.data is missing: download it from ...")

    monkeypatch.setitem(eval_driver.DOMAINS, "recommendations", missing)
    monkeypatch.setitem(eval_driver.DOMAINS, "fraud", lambda: "| fraud table |")

    status = eval_driver.main(["--only", "fraud", "recommendations"])

    out = capsys.readouterr().out
    assert status == 1
    assert "## fraud" in out and "| fraud table |" in out
    assert "SKIPPED: ml-100k/u.data is missing" in out


def test_the_driver_prints_the_tables_it_has_beside_the_missing_ones(capsys, monkeypatch) -> None:
    def partly() -> str:
        raise eval_driver.PartlyMissing("| summaries table |", ["set_b is not in the cache"])

    monkeypatch.setitem(eval_driver.DOMAINS, "summaries", partly)

    status = eval_driver.main(["--only", "summaries"])

    out = capsys.readouterr().out
    assert status == 1
    assert "| summaries table |" in out
    assert "SKIPPED: set_b is not in the cache" in out

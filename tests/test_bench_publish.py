"""The output-commit benchmark (workload 10) at its quick size: both commits and the fraud day are timed, and each comparison has its ratio."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_bench_publish_smoke_run_times_both_commits_and_the_fraud_day(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.bench",
            "--quick",
            "--only",
            "publish",
            "--scale",
            "0.2",
            "--out",
            str(tmp_path),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    (workload,) = json.loads((tmp_path / "results.json").read_text())["workloads"]
    facts, comparisons = workload["facts"], workload["comparisons"]

    peers = [c["peer"] for c in comparisons]
    assert any(p.startswith("c230d28's folder rename") for p in peers)
    assert peers.count("pq.write_table of the same scores") == 2
    for c in comparisons:
        assert c["unit"] == "s" and c["subject_value"] > 0 and c["peer_value"] > 0
        assert c["ratio"] > 0
    # The quick size: 20,000 rows cut into shards of 10,000, every row published in the table.
    assert facts["rows"] == facts["published_rows"] == 20_000
    assert facts["shard_files"]["10000"] == 2
    assert facts["rename_commit_seconds"] > 0
    assert facts["iceberg_commit_seconds_10000"] > 0 and facts["iceberg_over_rename_10000"] > 0
    # The commit it replaced, staging by writing the rows again, is timed beside it.
    assert any(p.startswith("staging by writing the rows again") for p in peers)
    assert facts["rewrite_commit_seconds_10000"] > 0 and facts["rewrite_over_registered_10000"] > 0
    assert facts["fraud_scores_rows"] > 0
    assert 0 < facts["fraud_day_commit_share"] < 1
    assert "publish fraud_scores" in facts["fraud_day_commit_calls"]
    assert "| 10 output commit |" in (tmp_path / "results.md").read_text()

"""End to end through the real command lines: `nightshift generate`, `dagster job execute`, `nightshift run`."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from resources.storage import DataStore

BIN = Path(sys.executable).parent
DATE = "2026-03-03"


def _env(data_root: Path, dagster_home: Path) -> dict[str, str]:
    return {
        **os.environ,
        "NIGHTSHIFT_DATA_ROOT": str(data_root),
        "DAGSTER_HOME": str(dagster_home),
        "HF_HUB_OFFLINE": "1",
    }


def _run(args: list[str], env: dict[str, str], timeout: int = 240) -> subprocess.CompletedProcess:
    return subprocess.run(args, env=env, capture_output=True, text=True, timeout=timeout)


def _generate(
    env: dict[str, str], days: int = 2, scale: float = 0.01
) -> subprocess.CompletedProcess:
    done = _run(
        [
            str(BIN / "nightshift"),
            "generate",
            "--date",
            DATE,
            "--days",
            str(days),
            "--scale",
            str(scale),
        ],
        env,
    )
    assert done.returncode == 0, done.stderr
    return done


def _job_execute(job: str, env: dict[str, str], date: str = DATE) -> subprocess.CompletedProcess:
    return _run(
        [
            str(BIN / "dagster"),
            "job",
            "execute",
            "-m",
            "orchestration.definitions",
            "-j",
            job,
            "--tags",
            json.dumps({"dagster/partition": date}),
        ],
        env,
    )


def test_generate_writes_every_dataset_for_each_day(data_root, dagster_home) -> None:
    done = _generate(_env(data_root, dagster_home))
    store = DataStore(str(data_root))
    for dataset in ("transactions", "transactions_labelled", "interactions", "documents"):
        assert store.landing_dates(dataset) == ["2026-03-02", DATE], dataset
        assert dataset in done.stdout


def test_generate_rejects_a_bad_date(data_root, dagster_home) -> None:
    done = _run(
        [str(BIN / "nightshift"), "generate", "--date", "03/03/2026"], _env(data_root, dagster_home)
    )
    assert done.returncode == 2 and "not a date (YYYY-MM-DD): '03/03/2026'" in done.stderr


def test_dagster_job_execute_scores_the_tagged_partition(data_root, dagster_home) -> None:
    env = _env(data_root, dagster_home)
    _generate(env)
    done = _job_execute("fraud_scoring_job", env)
    assert done.returncode == 0 and "RUN_SUCCESS" in done.stdout + done.stderr, done.stderr[-3000:]
    store = DataStore(str(data_root))
    scores = store.read_output("fraud_scores", DATE)
    assert (
        scores.num_rows
        == store.read_landing(
            "transactions", DATE, pq.read_schema(store.landing_files("transactions", DATE)[0])
        ).num_rows
    )
    assert not store.output_exists("fraud_scores", "2026-03-02")


FUTURE = (dt.datetime.now(dt.UTC).date() + dt.timedelta(days=30)).isoformat()


@pytest.mark.parametrize(
    ("command", "date", "words"),
    [
        ("run", "2026-13-01", "argument --date: not a date (YYYY-MM-DD): '2026-13-01'"),
        ("run", "../../etc", "argument --date: not a date (YYYY-MM-DD): '../../etc'"),
        ("generate", "../../etc", "argument --date: not a date (YYYY-MM-DD): '../../etc'"),
        ("generate", "2026-02-30", "argument --date: not a date (YYYY-MM-DD): '2026-02-30'"),
        (
            "run",
            "2025-12-31",
            "partition 2025-12-31 is before the first partition 2026-01-01 (NIGHTSHIFT_START_DATE)",
        ),
        ("run", FUTURE, f"partition {FUTURE} is not over yet: the last partition is"),
    ],
)
def test_a_bad_date_is_answered_in_one_line(data_root, dagster_home, command, date, words) -> None:
    done = _run([str(BIN / "nightshift"), command, "--date", date], _env(data_root, dagster_home))
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.splitlines()
    assert line.startswith(f"nightshift {command}: error: ") and words in line, line
    assert "Traceback" not in done.stderr and not done.stdout
    assert not (data_root / "landing").exists()


def test_a_partition_before_the_start_date_fails_once_without_retries(
    data_root, dagster_home
) -> None:
    env = _env(data_root, dagster_home)
    done = _job_execute("daily_summaries_job", env, date="2025-12-31")
    output = done.stdout + done.stderr
    assert done.returncode != 0 and "RUN_SUCCESS" not in output
    assert (
        "Failure: partition 2025-12-31 is before the first partition 2026-01-01 "
        "(NIGHTSHIFT_START_DATE)" in output
    )
    # Bad input is not retried: no retry was requested, no step started twice.
    assert "STEP_UP_FOR_RETRY" not in output and "STEP_RESTARTED" not in output
    assert output.count("STEP_FAILURE") == 1 and "CheckError" not in output


def test_dagster_job_execute_fails_on_a_missing_partition(data_root, dagster_home) -> None:
    env = _env(data_root, dagster_home)
    _generate(env, days=1)
    done = _job_execute("daily_summaries_job", env, date="2026-03-01")
    output = done.stdout + done.stderr
    assert done.returncode != 0 and "RUN_SUCCESS" not in output
    assert "landing partition missing: dataset 'documents', date 2026-03-01" in output
    assert not DataStore(str(data_root)).output_exists("document_summaries", "2026-03-01")


@pytest.mark.parametrize("jobs", [["recommendations_job"]])
def test_nightshift_run_prints_the_table(data_root, dagster_home, jobs) -> None:
    env = _env(data_root, dagster_home)
    done = _run(
        [
            str(BIN / "nightshift"),
            "run",
            "--date",
            DATE,
            "--generate-days",
            "3",
            "--scale",
            "0.02",
            "--jobs",
            *jobs,
        ],
        env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("asset"))
    assert lines[header].split() == [
        "asset",
        "partition",
        "rows",
        "in",
        "rows",
        "out",
        "seconds",
        "cost",
        "output",
    ]
    # A scored day's cost over all its attempts, at the default node type's table prices.
    assert lines[header - 1] == "cost: node time over all attempts, at g5.xlarge prices"
    rows = {line.split()[0]: line.split() for line in lines[header + 2 :]}
    assert set(rows) == {"interactions", "recommendation_model", "user_recommendations"}
    scored = rows["user_recommendations"]
    assert scored[1] == DATE and int(scored[3]) > 0 and scored[-1].endswith(f"date={DATE}")
    assert scored[-2].startswith("$") and float(scored[-2][1:]) > 0

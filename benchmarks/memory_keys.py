"""Workload 9: peak memory as a day grows in rows and in accounts (keys), local and on Ray.

Workload 5 grows a day by repeating it, so its accounts stay the same and the fraud profile
(exact per account) does not grow. Here the generated day grows both: ``generate_day`` at
``scale`` and at ``factor`` x ``scale`` has ``factor`` times the rows, accounts and merchants.

Each run is the real CLI, ``dagster job execute -m orchestration.definitions -j
fraud_scoring_job`` for one day, in its own process with its own instance, the model trained
once beforehand and reused (so only the landing checks, the scores and the alerts count). It is
measured from outside: a thread reads ``/proc/<pid>/status`` of the process and of every process
under it (Ray's daemons and workers) every 50 ms; ``VmHWM``, the kernel's high-water mark of a
process's resident memory, is exact whenever it was read; ``RssAnon`` and ``RssShmem`` split it
into private memory and shared pages (Ray's object store, counted in every process that touched
them though they exist once on the node); the driver's samples are matched with the run's step
events and log lines to say which step and phase held the peak. A small launcher forks the
CLI and reports ``ru_maxrss`` of it and the descendants it reaped, as a cross-check (measured
from this process, a child would start at this process's own high-water mark).

With ``executor: ray`` the same job runs with ``NIGHTSHIFT_EXECUTOR=ray``: the step starts a
local Ray with two workers and stops it after. Shards hold ``shard_rows`` rows at both sizes,
so a worker's memory should follow the shard, not the day; the driver still runs the landing
checks and cuts the day into shards.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pyarrow.compute as pc
import pyarrow.parquet as pq

from benchmarks.common import Workload

REPO = Path(__file__).resolve().parents[1]
SMALL, LARGE = "2026-03-02", "2026-03-03"
WORKERS = 2
SAMPLE_SECONDS = 0.05
TARGET = round(1 / 1.2, 3)  # the target: the 10x day's peak within 1.2x of the 1x day's

# Forks the command, waits for it and writes ru_maxrss of it (and of the descendants it reaped).
LAUNCHER = """
import json, os, sys
pid = os.fork()
if pid == 0:
    os.execvp(sys.argv[2], sys.argv[2:])
_, status, usage = os.wait4(pid, 0)
code = os.waitstatus_to_exitcode(status)
with open(sys.argv[1], "w") as out:
    json.dump({"pid": pid, "maxrss_kib": usage.ru_maxrss, "exit": code}, out)
sys.exit(code if code >= 0 else 128 - code)
"""


# Resident memory is private (RssAnon), mapped files (RssFile) and shared memory (RssShmem):
# pages of Ray's object store that a process wrote or read count there.
FIELDS = ("VmRSS", "VmHWM", "RssAnon", "RssShmem", "PPid")


def _status(pid: int) -> dict[str, int]:
    """The FIELDS (KiB; PPid) of a live process; empty if it is gone."""
    found: dict[str, int] = {}
    try:
        with open(f"/proc/{pid}/status") as handle:
            for line in handle:
                key, _, value = line.partition(":")
                if key in FIELDS:
                    found[key] = int(value.split()[0])
    except (OSError, ValueError):
        return {}
    return found


def _title(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            args = handle.read().split(b"\0")
    except OSError:
        return ""
    words = [a.decode(errors="replace") for a in args if a]
    if not words:  # exiting
        return ""
    # Ray renames its workers (setproctitle: "ray::ShardWorker.run"); others show their script
    # (log_monitor.py) or program (raylet, gcs_server, tail).
    if words[0].startswith("ray::"):
        return words[0]
    script = next((w for w in words if w.endswith(".py")), words[0])
    return os.path.basename(script)


class TreeSampler:
    """Samples the memory of a process and all its descendants until stopped."""

    def __init__(self, root: int, every: float = SAMPLE_SECONDS):
        self.root, self.every = root, every
        self.hwm: dict[int, int] = {}  # pid -> highest VmHWM read (KiB)
        self.anon: dict[int, int] = {}  # pid -> highest RssAnon sampled (KiB)
        self.shmem: dict[int, int] = {}  # pid -> highest RssShmem sampled (KiB)
        self.titles: dict[int, set[str]] = {}
        self.parents: dict[int, int] = {}
        # pid -> (unix time, VmRSS, RssAnon) in KiB
        self.rss: dict[int, list[tuple[float, int, int]]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> TreeSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _tree(self) -> list[int]:
        children: dict[int, list[int]] = {}
        for entry in os.scandir("/proc"):
            if entry.name.isdigit():
                parent = _status(int(entry.name)).get("PPid")
                if parent is not None:
                    children.setdefault(parent, []).append(int(entry.name))
        found, todo = [], [self.root]
        while todo:
            pid = todo.pop()
            found.append(pid)
            todo.extend(children.get(pid, []))
        return found

    def _run(self) -> None:
        tick = 0
        pids: list[int] = [self.root]
        while not self._stop.is_set():
            if tick % 4 == 0:  # walking /proc costs more than reading a few status files
                pids = self._tree()
            tick += 1
            now = time.time()
            for pid in pids:
                status = _status(pid)
                if "VmHWM" not in status:
                    continue
                self.hwm[pid] = max(self.hwm.get(pid, 0), status["VmHWM"])
                self.anon[pid] = max(self.anon.get(pid, 0), status.get("RssAnon", 0))
                self.shmem[pid] = max(self.shmem.get(pid, 0), status.get("RssShmem", 0))
                self.parents[pid] = status.get("PPid", 0)
                self.titles.setdefault(pid, set()).add(_title(pid))
                self.rss.setdefault(pid, []).append(
                    (now, status["VmRSS"], status.get("RssAnon", 0))
                )
            self._stop.wait(self.every)


def _mib(kib: float) -> float:
    return round(kib / 1024, 1)


# What the fraud_scores step logs as it goes: the ends of its phases, for the driver's memory.
PHASES = (
    ("shards run on", "load, screen, cut into shards"),  # ray: the workers start after the cut
    (" rows in, ", "score and commit (local: from the step's start)"),
)


def _steps(home: Path) -> tuple[dict, dict[str, tuple[float, float]], list[tuple[float, str]]]:
    """The run's fraud_scores metadata, each step's (start, end) unix times, and the ends of
    the fraud_scores step's phases (unix time, what ended)."""
    from dagster import AssetKey, DagsterEventType, DagsterInstance, DagsterRunStatus

    from assets.day_metadata import day_entries

    with DagsterInstance.from_config(str(home)) as instance:
        (run,) = instance.get_runs()
        if run.status != DagsterRunStatus.SUCCESS:
            raise RuntimeError(f"run {run.run_id} ended {run.status}")
        started: dict[str, float] = {}
        spans: dict[str, tuple[float, float]] = {}
        ends: list[tuple[float, str]] = []
        for entry in instance.all_logs(run.run_id):
            event = entry.dagster_event
            if event is None:
                if entry.step_key == "fraud_scores":
                    for marker, phase in PHASES:
                        if marker in entry.user_message:
                            ends.append((entry.timestamp, phase))
                continue
            if event.event_type == DagsterEventType.ASSET_MATERIALIZATION and (
                event.step_key == "fraud_scores"
            ):
                ends.append((entry.timestamp, "checks"))
            if event.event_type == DagsterEventType.STEP_START:
                started[event.step_key] = entry.timestamp
            elif event.event_type == DagsterEventType.STEP_SUCCESS:
                spans[event.step_key] = (started[event.step_key], entry.timestamp)
        latest = instance.get_latest_materialization_event(AssetKey("fraud_scores"))
        meta = day_entries(latest.asset_materialization.metadata)
        keep = (
            "rows_in",
            "shards",
            "rows_redone",
            "seconds",
            "executor",
            "workers",
            "worker_shards",
            "worker_peak_rss_mib",
            "worker_model_loads",
            "account_shards",
        )
        return {k: meta[k].value for k in keep if k in meta}, spans, ends


def job(root: Path, home: Path, date: str, executor: str, threads: int, shard_rows: int) -> dict:
    """Runs ``fraud_scoring_job`` for ``date`` through the CLI; returns what was measured."""
    home.mkdir(parents=True, exist_ok=True)
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    env = {
        **os.environ,
        "NIGHTSHIFT_DATA_ROOT": str(root),
        "DAGSTER_HOME": str(home),
        "OMP_NUM_THREADS": str(threads),
        "NIGHTSHIFT_CPU_THREADS": str(threads),
        "NIGHTSHIFT_SHARD_ROWS": str(shard_rows),
        "NIGHTSHIFT_EXECUTOR": executor,
        "NIGHTSHIFT_RAY_WORKERS": str(WORKERS),
        "NIGHTSHIFT_RAY_CPUS_PER_WORKER": "1",
        "RAY_USAGE_STATS_ENABLED": "0",
    }
    env.pop("NIGHTSHIFT_RAY_ADDRESS", None)  # a local Ray started by the step
    dagster = Path(sys.executable).with_name("dagster")
    command = [
        str(dagster),
        "job",
        "execute",
        "-m",
        "orchestration.definitions",
        "-j",
        "fraud_scoring_job",
        "--tags",
        json.dumps({"dagster/partition": date}),
    ]
    report = home / "launcher.json"
    began = time.perf_counter()
    launcher = subprocess.Popen(
        [sys.executable, "-c", LAUNCHER, str(report), *command],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    with TreeSampler(launcher.pid) as sampler:
        _, errors = launcher.communicate(timeout=3600)
    seconds = time.perf_counter() - began
    if launcher.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} ({executor}) failed:\n{errors[-3000:]}")
    launched = json.loads(report.read_text())
    meta, spans, ends = _steps(home)
    figures = _figures(sampler, launched, meta, spans, seconds, executor)
    figures["fraud_scores_phases"] = _phases(sampler.rss.get(launched["pid"], []), spans, ends)
    return figures


def _phases(
    samples: list[tuple[float, int, int]],
    spans: dict[str, tuple[float, float]],
    ends: list[tuple[float, str]],
) -> list[dict]:
    """The driver's memory in each phase of the fraud_scores step (sampled VmRSS, RssAnon)."""
    if "fraud_scores" not in spans:
        return []
    start, end = spans["fraud_scores"]
    phases = []
    for stop, what in [*sorted(ends), (end, "rest of the step")]:
        inside = [(rss, anon) for t, rss, anon in samples if start <= t <= stop]
        phases.append(
            {
                "phase": what,
                "seconds": round(stop - start, 2),
                "rss_mib": _mib(max((r for r, _ in inside), default=0)),
                "anon_mib": _mib(max((a for _, a in inside), default=0)),
            }
        )
        start = stop
    return phases


def _figures(
    sampler: TreeSampler,
    launched: dict,
    meta: dict,
    spans: dict[str, tuple[float, float]],
    seconds: float,
    executor: str,
) -> dict:
    driver = launched["pid"]
    workers = {
        pid: _mib(hwm)
        for pid, hwm in sampler.hwm.items()
        if any("ShardWorker" in t for t in sampler.titles[pid])
    }
    others = {
        f"{max(sampler.titles[pid], key=len)} ({pid})": _mib(hwm)
        for pid, hwm in sampler.hwm.items()
        if pid not in workers and pid not in (driver, sampler.root)
    }
    samples = sampler.rss.get(driver, [])
    by_step, anon_by_step = {}, {}
    for step, (start, end) in spans.items():
        inside = [(rss, anon) for t, rss, anon in samples if start <= t <= end]
        if inside:
            by_step[step] = _mib(max(rss for rss, _ in inside))
            anon_by_step[step] = _mib(max(anon for _, anon in inside))
    return {
        "executor": executor,
        "seconds": round(seconds, 1),
        "driver_peak_mib": _mib(sampler.hwm.get(driver, 0)),
        "driver_rss_by_step_mib": by_step,
        "driver_anon_by_step_mib": anon_by_step,
        "driver_anon_peak_mib": _mib(sampler.anon.get(driver, 0)),
        "driver_shmem_peak_mib": _mib(sampler.shmem.get(driver, 0)),
        "step_seconds": {k: round(e - s, 2) for k, (s, e) in spans.items() if e - s > 0.2},
        "worker_peak_mib": max(workers.values(), default=0.0),
        "worker_peaks_mib": sorted(workers.values()),
        "worker_anon_peak_mib": max((_mib(sampler.anon[p]) for p in workers), default=0.0),
        "worker_shmem_peak_mib": max((_mib(sampler.shmem[p]) for p in workers), default=0.0),
        "other_processes_peak_mib": others,
        "launcher_maxrss_mib": _mib(launched["maxrss_kib"]),
        "samples": len(samples),
        "metadata": meta,
    }


def day_size(root: Path, date: str) -> dict[str, int]:
    """Rows, distinct accounts and distinct merchants of a landed day."""
    from assets.fraud.schemas import TRANSACTIONS
    from resources.storage import DataStore

    files = DataStore(str(root)).landing_files(TRANSACTIONS, date)
    table = pq.read_table(files, columns=["account_id", "merchant_id"])
    return {
        "rows": table.num_rows,
        "accounts": len(pc.unique(table["account_id"])),
        "merchants": len(pc.unique(table["merchant_id"])),
    }


def rewrite_row_groups(root: Path, date: str, rows: int) -> int:
    """Rewrites a landed day's files with row groups of ``rows`` rows; returns the groups.

    A streaming reader holds one row group: ``generate_day`` writes one file whose groups are
    pyarrow's default (up to 1,048,576 rows), so a 500k-row day is one group of 500k rows and
    a 5M-row day groups of 1M, and the reader's memory grows with the groups, not the day.
    """
    from assets.fraud.schemas import TRANSACTIONS
    from resources.storage import DataStore

    groups = 0
    for path in DataStore(str(root)).landing_files(TRANSACTIONS, date):
        table = pq.read_table(path)
        pq.write_table(table, path, row_group_size=rows)
        groups += pq.ParquetFile(path).num_row_groups
    return groups


def run(
    work: Path,
    scale: float,
    factor: int,
    threads: int,
    shard_rows: int,
    row_group_rows: int | None = None,
) -> Workload:
    from assets.fraud.demo_data import ROWS_PER_DAY
    from benchmarks.executor import private_ray
    from benchmarks.fraud_data import train_model, write_partition

    w = Workload("9 memory, rows and keys")
    root = work / "memory_keys"
    train_model(root, threads)
    scales = {SMALL: scale, LARGE: scale * factor}
    for date, s in scales.items():
        write_partition(root, date, int(round(ROWS_PER_DAY * s)))
    sizes = {date: day_size(root, date) for date in scales}
    if row_group_rows:  # the same row groups at both sizes (see rewrite_row_groups)
        for date in scales:
            sizes[date]["row_groups"] = rewrite_row_groups(root, date, row_group_rows)
    runs: dict[str, dict] = {}
    with private_ray():  # the jobs inherit its RAY_TMPDIR
        for date in scales:  # both executors on one size, then the other
            for executor in ("local", "ray"):
                home = work / f"home-{executor}-{date}"
                runs[f"{executor} {date}"] = job(root, home, date, executor, threads, shard_rows)
    w.facts.update(
        scales=list(scales.values()),
        sizes=sizes,
        shard_rows=shard_rows,
        row_group_rows=row_group_rows or "as generated (pyarrow's default, up to 1,048,576)",
        threads=threads,
        ray_workers=WORKERS,
        runs=runs,
    )
    small, large = sizes[SMALL], sizes[LARGE]
    grown = (
        f"{large['rows'] / small['rows']:.1f}x rows, {large['accounts'] / small['accounts']:.1f}x "
        f"accounts ({small['accounts']:,} -> {large['accounts']:,})"
    )
    at = {d: f"{sizes[d]['rows']:,} rows, {sizes[d]['accounts']:,} accounts" for d in scales}
    local_s, local_l = runs[f"local {SMALL}"], runs[f"local {LARGE}"]
    ray_s, ray_l = runs[f"ray {SMALL}"], runs[f"ray {LARGE}"]
    for subject, small_run, large_run, key, note in (
        ("local engine: the job's process", local_s, local_l, "driver_peak_mib", grown),
        (
            "ray: the driver (the job's process)",
            ray_s,
            ray_l,
            "driver_peak_mib",
            "landing checks, cutting the day into account shards, commit",
        ),
        (
            "ray: the largest worker",
            ray_s,
            ray_l,
            "worker_peak_mib",
            f"{shard_rows:,} rows per shard at both sizes ({ray_s['metadata'].get('shards')} "
            f"and {ray_l['metadata'].get('shards')} shards)",
        ),
    ):
        w.compare(
            f"{subject}, {at[LARGE]}",
            f"the same, {at[SMALL]} (peak RSS)",
            large_run[key],
            small_run[key],
            "MiB",
            False,
            TARGET,
            f"target: 10x day within 1.2x (ratio >= {TARGET}); {note}",
        )
    shared = (
        "private memory alone (RssAnon, sampled every 50 ms): the object store's shared pages "
        "a process wrote or read count in its RSS, but exist once on the node (at most "
        "the store's 512 MiB)"
    )
    for subject, key in (
        ("ray: the driver's private memory", "driver_anon_peak_mib"),
        ("ray: the largest worker's private memory", "worker_anon_peak_mib"),
    ):
        w.compare(
            f"{subject}, {at[LARGE]}",
            f"the same, {at[SMALL]}",
            ray_l[key],
            ray_s[key],
            "MiB",
            False,
            TARGET,
            shared,
        )
    steps = {k: sizes[k[-10:]]["rows"] / r["step_seconds"]["fraud_scores"] for k, r in runs.items()}
    w.facts["fraud_scores_step_rows_per_second"] = {k: round(v) for k, v in steps.items()}
    w.compare(
        f"ray, {WORKERS} workers: the fraud_scores step, {at[LARGE]}",
        f"local engine: the fraud_scores step, {at[LARGE]}",
        steps[f"ray {LARGE}"],
        steps[f"local {LARGE}"],
        "rows/s",
        True,
        None,
        f"scaling: at {at[SMALL]} {steps[f'ray {SMALL}']:,.0f} against "
        f"{steps[f'local {SMALL}']:,.0f} rows/s (the local profile holds every account of the "
        "day; a shard's, its own); step times from the run's events, one run each",
    )
    w.compare(
        f"ray driver, {at[LARGE]}",
        f"local engine's process, {at[LARGE]} (peak RSS)",
        ray_l["driver_peak_mib"],
        local_l["driver_peak_mib"],
        "MiB",
        False,
        None,
        f"the workers hold another {ray_l['worker_peak_mib']:,.0f} MiB each at most",
    )
    return w


if __name__ == "__main__":  # one run, for a look by hand: ROOT HOME DATE EXECUTOR SHARD_ROWS
    from benchmarks.executor import private_ray

    with private_ray():
        root, home, date, executor, shard_rows = sys.argv[1:6]
        print(json.dumps(job(Path(root), Path(home), date, executor, 1, int(shard_rows)), indent=2))

"""Workload 13: what a run's Prometheus metrics (resources/run_metrics.py) cost a fraud day.

The same landed day is scored through ``materialize`` of ``fraud_scores`` with the metrics on
and off, alternated in one process, best of N each; the outputs must be equal. "On" is what a
deployment with a Pushgateway runs, and more: every shard feeds the day's metrics, a push goes
out at most every ``PUSH_SECONDS`` (a thirtieth of the default interval, so a short day pushes
as often as a long one would) and once when the day is recorded, and the registry is also
served on a loopback port. The Pushgateway is Debian's ``prometheus-pushgateway`` where it is
installed (``make prometheus``), started here on a free loopback port and kept in memory;
without it the day's metrics are served and not pushed, which the results say.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path

from benchmarks.common import Workload
from benchmarks.executor import DAY, score
from benchmarks.fraud_data import landed_day
from benchmarks.on_off import alternate, compare

PUSH_SECONDS = 1.0
# Issue 40: a day with its metrics at most 3% slower than without.
TARGET = 0.97


def run(
    work: Path, rows: int, threads: int, batch_size: int, shard_rows: int, repeats: int = 3
) -> Workload:
    w = Workload("13 metrics")
    root = work / "metrics"
    rows = landed_day(root, DAY, rows, threads)
    binary = shutil.which("prometheus-pushgateway")
    with _pushgateway(binary, work) if binary else nullcontext(None) as gateway:
        on = {
            "metrics_pushgateway": gateway,
            "metrics_push_seconds": PUSH_SECONDS,
            "metrics_port": _free_port(),
        }

        def day(setting: str) -> tuple[float, dict]:
            settings = on if setting == "on" else {}
            return score(root, "local", threads, batch_size, shard_rows, **settings)

        ran = alternate(day, root, repeats)
        pushed = _pushed_groups(gateway) if gateway else 0
    w.facts.update(
        rows=rows,
        shard_rows=shard_rows,
        threads=threads,
        batch_size=batch_size,
        repeats=repeats,
        pushgateway=gateway is not None,
        push_seconds=PUSH_SECONDS,
        groups_on_the_gateway=pushed,
        **ran.facts(),
    )
    where = f"pushed every {PUSH_SECONDS:g} s and served" if gateway else "served, not pushed"
    compare(
        w,
        ran,
        rows,
        f"fraud_scores, metrics on ({where})",
        "the same, metrics off (nothing configured)",
        repeats,
        TARGET,
    )
    return w


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def _pushgateway(binary: str, work: Path) -> Iterator[str]:
    """Debian's Pushgateway on a free loopback port, its groups in memory (its default file
    would hold another run's), until the block ends; yields its URL."""
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    with (work / "pushgateway.log").open("w") as log:
        process = subprocess.Popen(
            [binary, f"--web.listen-address=127.0.0.1:{port}", "--persistence.file="],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"{url}/-/ready", timeout=2).close()
                break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the Pushgateway at {url} did not start") from None
                time.sleep(0.2)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=30)


def _pushed_groups(url: str) -> int:
    """How many groups the gateway holds: one, if every push of the day replaced the last."""
    with urllib.request.urlopen(f"{url}/api/v1/metrics", timeout=5) as reply:
        return len(json.loads(reply.read())["data"])

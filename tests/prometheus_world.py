"""Debian's prometheus and prometheus-pushgateway on free loopback ports, for tests: small
functions that start each one in a temporary folder, query Prometheus's HTTP API and wait for
a condition. Nothing here knows nightshift's metrics."""

from __future__ import annotations

import json
import shutil
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ui_stack import free_port, wait_for

PROMETHEUS = shutil.which("prometheus")
PUSHGATEWAY = shutil.which("prometheus-pushgateway")
MISSING = (
    "Debian's prometheus and prometheus-pushgateway are not installed "
    "(sudo apt-get install -y prometheus prometheus-pushgateway)"
)
READY_SECONDS = 60.0
POLL_SECONDS = 0.25


def get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=5) as reply:
        return reply.read()


@contextmanager
def _serving(command: list[str], url: str, root: Path, name: str) -> Iterator[str]:
    """Runs ``command`` until the block ends, once ``url``/-/ready answers; its output goes
    to ``root``/``name``.log, quoted in the failure if it dies before it is ready."""
    log = root / f"{name}.log"
    with log.open("w") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    try:

        def ready() -> bool:
            if process.poll() is not None:
                raise AssertionError(
                    f"{name} exited with {process.returncode}: {log.read_text()[-2000:]}"
                )
            try:
                get(f"{url}/-/ready")
            except OSError:
                return False
            return True

        wait_for(ready, READY_SECONDS, f"{name} ready at {url}", every=POLL_SECONDS)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@contextmanager
def start_pushgateway(root: Path) -> Iterator[str]:
    """A Pushgateway on a free loopback port, kept in memory; yields its URL."""
    assert PUSHGATEWAY is not None, MISSING
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    # Debian's build persists to /var/lib/prometheus/pushgateway.data by default: every
    # gateway started so would load the groups the last one held, another test's days among
    # them. An empty file name keeps the groups in memory only.
    command = [PUSHGATEWAY, f"--web.listen-address=127.0.0.1:{port}", "--persistence.file="]
    with _serving(command, url, root, "pushgateway") as served:
        yield served


@contextmanager
def start_prometheus(
    root: Path, rules: Sequence[Path] = (), scrape: Sequence[str] = ()
) -> Iterator[str]:
    """A Prometheus on a free loopback port with its TSDB under ``root``, evaluating
    ``rules`` (rule files, loaded as they are) and scraping ``scrape`` (URLs of Pushgateways)
    every second with ``honor_labels``, as deploy/prometheus/prometheus.yml does; yields its
    URL once every target has been scraped (Prometheus hands new targets to its scrapers only
    every few seconds, and what is pushed before then is never seen)."""
    assert PROMETHEUS is not None, MISSING
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    targets = [urllib.parse.urlsplit(u).netloc for u in scrape]
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(Path(r).resolve()) for r in rules],
        "scrape_configs": [
            {
                "job_name": "pushgateway",
                # The pushed job, asset and partition labels are kept, not overwritten.
                "honor_labels": True,
                "static_configs": [{"targets": targets}],
            }
        ],
    }
    path = root / "prometheus.yml"
    path.write_text(json.dumps(config, indent=2))  # JSON is YAML
    command = [
        PROMETHEUS,
        f"--config.file={path}",
        f"--storage.tsdb.path={root / 'tsdb'}",
        f"--web.listen-address=127.0.0.1:{port}",
    ]
    with _serving(command, url, root, "prometheus") as served:
        if targets:

            def scraped() -> bool:
                up = query(served, 'up{job="pushgateway"} == 1')
                return len(up) == len(targets)

            scraping = f"prometheus at {served} scraping {', '.join(targets)}"
            wait_for(scraped, READY_SECONDS, scraping, every=POLL_SECONDS)
        yield served


def api(base: str, path: str, **params: Any) -> Any:
    """The ``data`` of a Prometheus HTTP API answer; an error answer fails with its message."""
    url = f"{base}/api/v1/{path}"
    if params:
        url += "?" + urllib.parse.urlencode(params)
    try:
        answer = json.loads(get(url))
    except urllib.error.HTTPError as exc:
        answer = json.loads(exc.read())
    if answer.get("status") != "success":
        raise AssertionError(f"{path} {params}: {answer.get('errorType')}: {answer.get('error')}")
    return answer["data"]


def query(base: str, expr: str) -> list[dict]:
    """An instant query's result: a list of ``{"metric": labels, "value": [t, "v"]}``."""
    return api(base, "query", query=expr)["result"]


def alerts(base: str) -> list[dict]:
    """The alerts Prometheus holds now, pending and firing, each with labels and state."""
    return api(base, "alerts")["alerts"]

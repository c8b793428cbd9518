"""Turning SIGTERM, SIGINT and cloud interruption notices into one event the engine checks.

Spot capacity is taken back with a notice (AWS: two minutes; GCP and Azure: about 30 seconds)
or with just a SIGTERM. A background thread polls the cloud's metadata endpoint; signal
handlers catch the rest. The engine calls ``check()`` between batches and stops at the next
batch boundary, also where the batches run on a thread of their own (Python runs signal
handlers on the main thread only: the signal's arrival is read from a wake-up pipe, and the
check waits for the main thread's handler). SIGUSR1 is a soft interruption: the scheduler wants the node for other work,
but the node itself stays, so the step may be retried in place.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

log = logging.getLogger(__name__)

HARD_SIGNALS = (signal.SIGTERM, signal.SIGINT)
SOFT_SIGNAL = signal.SIGUSR1
WATCHED_SIGNALS = frozenset((*HARD_SIGNALS, SOFT_SIGNAL))
# How long a check on another thread waits for the main thread to handle a signal that has
# arrived: the main thread is waiting for that thread's batches, so it takes the signal at once.
HANDOFF_SECONDS = 2.0


@dataclass(frozen=True)
class Notice:
    """Why work must stop, and whether the node itself is going away."""

    reason: str
    node_lost: bool = True


class NoticeSource(Protocol):
    name: str

    def poll(self) -> Notice | None: ...


def _request(url: str, method: str = "GET", headers: dict | None = None, timeout: float = 1.0):
    req = urllib.request.Request(url, method=method, headers=headers or {})
    return urllib.request.urlopen(req, timeout=timeout)  # noqa: S310 - configured endpoint


class AwsSpotNotice:
    """EC2 spot interruption notices through IMDSv2 (token, then ``spot/instance-action``).

    Args:
        endpoint: the instance metadata service (configurable for tests and proxies).
        token_ttl: seconds the IMDSv2 token lives; a 401 fetches a new one.
        on_advisory: called once with the rebalance recommendation, which warns but does not stop.
    """

    name = "aws"

    def __init__(
        self,
        endpoint: str = "http://169.254.169.254",
        token_ttl: int = 21600,
        on_advisory: Callable[[str], None] | None = None,
    ):
        self.endpoint = endpoint.rstrip("/")
        self.token_ttl = token_ttl
        self.on_advisory = on_advisory
        self._token: str | None = None
        self._advised = False

    def _fetch_token(self) -> str:
        with _request(
            f"{self.endpoint}/latest/api/token",
            method="PUT",
            headers={"X-aws-ec2-metadata-token-ttl-seconds": str(self.token_ttl)},
        ) as resp:
            return resp.read().decode()

    def _get(self, path: str) -> str | None:
        for attempt in range(2):
            if self._token is None:
                self._token = self._fetch_token()
            try:
                with _request(
                    f"{self.endpoint}{path}", headers={"X-aws-ec2-metadata-token": self._token}
                ) as resp:
                    return resp.read().decode()
            except urllib.error.HTTPError as exc:
                if exc.code == 404:
                    return None
                if exc.code == 401 and attempt == 0:
                    self._token = None  # expired or missing token: fetch a new one once
                    continue
                raise
        return None

    def poll(self) -> Notice | None:
        action = self._get("/latest/meta-data/spot/instance-action")
        if action:
            detail = json.loads(action)
            return Notice(
                f"aws spot {detail.get('action', 'interruption')} at {detail.get('time')}"
            )
        if not self._advised:
            rebalance = self._get("/latest/meta-data/events/recommendations/rebalance")
            if rebalance and self.on_advisory:
                self._advised = True
                self.on_advisory(f"aws rebalance recommendation: {rebalance}")
        return None


class GcpPreemption:
    """GCE preemption: ``instance/preempted`` turns TRUE about 30 s before the node stops."""

    name = "gcp"

    def __init__(self, endpoint: str = "http://metadata.google.internal"):
        self.endpoint = endpoint.rstrip("/")

    def poll(self) -> Notice | None:
        url = f"{self.endpoint}/computeMetadata/v1/instance/preempted"
        with _request(url, headers={"Metadata-Flavor": "Google"}) as resp:
            preempted = resp.read().decode().strip().upper() == "TRUE"
        return Notice("gcp preemption") if preempted else None


class AzureScheduledEvents:
    """Azure spot eviction: a ``Preempt`` scheduled event, at least 30 s ahead."""

    name = "azure"

    def __init__(self, endpoint: str = "http://169.254.169.254"):
        self.endpoint = endpoint.rstrip("/")

    def poll(self) -> Notice | None:
        url = f"{self.endpoint}/metadata/scheduledevents?api-version=2020-07-01"
        with _request(url, headers={"Metadata": "true"}) as resp:
            events = json.loads(resp.read() or b"{}").get("Events", [])
        preempt = [e for e in events if e.get("EventType") == "Preempt"]
        if preempt:
            return Notice(f"azure preemption at {preempt[0].get('NotBefore')}")
        return None


SOURCES = {"aws": AwsSpotNotice, "gcp": GcpPreemption, "azure": AzureScheduledEvents}


def notice_source(kind: str, endpoint: str | None = None) -> NoticeSource | None:
    """The notice source for ``aws|gcp|azure`` (``signals`` or ``off``: none, signals only)."""
    if kind in ("off", "signals", ""):
        return None
    if kind not in SOURCES:
        raise ValueError(
            f"unknown spot notice source '{kind}': expected signals, aws, gcp or azure"
        )
    return SOURCES[kind](endpoint) if endpoint else SOURCES[kind]()


class InterruptionWatcher:
    """Collects the first interruption from signals and a polled notice source.

    Use as a context manager around the work; signal handlers are installed only in the main
    thread and the previous handlers are restored on exit. A signal that arrived while the work
    finished anyway is handed on to the previous handler, so the orchestrator still sees it.

    Args:
        source: a cloud notice source polled in a background thread, or None for signals only.
        poll_seconds: how often to poll the source.
    """

    def __init__(self, source: NoticeSource | None = None, poll_seconds: float = 5.0):
        self.source = source
        self.poll_seconds = poll_seconds
        self._notice: Notice | None = None
        self._signal: int | None = None
        self._consumed = False
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._previous: dict[int, object] = {}
        self._noticed = threading.Event()
        self._wakeup: tuple[int, int] | None = None  # the pipe signals are written to

    @property
    def notice(self) -> Notice | None:
        return self._notice

    def check(self) -> Notice | None:
        """The pending interruption, if any; the engine calls this between batches.

        On a thread other than the main one, a signal that has arrived and whose handler has
        not run yet is waited for, so a batch begun after the signal is never scored."""
        if self._notice is None and self._wakeup is not None and self._signal_arrived():
            self._noticed.wait(HANDOFF_SECONDS)
        return self._notice

    def _signal_arrived(self) -> bool:
        """Whether a watched signal arrived whose handler may not have run yet: written to the
        wake-up pipe by the C-level handler, or still queued for the main thread (seen
        only by a thread that blocks the signals, as the scoring thread does)."""
        if threading.current_thread() is threading.main_thread():
            return False  # the handler runs here, before this line could
        return (
            self._wakeup_read()
            or bool(signal.sigpending() & WATCHED_SIGNALS)
            or self._wakeup_read()  # taken off the queue since the line above
        )

    def _wakeup_read(self) -> bool:
        try:
            arrived = os.read(self._wakeup[0], 512)
        except OSError:  # nothing there (the pipe does not block)
            return False
        return any(byte in {int(s) for s in WATCHED_SIGNALS} for byte in arrived)

    def consume(self) -> None:
        """Marks the interruption as acted on, so it is not handed on again on exit."""
        self._consumed = True

    def trigger(self, notice: Notice) -> None:
        with self._lock:
            if self._notice is None:
                self._notice = notice
                log.warning("interruption: %s", notice.reason)
        self._noticed.set()

    def _on_signal(self, signum: int, frame) -> None:
        self._signal = signum
        soft = signum == SOFT_SIGNAL
        name = signal.Signals(signum).name
        self.trigger(Notice(f"{name} received", node_lost=not soft))

    def _poll(self) -> None:
        while not self._stop.wait(self.poll_seconds if self._notice is None else 3600):
            try:
                notice = self.source.poll()
            except (OSError, ValueError) as exc:
                log.debug("notice source %s unreachable: %s", self.source.name, exc)
                continue
            if notice:
                self.trigger(notice)

    def __enter__(self) -> InterruptionWatcher:
        if threading.current_thread() is threading.main_thread():
            for signum in (*HARD_SIGNALS, SOFT_SIGNAL):
                self._previous[signum] = signal.signal(signum, self._on_signal)
            self._open_wakeup()
        else:
            log.info("not in the main thread: interruptions come from notices only")
        if self.source is not None:
            self._thread = threading.Thread(
                target=self._poll, name="nightshift-notices", daemon=True
            )
            self._thread.start()
        return self

    def _open_wakeup(self) -> None:
        """Has signals written to a pipe of ours as they arrive, unless someone else (an
        asyncio loop) already reads them so: then only the main thread sees them at once."""
        read, write = os.pipe()
        os.set_blocking(read, False)
        os.set_blocking(write, False)
        previous = signal.set_wakeup_fd(write, warn_on_full_buffer=False)
        if previous != -1:
            signal.set_wakeup_fd(previous)
            os.close(read)
            os.close(write)
            return
        self._wakeup = (read, write)

    def _close_wakeup(self) -> None:
        if self._wakeup is not None:
            signal.set_wakeup_fd(-1)
            for fd in self._wakeup:
                os.close(fd)
            self._wakeup = None

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._close_wakeup()
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        if self._signal is not None and not self._consumed and self._signal != SOFT_SIGNAL:
            # The work ended before it saw the signal: let the orchestrator handle it as usual.
            signal.raise_signal(self._signal)

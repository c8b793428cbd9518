"""The interruption watcher: signals, and AWS, GCP and Azure notices from fake metadata servers."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from inference.engine.interrupt import (
    AwsSpotNotice,
    AzureScheduledEvents,
    GcpPreemption,
    InterruptionWatcher,
    notice_source,
)


class Metadata(BaseHTTPRequestHandler):
    """Answers like a cloud metadata service; the test sets what each path returns."""

    routes: dict[str, tuple[int, bytes]] = {}
    tokens: list[str] = []
    seen: list[tuple[str, str, dict]] = []

    def _answer(self, method: str) -> None:
        Metadata.seen.append((method, self.path, {k.lower(): v for k, v in self.headers.items()}))
        if method == "PUT" and self.path == "/latest/api/token":
            Metadata.tokens.append(f"t{len(Metadata.tokens) + 1}")
            status, body = 200, Metadata.tokens[-1].encode()
        elif self.path.startswith("/latest/") and self.headers.get("X-aws-ec2-metadata-token") != (
            Metadata.tokens[-1] if Metadata.tokens else None
        ):
            status, body = 401, b""
        else:
            status, body = Metadata.routes.get(self.path, (404, b""))
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:  # noqa: N802
        self._answer("GET")

    def do_PUT(self) -> None:  # noqa: N802
        self._answer("PUT")

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def metadata() -> Iterator[str]:
    Metadata.routes, Metadata.tokens, Metadata.seen = {}, [], []
    server = ThreadingHTTPServer(("127.0.0.1", 0), Metadata)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


ACTION = "/latest/meta-data/spot/instance-action"
REBALANCE = "/latest/meta-data/events/recommendations/rebalance"


def test_aws_nothing_pending_then_a_terminate_notice(metadata) -> None:
    advisories: list[str] = []
    source = AwsSpotNotice(metadata, on_advisory=advisories.append)
    assert source.poll() is None
    Metadata.routes[REBALANCE] = (200, b'{"noticeTime": "2026-03-02T01:58:00Z"}')
    assert source.poll() is None and advisories == [
        'aws rebalance recommendation: {"noticeTime": "2026-03-02T01:58:00Z"}'
    ]
    Metadata.routes[ACTION] = (200, json.dumps({"action": "terminate", "time": "T"}).encode())
    notice = source.poll()
    assert notice.reason == "aws spot terminate at T" and notice.node_lost
    puts = [s for s in Metadata.seen if s[0] == "PUT"]
    assert len(puts) == 1 and puts[0][2]["x-aws-ec2-metadata-token-ttl-seconds"] == "21600"


def test_aws_refetches_an_expired_token_on_401(metadata) -> None:
    source = AwsSpotNotice(metadata)
    assert source.poll() is None
    Metadata.tokens.append("rotated")  # the server no longer accepts the token the source holds
    Metadata.routes[ACTION] = (200, b'{"action": "stop", "time": "T"}')
    assert source.poll().reason == "aws spot stop at T"
    assert [s[0] for s in Metadata.seen].count("PUT") == 2


def test_gcp_and_azure_notices(metadata) -> None:
    gcp = GcpPreemption(metadata)
    Metadata.routes["/computeMetadata/v1/instance/preempted"] = (200, b"FALSE")
    assert gcp.poll() is None
    Metadata.routes["/computeMetadata/v1/instance/preempted"] = (200, b"TRUE")
    assert gcp.poll().reason == "gcp preemption"
    assert Metadata.seen[-1][2]["metadata-flavor"] == "Google"

    azure = AzureScheduledEvents(metadata)
    path = "/metadata/scheduledevents?api-version=2020-07-01"
    Metadata.routes[path] = (200, b'{"Events": [{"EventType": "Reboot"}]}')
    assert azure.poll() is None
    Metadata.routes[path] = (200, b'{"Events": [{"EventType": "Preempt", "NotBefore": "N"}]}')
    assert azure.poll().reason == "azure preemption at N"
    assert Metadata.seen[-1][2]["metadata"] == "true"


def test_watcher_polls_in_the_background(metadata) -> None:
    with InterruptionWatcher(notice_source("aws", metadata), poll_seconds=0.05) as watcher:
        assert watcher.check() is None
        Metadata.routes[ACTION] = (200, b'{"action": "terminate", "time": "T"}')
        deadline = time.monotonic() + 10
        while watcher.check() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert watcher.check().reason == "aws spot terminate at T"


def test_watcher_turns_signals_into_notices_and_restores_handlers() -> None:
    before = signal.getsignal(signal.SIGTERM)
    with InterruptionWatcher() as watcher:
        os.kill(os.getpid(), signal.SIGUSR1)
        assert watcher.check().reason == "SIGUSR1 received" and not watcher.check().node_lost
    with InterruptionWatcher() as watcher:
        os.kill(os.getpid(), signal.SIGTERM)
        assert watcher.check().node_lost
        watcher.consume()  # acted on: not handed to the previous handler on exit
    assert signal.getsignal(signal.SIGTERM) is before


def test_a_signal_not_acted_on_is_handed_to_the_previous_handler() -> None:
    received: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: received.append(signum))
    try:
        with InterruptionWatcher():
            os.kill(os.getpid(), signal.SIGINT)
        assert received == [signal.SIGINT]
    finally:
        signal.signal(signal.SIGINT, previous)


def test_unknown_source_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="unknown spot notice source 'ibm'"):
        notice_source("ibm")
    assert notice_source("off") is None

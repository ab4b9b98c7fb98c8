"""PromClient's errors carry the HTTP status of a rejection (a busy server's 503 is waited out by
the benchmarks) and None when nothing answered. The seam: a loopback HTTP server standing in for
a busy query server, answering as VictoriaMetrics does at its concurrency limit."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from flopwatch.promql import PromClient, PromError
from flopwatch.stack import free_port


class _Busy(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = b'{"status":"error","errorType":"server_error","error":"too many concurrent requests"}'
        self.send_response(503)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def busy_url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Busy)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_a_rejection_carries_its_http_status_and_the_servers_words(busy_url):
    with pytest.raises(PromError, match=r"HTTP 503 .*too many concurrent requests") as caught:
        PromClient(busy_url).scalar("up")
    assert caught.value.status == 503


def test_no_answer_has_no_status():
    with pytest.raises(PromError, match="cannot reach") as caught:
        PromClient(f"http://127.0.0.1:{free_port()}", timeout=2).scalar("up")
    assert caught.value.status is None

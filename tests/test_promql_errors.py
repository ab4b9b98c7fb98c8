"""PromClient's errors carry the HTTP status of a rejection (a busy server's 503 is waited out by
the benchmarks) and None when nothing answered. The seam: a loopback HTTP server standing in for
a busy query server, answering as VictoriaMetrics does at its concurrency limit."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from flopwatch.exporters.http import HttpServer, Response
from flopwatch.promql import PromClient, PromError
from flopwatch.stack import free_port

#: What VictoriaMetrics answers a query at its concurrency limit.
BUSY = Response(503, b'{"status":"error","errorType":"server_error","error":"too many concurrent requests"}',
                "application/json")


@pytest.fixture
def busy_url() -> Iterator[str]:
    server = HttpServer("127.0.0.1", 0, lambda path: BUSY)   # the agent's own HTTP server
    host, port = server.start()
    yield f"http://{host}:{port}"
    server.stop()


def test_a_rejection_carries_its_http_status_and_the_servers_words(busy_url):
    with pytest.raises(PromError, match=r"HTTP 503 .*too many concurrent requests") as caught:
        PromClient(busy_url).scalar("up")
    assert caught.value.status == 503


def test_no_answer_has_no_status():
    with pytest.raises(PromError, match="cannot reach") as caught:
        PromClient(f"http://127.0.0.1:{free_port()}", timeout=2).scalar("up")
    assert caught.value.status is None

"""The agent's HTTP server: keep-alive, HEAD, and malformed requests answered and counted."""

from __future__ import annotations

import http.client
import socket

import pytest

from flopwatch.exporters.http import MAX_HEADER_BYTES, HttpServer, Response


@pytest.fixture
def server():
    payload = {"/metrics": Response(200, b"flopwatch_x 1\n")}
    srv = HttpServer("127.0.0.1", 0, lambda path: payload.get(path, Response(404, b"nope\n", "text/plain")))
    srv.start()
    yield srv
    srv.stop()


def raw(server: HttpServer, data: bytes) -> bytes:
    with socket.create_connection(server.address, timeout=5) as sock:
        sock.sendall(data)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
        return b"".join(chunks)


def test_keep_alive_serves_many_requests_on_one_connection(server):
    conn = http.client.HTTPConnection(*server.address, timeout=5)
    for _ in range(20):
        conn.request("GET", "/metrics")
        answer = conn.getresponse()
        assert answer.status == 200
        assert answer.read() == b"flopwatch_x 1\n"
        assert answer.getheader("Content-Type").startswith("text/plain; version=0.0.4")
    conn.close()
    assert server.responses[200] == 20


def test_head_and_query_string_and_404(server):
    conn = http.client.HTTPConnection(*server.address, timeout=5)
    conn.request("HEAD", "/metrics?x=1")
    answer = conn.getresponse()
    assert answer.status == 200 and answer.getheader("Content-Length") == "14"
    answer.read()
    conn.request("GET", "/other")
    assert conn.getresponse().status == 404


@pytest.mark.parametrize(
    ("request_bytes", "status"),
    [
        (b"GARBAGE\r\n\r\n", b"400"),
        (b"GET /metrics SPDY/9\r\n\r\n", b"400"),
        (b"GET /metrics HTTP/1.1\r\nno-colon-here\r\n\r\n", b"400"),
        (b"GET /metrics HTTP/1.1\r\nContent-Length: -5\r\n\r\n", b"400"),
        (b"POST /metrics HTTP/1.0\r\n\r\n", b"405"),
        (b"GET /metrics HTTP/1.1\r\nContent-Length: 99999999\r\n\r\n", b"413"),
        (b"GET /metrics HTTP/1.1\r\nX: " + b"a" * (MAX_HEADER_BYTES + 10) + b"\r\n\r\n", b"431"),
    ],
)
def test_malformed_requests_are_rejected_and_counted(server, request_bytes, status):
    answer = raw(server, request_bytes)
    assert answer.startswith(b"HTTP/1.1 " + status)
    assert server.responses[int(status)] == 1
    # the server is still fine afterwards
    conn = http.client.HTTPConnection(*server.address, timeout=5)
    conn.request("GET", "/metrics")
    assert conn.getresponse().status == 200


def test_random_bytes_do_not_kill_the_server(server):
    for junk in (b"\x00\xff" * 100 + b"\r\n\r\n", b"\r\n\r\n", b"GET\r\n\r\n"):
        assert raw(server, junk).startswith(b"HTTP/1.1 400")
    conn = http.client.HTTPConnection(*server.address, timeout=5)
    conn.request("GET", "/metrics")
    assert conn.getresponse().status == 200


def test_router_bug_becomes_503():
    def broken(path):
        raise RuntimeError("bug")

    srv = HttpServer("127.0.0.1", 0, broken)
    srv.start()
    try:
        conn = http.client.HTTPConnection(*srv.address, timeout=5)
        conn.request("GET", "/metrics")
        assert conn.getresponse().status == 503
    finally:
        srv.stop()


def test_busy_port_raises_oserror(server):
    other = HttpServer("127.0.0.1", server.port, lambda path: Response(200, b""))
    with pytest.raises(OSError):
        other.start()


def test_an_idle_connection_is_closed_after_the_idle_timeout(server, monkeypatch):
    """A scraper that connects and then says nothing (or keeps a connection it no longer uses) does
    not hold a slot forever: after IDLE_TIMEOUT_S without a request the server hangs up."""
    from flopwatch.exporters import http as module

    monkeypatch.setattr(module, "IDLE_TIMEOUT_S", 0.2)
    with socket.create_connection(server.address, timeout=10) as sock:
        sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        answer = b""
        while b"flopwatch_x 1\n" not in answer:
            answer += sock.recv(65536)
        assert answer.startswith(b"HTTP/1.1 200")
        assert sock.recv(65536) == b""   # closed by the server, long before the socket's own 10 s

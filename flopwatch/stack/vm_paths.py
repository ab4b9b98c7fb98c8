"""A stand-in for a VictoriaMetrics cluster's URL paths, in front of single-node VictoriaMetrics.

The global tier is a VictoriaMetrics cluster in production: writes go to vminsert at
`/insert/<accountID>/prometheus/api/v1/write`, reads to vmselect at
`/select/<accountID>/prometheus/api/v1/...`. The cluster's programs cannot be built here (the Go
module proxy refuses every `-cluster` version), so tests and `flopwatch demo --shards` run one
single-node VictoriaMetrics behind this loopback proxy, which takes the cluster's paths and
forwards them to the single node's own. Configs written against it (Prometheus's remote_write
URL, vmalert's -datasource.url and -remoteWrite.url, a PromClient's base URL) are the ones a real
cluster takes, unchanged: it is not a cluster (one store, no replication) and says so here.

The path forms follow VictoriaMetrics 1.151's lib/httpserver/path.go (`/{prefix}/{tenantID}/{suffix}`,
repeated slashes collapsed) and the cluster's URL-format docs: insert suffixes `prometheus` and
`prometheus/api/v1/write` (remote write) and `prometheus/api/v1/import[/native|/csv|/prometheus]`;
select suffixes `prometheus/<query API path>`. Only tenant 0 (`0` or `0:0`) is served: any other
tenant, a tenant left to headers, or a suffix the cluster would not route is answered 404 with one
line saying what was wrong, and counted.
"""

from __future__ import annotations

import contextlib
import http.client
import socket
import sys
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Self

from flopwatch.stack.process import free_port

#: The tenant this stand-in serves (a real cluster serves any 32-bit accountID[:projectID]).
TENANTS = ("0", "0:0")
#: vminsert's ingestion suffixes -> the single node's path.
INSERT_PATHS = {
    "prometheus": "/api/v1/write",
    "prometheus/api/v1/write": "/api/v1/write",
    "prometheus/api/v1/import": "/api/v1/import",
    "prometheus/api/v1/import/native": "/api/v1/import/native",
    "prometheus/api/v1/import/csv": "/api/v1/import/csv",
    "prometheus/api/v1/import/prometheus": "/api/v1/import/prometheus",
}
#: Single-node paths under `prometheus/` that vmselect does not serve (they are vminsert's).
_NOT_SELECT = ("api/v1/write", "api/v1/import", "api/v1/push")
#: Headers that belong to one connection, not to the request forwarded on another.
_HOP_BY_HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer", "upgrade",
               "host", "content-length"}
#: Answer headers the proxy writes itself.
_OWN = {"date", "server"}
UPSTREAM_TIMEOUT_S = 60.0


class Refused(Exception):
    """A path the cluster would not route to tenant 0: the one-line reason, answered with 404."""


def upstream_path(path: str) -> tuple[str, str]:
    """(`insert` or `select`, the single node's path) for a cluster path (query string apart);
    Refused with the reason when a cluster would not serve it here."""
    parts = [part for part in path.split("/") if part]   # repeated slashes collapse, as in path.go
    if not parts or parts[0] not in ("insert", "select"):
        raise Refused(f"{path}: not a cluster path; expected /insert/0/prometheus/api/v1/write or "
                      "/select/0/prometheus/api/v1/...")
    prefix = parts[0]
    if len(parts) < 3:
        raise Refused(f"{path}: expected /{prefix}/<accountID>/<suffix>")
    tenant, suffix = parts[1], "/".join(parts[2:])
    if tenant not in TENANTS:
        raise Refused(f"{path}: tenant {tenant!r}: this single-node stand-in for the cluster serves accountID 0 "
                      f"only; write /{prefix}/0/{suffix}")
    if prefix == "insert":
        if suffix not in INSERT_PATHS:
            raise Refused(f"{path}: vminsert takes no {suffix!r}; remote write goes to "
                          "/insert/0/prometheus/api/v1/write")
        return prefix, INSERT_PATHS[suffix]
    rest = suffix.removeprefix("prometheus/")
    if rest == suffix or not rest or rest.startswith(_NOT_SELECT):
        raise Refused(f"{path}: vmselect takes no {suffix!r}; queries go to /select/0/prometheus/api/v1/query")
    return prefix, "/" + rest


class _QuietServer(ThreadingHTTPServer):
    """A client that hangs up mid-answer (a killed Prometheus, a store going down) is normal here:
    it is not a traceback on stderr."""

    def handle_error(self, request: object, client_address: object) -> None:
        error = sys.exc_info()[1]
        if not isinstance(error, (BrokenPipeError, ConnectionResetError)):
            super().handle_error(request, client_address)


class ClusterPaths:
    """The loopback proxy: cluster paths of tenant 0 to one single-node VictoriaMetrics (`upstream`,
    http://host:port), `/health` passed through. `forwarded` and `refused` count requests by prefix
    (insert, select; `other` for a refused path of neither), `failed` those the single node did not
    answer (502). stop() and start() again keep the port, for outage tests."""

    def __init__(self, upstream: str, port: int | None = None) -> None:
        self.upstream = upstream.rstrip("/")
        self.host = "127.0.0.1"
        self.port = port or free_port()
        self.forwarded: Counter[str] = Counter()
        self.refused: Counter[str] = Counter()
        self.failed: Counter[str] = Counter()
        self.last_refusal = ""
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._connections: set[socket.socket] = set()

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def insert_url(self) -> str:
        """Prometheus's remote_write URL (vminsert's)."""
        return f"{self.url}/insert/0/prometheus/api/v1/write"

    @property
    def select_url(self) -> str:
        """The query API's base (vmselect's): a PromClient's or vmalert's -datasource.url."""
        return f"{self.url}/select/0/prometheus"

    def start(self) -> Self:
        if self._server is not None:
            return self
        self._server = _QuietServer((self.host, self.port), _handler(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="vm-paths", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop listening and end open keep-alive connections (a writer sees the outage at once)."""
        server, self._server = self._server, None
        if server is None:
            return
        server.shutdown()
        server.server_close()
        with self._lock:
            connections, self._connections = list(self._connections), set()
        for connection in connections:
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)
        if self._thread is not None:
            self._thread.join(timeout=5)

    def running(self) -> bool:
        return self._server is not None

    def count(self, counter: Counter[str], prefix: str) -> None:
        with self._lock:
            counter[prefix] += 1

    def track(self, connection: socket.socket, open_: bool) -> None:
        with self._lock:
            (self._connections.add if open_ else self._connections.discard)(connection)

    def forward(self, method: str, path: str, headers: dict[str, str], body: bytes) -> tuple[int, list, bytes]:
        """One request to the single node: (status, headers, body); OSError when it does not answer."""
        host, _, port = self.upstream.removeprefix("http://").partition(":")
        connection = http.client.HTTPConnection(host, int(port or 80), timeout=UPSTREAM_TIMEOUT_S)
        try:
            connection.request(method, path, body=body or None, headers=headers)
            answer = connection.getresponse()
            return answer.status, answer.getheaders(), answer.read()
        finally:
            connection.close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _handler(paths: ClusterPaths) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"    # keep-alive, as vminsert and vmselect answer

        def setup(self) -> None:
            super().setup()
            paths.track(self.connection, True)

        def finish(self) -> None:
            paths.track(self.connection, False)
            with contextlib.suppress(OSError):
                super().finish()

        def do_GET(self) -> None:
            self._proxy()

        def do_POST(self) -> None:
            self._proxy()

        def _proxy(self) -> None:
            path, _, query = self.path.partition("?")
            body = self._body()
            if path.strip("/") == "health":
                prefix, target = "health", "/health"
            else:
                try:
                    prefix, target = upstream_path(path)
                except Refused as refusal:
                    kind = next((p for p in ("insert", "select") if path.lstrip("/").startswith(p)), "other")
                    paths.count(paths.refused, kind)
                    paths.last_refusal = str(refusal)
                    self._answer(404, [("Content-Type", "text/plain")], f"{refusal}\n".encode())
                    return
            headers = {name: value for name, value in self.headers.items() if name.lower() not in _HOP_BY_HOP}
            try:
                status, answer_headers, answer = paths.forward(self.command, target + ("?" + query if query else ""),
                                                               headers, body)
            except OSError as error:
                paths.count(paths.failed, prefix)
                self._answer(502, [("Content-Type", "text/plain")],
                             f"the single-node VictoriaMetrics at {paths.upstream} did not answer ({error})\n".encode())
                return
            paths.count(paths.forwarded, prefix)
            self._answer(status, [(k, v) for k, v in answer_headers if k.lower() not in _HOP_BY_HOP | _OWN], answer)

        def _body(self) -> bytes:
            if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
                chunks = []
                while size := int(self.rfile.readline().split(b";")[0].strip() or b"0", 16):
                    chunks.append(self.rfile.read(size))
                    self.rfile.readline()
                while self.rfile.readline() not in (b"\r\n", b"\n", b""):   # trailers
                    pass
                return b"".join(chunks)
            return self.rfile.read(int(self.headers.get("Content-Length") or 0))

        def _answer(self, status: int, headers: list[tuple[str, str]], body: bytes) -> None:
            self.send_response(status)
            for name, value in headers:
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def log_message(self, *args: object) -> None:   # counted, not logged
            pass

    return Handler

"""A small asyncio HTTP/1.1 server for pre-rendered payloads (the agent's and the simulator's).

Scrapes only copy bytes that the collection loop rendered, so this stays at a few hundred
microseconds per request with keep-alive. It accepts GET and HEAD (and POST where a `post` handler
is given: `flopwatch remediate`'s webhook), bounds request size and idle time, answers malformed
requests with 400/405/413/431 and counts every answer by status code.

With an `Access` (the agent's web config, flopwatch/exporters/webconfig.py) each connection is
upgraded to TLS before its first request, and every request's credentials are checked before
routing (401 with WWW-Authenticate when they are wrong). The upgrade is done per connection with
`start_tls` rather than by handing the context to `start_server`, so that a refused handshake
reaches this code and is counted by reason, and a rotated certificate reaches the next connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

log = logging.getLogger(__name__)

MAX_HEADER_BYTES = 16 * 1024
MAX_BODY_BYTES = 64 * 1024
IDLE_TIMEOUT_S = 30.0
TLS_HANDSHAKE_TIMEOUT_S = 10.0
METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found", 405: "Method Not Allowed",
            413: "Payload Too Large", 429: "Too Many Requests", 431: "Request Header Fields Too Large",
            503: "Service Unavailable"}


@dataclass(frozen=True)
class Response:
    status: int
    body: bytes
    content_type: str = METRICS_CONTENT_TYPE


Router = Callable[[str], Response]
#: (path, body) -> response, for POST; called on the server's event loop thread, so it must be quick.
PostHandler = Callable[[str, bytes], Response]


class Access(Protocol):
    """TLS and credentials in front of the router (webconfig.WebAccess); called on the loop thread."""

    def tls_context(self) -> ssl.SSLContext | None: ...

    async def authorize(self, authorization: str | None) -> int: ...  # 200, 401 or 429


_DENIED = {
    401: (Response(401, b"unauthorized: give a user and password, or a token, of the web config\n", "text/plain"),
          'WWW-Authenticate: Basic realm="flopwatch", charset="UTF-8"\r\n'),
    429: (Response(429, b"too many password checks at once; retry in a second\n", "text/plain"),
          "Retry-After: 1\r\n"),
}


class HttpServer:
    """Serves `router(path)` on (host, port) from a background thread with its own event loop."""

    def __init__(self, host: str, port: int, router: Router, access: Access | None = None, *,
                 post: PostHandler | None = None, max_body: int = MAX_BODY_BYTES) -> None:
        self.host, self.port = host, port
        self.router = router
        self.access = access
        self.post = post
        self.max_body = max_body
        self.responses: Counter[int] = Counter()
        self.tls_failures: Counter[str] = Counter()  # refused or lost TLS handshakes, by reason
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.Server | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None

    @property
    def address(self) -> tuple[str, int]:
        return self.host, self.port

    def start(self) -> tuple[str, int]:
        """Bind and serve; returns the bound address (port 0 becomes a real port). Raises OSError."""
        self._thread = threading.Thread(target=self._run, name="http", daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            raise self._error
        return self.address

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            self._server = loop.run_until_complete(
                asyncio.start_server(self._handle, self.host, self.port, reuse_address=True,
                                     limit=MAX_HEADER_BYTES, backlog=1024)
            )
        except OSError as error:
            self._error = error
            self._ready.set()
            loop.close()
            return
        sock = self._server.sockets[0].getsockname()
        self.port = sock[1]
        self._ready.set()
        try:
            loop.run_forever()
        finally:
            self._server.close()
            # Connections still open (keep-alive scrapers) are ended here, not left for the garbage
            # collector to find as pending tasks of a closed loop.
            handlers = asyncio.all_tasks(loop)
            for task in handlers:
                task.cancel()
            if handlers:
                loop.run_until_complete(asyncio.gather(*handlers, return_exceptions=True))
            loop.run_until_complete(self._server.wait_closed())
            loop.close()

    def stop(self) -> None:
        if self._loop is not None and self._loop.is_running():
            self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(timeout=5)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            if self.access is not None and not await self._start_tls(writer):
                return
            while True:
                try:
                    async with asyncio.timeout(IDLE_TIMEOUT_S):
                        head = await reader.readuntil(b"\r\n\r\n")
                except asyncio.LimitOverrunError:
                    await self._send(writer, Response(431, b"request headers too large\n", "text/plain"),
                                     head_only=False, keep_alive=False)
                    return
                except (asyncio.IncompleteReadError, TimeoutError, ConnectionError):
                    return
                keep_alive = await self._answer(head, reader, writer)
                if not keep_alive:
                    return
        finally:
            with contextlib.suppress(Exception):
                writer.close()

    async def _start_tls(self, writer: asyncio.StreamWriter) -> bool:
        """Upgrade the connection when the web config asks for TLS; False (counted) when it fails."""
        assert self.access is not None
        context = self.access.tls_context()
        if context is None:
            return True
        try:
            await writer.start_tls(context, ssl_handshake_timeout=TLS_HANDSHAKE_TIMEOUT_S)
        except (OSError, TimeoutError, EOFError) as error:  # ssl.SSLError and ConnectionError are OSErrors
            reason = tls_failure_reason(error)
            self.tls_failures[reason] += 1
            log.debug("TLS handshake from %s refused: %s", writer.get_extra_info("peername"), reason)
            return False
        return True

    async def _answer(self, head: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        try:
            lines = head.decode("latin-1").split("\r\n")
            method, target, version = lines[0].split(" ")
            if not version.startswith("HTTP/1."):
                raise ValueError
            headers = {}
            for line in lines[1:]:
                if line:
                    name, sep, value = line.partition(":")
                    if not sep:
                        raise ValueError
                    headers[name.strip().lower()] = value.strip()
            length = int(headers.get("content-length", "0"))
            if length < 0:
                raise ValueError
        except ValueError:
            await self._send(writer, Response(400, b"malformed HTTP request\n", "text/plain"),
                             head_only=False, keep_alive=False)
            return False
        if length > self.max_body:
            await self._send(writer, Response(413, b"request body too large\n", "text/plain"),
                             head_only=False, keep_alive=False)
            return False
        try:
            async with asyncio.timeout(IDLE_TIMEOUT_S):
                body = await reader.readexactly(length) if length else b""
        except (asyncio.IncompleteReadError, TimeoutError, ConnectionError):
            return False
        connection = headers.get("connection", "").lower()
        keep_alive = connection != "close" and (version == "HTTP/1.1" or connection == "keep-alive")
        if self.access is not None:  # before routing: nothing is served, not even a 404, to strangers
            status = await self.access.authorize(headers.get("authorization"))
            if status != 200:
                denied, extra = _DENIED[status]
                await self._send(writer, denied, head_only=method == "HEAD", keep_alive=keep_alive, extra=extra)
                return keep_alive
        allowed = ("GET", "HEAD", "POST") if self.post is not None else ("GET", "HEAD")
        if method not in allowed:
            await self._send(writer, Response(405, f"only {', '.join(allowed)}\n".encode(), "text/plain"),
                             head_only=False, keep_alive=keep_alive, extra=f"Allow: {', '.join(allowed)}\r\n")
            return keep_alive
        path = target.split("?", 1)[0]
        try:
            response = self.post(path, body) if method == "POST" and self.post is not None else self.router(path)
        except Exception:  # a router bug must not kill the server
            log.exception("error answering %s", path)
            response = Response(503, b"internal error, see the agent's log\n", "text/plain")
        await self._send(writer, response, head_only=method == "HEAD", keep_alive=keep_alive)
        return keep_alive

    async def _send(self, writer: asyncio.StreamWriter, response: Response, head_only: bool,
                    keep_alive: bool, extra: str = "") -> None:
        self.responses[response.status] += 1
        head = (
            f"HTTP/1.1 {response.status} {_REASONS.get(response.status, 'Error')}\r\n"
            f"Content-Type: {response.content_type}\r\n"
            f"Content-Length: {len(response.body)}\r\n"
            f"Connection: {'keep-alive' if keep_alive else 'close'}\r\n"
            + extra
            + "\r\n"
        ).encode("latin-1")
        writer.write(head if head_only else head + response.body)
        with contextlib.suppress(ConnectionError):
            await writer.drain()


#: Why a TLS handshake failed, from OpenSSL's reason code (a fixed set: it is a label value).
_TLS_REASONS = {
    "PEER_DID_NOT_RETURN_A_CERTIFICATE": "no_client_cert",
    "CERTIFICATE_VERIFY_FAILED": "bad_client_cert",
    "HTTP_REQUEST": "plain_http",
    "HTTPS_PROXY_REQUEST": "plain_http",
    "UNEXPECTED_EOF_WHILE_READING": "closed",
}


def tls_failure_reason(error: BaseException) -> str:
    """no_client_cert, bad_client_cert, plain_http, client_alert (the client refused us, e.g. our
    certificate), protocol (versions, ciphers, garbage), timeout or closed."""
    if isinstance(error, ssl.SSLError):
        reason = error.reason or ""
        if reason in _TLS_REASONS:
            return _TLS_REASONS[reason]
        if "ALERT" in reason:
            return "client_alert"
        if isinstance(error, ssl.SSLEOFError):
            return "closed"
        return "protocol"
    if isinstance(error, TimeoutError) or "taking longer" in str(error):
        return "timeout"
    return "closed"

"""A small asyncio HTTP/1.1 server for pre-rendered payloads (the agent's and the simulator's).

Scrapes only copy bytes that the collection loop rendered, so this stays at a few hundred
microseconds per request with keep-alive. It accepts GET and HEAD, bounds request size and idle
time, answers malformed requests with 400/405/431 and counts every answer by status code.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger(__name__)

MAX_HEADER_BYTES = 16 * 1024
MAX_BODY_BYTES = 64 * 1024
IDLE_TIMEOUT_S = 30.0
METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
            413: "Payload Too Large", 431: "Request Header Fields Too Large", 503: "Service Unavailable"}


@dataclass(frozen=True)
class Response:
    status: int
    body: bytes
    content_type: str = METRICS_CONTENT_TYPE


Router = Callable[[str], Response]


class HttpServer:
    """Serves `router(path)` on (host, port) from a background thread with its own event loop."""

    def __init__(self, host: str, port: int, router: Router) -> None:
        self.host, self.port = host, port
        self.router = router
        self.responses: Counter[int] = Counter()
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
            loop.run_until_complete(self._server.wait_closed())
            loop.close()

    def stop(self) -> None:
        if self._loop is not None and self._loop.is_running():
            self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(timeout=5)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                try:
                    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), IDLE_TIMEOUT_S)
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
        if length > MAX_BODY_BYTES:
            await self._send(writer, Response(413, b"request body too large\n", "text/plain"),
                             head_only=False, keep_alive=False)
            return False
        if length:
            await reader.readexactly(length)
        connection = headers.get("connection", "").lower()
        keep_alive = connection != "close" and (version == "HTTP/1.1" or connection == "keep-alive")
        if method not in ("GET", "HEAD"):
            await self._send(writer, Response(405, b"only GET and HEAD\n", "text/plain"),
                             head_only=False, keep_alive=keep_alive, allow=True)
            return keep_alive
        path = target.split("?", 1)[0]
        try:
            response = self.router(path)
        except Exception:  # a router bug must not kill the server
            log.exception("error answering %s", path)
            response = Response(503, b"internal error, see the agent's log\n", "text/plain")
        await self._send(writer, response, head_only=method == "HEAD", keep_alive=keep_alive)
        return keep_alive

    async def _send(self, writer: asyncio.StreamWriter, response: Response, head_only: bool,
                    keep_alive: bool, allow: bool = False) -> None:
        self.responses[response.status] += 1
        head = (
            f"HTTP/1.1 {response.status} {_REASONS.get(response.status, 'Error')}\r\n"
            f"Content-Type: {response.content_type}\r\n"
            f"Content-Length: {len(response.body)}\r\n"
            f"Connection: {'keep-alive' if keep_alive else 'close'}\r\n"
            + ("Allow: GET, HEAD\r\n" if allow else "")
            + "\r\n"
        ).encode("latin-1")
        writer.write(head if head_only else head + response.body)
        with contextlib.suppress(ConnectionError):
            await writer.drain()

"""The simulator's expositions served from a child process, so scrapes and ticks share no
interpreter.

In one process, the HTTP thread and the fleet's ticks take turns on one interpreter lock and
evict each other's caches: at 10,000 GPUs, 250 scrapes a second made every tick 15-20% longer,
which cost several times what the HTTP handling itself costs. Here the parent ticks and renders
and sends each tick's bytes down a socket pair in one message; the child only keeps the latest
bytes and answers scrapes. Both processes' CPU is the simulator's (`pid` names the child so that
benchmarks can count it).
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import re
import threading
from collections import Counter
from collections.abc import Sequence
from itertools import accumulate, pairwise
from multiprocessing.connection import Connection

from flopwatch.exporters.http import HttpServer, Response

log = logging.getLogger(__name__)

#: Seconds the parent waits for the child to bind, and to exit when told to stop.
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 5.0
_NODE_PATH = re.compile(r"^/node/([0-9]+)/(dcgm/)?metrics$")


class NodeBodies:
    """The latest exposition of every node (and of its dcgm-exporter, when the fleet has one),
    routed the way the simulator serves them: `/node/<i>/metrics`, `/node/<i>/dcgm/metrics`."""

    def __init__(self, agents: Sequence[bytes] = (), dcgm: Sequence[bytes] = ()) -> None:
        self.agents, self.dcgm = agents, dcgm

    def route(self, path: str) -> Response:
        match = _NODE_PATH.match(path)
        if match:
            index = int(match.group(1))
            bodies = self.dcgm if match.group(2) else self.agents
            if index < len(bodies):
                return Response(200, bodies[index])
        if path == "/":
            body = f"FlopWatch simulator: {len(self.agents)} nodes at /node/<index>/metrics\n".encode()
            return Response(200, body, "text/plain")
        return Response(404, b"not found: nodes are at /node/<index>/metrics\n", "text/plain")


def _split(blob: bytes, lengths: Sequence[int], start: int = 0) -> list[bytes]:
    ends = list(accumulate(lengths, initial=start))
    return [blob[a:b] for a, b in pairwise(ends)]


def _serve(conn: Connection, host: str, port: int) -> None:
    """The child: bind, report the address, then take each published tick until told to stop
    (or until the parent is gone and the socket pair closes)."""
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    bodies = NodeBodies()
    http = HttpServer(host, port, bodies.route)
    try:
        address = http.start()
    except OSError as error:
        conn.send(("error", error.errno, error.strerror))
        return
    conn.send(("ready", address))
    try:
        while True:
            kind, *rest = conn.recv()
            if kind == "publish":
                agent_lengths, dcgm_lengths = rest
                blob = conn.recv_bytes()
                bodies.agents, bodies.dcgm = _split(blob, agent_lengths), _split(blob, dcgm_lengths, sum(agent_lengths))
                conn.send(("published",))
            elif kind == "responses":
                conn.send(dict(http.responses))
            else:
                break
    except (EOFError, OSError):
        pass   # the parent is gone
    finally:
        http.stop()


class ServingProcess:
    """The parent's side: start the child, publish every tick's bodies to it, read its answer
    counts, stop it. One lock serialises the socket pair between the fleet's and other threads."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self.host, self.port = host, port
        self._conn: Connection | None = None
        self._process: multiprocessing.process.BaseProcess | None = None
        self._lock = threading.Lock()

    @property
    def address(self) -> tuple[str, int]:
        return self.host, self.port

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def start(self) -> tuple[str, int]:
        """Start the child and wait until it listens; OSError (as binding raised it) when it cannot."""
        context = multiprocessing.get_context("spawn")   # never fork a process that runs threads
        parent, child = context.Pipe()
        process = context.Process(target=_serve, args=(child, self.host, self.port), daemon=True,
                                  name="flopwatch-sim-http")
        process.start()
        child.close()
        if not parent.poll(START_TIMEOUT_S):
            process.terminate()
            raise OSError(f"the simulator's HTTP process did not start within {START_TIMEOUT_S:g} s")
        try:
            kind, *rest = parent.recv()
        except EOFError:
            process.join(STOP_TIMEOUT_S)
            raise OSError(f"the simulator's HTTP process exited with status {process.exitcode}") from None
        if kind == "error":
            process.join(STOP_TIMEOUT_S)
            raise OSError(*rest)
        (self.host, self.port), = rest
        self._conn, self._process = parent, process
        return self.address

    def publish(self, agents: Sequence[bytes], dcgm: Sequence[bytes] = ()) -> None:
        """Hand the child this tick's bodies; once this returns, every scrape gets them."""
        if self._conn is None:
            raise RuntimeError("publish before start")
        blob = b"".join([*agents, *dcgm])
        with self._lock:
            self._conn.send(("publish", [len(body) for body in agents], [len(body) for body in dcgm]))
            self._conn.send_bytes(blob)
            self._conn.recv()

    def responses(self) -> Counter[int]:
        """The child's answers so far, by HTTP status."""
        if self._conn is None:
            return Counter()
        with self._lock:
            self._conn.send(("responses",))
            return Counter(self._conn.recv())

    def stop(self) -> None:
        if self._conn is None or self._process is None:
            return
        with self._lock:
            with contextlib.suppress(OSError):   # already gone
                self._conn.send(("stop",))
            self._conn.close()
        self._process.join(STOP_TIMEOUT_S)
        if self._process.is_alive():
            log.warning("the simulator's HTTP process did not stop within %g s; terminating it", STOP_TIMEOUT_S)
            self._process.terminate()
            self._process.join(STOP_TIMEOUT_S)
        self._conn = self._process = None

"""The node agent: runs collectors on its own clock and serves the last rendered exposition.

A scrape never touches hardware and concurrent scrapes never race: the collection thread
updates every collector, renders the registry once into bytes, and swaps the reference that the
HTTP server hands out.
"""

from __future__ import annotations

import logging
import platform
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Protocol

from prometheus_client import CollectorRegistry
from prometheus_client.core import Metric as Family

from flopwatch import __version__
from flopwatch.catalog import agent as m
from flopwatch.exporters.exposition import BlockRenderer, Blocks, ExpositionRenderer
from flopwatch.exporters.http import METRICS_CONTENT_TYPE, Access, HttpServer, Response

log = logging.getLogger(__name__)

LANDING_PAGE = b"""<html><head><title>FlopWatch agent</title></head><body>
<h1>FlopWatch agent</h1><p><a href="/metrics">/metrics</a> &middot; <a href="/healthz">/healthz</a></p>
</body></html>
"""


class Collector(Protocol):
    """What the agent runs: `update()` reads sources (returns errors met), `collect()` renders."""

    name: str

    def update(self) -> int: ...

    def collect(self) -> Iterator[Family]: ...

    def close(self) -> None: ...


class _Registered:
    """Adapts a Collector to prometheus_client's registry (which only calls collect()) and keeps
    the renderer whose cache belongs to that collector's series."""

    def __init__(self, collector: Collector) -> None:
        self.collector = collector
        self.blocks: Callable[[], Blocks] | None = getattr(collector, "blocks", None)
        self.families = ExpositionRenderer()
        self.templates = BlockRenderer()

    def collect(self) -> Iterator[Family]:
        return self.collector.collect()

    def render_into(self, out: list[bytes]) -> None:
        if self.blocks is not None:
            self.templates.render(self.blocks(), out)
        else:
            text: list[str] = []
            self.families.render_into(self.collector.collect(), text)
            out.append("".join(text).encode())


class Agent:
    def __init__(self, node: str, collectors: Sequence[Collector], backend_name: str) -> None:
        self.node = node
        self.collectors = list(collectors)
        self.backend_name = backend_name
        self.durations: dict[str, float] = {}
        self.errors: dict[str, int] = {c.name: 0 for c in self.collectors}
        self.last_success: dict[str, float] = {}
        self.http: HttpServer | None = None
        self.registry = CollectorRegistry(auto_describe=False)
        self._sources = [_Registered(collector) for collector in self.collectors]
        for source in self._sources:
            self.registry.register(source)
        self._self_metrics = _SelfMetrics(self)
        self.registry.register(self._self_metrics)
        self._self_renderer = BlockRenderer()
        self._exposition = b""
        self.cycles = 0
        self.interval: float | None = None       # set by run(); /healthz judges staleness by it
        self.last_cycle_at: float | None = None  # monotonic time of the last finished cycle
        #: Called after each cycle with (unix time the cycle started, its exposition), on the
        #: collection thread: they must not block (e.g. the InfluxDB sink's queue put).
        self.cycle_listeners: list[Callable[[float, bytes], None]] = []

    # -- collection ----------------------------------------------------------------------------
    def collect_once(self) -> None:
        cycle_time = time.time()
        for collector in self.collectors:
            started = time.perf_counter()
            try:
                failures = collector.update()
            except Exception as error:  # one collector's failure must not stop the others
                log.warning("collector %s failed: %s", collector.name, error)
                failures = 1
            self.durations[collector.name] = time.perf_counter() - started
            self.errors[collector.name] += failures
            if not failures:
                self.last_success[collector.name] = time.time()
        out: list[bytes] = []
        for source in self._sources:
            source.render_into(out)
        self._self_renderer.render(self._self_metrics.blocks(), out)
        self._exposition = b"".join(out)
        self.cycles += 1
        self.last_cycle_at = time.monotonic()
        for listener in self.cycle_listeners:
            try:
                listener(cycle_time, self._exposition)
            except Exception:
                log.exception("cycle listener %r failed", listener)

    def exposition(self) -> bytes:
        return self._exposition

    def run(self, interval: float, stop: threading.Event,
            clock: Callable[[], float] = time.monotonic) -> None:
        """Collect every `interval` seconds on a fixed schedule until `stop` is set (`clock` and
        `stop.wait` are the seams a test drives the schedule through)."""
        self.interval = interval
        next_at = clock()
        while not stop.is_set():
            try:
                self.collect_once()
            except Exception:  # keep collecting; /healthz turns 503 if this keeps happening
                log.exception("collection cycle failed")
            next_at += interval
            delay = next_at - clock()
            if delay < 0:  # fell behind (slow hardware): skip missed slots instead of bursting
                skipped = int(-delay // interval) + 1
                log.warning("collection took longer than the %.3gs interval; skipping %d slot(s)",
                            interval, skipped)
                next_at += skipped * interval
                delay = next_at - clock()
            stop.wait(max(0.0, delay))

    def close(self) -> None:
        for collector in self.collectors:
            try:
                collector.close()
            except Exception as error:
                log.debug("closing %s: %s", collector.name, error)

    # -- serving -------------------------------------------------------------------------------
    def route(self, path: str) -> Response:
        if path == "/metrics":
            return Response(200, self._exposition, METRICS_CONTENT_TYPE)
        if path == "/healthz":
            return self._health()
        if path == "/":
            return Response(200, LANDING_PAGE, "text/html; charset=utf-8")
        return Response(404, b"not found; metrics are at /metrics\n", "text/plain")

    def _health(self) -> Response:
        """200 while cycles finish on time; 503 before the first and when three are missed."""
        if self.last_cycle_at is None:
            return Response(503, b"starting: no collection has finished yet\n", "text/plain")
        age = time.monotonic() - self.last_cycle_at
        if self.interval is not None and age > 3 * self.interval + 5:
            return Response(503, f"stale: last collection finished {age:.0f}s ago\n".encode(), "text/plain")
        return Response(200, b"ok\n", "text/plain")

    def serve(self, host: str, port: int, access: Access | None = None) -> tuple[str, int]:
        """Serve /metrics; `access` (the web config) adds TLS and authentication."""
        self.http = HttpServer(host, port, self.route, access)
        return self.http.start()


class _SelfMetrics:
    """flopwatch_collector_* and flopwatch_build_info for the agent's own health (as Blocks, like the
    collectors: a simulator renders 1,250 agents every tick)."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        self._build = (__version__, agent.backend_name, platform.python_version())

    def blocks(self) -> Blocks:
        agent = self.agent
        out = Blocks(agent.node)
        put = out.add
        for metric in (m.COLLECTOR_DURATION, m.COLLECTOR_ERRORS, m.COLLECTOR_LAST_SUCCESS, m.BUILD_INFO):
            out.lists(metric)   # their headers even before the first cycle, as families would have them
        for name in agent.errors:
            put(m.COLLECTOR_DURATION, (name,), agent.durations.get(name))
            put(m.COLLECTOR_ERRORS, (name,), agent.errors[name])
            put(m.COLLECTOR_LAST_SUCCESS, (name,), agent.last_success.get(name))
        put(m.BUILD_INFO, self._build, 1)
        if agent.http is not None:
            for code, count in sorted(agent.http.responses.items()):
                put(m.HTTP_RESPONSES, (str(code),), count)
            for reason, count in sorted(agent.http.tls_failures.items()):
                put(m.HTTP_TLS_FAILURES, (reason,), count)
        return out

    def collect(self) -> Iterator[Family]:
        return self.blocks().families()

"""Serving a simulated fleet to a real Prometheus: one HTTP server, one path per node, a file_sd.

Every node is its own scrape target at `/node/<index>/metrics` on one loopback address, with an
explicit `instance` label (the node name) in the file_sd targets file, so Prometheus treats them as
separate machines. Each tick advances the fleet and re-renders every node through its SimNodeAgent;
a scrape only copies the last bytes. With the fleet's GPUs behind dcgm-exporter (`fleet.exporter`),
each node is a second target too, `/node/<index>/dcgm/metrics` with instance `<node>:9400`
(flopwatch/sim/dcgm_exposition.py), and its agent serves no GPU or attribution series.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections import deque
from pathlib import Path

from flopwatch.exporters.http import HttpServer, Response
from flopwatch.sim.dcgm_exposition import DcgmNodeExporter, uses_flopwatch_counters
from flopwatch.sim.fleet import Fleet
from flopwatch.sim.node import SimNodeAgent

log = logging.getLogger(__name__)

_NODE_PATH = re.compile(r"^/node/(\d+)/(dcgm/)?metrics$")


class FleetServer:
    def __init__(self, fleet: Fleet, host: str = "127.0.0.1", port: int = 0,
                 nvlink_per_link: bool = False) -> None:
        self.fleet = fleet
        exporter = fleet.scenario.fleet.exporter
        self.agents = [SimNodeAgent(fleet, node, nvlink_per_link, gpus=exporter == "agent") for node in fleet.nodes]
        self.dcgm = [] if exporter == "agent" else [
            DcgmNodeExporter(fleet, node, uses_flopwatch_counters(exporter)) for node in fleet.nodes]
        self.expositions: list[bytes] = [b""] * len(self.agents)
        self.dcgm_expositions: list[bytes] = [b""] * len(self.dcgm)
        self.http = HttpServer(host, port, self.route)
        self.lock = threading.Lock()   # held while the fleet changes (ticks, injected faults)
        self.ticks = 0
        self.last_tick_seconds = 0.0
        self.tick_seconds: deque[float] = deque(maxlen=10_000)  # recent tick costs, for benchmarks

    @property
    def address(self) -> tuple[str, int]:
        return self.http.address

    def route(self, path: str) -> Response:
        match = _NODE_PATH.match(path)
        if match:
            index = int(match.group(1))
            bodies = self.dcgm_expositions if match.group(2) else self.expositions
            if index < len(bodies):
                return Response(200, bodies[index])
        if path == "/":
            body = f"FlopWatch simulator: {len(self.agents)} nodes at /node/<index>/metrics\n".encode()
            return Response(200, body, "text/plain")
        return Response(404, b"not found: nodes are at /node/<index>/metrics\n", "text/plain")

    def render_all(self) -> None:
        self.expositions = [agent.render() for agent in self.agents]
        self.dcgm_expositions = [exporter.render() for exporter in self.dcgm]

    def tick(self, dt: float) -> None:
        started = time.perf_counter()
        with self.lock:
            self.fleet.advance(dt)
            self.render_all()
        self.ticks += 1
        self.last_tick_seconds = time.perf_counter() - started
        self.tick_seconds.append(self.last_tick_seconds)

    def start(self) -> tuple[str, int]:
        self.render_all()
        return self.http.start()

    def stop(self) -> None:
        self.http.stop()

    def targets(self) -> list[dict[str, object]]:
        host, port = self.address
        agents = [{"targets": [f"{host}:{port}"],
                   "labels": {"__metrics_path__": f"/node/{node.index}/metrics", "instance": node.name}}
                  for node in self.fleet.nodes]
        return agents + [{"targets": [f"{host}:{port}"],
                          "labels": {"__metrics_path__": f"/node/{exporter.node.index}/dcgm/metrics",
                                     "instance": exporter.instance}} for exporter in self.dcgm]

    def write_file_sd(self, path: str | Path) -> Path:
        """Write the targets file atomically (Prometheus re-reads it on change)."""
        path = Path(path)
        partial = path.with_suffix(path.suffix + ".tmp")
        partial.write_text(json.dumps(self.targets(), indent=1))
        partial.replace(path)
        return path

    def run(self, duration: float, stop: threading.Event, interval: float | None = None) -> None:
        """Advance in real time, one tick per scrape interval, until `duration` or `stop`."""
        interval = interval or self.fleet.scenario.scrape_interval
        next_at = time.monotonic() + interval
        end = time.monotonic() + duration if duration > 0 else float("inf")
        while not stop.is_set() and time.monotonic() < end:
            if stop.wait(max(0.0, next_at - time.monotonic())):
                break
            self.tick(interval)
            next_at += interval
            if self.last_tick_seconds > interval:
                log.warning("a tick took %.2fs, longer than the %gs interval: the fleet is too large "
                            "for one simulator process on this machine", self.last_tick_seconds, interval)
                next_at = time.monotonic() + interval

"""The demo's fleet ticks between Prometheus's scrape rounds, so every node's samples show each
tick exactly once and the report can cover exactly the ticks that were scraped (its figures
then equal the simulator's truth). The server notes each scrape; the ticker learns the scrape
phases and ticks in the widest quiet gap of each round; report_span picks the window.
"""

from __future__ import annotations

import math
import re
import threading
import time
from dataclasses import dataclass

from flopwatch.exporters.http import Response
from flopwatch.sim.fleet import Fleet
from flopwatch.sim.serve import FleetServer

#: The shortest span a report covers (flopwatch.report.window.MIN_WINDOW_S): a shorter demo's
#: report reaches back before its first tick.
MIN_SPAN_S = 60.0
#: Seconds kept clear between a tick or a report boundary and the nearest scrape.
MARGIN_S = 0.05
_NODE_PATH = re.compile(r"^/node/(\d+)/metrics$")


class ScrapedFleet(FleetServer):
    """The demo's fleet server: it notes when Prometheus scrapes each node and which tick the
    scrape saw, so the fleet can advance between two rounds of scrapes (every node scraped once
    per tick, none twice) and the report can cover exactly the ticks that were scraped."""

    def __init__(self, fleet: Fleet) -> None:
        super().__init__(fleet)
        self.generation = -1                       # ticks the served expositions show (0: the start)
        self.render_seconds = 0.0
        self.scrapes: list[list[tuple[float, int]]] = [[] for _ in self.agents]   # (unix time, tick)
        self.scraped = threading.Condition()

    def render_all(self) -> None:
        started = time.perf_counter()
        expositions = [agent.render() for agent in self.agents]
        self.render_seconds = time.perf_counter() - started
        with self.scraped:
            self.expositions = expositions
            self.generation += 1

    def route(self, path: str) -> Response:
        match = _NODE_PATH.match(path)
        if match and int(match.group(1)) < len(self.agents):
            index = int(match.group(1))
            with self.scraped:
                body = self.expositions[index]
                self.scrapes[index].append((time.time(), self.generation))
                self.scraped.notify_all()
            return Response(200, body)
        return super().route(path)

    def wait_scraped(self, node: int, generation: int, timeout: float, stop: threading.Event,
                     after: float = 0.0) -> bool:
        """Wait until `node` has served tick `generation` (in a scrape later than `after`);
        False on timeout or `stop`."""
        deadline = time.monotonic() + timeout
        with self.scraped:
            while not any(g >= generation and t > after for t, g in self.scrapes[node][-3:]):
                left = deadline - time.monotonic()
                if left <= 0 or stop.is_set():
                    return False
                self.scraped.wait(min(left, 0.2))
        return True


@dataclass
class Gap:
    """The quiet stretch of each scrape round: after node `last`'s scrape, `length` seconds
    without one; the fleet ticks in it, and the report's ends fall in it."""

    last: int
    length: float


def widest_gap(phases: list[float], interval: float, tick_s: float) -> Gap:
    """The gap between consecutive scrape phases (seconds into the interval, one per node) that
    fits a tick and, for a whole-second interval, holds a whole second with the most room either
    side (report windows are whole seconds); else the longest gap."""
    order = sorted(range(len(phases)), key=lambda n: phases[n])
    following = [phases[n] for n in order[1:]] + [phases[order[0]] + interval]   # round the circle
    gaps = [Gap(node, after - phases[node]) for node, after in zip(order, following, strict=True)]

    def room(gap: Gap) -> float:
        if gap.length < tick_s + 2 * MARGIN_S or interval != int(interval):
            return -1.0
        into = [(second - phases[gap.last]) % interval for second in range(int(interval))]
        return max((min(d, gap.length - d) for d in into if d < gap.length), default=-1.0)

    return max(gaps, key=lambda gap: (room(gap) >= MARGIN_S, room(gap), gap.length))


class Ticker:
    """Advances the fleet once per scrape round, right after the round's last node was scraped,
    until it has run `duration` seconds (0: until `stop`). Prometheus scrapes each node on its own
    fixed phase, so a tick in the same gap every round is seen by every node exactly once.
    Without a scrape of every node to learn the phases from, it ticks on the clock."""

    def __init__(self, server: ScrapedFleet, interval: float, duration: float, stop: threading.Event) -> None:
        self.server, self.interval, self.duration, self.stop = server, interval, duration, stop
        self.gap: Gap | None = None
        self.thread = threading.Thread(target=self.run, name="fleet", daemon=True)

    @property
    def ticks(self) -> int:
        return self.server.generation

    def run(self) -> None:
        server, interval = self.server, self.interval
        after = self._learn()
        if after is not None and self.gap is not None:
            while server.wait_scraped(self.gap.last, self.ticks, 2 * interval + 5, self.stop, after) and self._more():
                server.tick(interval)
        next_at = time.monotonic() + interval   # no phases (or Prometheus stopped scraping): the clock
        while self._more() and not self.stop.wait(max(0.0, next_at - time.monotonic())):
            self.gap = None
            server.tick(interval)
            next_at += interval

    def _more(self) -> bool:
        if self.stop.is_set():
            return False
        return self.duration <= 0 or self.ticks * self.interval < self.duration - 1e-9

    def _learn(self) -> float | None:
        """Wait for a scrape of every node and choose the gap the fleet ticks in; the time the
        first tick must follow (the gap's next occurrence), or None without every node's scrape."""
        server = self.server
        tick_s = 3 * server.render_seconds + 0.02   # what a tick costs, roughly (the start's render)
        for node in range(len(server.agents)):
            if not server.wait_scraped(node, 0, 3 * self.interval + 15, self.stop):
                return None
        with server.scraped:
            phases = [scrapes[-1][0] % self.interval for scrapes in server.scrapes]
        self.gap = widest_gap(phases, self.interval, tick_s)
        return time.time()


def report_span(server: ScrapedFleet, ticks: int, interval: float) -> tuple[float, float, str]:
    """The report's window (whole seconds): from between the start's last scrapes and tick 1's
    first to between every node's first scrape of the last tick and its next, so each node's
    samples in it are ticks 1..`ticks`, once each; and what keeps that from holding ("" when it
    holds): a demo shorter than a report's minimum span, no whole second in the gaps, scrapes
    out of turn."""
    never = threading.Event()
    deadline = time.monotonic() + interval + 5
    for node in range(len(server.agents)):   # the round after the last tick
        server.wait_scraped(node, ticks, max(0.0, deadline - time.monotonic()), never)
    with server.scraped:
        before = [[t for t, g in s if g < 1] for s in server.scrapes]
        after = [[t for t, g in s if g >= 1] for s in server.scrapes]
        last = [[t for t, g in s if g >= ticks] for s in server.scrapes]
    start_lo = max((max(t) for t in before if t), default=-math.inf)
    start_hi = min((min(t) for t in after if t), default=math.inf)
    end_lo = max((min(t) for t in last if t), default=time.time())
    end_hi = min((min(t) for t in last if t), default=math.inf) + interval
    end = float(math.ceil(end_lo + MARGIN_S))
    start = min(float(math.floor(start_hi - MARGIN_S)) if ticks else end, end - MIN_SPAN_S)
    while time.time() < end + MARGIN_S:
        time.sleep(0.05)
    with server.scraped:
        seen = [[g for t, g in s if start < t <= end] for s in server.scrapes]
    if start < start_hi - interval - MARGIN_S:
        return start, end, (f"the fleet ran {ticks * interval:g} s, under the minute a report covers: the report "
                            "also counts the time before its first tick")
    if not (start_lo + MARGIN_S < start and end < end_hi - MARGIN_S
            and all(sorted(g) == list(range(1, ticks + 1)) for g in seen)):
        return start, end, ("Prometheus's scrapes did not line up with the simulator's ticks: the report may be "
                            "a tick off the truth")
    return start, end, ""

"""Many scrapers at once against one `flopwatch agent` process: no errors, no torn bodies, no leak.

The agent is the real console script with its real HTTP server; only its GPUs are simulated
(`--backend sim`: no GPU or NVML here). 50 threads scrape it 200 times each over 127.0.0.1, half on
one keep-alive connection each and half on a fresh connection per scrape, while the agent keeps
re-rendering every second, so a scrape racing a render would show up as a torn or mixed body.
"""

from __future__ import annotations

import http.client
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families

from flopwatch.catalog import all_metrics
from flopwatch.stack import AgentProcess

pytestmark = pytest.mark.integration

SCRAPERS = 50
SCRAPES = 200
WARMUP_SCRAPES = 20
GPUS = 8
RSS_TOLERANCE = 0.05


@dataclass(frozen=True)
class Shape:
    """What every complete exposition of this agent looks like, whatever the current values."""

    lines: int
    families: int
    last_family: bytes

    @classmethod
    def of(cls, body: bytes) -> Shape:
        last_help = body.rindex(b"# HELP ")
        return cls(body.count(b"\n"), body.count(b"# TYPE "), body[last_help : body.index(b"\n", last_help)])

    def problem(self, body: bytes) -> str | None:
        if not body.startswith(b"# HELP flopwatch_") or not body.endswith(b"\n"):
            return f"body of {len(body)} bytes is cut: starts {body[:30]!r}, ends {body[-30:]!r}"
        lines, families = body.count(b"\n"), body.count(b"# TYPE ")
        if (lines, families) != (self.lines, self.families):
            return f"{families} families in {lines} lines, expected {self.families} in {self.lines}"
        if self.last_family not in body:
            return f"last family {self.last_family!r} missing"
        return None


@dataclass
class Scraper:
    """One client: `keep_alive` reuses one connection, otherwise each scrape opens a new one."""

    port: int
    keep_alive: bool
    shape: Shape
    ok: int = 0
    errors: list[str] = field(default_factory=list)
    last_body: bytes = b""

    def run(self, scrapes: int, start: threading.Barrier) -> None:
        connection: http.client.HTTPConnection | None = None
        start.wait()
        for _ in range(scrapes):
            try:
                if connection is None:
                    connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
                headers = {} if self.keep_alive else {"Connection": "close"}
                connection.request("GET", "/metrics", headers=headers)
                answer = connection.getresponse()
                body = answer.read()
                if answer.status != 200:
                    self.errors.append(f"HTTP {answer.status}")
                elif (problem := self.shape.problem(body)) is not None:
                    self.errors.append(problem)
                else:
                    self.ok += 1
                    self.last_body = body
            except (OSError, http.client.HTTPException) as error:
                self.errors.append(f"{type(error).__name__}: {error}")
                connection = None
                continue
            if not self.keep_alive:
                connection.close()
                connection = None
        if connection is not None:
            connection.close()


def scrape_round(port: int, shape: Shape, scrapes: int) -> list[Scraper]:
    scrapers = [Scraper(port, keep_alive=i % 2 == 0, shape=shape) for i in range(SCRAPERS)]
    start = threading.Barrier(SCRAPERS)
    threads = [
        threading.Thread(target=s.run, args=(scrapes, start), name=f"scraper-{i}") for i, s in enumerate(scrapers)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert not any(thread.is_alive() for thread in threads), "a scraper hung"
    return scrapers


class ConnectionWatch:
    """Samples how many TCP connections the agent holds, to show the scrapes really overlapped."""

    def __init__(self, pid: int) -> None:
        self.process = psutil.Process(pid)
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="connection-watch", daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            established = [c for c in self.process.net_connections("tcp") if c.status == psutil.CONN_ESTABLISHED]
            self.peak = max(self.peak, len(established))

    def __enter__(self) -> ConnectionWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def get(port: int, path: str) -> bytes:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.request("GET", path)
        return connection.getresponse().read()
    finally:
        connection.close()


@pytest.fixture(scope="module")
def agent() -> Iterator[AgentProcess]:
    with AgentProcess(node="load-node") as process:
        time.sleep(1.5)  # one scrape counted and a render after it: the exposition's shape is final
        yield process


def test_50_concurrent_scrapers_get_complete_bodies_and_memory_stays_flat(agent: AgentProcess) -> None:
    assert agent.proc is not None
    shape = Shape.of(get(agent.port, "/metrics"))
    # The text parser names counter families without their _total suffix.
    catalogue = {metric.name.removesuffix("_total") for _, metric in all_metrics()}
    rss = psutil.Process(agent.proc.pid)

    warmup = scrape_round(agent.port, shape, WARMUP_SCRAPES)
    assert [e for s in warmup for e in s.errors] == []
    rss_warm = rss.memory_info().rss

    started = time.monotonic()
    with ConnectionWatch(agent.proc.pid) as watch:
        scrapers = scrape_round(agent.port, shape, SCRAPES)
    elapsed = time.monotonic() - started
    rss_end = rss.memory_info().rss

    errors = [error for s in scrapers for error in s.errors]
    assert errors == [], f"{len(errors)} errors, first: {errors[:5]}"
    assert sum(s.ok for s in scrapers) == SCRAPERS * SCRAPES
    assert watch.peak >= SCRAPERS // 2, f"only {watch.peak} connections were open at once"
    # Every scraper's last body parses as a whole exposition with the agent's families in it.
    for scraper in scrapers:
        names = {family.name for family in text_string_to_metric_families(scraper.last_body.decode())}
        assert {"flopwatch_gpu_up", "flopwatch_build_info", "flopwatch_gpu_nvlink_bytes"} <= names <= catalogue
    growth = (rss_end - rss_warm) / rss_warm
    print(
        f"{SCRAPERS}x{SCRAPES} scrapes in {elapsed:.1f}s, peak {watch.peak} connections, RSS "
        f"{rss_warm / 2**20:.1f} -> {rss_end / 2**20:.1f} MiB ({growth:+.1%})"
    )
    assert abs(growth) <= RSS_TOLERANCE, (
        f"agent RSS {rss_warm / 2**20:.1f} MiB after warm-up, {rss_end / 2**20:.1f} MiB after {elapsed:.1f}s of load"
    )
    # The agent counted every answer, and every answer was a 200.
    time.sleep(1.2)
    counted = {
        s.labels["code"]: s.value
        for f in text_string_to_metric_families(get(agent.port, "/metrics").decode())
        if f.name == "flopwatch_http_responses"
        for s in f.samples
    }
    assert set(counted) == {"200"}
    assert counted["200"] >= SCRAPERS * (SCRAPES + WARMUP_SCRAPES)

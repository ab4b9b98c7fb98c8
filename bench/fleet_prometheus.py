"""A simulated fleet served on loopback and scraped by a real Prometheus through file_sd, ready
when every target is up: the setup the measurement scripts share (each measures its own thing
inside it). `served_fleet` alone is the fleet and its targets file, for another engine to scrape
(bench/vm_engine.py's VictoriaMetrics)."""

from __future__ import annotations

import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from flopwatch.promql import PromClient
from flopwatch.sim.fleet import Fleet
from flopwatch.sim.scenario import Scenario
from flopwatch.sim.serve import FleetServer
from flopwatch.stack import Prometheus
from flopwatch.stack.servers import scrape_job


@dataclass
class ScrapedFleet:
    server: FleetServer
    prometheus: Prometheus
    client: PromClient


def sim_scrape_job(targets_file: Path) -> dict[str, object]:
    """The scrape job of the served fleet's nodes (job `sim`), from its file_sd targets file."""
    return {"job_name": "sim", "file_sd_configs": [{"files": [str(targets_file)]}]}


def failed_scrapes(seconds: float) -> str:
    """PromQL: the fleet's scrapes that failed over the last `seconds` (whole seconds)."""
    window = f"{int(seconds)}s"
    return f'sum(count_over_time(up{{job="sim"}}[{window}])) - sum(sum_over_time(up{{job="sim"}}[{window}]))'


#: Seconds a measured fleet runs before its first scrape: every series exists from the start.
FLEET_HISTORY_S = 30.0


@contextmanager
def served_fleet(scenario: Scenario, tick: float | None = None,
                 history: float = 0.0) -> Iterator[tuple[FleetServer, Path]]:
    """The fleet served on loopback and ticking (every `tick` seconds, else at the scenario's
    scrape interval), and the file_sd targets file that names its nodes; stopped on exit. With
    `history`, the fleet has run that many seconds before the first scrape, so every series it
    will have exists from the start (the agents' recent windows need 10 s of steps): two engines
    measured one after the other then see the same series."""
    fleet = Fleet(scenario, start_unix=time.time() - history)
    if history:
        fleet.advance(history)
    server = FleetServer(fleet)
    server.start()
    stop = threading.Event()
    ticker = threading.Thread(target=server.run, args=(0, stop, tick) if tick else (0, stop), daemon=True)
    targets_file = server.write_file_sd(Path(tempfile.mkdtemp(prefix="flopwatch-bench-")) / "targets.json")
    try:
        ticker.start()
        yield server, targets_file
    finally:
        stop.set()
        ticker.join(30)
        server.stop()


def wait_targets(client: PromClient, expected: int, within: float, engine: str = "Prometheus") -> None:
    """Until `expected` targets of the `sim` job are up; SystemExit naming the count when they are not."""
    deadline = time.monotonic() + within
    while (client.scalar('count(up{job="sim"} == 1)') or 0) < expected:
        if time.monotonic() > deadline:
            raise SystemExit(f"{engine}: not all {expected} targets came up within {within:g} s")
        time.sleep(2)


@contextmanager
def scraped_fleet(scenario: Scenario, *, scrape_interval: str = "5s", evaluation_interval: str = "15s",
                  rule_files: Sequence[Path] = (), self_scrape: bool = True, tick: float | None = None,
                  targets: int | None = None, up_within: float = 300, query_timeout: float = 120,
                  extra_args: Sequence[str] = (), history: float = 0.0) -> Iterator[ScrapedFleet]:
    """The served fleet (served_fleet) and a Prometheus scraping it (and itself, with
    `self_scrape`), once `targets` (default: one per node) are up; SystemExit naming the count
    when they are not within `up_within` seconds."""
    with served_fleet(scenario, tick, history) as (server, targets_file):
        prometheus = Prometheus([sim_scrape_job(targets_file)],
                                rule_files=list(rule_files), scrape_interval=scrape_interval,
                                evaluation_interval=evaluation_interval, extra_args=list(extra_args))
        if self_scrape:
            prometheus.config["scrape_configs"].append(
                scrape_job("prometheus", [f"{prometheus.host}:{prometheus.port}"]))
        try:
            prometheus.start(timeout=60)
            client = PromClient(prometheus.url, timeout=query_timeout)
            wait_targets(client, targets if targets is not None else scenario.fleet.nodes, up_within)
            yield ScrapedFleet(server, prometheus, client)
        finally:
            prometheus.stop()

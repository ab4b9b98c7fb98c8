"""Goodput's tiles count every second of a job whose scrapes take most of their interval.

A scrape's samples carry the moment it started and reach Prometheus's storage when it ends. A rule
that differences a counter against its value one tile before, read at the evaluation itself, can
miss the scrape still in flight; the next tile reads that scrape, landed by then, as its start, and
the change between the two samples is counted by neither. The goodput group reads each tile one tile
back (flopwatch/mixin/scrape.py, `settled`), when every scrape in it has landed.

Twenty targets, each one node of a job whose per-node phase seconds grow exactly 1 per second,
answer 0.6 s after a scrape asks (Prometheus scrapes each every second, at offsets it spreads over
the second). The shipped goodput group, built for a 1 s scrape, must read the job's phase time as 20
rank-seconds per second within 1%; a control rule in the same server, the tile read at its
evaluation, must read it low by about 0.6 s in every 15 (4%): the test can tell the two apart.
Prometheus is the real one, in both releases; the nodes are a stand-in HTTP server (no agent needed:
the counter is what an agent's flopwatch_train_job_phase_seconds_total exposes).
"""

from __future__ import annotations

import threading
import time
import urllib.parse
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml
from helpers import wait_for

from flopwatch.mixin import build, scrape
from flopwatch.mixin.config import load as load_settings
from flopwatch.promql import PromClient
from flopwatch.stack.servers import Prometheus

pytestmark = pytest.mark.integration

NODES = 20
ANSWER_AFTER_S = 0.6
PHASE = "flopwatch_train_job_phase_seconds_total"
RATE = "job_id_phase:flopwatch_train_phase_seconds:rate5m"
TILES = "job_id_phase:flopwatch_train_phase_seconds:increase15s"
CONTROL = "job_id_phase:control_tile_read_at_evaluation:increase15s"
TILES_NEEDED = 6
TIMEOUT_S = 240


class SlowNodes(ThreadingHTTPServer):
    """Each node's counter as of the moment the scrape asked, answered ANSWER_AFTER_S later."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.started = time.time()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    server: SlowNodes

    def do_GET(self) -> None:
        seconds = time.time() - self.server.started
        node = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query).get("node", ["n0"])[0]
        time.sleep(ANSWER_AFTER_S)
        body = (f"# TYPE {PHASE} counter\n"
                f'{PHASE}{{node="{node}",job_id="slow",phase="compute"}} {seconds:.3f}\n').encode()
        try:
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            pass    # Prometheus stopped while this scrape waited

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def slow_nodes() -> Iterator[SlowNodes]:
    server = SlowNodes()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def shipped_goodput_rules(folder: Path) -> Path:
    """alerts/flopwatch-goodput.yml as `flopwatch rules build` writes it for a 1 s scrape."""
    settings = folder / "settings.yml"
    settings.write_text("scrape_interval: 1s\n")
    path = folder / "flopwatch-goodput.yml"
    path.write_text(build.rules(load_settings(settings))["flopwatch-goodput.yml"])
    return path


def control_rules(folder: Path, tile: str) -> Path:
    """The tile as it was read before: at the evaluation, against the evaluation one tile before."""
    path = folder / "control.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "control", "interval": tile, "rules": [
        {"record": CONTROL, "expr": f"sum by (job_id, phase) ({PHASE} - {PHASE} offset {tile} >= 0)"}]}]}))
    return path


def test_tiles_count_the_scrapes_still_in_flight(tmp_path: Path, slow_nodes: SlowNodes, server_release: str) -> None:
    goodput = shipped_goodput_rules(tmp_path)
    tile, tile_s = scrape.Scrape.of("1s").tile, scrape.Scrape.of("1s").tile_seconds()
    scrape_configs = [{"job_name": "slow-nodes", "static_configs": [
        {"targets": [slow_nodes.address], "labels": {"__param_node": f"n{node}"}} for node in range(NODES)]}]
    with Prometheus(scrape_configs, rule_files=[goodput, control_rules(tmp_path, tile)],
                    scrape_interval="1s", evaluation_interval=tile) as prom:
        client = PromClient(prom.url)

        def counted() -> dict[str, float]:
            return {name: sum(s.value for s in client.query(f"count_over_time({name}[5m])"))
                    for name in (TILES, CONTROL)}

        wait_for(lambda: min(counted().values()) >= TILES_NEEDED, TIMEOUT_S,
                 f"{TILES_NEEDED} tiles of both the shipped rule and the control")
        durations = client.query("avg(avg_over_time(scrape_duration_seconds[5m]))")
        settled = client.query(f"avg_over_time({TILES}[5m]) / {tile_s}")
        control = client.query(f"avg_over_time({CONTROL}[5m]) / {tile_s}")
        rate = client.query(RATE)

    print(f"{server_release}: mean scrape {durations[0].value:.2f}s; {NODES} nodes' phase time read "
          f"{settled[0].value:.3f} rank-s/s settled, {control[0].value:.3f} at the evaluation")
    assert durations[0].value >= ANSWER_AFTER_S, "the scrapes were not slow: the test tested nothing"
    assert control[0].value < NODES * (1 - 0.5 * ANSWER_AFTER_S / tile_s), \
        f"the control did not lose the scrapes in flight ({control[0].value:.3f}): the test cannot tell"
    assert abs(settled[0].value - NODES) <= 0.01 * NODES, \
        f"the shipped tiles read {settled[0].value:.3f} rank-seconds per second of {NODES}"
    assert abs(rate[0].value - NODES) <= 0.01 * NODES, f"{RATE} read {rate[0].value:.3f} of {NODES}"

"""The pieces of `flopwatch demo --shards N` (the run itself is demo._run_sharded): the fleet cut
into shards that the first job spans, the fleet's clock, and the summary of the alerts received
that `--json` writes, so a script can check that an incident paged exactly once.
"""

from __future__ import annotations

import json
import math
import threading
import time
from pathlib import Path
from typing import Any

from flopwatch.errors import UsageError
from flopwatch.mixin.scrape import MAXIMUM_SECONDS, MINIMUM_SECONDS
from flopwatch.sim.fleet import node_name
from flopwatch.sim.scenario import Scenario
from flopwatch.sim.serve import FleetServer
from flopwatch.sim.ticker import MIN_SPAN_S
from flopwatch.stack.webhook import WebhookReceiver

#: The labels of an alert that say where and why (the page's who and what), kept apart in incidents().
INCIDENT_LABELS = ("severity", "job_id", "node", "gpu", "rank", "cause")


def incidents(webhook: WebhookReceiver, injected: str = "") -> dict[str, Any]:
    """What the webhook received, one entry per incident (receiver and the alert's labels) with how
    many firing and resolved notifications carried it (`firing` 1: it paged exactly once), the
    Alertmanager that sent each firing one (`senders`) and when the first arrived (unix seconds). A
    notification repeats every alert of its group, so
    an alert joined later by another of its group counts twice."""
    found: dict[tuple[str, tuple[tuple[str, str], ...]], dict[str, Any]] = {}
    for payload in list(webhook.payloads):
        for alert in payload["alerts"]:
            labels = dict(alert["labels"])
            entry = found.setdefault((payload.get("receiver", ""), tuple(sorted(labels.items()))), {
                "alertname": labels.get("alertname"), "receiver": payload.get("receiver"),
                **{name: labels.get(name) for name in INCIDENT_LABELS}, "labels": labels, "firing": 0, "resolved": 0,
                "senders": [], "first_firing_at": None})
            if alert.get("status") in ("firing", "resolved"):
                entry[alert["status"]] += 1
            if alert.get("status") == "firing":
                entry["senders"].append(payload.get("externalURL"))
                if entry["first_firing_at"] is None:
                    entry["first_firing_at"] = alert.get("received_at")
    return {"injected": injected, "notifications": webhook.posts, "incidents": list(found.values())}


def write_json(path: Path, summary: dict[str, Any]) -> str:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(summary, indent=1) + "\n")
    except OSError as error:
        return f"not written ({error.strerror or error})"
    return str(path)


def shard_nodes(scenario: Scenario, shards: int) -> dict[str, list[int]]:
    """Shard name -> its nodes: `shards` contiguous ranges of the fleet, cut inside the first job's
    nodes so that it spans them all (the rest of the fleet falls in with its neighbours). A UsageError
    when the first job has fewer nodes than shards."""
    if shards < 2:
        raise UsageError(f"--shards {shards}: the two-tier layout needs at least 2 shards (leave --shards out for "
                         "one Prometheus)")
    if not MINIMUM_SECONDS <= scenario.scrape_interval <= MAXIMUM_SECONDS:
        raise UsageError(f"--shards: the scenario scrapes every {scenario.scrape_interval:g}s; the shards' rules "
                         f"need {MINIMUM_SECONDS:g}s to {MAXIMUM_SECONDS:g}s")
    spanning = sorted(scenario.jobs[0].nodes)
    if len(spanning) < shards:
        raise UsageError(f"--shards {shards}: the first job ({scenario.jobs[0].id}) runs on {len(spanning)} nodes "
                         f"and cannot span {shards} shards; use --shards {len(spanning)} or fewer, or more --nodes")
    cuts = [0, *(spanning[round(k * len(spanning) / shards)] for k in range(1, shards)), scenario.fleet.nodes]
    return {f"shard-{k + 1}": list(range(cuts[k], cuts[k + 1])) for k in range(shards)}


def nodes_text(nodes: list[int]) -> str:
    return node_name(nodes[0]) if len(nodes) == 1 else f"{node_name(nodes[0])}-{node_name(nodes[-1])}"


class ClockTicker:
    """The sharded demo's fleet clock (the attributes of sim.ticker.Ticker that the view reads). Each
    node is scraped by both replicas of its shard, each on its own phase, so there is no quiet
    stretch between rounds of scrapes to tick in: the fleet ticks every interval on the clock, and
    the report's window (span()) runs from the first tick to the last one's scrapes."""

    CAVEAT = ("two replicas scrape each node, each on its own phase, and the fleet ticks on the clock: the report "
              "may be a tick off the truth")

    def __init__(self, server: FleetServer, interval: float, duration: float, stop: threading.Event) -> None:
        self.server, self.interval, self.duration, self.stop = server, interval, duration, stop
        self.started = self.ended = 0.0
        self.thread = threading.Thread(target=self.run, name="fleet", daemon=True)

    @property
    def ticks(self) -> int:
        return self.server.ticks

    def run(self) -> None:
        self.started = time.time()
        try:
            self.server.run(self.duration, self.stop, self.interval)
        finally:
            self.ended = time.time()

    def span(self) -> tuple[float, float]:
        """(start, end) in whole seconds: from the first tick to a scrape interval after the last, which
        every replica has scraped by then (waited for here); at least MIN_SPAN_S."""
        self.thread.join()
        end = float(math.ceil(self.ended + self.interval))
        while time.time() < end:
            time.sleep(0.05)
        return min(float(math.floor(self.started)), end - MIN_SPAN_S), end



"""End to end: the pages a degrading leaf switch causes, as flopwatch.detect.pages counts them and
as a real Alertmanager sends them to a webhook, with the shipped inhibitions and without them.

The alerts are real: the detection engine evaluates alerts/ in a real Prometheus over a simulated
rail-optimised fabric whose leaf flaps every port (the GPUs, NICs and switches are simulated). The
episodes are then replayed into a real Alertmanager (routed by alerts/alertmanager.yml, receivers
pointed at a local webhook) on the wall clock, SCALE wall seconds per simulated second, as
Prometheus would send them: each alert posted when it fires, posted again resolved when it
resolves. Group waits and intervals are scaled alike and set so no flush falls on an evaluation
step (5 s apart): flushes land halfway between two steps, so Alertmanager's own timing jitter
cannot reorder an alert and a flush. Both run in each release FlopWatch supports
(`server_release`: Debian's Prometheus 2.42 and Alertmanager 0.25, and the current upstream ones),
so the shipped routes and inhibitions are checked against each Alertmanager.
"""

from __future__ import annotations

import time
from datetime import timedelta
from itertools import groupby
from pathlib import Path
from typing import Any

import pytest
import yaml

from flopwatch.commands.demo import alertmanager_config
from flopwatch.detect.alerts import Episode
from flopwatch.detect.detect import run_scenario
from flopwatch.detect.pages import Alert, AlertmanagerConfig, incidents, parse_matcher
from flopwatch.sim.scenario import parse
from flopwatch.stack import Alertmanager
from flopwatch.stack.webhook import WebhookReceiver

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
SCALE = 0.15                       # wall seconds per simulated second
GROUP_WAIT_S, GROUP_INTERVAL_S = 12.5, 60.0   # simulated: flushes fall between the 5 s steps
FAULT_START_S, WINDOW_S = 120.0, 150.0        # replay the fault's first 2.5 minutes
FABRIC_SOURCES = ("FlopWatchSwitchDegraded", "FlopWatchUplinkDegraded")
SCENARIO = {
    "name": "flapping-leaf", "seed": 13, "duration": "8m", "scrape_interval": "5s",
    "fleet": {"nodes": 8, "gpus_per_node": 1, "nics_per_node": 2},
    "fabric": {"rail_optimised": True, "nodes_per_leaf": 4, "spines": 2},
    "jobs": [{"id": "j", "nodes": "0-7", "tokens_per_step": 65536, "target_mfu": 0.4,
              "model": {"params": 1e9, "layers": 16, "heads": 16, "head_dim": 128, "seq_len": 2048}}],
    "faults": [{"kind": "switch_degrade", "switch": "leaf1-r0", "mode": "flap", "start": "2m", "duration": "6m"}],
}


@pytest.fixture(scope="module")
def fired(server_release: str) -> tuple[list[Episode], float]:
    """The shipped rules' alert episodes over the scenario, and its start (unix seconds), from the
    release's Prometheus (its Alertmanager then gets them)."""
    _, result = run_scenario(parse(SCENARIO), ROOT / "alerts")
    return result.episodes, result.start_unix


def config(webhook_url: str | None, scale: float, inhibit: bool) -> dict[str, Any]:
    """alertmanager.yml as shipped, every receiver a webhook (the demo's), every route's waits set
    to the test's (times `scale`); without `inhibit`, the fabric alerts inhibit nothing."""
    path = ROOT / "alerts" / "alertmanager.yml"
    data = alertmanager_config(webhook_url or "http://127.0.0.1:9/")
    routes = [data["route"]]
    while routes:
        route = routes.pop()
        route.update(group_wait=f"{GROUP_WAIT_S * scale * 1000:.0f}ms",
                     group_interval=f"{GROUP_INTERVAL_S * scale * 1000:.0f}ms")
        routes.extend(route.get("routes", []))
    if not inhibit:
        data["inhibit_rules"] = [rule for rule in data.get("inhibit_rules", []) if not _fabric_source(rule)]
        assert len(data["inhibit_rules"]) < len(yaml.safe_load(path.read_text())["inhibit_rules"])
    return data


def _fabric_source(rule: dict[str, Any]) -> bool:
    """Whether a switch or uplink alert is this inhibit rule's source."""
    matchers = [parse_matcher(m, "source_matchers") for m in rule.get("source_matchers", [])]
    return any(all(m.matches({"alertname": name}) for m in matchers) for name in FABRIC_SOURCES)


def replay(episodes: list[tuple[float, float | None, dict[str, str]]], alertmanager: Alertmanager,
           stop: float) -> None:
    """Post each alert when it fires and again when it resolves (simulated seconds), SCALE-fast."""
    events = sorted([(fired, "fire", i) for i, (fired, _, _) in enumerate(episodes)]
                    + [(end, "resolve", i) for i, (_, end, _) in enumerate(episodes) if end is not None])
    began = time.time()
    started_at: dict[int, float] = {}
    for at, batch in groupby(events, key=lambda e: e[0]):
        time.sleep(max(0.0, began + at * SCALE - time.time()))
        now = time.time()
        body = []
        for _, what, i in batch:
            starts = started_at.setdefault(i, now)
            ends = now if what == "resolve" else now + 3600
            body.append({"labels": episodes[i][2], "startsAt": starts, "endsAt": ends})
        alertmanager.post_alerts(body)
    time.sleep(max(0.0, began + stop * SCALE - time.time()))


def real_incidents(payloads: list[dict[str, Any]]) -> list[dict[str, str]]:
    """Pages the webhook got: per group, a firing notification after none or after a resolved one."""
    last: dict[str, str] = {}
    opened = []
    for payload in payloads:
        if payload["receiver"] != "page":
            continue
        if payload["status"] == "firing" and last.get(payload["groupKey"]) != "firing":
            opened.append(payload["groupLabels"])
        last[payload["groupKey"]] = payload["status"]
    return opened


def in_window(fired: tuple[list[Episode], float]) -> list[tuple[float, float | None, dict[str, str]]]:
    """The episodes of the replayed window, in simulated seconds from its start."""
    episodes, start_unix = fired
    begin = start_unix + FAULT_START_S
    out = []
    for e in episodes:
        if begin <= e.fired_at < begin + WINDOW_S:
            end = e.resolved_at - begin if e.resolved_at is not None and e.resolved_at < begin + WINDOW_S else None
            out.append((e.fired_at - begin, end, e.labels))
    return out


def pages_both_ways(fired, inhibit: bool) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    window = in_window(fired)
    names = {labels["alertname"] for _, _, labels in window}
    assert {"FlopWatchSwitchDegraded", "FlopWatchIbLinkFlapping"} <= names, names
    margin = 2.0 / SCALE                       # simulated seconds waited after the last alert
    ours = incidents([_alert(w) for w in window], AlertmanagerConfig.from_dict(config(None, 1.0, inhibit)),
                     until=WINDOW_S + margin)
    with WebhookReceiver() as webhook, Alertmanager(config(webhook.url, SCALE, inhibit)) as alertmanager:
        replay(window, alertmanager, WINDOW_S + margin)
        payloads = list(webhook.payloads)
    return [i.group_labels for i in ours], real_incidents(payloads)


def _alert(item: tuple[float, float | None, dict[str, str]]) -> Alert:
    fired, end, labels = item
    return Alert(labels, fired, end, labels["alertname"])


def _key(labels: dict[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(labels.items()))


def test_a_flapping_leaf_pages_once_through_a_real_alertmanager(fired):
    ours, theirs = pages_both_ways(fired, inhibit=True)
    assert sorted(map(_key, ours)) == sorted(map(_key, theirs))
    assert len(theirs) == 1 and theirs[0] == {}   # the switch page: no job_id, no node to group by


def test_without_the_fabric_inhibition_every_port_pages_and_the_count_still_agrees(fired):
    ours, theirs = pages_both_ways(fired, inhibit=False)
    assert sorted(map(_key, ours)) == sorted(map(_key, theirs))
    ports = {labels["node"] for labels in theirs if "node" in labels}
    assert ports == {f"node{n:04d}" for n in range(4)} and len(theirs) == 5   # 4 ports + the switch


def test_timing_waits_keep_flushes_off_the_evaluation_steps():
    """Guard for the replay: a flush never falls on a 5 s step."""
    flushes = [GROUP_WAIT_S + k * GROUP_INTERVAL_S for k in range(20)]
    assert all(abs(f % 5 - 2.5) < 1e-9 for f in flushes)
    assert timedelta(seconds=GROUP_WAIT_S * SCALE) > timedelta(milliseconds=500)

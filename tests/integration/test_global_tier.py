"""Shards judge ranks, the global tier judges jobs: the two-tier layout end to end on loopback
(docs/scaling.md, flopwatch/mixin/tiers.py, flopwatch/stack/sharded.py).

Four shards, each an HA pair of Prometheus servers evaluating the shard rule set and remote-writing
the series the global rules read (replica label dropped, shard label kept) to the global tier:
single-node VictoriaMetrics behind a VictoriaMetrics cluster's URL paths, with vmalert evaluating the
global rule set over it. Every tier sends to a 2-member Alertmanager cluster routed by
alerts/alertmanager.yml to a local webhook. A reference Prometheus scrapes the whole fleet and
evaluates alerts/ as one server would. The fleet is simulated (tests/integration/fleets.py,
spanning_job_four_shards): job `span`, pipeline-parallel over all four shards with a heavy stage,
and one job inside each shard, all running for 10 minutes before the first scrape.

In one run of the stack, in order:

- job MFU, goodput, ETTR and the lost shares the global tier records equal the reference's, while
  the fleet runs steadily (vmalert's chained records trail the reference's by one evaluation a link,
  so a fault's ramp would set them apart);
- a thermal straggler in `span` pages once, naming node, GPU, rank and cause, although one replica
  of its shard and the Alertmanager about to send are SIGKILLed between the alert's arrival and its
  page;
- the heavy stage gives one FlopWatchPipelineImbalance ticket, from the global tier's vmalert;
- with the global tier down for two minutes, a second straggler still pages once, and when the
  tier returns remote write fills the outage: no gap in the forwarded series (the catch-up time is
  printed for bench/RESULTS.md);
- no job-level alert comes from a shard.

Current release only (Prometheus 3.16, Alertmanager 0.31, VictoriaMetrics and vmalert 1.151): the
layout is 13 servers beside the simulator, over 6 minutes of run on 2 cores for each release, and
what it adds to the page path of one shard (an HA pair and an Alertmanager cluster, with SIGKILLs)
is tested on both releases by test_ha_pages.py. Only the GPUs are simulated.
"""

from __future__ import annotations

import contextlib
import json
import math
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from helpers import program, wait_for

from flopwatch.mixin import config
from flopwatch.mixin.tiers import JOB_ALERTS
from flopwatch.promql import PromClient
from flopwatch.sim.fleet import Fleet, node_name
from flopwatch.sim.scenario import Scenario
from flopwatch.sim.serve import FleetServer
from flopwatch.stack import releases
from flopwatch.stack.servers import Alertmanager, alertmanager_config
from flopwatch.stack.sharded import ShardedStack
from flopwatch.stack.webhook import WebhookReceiver
from integration.fleets import serving, spanning_job_four_shards
from integration.test_ha_pages import STRAGGLER, end_fault, held_stragglers, straggler_notifications

pytestmark = pytest.mark.integration

#: The rules' settings: the fleet's 1 s scrape, and a pipeline ticket held 1 minute, not 10.
SETTINGS = {"scrape_interval": "1s", "stragglers": {"stage_for": "1m"}}
SPAN = "span"
JOBS = (SPAN, "local-0", "local-1", "local-2", "local-3")
FIRST, SECOND = (2, 5), (4, 6)   # (node, GPU) of each straggler of `span`: rank 21 (stage 0), rank 38 (stage 1)
HEAVY_STAGE = "1"
READY_TIMEOUT_S = 120     # from the start to every rank scored on every replica and forwarded
PAGE_TIMEOUT_S = 75       # from an injection to its page
RESOLVE_TIMEOUT_S = 90    # from the end of a fault to its resolved notification
TICKET_TIMEOUT_S = 300    # from the start: 2m medians, a 1m hold, the ticket route's wait
AGREE_TIMEOUT_S = 330     # vmalert's chains fill one evaluation a link; restart_global_rules says what else
OUTAGE_S = 120
CATCH_UP_TIMEOUT_S = 120
TOLERANCE = 0.005
#: Seconds the fleet runs before it is first scraped. Where a window holds a counter's first sample,
#: VictoriaMetrics's increase() counts it as grown from 0 when it is under 10 x (its change per sample
#: + 1), Prometheus's from that sample on: until the series is 5 minutes old their 5-minute figures
#: differ. A local job's comm seconds grow 0.02 s a scrape: past that mark (10.2 s) after 7 minutes.
HISTORY_S = 600
#: The job figures compared (each series of each, by its labels): vmalert's records in the global
#: store against the reference Prometheus's.
FIGURES = ("job_id:flopwatch_mfu:ratio", "job_id:flopwatch_goodput:ratio", "job_id:flopwatch_ettr:ratio",
           "job_id_class:flopwatch_step_time_lost:ratio", "job_id:flopwatch_badput:ratio")
#: What goodput is built from, printed beside the figures so that a difference says where it starts.
COMPONENTS = ("job_id_phase:flopwatch_train_phase_seconds:rate5m", "job_id:flopwatch_straggler_wait_seconds:rate5m",
              "job_id:flopwatch_held_seconds:rate5m", "job_id:flopwatch_replaying:ratio5m",
              "job_id:flopwatch_comm_seconds_per_step:avg5m", "job_id:flopwatch_comm_floor_seconds:min5m",
              "job_id:flopwatch_comm_seconds_per_step:min5m", "job_id:flopwatch_step_seconds:mean5m")
#: Forwarded series checked for a gap over the outage, with the interval they are written at: a
#: per-rank counter (scraped every second) and a per-GPU record (its group runs every 15 s).
FORWARDED = {"flopwatch_train_model_flops_total": 1.0, "node_gpu:flopwatch_gpu_utilization_ratio:max": 15.0}


@dataclass
class Tier:
    """The running layout, the fleet it watches and the pager, shared by the module's tests."""

    stack: ShardedStack
    server: FleetServer
    webhook: WebhookReceiver
    shards: dict[str, list[int]]
    marks: dict[str, float] = field(default_factory=dict)   # wall-clock moments later tests read

    @property
    def shard_labels(self) -> set[str]:
        """The labels only a shard's series and alerts carry (its name, its replica)."""
        return {self.stack.topology.shard_label, self.stack.topology.replica_label}

    def shard_of(self, node: int) -> str:
        return next(name for name, nodes in self.shards.items() if node in nodes)

    def live_alertmanagers(self) -> list[Alertmanager]:
        return [member for member in self.stack.alertmanagers if member.running()]


def scored_ranks(client: PromClient) -> dict[str, float]:
    return {s.labels["job_id"]: s.value for s in client.query("job_id:flopwatch_straggler_ranks:count")}


def rules_api(url: str) -> list[dict[str, Any]]:
    """Every rule a Prometheus or vmalert evaluates (/api/v1/rules), flattened."""
    with urllib.request.urlopen(url + "/api/v1/rules", timeout=10) as answer:
        groups = json.load(answer)["data"]["groups"]
    return [rule for group in groups for rule in group["rules"]]


def notifications(webhook: WebhookReceiver, alertname: str, status: str = "firing",
                  **labels: str) -> list[dict[str, Any]]:
    """The notifications that carry an `alertname` alert in `status` with `labels`."""
    return [payload for payload in list(webhook.payloads)
            if any(alert["labels"].get("alertname") == alertname and alert.get("status") == status
                   and all(alert["labels"].get(k) == v for k, v in labels.items()) for alert in payload["alerts"])]


def figures(client: PromClient, record: str, at: float) -> dict[frozenset[tuple[str, str]], float]:
    """Each series of `record`'s mean over the minute before `at`, by its labels (the name apart:
    VictoriaMetrics keeps it on avg_over_time, Prometheus drops it)."""
    return {frozenset((k, v) for k, v in s.labels.items() if k != "__name__"): s.value
            for s in client.query(f"avg_over_time({record}[1m])", at)}


#: One phase's tiles of `span` and the counter they are taken from, printed where the figures differ.
TILE = 'job_id_phase:flopwatch_train_phase_seconds:increase15s{job_id="span", phase="compute"}[5m]'
COUNTER = 'flopwatch_train_job_phase_seconds_total{job_id="span", phase="compute"}'
RETAKEN = f"sum({COUNTER} offset 15s - {COUNTER} offset 30s >= 0)"
NODES = f"count({COUNTER} offset 15s - {COUNTER} offset 30s >= 0)"


def servers(tier: Tier) -> dict[str, PromClient]:
    """The layout's Prometheus servers that are running, by a readable name."""
    assert tier.stack.reference is not None
    named = {f"{shard}/{index}": PromClient(replica.url) for shard, replicas in tier.stack.shards.items()
             for index, replica in enumerate(replicas) if replica.running()}
    return {"reference": PromClient(tier.stack.reference.url), **named}


def samples(client: PromClient, selector: str, at: float) -> list[tuple[float, float]]:
    """The raw samples (time, value) of a range selector's one series at `at` (empty where it has none)."""
    query = urllib.parse.urlencode({"query": selector, "time": at})
    with urllib.request.urlopen(f"{client.url}/api/v1/query?{query}", timeout=30) as answer:
        result = json.load(answer)["data"]["result"]
    return [(float(moment), float(value)) for moment, value in result[0]["values"]] if result else []


def ranks_held(scenario: Scenario, nodes: list[int]) -> dict[str, float]:
    """Job -> its ranks on `nodes` (one per GPU)."""
    held: dict[str, float] = {}
    for job in scenario.jobs:
        on = [node for node in job.nodes if node in nodes]
        if on:
            held[job.id] = float(len(on) * scenario.fleet.gpus_per_node)
    return held


def restart_global_rules(stack: ShardedStack, ranks: dict[str, float]) -> None:
    """vmalert starts over on the global store once every shard has forwarded all its ranks for a tile.

    It started with the shards, and its first goodput tile summed the 15-second differences of the
    ranks whose shards had forwarded 15 seconds by then: `span`'s read 12% short, and every 5-minute
    figure built on the tiles carried that for 5 minutes. A tier that has run that long holds no such
    tile, and that tier is what is compared with the reference. (The reference's own first tile is
    whole unless its goodput group first ran within the second over which its first scrapes of span's
    nodes spread, about 1 start in 20: AGREE_TIMEOUT_S waits that out.)"""
    label, store = stack.topology.shard_label, PromClient(stack.global_url)
    wait_for(lambda: {s.labels.get(label): s.value for s in store.query(
                 f"count by ({label}) (count_over_time(flopwatch_train_steps_total[20s]) >= 16)")} == ranks,
             READY_TIMEOUT_S, "every rank of every shard forwarded for 16 s")
    stack.vmalert.kill()
    selector = urllib.parse.urlencode({"match[]": f'{{__name__=~".+:.+", {label}=""}}'}).encode()  # vmalert's records
    delete = urllib.request.Request(f"{stack.global_store.url}/api/v1/admin/tsdb/delete_series", data=selector)
    with urllib.request.urlopen(delete, timeout=30):
        pass
    stack.vmalert.restart()


@pytest.fixture(scope="module")
def tier(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tier]:
    for name in ("prometheus", "alertmanager", "victoria-metrics", "vmalert"):
        program(name, "current")      # a missing build fails here, naming what builds it
    folder = tmp_path_factory.mktemp("global-tier")
    (folder / "settings.yml").write_text(yaml.safe_dump(SETTINGS))
    settings = config.load(folder / "settings.yml")
    scenario, shards = spanning_job_four_shards("global-tier", seed=23)
    fleet = Fleet(scenario)
    for _ in range(round(HISTORY_S / scenario.scrape_interval)):
        fleet.advance(scenario.scrape_interval)
    fleet.start_unix = time.time() - fleet.t      # step timestamps on the wall clock
    with releases.use("current"), WebhookReceiver() as webhook, serving(fleet) as server:
        routes = alertmanager_config(webhook.url)
        page = next(route for route in routes["route"]["routes"] if route["receiver"] == "page")
        page["group_wait"] = "5s"     # room to kill between a page's alert reaching Alertmanager and its notification
        targets = server.targets()
        stack = ShardedStack(settings, {name: [targets[node] for node in nodes] for name, nodes in shards.items()},
                             receiver_url=webhook.url, workdir=folder / "stack", reference=True,
                             alertmanager=routes)
        with stack:
            assert stack.reference is not None
            expected = [(PromClient(replica.url), ranks_held(scenario, shards[name]))
                        for name, replicas in stack.shards.items() for replica in replicas]
            expected.append((PromClient(stack.reference.url), ranks_held(scenario, list(range(scenario.fleet.nodes)))))
            wait_for(lambda: all(scored_ranks(client) == held for client, held in expected), READY_TIMEOUT_S,
                     "every job's ranks scored on every shard replica (16 of span and 8 of its own job) and on the "
                     "reference")
            forwarded = {name: sum(ranks_held(scenario, nodes).values()) for name, nodes in shards.items()}
            restart_global_rules(stack, forwarded)
            yield Tier(stack, server, webhook, shards)


def test_job_figures_from_the_global_tier_equal_the_reference(tier: Tier) -> None:
    """While the fleet runs steadily (before any fault: vmalert's records lag the reference's by one
    evaluation per link of their chain, so only steady figures can be compared at one moment)."""
    assert tier.stack.reference is not None
    reference, global_tier = PromClient(tier.stack.reference.url), PromClient(tier.stack.global_url)
    compared: dict[str, tuple[dict[Any, float], dict[Any, float]]] = {}

    def agree() -> bool:
        at = time.time() - 20     # both tiers have evaluated up to here (vmalert writes within a second)
        compared.update({record: (figures(reference, record, at), figures(global_tier, record, at))
                         for record in FIGURES})
        return all(want.keys() == got.keys() and {dict(key)["job_id"] for key in want} >= set(JOBS)
                   and all(abs(got[key] - want[key]) <= TOLERANCE for key in want)
                   for want, got in compared.values())

    started = time.monotonic()
    with contextlib.suppress(AssertionError):   # the assertions below say which figure differs, and how
        wait_for(agree, AGREE_TIMEOUT_S, "the global tier's job figures to equal the reference's")
    at = time.time() - 20
    durations = reference.query("avg(avg_over_time(scrape_duration_seconds[5m]))")
    print(f"the reference's mean scrape duration over 5 minutes: {durations[0].value:.3f}s" if durations else "")
    for name, client in servers(tier).items():
        failed = client.query("sum(count_over_time(up[5m])) - sum(sum_over_time(up[5m]))", at)
        print(f"{name}: {failed[0].value if failed else 'no'} failed scrapes in the 5 minutes before the figures")
    for name, client in (("reference", reference), ("global", global_tier)):
        tiles = samples(client, TILE, at)
        print(name, "compute tiles of span, each over its 15 s at 64 ranks:",
              [(round(moment % 60, 1), round(value / 15 / 64, 4)) for moment, value in tiles])
        for delay in (0, 30):   # the tiles taken again now that every sample has landed, at the tile's
            again = [client.query(RETAKEN, moment - delay) for moment, _ in tiles]  # moment and 30 s before
            nodes = [client.query(NODES, moment - delay) for moment, _ in tiles]
            print(name, f"the same tiles taken again {delay} s before their moment:",
                  [round(answer[0].value / 15 / 64, 4) if answer else None for answer in again],
                  "nodes:", [answer[0].value if answer else 0 for answer in nodes])
        grown = client.query(f"{COUNTER} offset 45s - {COUNTER} offset 165s", at)
        counted = client.query(f"count_over_time({COUNTER}[2m] offset 45s)", at)
        print(name, "span's compute seconds per node over 2 minutes, and their samples:",
              sorted((s.labels.get("instance", s.labels.get("node", "?")), round(s.value, 2)) for s in grown),
              sorted((s.labels.get("instance", s.labels.get("node", "?")), s.value) for s in counted))
    for record in COMPONENTS:      # pytest shows these where an assertion below fails
        want, got = figures(reference, record, at), figures(global_tier, record, at)
        print(record, {json.dumps(dict(key), sort_keys=True): (round(want[key], 5), round(got.get(key, math.nan), 5))
                       for key in want if dict(key)["job_id"] == SPAN})
    for record, (want, got) in compared.items():
        assert {dict(key)["job_id"] for key in want} >= set(JOBS), f"{record}: the reference lacks a job: {want}"
        labelled = [dict(key) for key in got if tier.shard_labels & dict(key).keys()]
        assert not labelled, f"{record}: the global tier's records carry a shard's labels: {labelled}"
        assert want.keys() == got.keys(), f"{record}: only in the reference: {[dict(k) for k in want - got.keys()]}, " \
            f"only in the global tier: {[dict(k) for k in got - want.keys()]}"
        off = {json.dumps(dict(key), sort_keys=True): (want[key], got[key]) for key in want
               if abs(got[key] - want[key]) > TOLERANCE}
        assert not off, f"{record}: the global tier differs from the reference by over {TOLERANCE}: {off}"
    for record, (want, got) in compared.items():
        worst = max(want, key=lambda key: abs(got[key] - want[key]))
        print(f"{record}: {len(want)} series, largest difference {abs(got[worst] - want[worst]):.5f} "
              f"({dict(worst)}: reference {want[worst]:.4f}, global {got[worst]:.4f})")
    print(f"figures agreed {time.monotonic() - started:.0f}s into this test")


def test_a_straggler_pages_once_when_a_replica_and_the_sending_alertmanager_die(tier: Tier) -> None:
    node, gpu = FIRST
    shard = tier.shard_of(node)
    with tier.server.lock:
        fault = tier.server.fleet.inject("thermal_throttle", node, gpu=gpu, duration=3600, slowdown=0.08)
    members = tier.live_alertmanagers()
    wait_for(lambda: all(held_stragglers(member, node) for member in members), PAGE_TIMEOUT_S,
             "the straggler's alert in every Alertmanager")
    paged_before_kill = straggler_notifications(tier.webhook, node, "firing")
    sender = min(members, key=Alertmanager.position)      # the member that sends at once; the other waits
    tier.stack.kill_alertmanager(tier.stack.alertmanagers.index(sender))
    tier.stack.kill_replica(shard, tier.stack.replicas[0])
    wait_for(lambda: straggler_notifications(tier.webhook, node, "firing"), PAGE_TIMEOUT_S,
             "the page from the surviving Alertmanager")
    end_fault(tier.server, fault)
    # Its resolved notification comes after every firing one the survivor could send for it.
    wait_for(lambda: straggler_notifications(tier.webhook, node, "resolved"), RESOLVE_TIMEOUT_S,
             "the resolved notification")

    assert paged_before_kill == [], "the page came before the kill: the kill tested nothing"
    assert not sender.running() and not tier.stack.replica(shard, tier.stack.replicas[0]).running()
    firing = straggler_notifications(tier.webhook, node, "firing")
    assert len(firing) == 1, f"the straggler paged {len(firing)} times, from {[p['externalURL'] for p in firing]}"
    assert len(straggler_notifications(tier.webhook, node, "resolved")) == 1
    labels = next(alert["labels"] for alert in firing[0]["alerts"] if alert["labels"]["alertname"] == STRAGGLER)
    assert (labels["job_id"], labels["node"], labels["gpu"], labels["rank"], labels["cause"]) == \
        (SPAN, node_name(node), str(gpu), str(node * 8 + gpu), "thermal"), labels
    topology = tier.stack.topology
    assert labels[topology.shard_label] == shard and topology.replica_label not in labels, labels
    assert labels[tier.stack.settings.labels.cluster] == topology.cluster, labels


def test_a_heavy_stage_tickets_once_from_the_global_tier(tier: Tier) -> None:
    def tickets() -> list[dict[str, Any]]:
        return notifications(tier.webhook, "FlopWatchPipelineImbalance", job_id=SPAN)

    first = wait_for(tickets, TICKET_TIMEOUT_S, "the pipeline imbalance ticket")[0]

    # In the module's order the straggler's page came first: its kill leaves one Alertmanager, and
    # the wait for its resolution outlasts any second notification a member could send for a ticket
    # that arrived before the kill.
    assert len(tickets()) == 1, f"{len(tickets())} tickets, from {[p['externalURL'] for p in tickets()]}"
    alerts = [alert for alert in first["alerts"] if alert["labels"]["alertname"] == "FlopWatchPipelineImbalance"]
    assert [alert["labels"].get("stage") for alert in alerts] == [HEAVY_STAGE], alerts
    assert first["receiver"] == "ticket" and alerts[0]["labels"]["severity"] == "ticket"
    source = urlsplit(alerts[0]["generatorURL"])     # vmalert names itself by host name, and its own port
    assert source.port == tier.stack.vmalert.port and source.path.startswith("/vmalert/"), \
        f"the ticket came from {alerts[0]['generatorURL']}, not the global tier's vmalert"
    assert not tier.shard_labels & alerts[0]["labels"].keys(), alerts[0]["labels"]


def test_shards_page_through_a_global_outage_and_remote_write_fills_it(tier: Tier) -> None:
    stack, (node, gpu) = tier.stack, SECOND
    global_tier = PromClient(stack.global_url)
    stack.stop_global()
    down = time.time()
    with tier.server.lock:
        fault = tier.server.fleet.inject("thermal_throttle", node, gpu=gpu, duration=3600, slowdown=0.08)
    wait_for(lambda: straggler_notifications(tier.webhook, node, "firing"), PAGE_TIMEOUT_S,
             "the straggler's page while the global tier is down")
    paged_down = not stack.global_store.running() and not stack.paths.running()
    time.sleep(max(0.0, down + OUTAGE_S - time.time()))     # the outage lasts OUTAGE_S by the servers' clock
    stack.start_global()
    up = time.time()
    tier.marks.update(down=down, up=up)
    window = round(up - down)
    label = stack.topology.shard_label
    checked = {(shard, name): f'{name}{{{label}="{shard}", node="{node_name(nodes[0])}", gpu="0"}}'
               for shard, nodes in tier.shards.items() for name in FORWARDED}

    def count(selector: str) -> float:
        return sum(s.value for s in global_tier.query(f"count_over_time({selector}[{window}s])", up))

    def caught_up() -> bool:
        stack.global_store.flush()
        newest = {s.labels.get(label): s.value for s in global_tier.query(
            f"max by ({label}) (tlast_over_time(flopwatch_train_model_flops_total[1m]))")}
        return all(newest.get(shard, 0) >= up for shard in tier.shards) and \
            all(count(selector) >= window / FORWARDED[name] - 1 for (_, name), selector in checked.items())

    wait_for(caught_up, CATCH_UP_TIMEOUT_S, "remote write to fill the outage and reach the present")
    catch_up = time.time() - up
    counted = {key: count(selector) for key, selector in checked.items()}
    end_fault(tier.server, fault)
    wait_for(lambda: straggler_notifications(tier.webhook, node, "resolved"), RESOLVE_TIMEOUT_S,
             "the second straggler's resolved notification")
    print(f"global tier down {window}s: remote write caught up {catch_up:.1f}s after it returned; "
          f"samples over the outage: {counted}")

    assert paged_down, "the global tier was up again when the page came: the outage tested nothing"
    firing = straggler_notifications(tier.webhook, node, "firing")
    assert firing[0]["alerts"][0]["received_at"] < up, "the page waited for the global tier"
    assert len(firing) == 1, f"the straggler paged {len(firing)} times"
    labels = next(alert["labels"] for alert in firing[0]["alerts"] if alert["labels"]["alertname"] == STRAGGLER)
    assert (labels["job_id"], labels["node"], labels["gpu"], labels["rank"], labels["cause"], labels[label]) == \
        (SPAN, node_name(node), str(gpu), str(node * 8 + gpu), "thermal", tier.shard_of(node)), labels
    for (shard, name), samples in counted.items():
        expected = window / FORWARDED[name]    # one sample per interval: both replicas' copies deduplicated
        assert expected - 1 <= samples <= expected + 1, \
            f"{name} of {shard}: {samples:g} samples over the {window}s outage, expected {expected:g}"


def test_job_level_alerts_come_from_the_global_tier_only(tier: Tier) -> None:
    live = {name: [server for server in replicas if server.running()] for name, replicas in tier.stack.shards.items()}
    shard_rules = {replica.url: rules_api(replica.url) for replicas in live.values() for replica in replicas}
    global_alerts = {rule["name"] for rule in tier.stack.vmalert.rules() if rule["type"] == "alerting"}

    def job_alerts() -> list[dict[str, Any]]:
        return [alert for payload in list(tier.webhook.payloads) for alert in payload["alerts"]
                if alert["labels"]["alertname"] in JOB_ALERTS]

    wait_for(job_alerts, TICKET_TIMEOUT_S, "a job-level alert (the pipeline ticket) at the webhook")
    tickets = [(alert["status"], alert["received_at"]) for payload in list(tier.webhook.payloads)
               for alert in payload["alerts"] if alert["labels"]["alertname"] == "FlopWatchPipelineImbalance"]
    outage = (tier.marks.get("down", float("inf")), tier.marks.get("up", float("inf")))
    print(f"pipeline ticket notifications ({tier.webhook.posts} notifications in all): " + ", ".join(
        f"{status} {'before' if at < outage[0] else 'during' if at < outage[1] else 'after'} the global outage"
        for status, at in tickets))

    assert all(live.values()), f"a shard has no replica up: {live}"
    for url, rules in shard_rules.items():
        alerts = {rule["name"] for rule in rules if rule["type"] == "alerting"}
        records = {rule["name"] for rule in rules if rule["type"] == "recording"}
        assert STRAGGLER in alerts and "job_id:flopwatch_goodput:ratio" in records, f"{url}: {sorted(alerts)}"
        assert not alerts & JOB_ALERTS, f"{url} evaluates job-level alerts: {sorted(alerts & JOB_ALERTS)}"
    assert global_alerts == JOB_ALERTS
    from_shards = [alert["labels"] for alert in job_alerts() if tier.shard_labels & alert["labels"].keys()]
    assert not from_shards, f"job-level alerts from shards: {from_shards}"

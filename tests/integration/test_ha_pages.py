"""The page path without a single point of failure: one shard as a Prometheus HA pair (identical
servers that differ only in their `replica` external label, which their alerts leave out) sending to
a two-member Alertmanager cluster (gossip), routed by alerts/alertmanager.yml with its receivers
pointed at a local webhook. One replica and one Alertmanager are killed (SIGKILL) mid-incident.

Two thermal stragglers on different nodes, so two page groups (the route groups by node), in one
run of the stack:

- the first pages while everything is up, and the kills come after its notification (and after
  the other member received its notification-log entry), before the group would repeat: the
  survivors must not page it again;
- the second is killed into: once both Alertmanagers hold its alert and before its notification,
  the replica that was up and the Alertmanager that would have sent (position 0: the other waits
  one peer timeout and sends only what nobody logged) die; the survivors must page it.

Then both faults end; each group's resolved notification comes from the surviving Alertmanager,
whose notifications for a group go out one after another, so once it has arrived every firing
notification either member could send for that incident has arrived too. Each incident must have
paged exactly once (and resolved once), naming node, GPU, rank and cause.

What is guaranteed, and so tested: no page is lost while one replica and one Alertmanager live, and
no page repeats when a member dies after its notification has reached the others. What is not: a
member that dies after the receiver took its notification but before the notification log reached
its peer (a gossip interval, 50 ms here, 200 ms by default) leaves the peer to send it again, one
peer timeout later. Alertmanager delivers at least once across peers, and so does this test's
pair; the receiver (PagerDuty's dedup key is the group key) absorbs that duplicate.

Both releases (`server_release`): Debian's Prometheus 2.42 and Alertmanager 0.25, and the current
upstream ones. Only the GPUs are simulated.
"""

from __future__ import annotations

import dataclasses
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
from helpers import wait_for

from flopwatch.commands.demo import alertmanager_config, rule_files
from flopwatch.promql import PromClient
from flopwatch.sim.fleet import Fleet, node_name
from flopwatch.sim.scenario import FaultSpec
from flopwatch.sim.serve import FleetServer
from flopwatch.stack.servers import REPLICA_LABEL, Alertmanager, ha_pair
from flopwatch.stack.webhook import WebhookReceiver
from integration.fleets import llm_8b_32_ranks, serving

pytestmark = pytest.mark.integration

SCRAPE_S = 5
PAGE_TIMEOUT_S = 75       # from an injection to its page
RESOLVE_TIMEOUT_S = 90    # from the end of the faults to both resolved notifications
FIRST, SECOND = (2, 5), (0, 3)   # (node, GPU) of each straggler: ranks 21 and 3, two page groups
STRAGGLER = "FlopWatchStraggler"


def straggler_notifications(webhook: WebhookReceiver, node: int, status: str) -> list[dict[str, Any]]:
    """The page notifications that carry node's straggler in `status` (firing or resolved)."""
    return [payload for payload in list(webhook.payloads) if payload.get("receiver") == "page"
            and any(alert["labels"].get("alertname") == STRAGGLER and alert["labels"].get("node") == node_name(node)
                    and alert.get("status") == status for alert in payload["alerts"])]


def held_stragglers(alertmanager: Alertmanager, node: int) -> list[dict[str, Any]]:
    return [alert for alert in alertmanager.alerts()
            if alert["labels"].get("alertname") == STRAGGLER and alert["labels"].get("node") == node_name(node)]


def end_fault(server: FleetServer, fault: FaultSpec) -> None:
    """The injected fault stops now (the simulator applies its faults afresh on every tick)."""
    with server.lock:
        faults = server.fleet.scenario.faults
        faults[faults.index(fault)] = dataclasses.replace(fault, end=server.fleet.t)


def test_one_page_per_incident_when_a_replica_and_an_alertmanager_die(tmp_path: Path, server_release: str) -> None:
    started = time.monotonic()
    fleet = Fleet(llm_8b_32_ranks("ha-pages", seed=11, nodes=5, scrape_s=SCRAPE_S))
    for _ in range(24):                       # two minutes of history in the counters
        fleet.advance(SCRAPE_S)
    fleet.start_unix = time.time() - fleet.t  # step timestamps on the wall clock
    with WebhookReceiver() as webhook, serving(fleet) as server, ExitStack() as stack:
        config = alertmanager_config(webhook.url)
        routes = [config["route"], *config["route"]["routes"]]
        assert all(REPLICA_LABEL not in route.get("group_by", []) for route in routes), "grouping splits the pair"
        page_route = next(route for route in config["route"]["routes"] if route["receiver"] == "page")
        page_route["group_wait"] = "5s"       # room to kill between the alert's arrival and its page
        alertmanagers = Alertmanager.cluster(config, 2)
        targets = server.write_file_sd(tmp_path / "targets.json")
        replicas = ha_pair([{"job_name": "flopwatch", "file_sd_configs": [{"files": [str(targets)]}]}],
                           cluster="shard-1", alertmanagers=[am.url for am in alertmanagers],
                           rule_files=rule_files(), scrape_interval=f"{SCRAPE_S}s", evaluation_interval=f"{SCRAPE_S}s")
        for process in [*alertmanagers, *replicas]:
            stack.enter_context(process)
        wait_for(lambda: all(am.clustered(2) for am in alertmanagers), 30, "a settled 2-member Alertmanager cluster")
        clients = [PromClient(replica.url) for replica in replicas]
        wait_for(lambda: all([s.value for s in client.query("job_id:flopwatch_straggler_ranks:count")] == [32]
                             for client in clients), 60, "all 32 ranks in the peer group on both replicas")

        # The first incident, everything up.
        updates_before = alertmanagers[0].peer_update_messages(), alertmanagers[1].peer_update_messages()
        with server.lock:
            first = fleet.inject("thermal_throttle", FIRST[0], gpu=FIRST[1], duration=3600, slowdown=0.08)
        wait_for(lambda: straggler_notifications(webhook, FIRST[0], "firing"), PAGE_TIMEOUT_S, "the first page")
        sender = min(alertmanagers, key=Alertmanager.position)        # the member that sends first
        survivor = next(am for am in alertmanagers if am is not sender)
        held_first = held_stragglers(survivor, FIRST[0])
        # Its notification-log entry has reached the other member: a page repeated after the kill
        # below would be the cluster forgetting what it sent, not the gossip window.
        wait_for(lambda: survivor.peer_update_messages() > updates_before[alertmanagers.index(survivor)], 10,
                 "the notification log gossiped to the other member")

        # The second incident: kill into it once both Alertmanagers hold its alert, before its page.
        with server.lock:
            second = fleet.inject("thermal_throttle", SECOND[0], gpu=SECOND[1], duration=3600, slowdown=0.08)
        wait_for(lambda: all(held_stragglers(am, SECOND[0]) for am in alertmanagers), PAGE_TIMEOUT_S,
                 "the second straggler's alert in both Alertmanagers")
        paged_before_kill = straggler_notifications(webhook, SECOND[0], "firing")
        sender.kill()
        replicas[0].kill()
        wait_for(lambda: straggler_notifications(webhook, SECOND[0], "firing"), PAGE_TIMEOUT_S,
                 "the second page from the survivors")

        for fault in (first, second):
            end_fault(server, fault)
        wait_for(lambda: all(straggler_notifications(webhook, node, "resolved") for node, _ in (FIRST, SECOND)),
                 RESOLVE_TIMEOUT_S, "both incidents' resolved notifications from the surviving Alertmanager")
        alive = (survivor.running(), replicas[1].running(), sender.running(), replicas[0].running())

    assert alive == (True, True, False, False)
    assert paged_before_kill == [], "the second page came before the kill: the kill tested nothing"
    assert [alert["labels"].get(REPLICA_LABEL) for alert in held_first] == [None], \
        f"the pair's alerts are not one alert to Alertmanager: {held_first}"
    for (node, gpu), incident in ((FIRST, "first (no kill)"), (SECOND, "second (killed into)")):
        firing = straggler_notifications(webhook, node, "firing")
        assert len(firing) == 1, f"{incident} incident paged {len(firing)} times, from " \
                                 f"{[payload['externalURL'] for payload in firing]}"
        assert len(straggler_notifications(webhook, node, "resolved")) == 1, f"{incident} incident resolved twice"
        labels = next(alert["labels"] for alert in firing[0]["alerts"] if alert["labels"]["alertname"] == STRAGGLER)
        assert (labels["node"], labels["gpu"], labels["rank"], labels["cause"]) == \
            (node_name(node), str(gpu), str(node * 8 + gpu), "thermal"), labels
        assert labels["cluster"] == "shard-1" and REPLICA_LABEL not in labels
    second_sender = straggler_notifications(webhook, SECOND[0], "firing")[0]["externalURL"]
    assert second_sender.rsplit(":", 1)[-1] == str(survivor.port), "the second page did not come from the survivor"
    print(f"{server_release}: {webhook.posts} notifications, {time.monotonic() - started:.0f}s")

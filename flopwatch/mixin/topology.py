"""The sharded layout the settings file's `topology:` section describes (docs/configuration.md,
"Topology"): shards of identical Prometheus replicas, the global tier they remote-write to, and the
Alertmanager cluster every tier sends to; and a probe of what the tiers will need to reach.

Plain data and the probe only: config.py reads and validates the section (one line per wrong value,
naming file and line), tiers.py turns it into rule sets and server configs. No default topology:
without the section FlopWatch is one Prometheus and alerts/ is what it evaluates.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from dataclasses import dataclass, field

#: The replica labels of a shard when the section names none: an HA pair.
DEFAULT_REPLICAS = ("a", "b")
#: The external label that tells a shard's replicas apart when the section names none.
DEFAULT_REPLICA_LABEL = "replica"
#: The external label that names a shard when the section names none.
DEFAULT_SHARD_LABEL = "shard"
#: The cluster every shard belongs to when the section names none.
DEFAULT_CLUSTER = "default"


@dataclass(frozen=True)
class Shard:
    #: The shard's external label (topology.shard_label); its servers' files are named after it.
    name: str
    #: Values of the replica label, one per identical Prometheus of the shard.
    replicas: tuple[str, ...] = DEFAULT_REPLICAS
    #: Declared size: a shard smaller than stragglers.vote_min_peers is refused (no peer group in it could vote).
    gpus: int | None = None


@dataclass(frozen=True)
class AlertmanagerPeer:
    #: Where Prometheus and vmalert send alerts, e.g. http://am-1:9093.
    url: str
    #: host:port of its gossip listener, e.g. am-1:9094.
    peer: str


@dataclass(frozen=True)
class GlobalTier:
    #: The remote-write endpoint, e.g. http://vminsert:8480/insert/0/prometheus/api/v1/write.
    write_url: str
    #: The Prometheus query API base, e.g. http://vmselect:8481/select/0/prometheus.
    read_url: str


@dataclass(frozen=True)
class Topology:
    shards: tuple[Shard, ...]
    #: YAML key `global` (a Python keyword).
    global_tier: GlobalTier = field(metadata={"yaml": "global"})
    alertmanagers: tuple[AlertmanagerPeer, ...]
    #: The external label that tells a shard's replicas apart (dropped from alerts and forwarded series).
    replica_label: str = DEFAULT_REPLICA_LABEL
    #: The cluster (one scheduler's fleet) the shards split: every shard carries it as its
    #: labels.cluster external label, so a job spanning shards is one job of one cluster on the
    #: global tier, as it is to the scheduler.
    cluster: str = DEFAULT_CLUSTER
    #: The external label that names each shard (kept on forwarded series, for drill-down).
    shard_label: str = DEFAULT_SHARD_LABEL

    def shard(self, name: str) -> Shard:
        """The shard called `name`; ValueError naming the shards there are."""
        for shard in self.shards:
            if shard.name == name:
                return shard
        raise ValueError(f"no shard {name!r} in the topology (shards: {', '.join(s.name for s in self.shards)})")


#: An empty remote-write request (snappy block of an empty WriteRequest: its length, 0): a remote-write
#: endpoint accepts it (2xx) and stores nothing; another path answers 400 or 404.
EMPTY_WRITE = b"\x00"
_WRITE_HEADERS = {"Content-Type": "application/x-protobuf", "Content-Encoding": "snappy",
                  "X-Prometheus-Remote-Write-Version": "0.1.0"}


def _probe(url: str, request: urllib.request.Request, timeout: float, what: str) -> str | None:
    """None when `request` (to `url` or a path under it) gets a 2xx answer; else one line naming
    `url` and what happened."""
    tried = f"{request.get_method()} {request.full_url.removeprefix(url)}".rstrip()
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            status = answer.status
    except urllib.error.HTTPError as error:
        status = error.code
    except (urllib.error.URLError, OSError) as error:
        return f"{what} {url} is unreachable ({getattr(error, 'reason', error)}; {tried})"
    return None if 200 <= status < 300 else f"{what} {url} answered HTTP {status} ({tried})"


def check(topology: Topology, *, timeout: float = 2.0, shard: str | None = None) -> list[str]:
    """One line per URL of the topology that does not answer as it must (empty: all reachable): the
    global write URL takes an empty remote-write request, the read URL answers a query, each
    Alertmanager is ready. With `shard`, only what that shard's Prometheus servers reach (the write
    URL and the Alertmanagers); an unknown shard is a ValueError."""
    if shard is not None:
        topology.shard(shard)
    tier = topology.global_tier
    probes = [(tier.write_url, urllib.request.Request(tier.write_url, data=EMPTY_WRITE, headers=_WRITE_HEADERS,
                                                      method="POST"), "global write URL")]
    if shard is None:
        probes.append((tier.read_url, urllib.request.Request(tier.read_url + "/api/v1/query?query=1"),
                       "global read URL"))
    probes += [(member.url, urllib.request.Request(member.url + "/-/ready"), "Alertmanager")
               for member in topology.alertmanagers]
    return [line for url, request, what in probes if (line := _probe(url, request, timeout, what))]

"""Lemon switches and cables: the fabric's switches and links with the most errors and flaps in the
window, beside the lemon nodes.

Per link (a NIC port and the leaf it plugs into, from the agents' topology info) the window's
InfiniBand errors and link downs; per switch the sums over its links, how many of its ports had
trouble, and the occasions the rules saw a fault shared by its ports (FlopWatchSwitchDegraded's
record). Without topology info the queries return nothing and the tables say so.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from flopwatch.catalog import fabric, nic
from flopwatch.report.fetch import Results
from flopwatch.report.incidents import runs
from flopwatch.report.model import Column, Table
from flopwatch.report.queries import IB_ERROR_COUNTERS, IB_ERRORS_PER_HOUR, Query, QueryBuilder, quote
from flopwatch.report.sections import cluster_name
from flopwatch.report.window import Grid

SHARED_FAULT = "switch_cause:flopwatch_fabric_shared_fault:priority"
TOP = 10
PORT = ("node", "device", "port", "switch", "level")
QUERY_NAMES = ("fabric_links", "fabric_link_errors", "fabric_link_flaps", "fabric_switch_faults")


@dataclass
class LemonLink:
    """One cable: a node's NIC port and the leaf switch at its other end."""

    cluster: str
    node: str
    device: str
    port: str
    switch: str
    level: str
    errors: float
    flaps: float


@dataclass
class LemonSwitch:
    cluster: str
    switch: str
    level: str
    errors: float = 0.0
    flaps: float = 0.0
    ports: set[tuple[str, str, str]] = field(default_factory=set)   # (node, device, port) with trouble
    occasions: int = 0              # separate stretches of a fault shared by its ports
    seconds: float = 0.0            # time with such a fault
    cause: str = ""                 # the strongest cause the rules named


@dataclass
class FabricLemons:
    """What the hardware section lists beside the lemon nodes; `seen` False: no topology info."""

    switches: list[LemonSwitch] = field(default_factory=list)
    links: list[LemonLink] = field(default_factory=list)
    seen: bool = False


def queries(promql: QueryBuilder) -> list[Query]:
    """Instant queries over the window (the topology's links; errors and link downs per link that
    had any) and one range query over the grid (the switches' shared faults)."""
    span, at = promql.span, promql.window.end
    on_port = promql.by("node", "device", "port")
    links = (f"max by ({promql.by(*PORT)}) (max_over_time({fabric.LINK_INFO.name}[{span}]))")

    def per_link(counter: str) -> str:
        """Links whose counter rose in the window (a healthy link is no row)."""
        return f"(sum by ({on_port}) ({counter}) > 0) * on ({on_port}) group_left (switch, level) {links}"

    return [
        Query("fabric_links", "links in the topology",
              f"count by ({promql.cluster_label}) (max_over_time({fabric.LINK_INFO.name}[{span}]))", at=at),
        Query("fabric_link_errors", "InfiniBand errors per link",
              per_link(f"increase({nic.ERRORS.name}{{counter=~{quote(IB_ERROR_COUNTERS)}}}[{span}])"), at=at),
        Query("fabric_link_flaps", "link downs per link", per_link(f"increase({nic.LINK_DOWNED.name}[{span}])"),
              at=at),
        Query("fabric_switch_faults", "switch faults",
              f"max by ({promql.by('switch', 'level', 'cause')}) (max_over_time({SHARED_FAULT}[{promql.bucket}]))",
              "range"),
    ]


def lemons(results: Results, grid: Grid, label: str) -> FabricLemons:
    """Switches with shared faults or trouble on two or more nodes' ports, and the troubled links (a
    link down, or more errors than the IBTA's 120 an hour allow over the window); each list worst
    first (shared faults, then flaps, then errors), at most TOP long."""
    keys = (label, *PORT)
    errors = results.vector("fabric_link_errors", *keys)
    flaps = results.vector("fabric_link_flaps", *keys)
    floor = IB_ERRORS_PER_HOUR * grid.n * grid.step / 3600   # the IBTA allowance over the window
    links, switches = [], {}
    for key in sorted(set(errors) | set(flaps)):
        cluster, node, device, port, switch, level = key
        link = LemonLink(cluster, node, device, port, switch, level, errors.get(key, 0.0), round(flaps.get(key, 0.0)))
        entry = switches.setdefault((cluster, switch), LemonSwitch(cluster, switch, level))
        entry.errors += link.errors
        entry.flaps += link.flaps
        if link.flaps > 0 or link.errors > floor:
            links.append(link)
            entry.ports.add((node, device, port))
    faults: dict[tuple[str, str, str], list[tuple[str, np.ndarray]]] = {}
    for (cluster, switch, level, cause), values in results.matrix("fabric_switch_faults", grid, label, "switch",
                                                                   "level", "cause").items():
        faults.setdefault((cluster, switch, level), []).append((cause, values))
    for (cluster, switch, level), by_cause in faults.items():
        entry = switches.setdefault((cluster, switch), LemonSwitch(cluster, switch, level))
        shown = np.logical_or.reduce([np.isfinite(values) for _, values in by_cause])
        stretches = runs(shown)
        entry.occasions = len(stretches)
        entry.seconds = sum(count for _, _, count in stretches) * grid.step
        # the strongest cause the rules named: each cause's record carries its rank as its value
        entry.cause = max(by_cause, key=lambda item: np.nanmax(item[1], initial=-np.inf))[0] if stretches else ""
    bad = [s for s in switches.values() if s.occasions or len({p[0] for p in s.ports}) >= 2]
    bad.sort(key=lambda s: (-s.occasions, -s.flaps, -s.errors, s.cluster, s.switch))
    links.sort(key=lambda ln: (-ln.flaps, -ln.errors, ln.cluster, ln.node, ln.device, ln.port))
    return FabricLemons(bad[:TOP], links[:TOP], seen=bool(results.vector("fabric_links", label)))


def tables(lemons: FabricLemons) -> list[Table]:
    """The lemon switches and cables tables of the hardware section (none without topology info)."""
    if not lemons.seen:
        return []
    switches, links = lemons.switches, lemons.links
    by_switch = Table("lemon_switches", "Lemon switches", [
        Column("cluster", "Cluster"), Column("switch", "Switch"), Column("level", "Level"),
        Column("occasions", "Switch faults", "int"), Column("degraded", "Time degraded", "duration"),
        Column("cause", "Cause"), Column("ports", "Ports with trouble", "int"), Column("nodes", "Nodes"),
        Column("flaps", "Link downs", "int"), Column("errors", "Port errors", "int"),
    ], empty="no switch had a fault shared by its ports or trouble on two nodes' ports (or no topology info)")
    for s in switches:
        nodes = sorted({p[0] for p in s.ports})
        by_switch.rows.append({
            "cluster": cluster_name(s.cluster), "switch": s.switch, "level": s.level, "occasions": s.occasions,
            "degraded": s.seconds, "cause": s.cause, "ports": len(s.ports), "nodes": ", ".join(nodes),
            "flaps": round(s.flaps), "errors": round(s.errors),
        })
    by_link = Table("lemon_cables", "Lemon cables", [
        Column("cluster", "Cluster"), Column("node", "Node"), Column("port", "Port"), Column("switch", "Switch"),
        Column("flaps", "Link downs", "int"), Column("errors", "Port errors", "int"),
    ], empty="no link went down or counted errors above the IBTA allowance (or no topology info)")
    for ln in links:
        by_link.rows.append({
            "cluster": cluster_name(ln.cluster), "node": ln.node, "port": f"{ln.device}/{ln.port}",
            "switch": f"{ln.switch} ({ln.level})", "flaps": round(ln.flaps), "errors": round(ln.errors),
        })
    return [by_switch, by_link]

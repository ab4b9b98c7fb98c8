"""The report's hardware section: XIDs by code, incidents by kind and one by one, lemon nodes."""

from __future__ import annotations

from dataclasses import dataclass, field

from flopwatch import xid as xid_table
from flopwatch.report.fabric import QUERY_NAMES as FABRIC_QUERIES
from flopwatch.report.fabric import FabricLemons
from flopwatch.report.fabric import tables as fabric_tables
from flopwatch.report.incidents import KIND_NAMES, Incident, Lemon
from flopwatch.report.model import Chart, Column, Figure, Section, Table
from flopwatch.report.sections import cluster_name, failed_notes

HARDWARE_KINDS = {kind: name for kind, name in KIND_NAMES.items() if kind != "straggler"}


def hardware(incidents: list[Incident], lemons: list[Lemon], errors: dict[str, str],
             fabric: FabricLemons | None = None) -> Section:
    section = Section("hardware", "Hardware incidents and lemon nodes",
                      intro="XIDs by code, lost GPUs, uncorrectable ECC errors, NVLink and InfiniBand error bursts "
                            "and PCIe downgrades. A lemon node had incidents on separate occasions (more than an "
                            "hour apart), stragglers included.")
    by_code = _xids_by_code(incidents)
    fabric = fabric or FabricLemons()
    section.tables = [_hardware_by_kind(incidents), by_code, _hardware_incidents(incidents), _lemon_nodes(lemons),
                      *fabric_tables(fabric)]
    if by_code.rows:
        section.charts.append(Chart("xids_by_code", "XID events by code", "bar", "int",
                                    bars=[(f"XID {r['xid']}", float(r["events"])) for r in by_code.rows]))
    section.figures = [Figure("Hardware incidents", len(incidents), "int"), Figure("Lemon nodes", len(lemons), "int")]
    if fabric.seen:
        section.figures.append(Figure("Lemon switches", len(fabric.switches), "int"))
    section.notes += failed_notes(errors, ("xid", "ecc", "lost", "nvlink_bad", "ib_bad", "ib_down", "pcie_bad",
                                           "lost_candidates", "nvlink_candidates", "ib_candidates",
                                           "pcie_candidates", "ecc_candidates", *FABRIC_QUERIES))
    return section


@dataclass
class XidTally:
    """One XID code's events and the GPUs and nodes that raised it."""

    events: float = 0.0
    gpus: set[tuple[str, str]] = field(default_factory=set)
    nodes: set[str] = field(default_factory=set)


def _known_xid(code: str) -> xid_table.Xid | None:
    return xid_table.TABLE.get(int(code)) if code.isdigit() else None


def _xids_by_code(incidents: list[Incident]) -> Table:
    tallies: dict[str, XidTally] = {}
    for i in incidents:
        if i.kind == "xid":
            tally = tallies.setdefault(i.code, XidTally())
            tally.events += i.count
            tally.gpus.add((i.node, i.gpu))
            tally.nodes.add(i.node)
    table = Table("xids_by_code", "XIDs by code", [
        Column("xid", "XID"), Column("meaning", "Meaning"), Column("severity", "Severity"),
        Column("events", "Events", "int"), Column("gpus", "GPUs", "int"), Column("nodes", "Nodes", "int"),
        Column("action", "What to do"),
    ], empty="no XID in this window")
    for code in sorted(tallies, key=lambda c: int(c) if c.isdigit() else 10**6):
        known, tally = _known_xid(code), tallies[code]
        table.rows.append({
            "xid": code, "meaning": known.meaning if known else "not in FlopWatch's table",
            "severity": known.severity if known else "", "events": tally.events,
            "gpus": len(tally.gpus), "nodes": len(tally.nodes),
            "action": known.action if known else xid_table.UNKNOWN_ACTION,
        })
    return table


def _hardware_by_kind(incidents: list[Incident]) -> Table:
    table = Table("hardware_by_kind", "Incidents by kind", [
        Column("kind", "Kind"), Column("incidents", "Incidents", "int"), Column("gpus", "GPUs or ports", "int"),
        Column("nodes", "Nodes", "int"),
    ])
    for kind, title in HARDWARE_KINDS.items():
        items = [i for i in incidents if i.kind == kind]
        table.rows.append({"kind": title, "incidents": len(items),
                           "gpus": len({(i.node, i.gpu, i.device) for i in items}),
                           "nodes": len({i.node for i in items})})
    return table


def _incident_detail(incident: Incident) -> str:
    if incident.kind == "xid":
        known = _known_xid(incident.code)
        return f"XID {incident.code} ×{int(incident.count)}" + (f": {known.meaning}" if known else "")
    if incident.kind == "ecc":
        return f"{int(incident.count)} uncorrectable error(s)"
    return incident.detail


def _hardware_incidents(incidents: list[Incident]) -> Table:
    table = Table("hardware_incidents", "Incidents", [
        Column("start", "When", "time"), Column("duration", "How long", "duration"), Column("cluster", "Cluster"),
        Column("kind", "Kind"), Column("node", "Node"), Column("gpu", "GPU / port"), Column("job_id", "Job"),
        Column("detail", "Detail"),
    ], empty="no hardware incident in this window")
    for i in incidents:
        table.rows.append({"start": i.start, "duration": i.seconds, "cluster": cluster_name(i.cluster),
                           "kind": HARDWARE_KINDS.get(i.kind, i.kind), "node": i.node, "gpu": i.gpu or i.device,
                           "job_id": i.job_id, "detail": _incident_detail(i)})
    return table


def _lemon_nodes(lemons: list[Lemon]) -> Table:
    table = Table("lemon_nodes", "Lemon nodes", [
        Column("cluster", "Cluster"), Column("node", "Node"), Column("occasions", "Occasions", "int"),
        Column("incidents", "Incidents"), Column("gpus", "GPUs"), Column("first", "First", "time"),
        Column("last", "Last", "time"),
    ], empty="no node had incidents on separate occasions")
    for lemon in lemons:
        table.rows.append({
            "cluster": cluster_name(lemon.cluster), "node": lemon.node, "occasions": lemon.occasions,
            "incidents": ", ".join(f"{HARDWARE_KINDS.get(k, k)} ×{n}" for k, n in sorted(lemon.kinds.items())),
            "gpus": ", ".join(lemon.gpus), "first": lemon.first, "last": lemon.last,
        })
    return table

"""Fabric: the switches of the topology and their ports' symptoms, grouped by level, so a fault
shared by many ports shows as one switch (the FlopWatchSwitchDegraded, FlopWatchUplinkDegraded and
FlopWatchSpineDegraded pages link here), and a switch's ports, errors, waits and link states one click below.

Reads the fabric records of alerts/flopwatch-fabric.yml; empty without topology info
(flopwatch_fabric_link_info from agents given topology.slurm or topology.rails).
"""

from __future__ import annotations

from grafana_foundation_sdk.models import dashboard as dm

from flopwatch.dashboards import common as c

UID = "flopwatch-fabric"
TITLE = "FlopWatch / Fabric"
SWITCH = 'level=~"$level", switch=~"$switch"'
PORTS = f'node_port:flopwatch_fabric_link_info:max{{{SWITCH}}}'
PORT = "{{switch}} {{node}} {{device}}/{{port}}"
SYMPTOMS = (("erroring", "Ports erroring", "symbol errors plus link error recoveries above 120/hour"),
            ("rate_degraded", "Ports below their rate", "a negotiated rate below 90% of the port's own "
             "highest of the last hour"),
            ("flapping", "Ports flapping", "a link down in the last 5 minutes"),
            ("xmit_wait", "Ports waiting to transmit", "transmit waits above 5x the fleet's typical busy port"))
ANY = "|".join(name for name, _, _ in SYMPTOMS)
CAUSES = {"0": ("healthy", c.GREEN), "1": ("congestion", c.YELLOW), "2": ("errors", c.RED),
          "3": ("flap", c.ORANGE), "4": ("rate", c.RED)}
PORT_STATES = {"1": ("DOWN", c.RED), "2": ("INIT", c.ORANGE), "3": ("ARMED", c.YELLOW),
               "4": ("ACTIVE", c.GREEN), "5": ("ACTIVE_DEFER", c.YELLOW)}


def on_ports(expr: str) -> str:
    """A per-port NIC expression restricted to the ports of the selected switches, with their switch."""
    return f"({expr}) * on (node, device, port) group_left (switch, level) {PORTS}"


def _variables() -> list:
    return [
        c.query_variable("level", "Level", "label_values(switch:flopwatch_fabric_uplink_info:max, level)",
                         "Switch tier: leaf (NIC ports plug into it), spine, core.", multi=True),
        c.query_variable("switch", "Switch", 'label_values(switch:flopwatch_fabric_ports:count{level=~"$level"}, '
                         "switch)", "Leaf switch of the topology (a rail's leaf in a rail-optimised fabric).",
                         multi=True),
    ]


def _switch_row(board: c.Board) -> None:
    board.row("Switches")
    table = (
        c.table_panel(
            "Switches and their ports' symptoms", "Every selected switch with its ports and nodes and the "
            "share of its ports erroring, below their rate, flapping and waiting to transmit now. A share of "
            "25% on at least 3 nodes is a switch fault (FlopWatchSwitchDegraded).", c.PERCENT,
            columns=["level", "switch"], width=24, height=9)
        .with_target(c.query(f"switch:flopwatch_fabric_ports:count{{{SWITCH}}}", ref="A", instant=True,
                             table_format=True))
        .with_target(c.query(f"switch:flopwatch_fabric_nodes:count{{{SWITCH}}}", ref="B", instant=True,
                             table_format=True))
    )
    table = c.value_column(c.value_column(table, "A", "Ports", c.COUNT), "B", "Nodes", c.COUNT)
    for ref, (name, title, _) in zip("CDEF", SYMPTOMS, strict=True):
        table = table.with_target(c.query(f"switch:flopwatch_fabric_ports_{name}:ratio{{{SWITCH}}}", ref=ref,
                                          instant=True, table_format=True))
        table = c.value_column(table, ref, title, c.PERCENT, (c.GREEN, ((0.1, c.ORANGE), (0.25, c.RED))))
    board.add(table.sort_by([c.sort_desc(SYMPTOMS[0][1])])
              .links(board.runbooks("FlopWatchSwitchDegraded", "FlopWatchUplinkDegraded")))
    board.add(
        c.state_timeline_panel(
            "Switch faults", "The cause FlopWatchSwitchDegraded names for each selected switch (the strongest "
            "symptom shared by >= 25% of its ports on >= 3 nodes), healthy otherwise.", c.COUNT, CAUSES,
            width=24, height=8)
        .links(board.runbooks("FlopWatchSwitchDegraded"))
        .with_target(c.query(
            f"max by (level, switch) (switch_cause:flopwatch_fabric_shared_fault:priority{{{SWITCH}}}) "
            f"or 0 * switch:flopwatch_fabric_ports:count{{{SWITCH}}}", "{{level}} {{switch}}")))
    board.add(*(
        c.timeseries_panel(
            f"{title} by switch", f"Share of each selected switch's ports with {meaning}, by level.",
            c.PERCENT, width=6, show_thresholds=True)
        .thresholds(c.thresholds(c.GREEN, (0.25, c.RED))).min(0).max(1)
        .with_target(c.query(f"switch:flopwatch_fabric_ports_{name}:ratio{{{SWITCH}}}", "{{level}} {{switch}}"))
        for name, title, meaning in SYMPTOMS))
    board.add(c.timeseries_panel(
        "Upper switches: their leaves' ports with a symptom", "For each spine (or core) switch, the mean "
        "share of its leaves' ports with any symptom: a spine fault lifts every leaf below it.", c.PERCENT,
        width=12, height=7).min(0)
        .with_target(c.query(
            f'avg by (parent) (max by (switch) ({{__name__=~"switch:flopwatch_fabric_ports_({ANY}):ratio"}}) '
            '* on (switch) group_right () switch:flopwatch_fabric_uplink_info:max{parent!=""})',
            "{{parent}}")))
    board.add(c.timeseries_panel(
        "Spines: share of their leaves with congested uplinks", "For each spine, the share of the leaves "
        "below it whose ports wait while jobs crossing them slow down (and jobs inside them do not). Most of "
        "one spine's leaves at once, and no other spine's as many, is the spine (FlopWatchSpineDegraded).",
        c.PERCENT, width=12, height=7, show_thresholds=True)
        .thresholds(c.thresholds(c.GREEN, (0.5, c.RED))).min(0).max(1)
        .links(board.runbooks("FlopWatchSpineDegraded", "FlopWatchUplinkDegraded"))
        .with_target(c.query(
            "(switch:flopwatch_fabric_leaves_uplink_congested:count or 0 * switch:flopwatch_fabric_leaves:count) "
            "/ switch:flopwatch_fabric_leaves:count", "{{switch}}")))


def _ports_row(board: c.Board) -> None:
    board.row("Ports of the selected switches")
    board.add(
        c.timeseries_panel(
            "Symbol errors per hour by port", "Symbol errors per hour of each port plugged into the selected "
            "switches, the ten highest; IBTA allows 120 (FlopWatchIbSymbolErrors).", c.PER_HOUR,
            show_thresholds=True)
        .thresholds(c.thresholds(c.GREEN, (120, c.RED)))
        .links(board.runbooks("FlopWatchIbSymbolErrors", "FlopWatchSwitchDegraded"))
        .with_target(c.query("topk(10, " + on_ports(
            'max by (node, device, port) (rate(flopwatch_nic_port_errors_total{counter="symbol_error"}'
            "[$__rate_interval])) * 3600") + ")", PORT)),
        c.timeseries_panel(
            "Transmit wait by port, over the fleet's typical port", "Each port's transmit waits over the "
            "median busy port's, the ten highest: above 5 it counts as waiting (congestion or a slow uplink).",
            c.COUNT, show_thresholds=True)
        .thresholds(c.thresholds(c.GREEN, (5, c.RED)))
        .links(board.runbooks("FlopWatchUplinkDegraded"))
        .with_target(c.query("topk(10, " + on_ports(
            "node_port:flopwatch_nic_xmit_wait:rate1m / on () group_left () fleet:flopwatch_nic_xmit_wait:median1m")
            + ")", PORT)),
        c.timeseries_panel(
            "Negotiated rate by port", "The ten slowest negotiated rates of the selected switches' ports: a "
            "switch training its ports at a lower rate shows as many at once.", c.BYTES_PER_SECOND)
        .with_target(c.query("bottomk(10, " + on_ports(
            "max by (node, device, port) (flopwatch_nic_port_rate_bytes_per_second)") + ")", PORT)),
        c.state_timeline_panel(
            "Port state", "Logical state of every port plugged into the selected switches: many DOWN or "
            "INIT at once under one switch is the switch.", c.COUNT, PORT_STATES)
        .links(board.runbooks("FlopWatchIbLinkFlapping"))
        .with_target(c.query(on_ports("max by (node, device, port) (flopwatch_nic_port_state)"), PORT)),
    )


def build(docs_url: str = c.DOCS_URL) -> dm.Dashboard:
    board = c.Board(UID, TITLE, "Switches of the fabric topology and their ports' errors, rates, waits and "
                    "link states, grouped by level.", _variables(), docs_url=docs_url)
    _switch_row(board)
    _ports_row(board)
    return board.build()

"""Network: InfiniBand/RoCE ports and NVLink, per rail, with error rates against the alert thresholds
and link state changes. Communication faults slow every rank of a job alike, so they show here (and
in the network alerts), not as one straggling rank.
"""

from __future__ import annotations

from grafana_foundation_sdk.models import dashboard as dm

from flopwatch.dashboards import common as c

UID = "flopwatch-network"
TITLE = "FlopWatch / Network"
NODE = 'node=~"$node"'
PORT = "{{node}} {{device}}/{{port}}"
PORT_STATES = {"1": ("DOWN", c.RED), "2": ("INIT", c.ORANGE), "3": ("ARMED", c.YELLOW),
               "4": ("ACTIVE", c.GREEN), "5": ("ACTIVE_DEFER", c.YELLOW)}


def _changes(metric: str) -> str:
    """State changes of each port: the `state` label changes with the value, so aggregate it away first."""
    return f"changes((max by (node, device, port) ({metric}{{{NODE}}}))[$__rate_interval:])"


def build(docs_url: str = c.DOCS_URL) -> dm.Dashboard:
    board = c.Board(UID, TITLE, "NIC and NVLink throughput per rail, error rates against their alert "
                    "thresholds, link state changes.", [c.node_variable()], docs_url=docs_url)

    _throughput(board)
    _errors(board)
    _link_state(board)
    return board.build()


def _throughput(board: c.Board) -> None:
    board.row("Throughput per rail")
    board.add(
        c.timeseries_panel(
            "InfiniBand throughput per rail", "Data bytes per second through each rail (NIC device) "
            "summed over the selected nodes, by direction. Rails of a healthy all-reduce carry about the "
            "same; a rail well below the others is slow or down on some node.", c.BYTES_PER_SECOND)
        .with_target(c.query(
            f"sum by (device, direction) (rate(flopwatch_nic_data_bytes_total{{{NODE}}}[$__rate_interval]))",
            "{{device}} {{direction}}")),
        c.timeseries_panel(
            "NVLink throughput per GPU", "NVLink bytes per second by GPU index (one rail each) summed over "
            "the selected nodes, by direction (dcgm-exporter: both directions together, direction total).",
            c.BYTES_PER_SECOND)
        .with_target(c.query(
            f"sum by (gpu, direction) (rate(flopwatch_gpu_nvlink_bytes_total{{{NODE}}}[$__rate_interval])) or "
            + c.dcgm_total("node_gpu:flopwatch_gpu_nvlink_bytes:rate1m", NODE,
                           "flopwatch_gpu_nvlink_bytes_total", "direction"),
            "GPU {{gpu}} {{direction}}")),
        c.timeseries_panel(
            "Busiest ports: transmit over negotiated rate", "The ten ports sending closest to their "
            "negotiated rate. Near 100% the link is the bottleneck.", c.PERCENT, show_thresholds=True)
        .thresholds(c.thresholds(c.GREEN, (0.9, c.ORANGE))).min(0)
        .with_target(c.query(
            f'topk(10, rate(flopwatch_nic_data_bytes_total{{{NODE}, direction="tx"}}[$__rate_interval]) '
            f"/ ignoring (direction) flopwatch_nic_port_rate_bytes_per_second{{{NODE}}})", PORT)),
        c.timeseries_panel(
            "Slowest negotiated port rates", "The ten ports with the lowest negotiated rate. A port "
            "trained below its peers (a bad cable or transceiver) halves the rail for every job on it.",
            c.BYTES_PER_SECOND)
        .with_target(c.query(f"bottomk(10, flopwatch_nic_port_rate_bytes_per_second{{{NODE}}})", PORT)),
    )


def _errors(board: c.Board) -> None:
    board.row("Errors against alert thresholds")
    board.add(
        c.timeseries_panel(
            "Symbol errors per hour", "The ten ports with the highest symbol-error rate, per hour. IBTA "
            "allows 120 an hour on a link: FlopWatchIbSymbolErrors tickets above that over 5 minutes.",
            c.PER_HOUR, show_thresholds=True)
        .thresholds(c.thresholds(c.GREEN, (120, c.RED)))
        .links(board.runbooks("FlopWatchIbSymbolErrors"))
        .with_target(c.query(
            f'topk(10, max by (node, device, port) (rate(flopwatch_nic_port_errors_total{{{NODE}, '
            f'counter="symbol_error"}}[$__rate_interval])) * 3600)', PORT)),
        c.timeseries_panel(
            "Link downs in the last 10 minutes", "Times each port's link went down in the 10 minutes before "
            "each point (the ten highest). One is a ticket (FlopWatchIbLinkDowned), two or more a flapping "
            "link and a page (FlopWatchIbLinkFlapping).", c.COUNT, show_thresholds=True)
        .thresholds(c.thresholds(c.GREEN, (0.5, c.ORANGE), (1.5, c.RED)))
        .links(board.runbooks("FlopWatchIbLinkDowned", "FlopWatchIbLinkFlapping"))
        .with_target(c.query(
            f"topk(10, max by (node, device, port) (increase(flopwatch_nic_link_downed_total{{{NODE}}}[10m])))",
            PORT)),
        c.timeseries_panel(
            "Other port errors", "The ten highest rates of the other IB port error counters (link error "
            "recovery, receive errors, discards, ...), by counter.", c.PER_SECOND)
        .with_target(c.query(
            f'topk(10, sum by (node, device, counter) (rate(flopwatch_nic_port_errors_total{{{NODE}, '
            f'counter!="symbol_error"}}[$__rate_interval])))', "{{node}} {{device}} {{counter}}")),
        c.timeseries_panel(
            "Transmit wait", "Ticks per second each port had data to send but no credit (port_xmit_wait), "
            "the ten highest: congestion or a slow peer downstream.", c.PER_SECOND)
        .with_target(c.query(
            f"topk(10, rate(flopwatch_nic_xmit_wait_total{{{NODE}}}[$__rate_interval]))", PORT)),
        c.timeseries_panel(
            "NVLink errors per GPU", "NVLink replay, recovery and CRC errors per second summed over each "
            "GPU's links over 1 minute, the ten highest. FlopWatchNvlinkErrors pages above 1/s for 30 s.", c.PER_SECOND,
            width=24, show_thresholds=True)
        .thresholds(c.thresholds(c.GREEN, (1, c.RED)))
        .links(board.runbooks("FlopWatchNvlinkErrors"))
        .with_target(c.query(
            f"topk(10, node_gpu:flopwatch_gpu_nvlink_errors:sum_rate1m{{{NODE}}})",
            "{{node}} GPU {{gpu}}")),
    )


def _link_state(board: c.Board) -> None:
    board.row("Link state")
    board.add(
        c.state_timeline_panel(
            "Port state", "Logical state of each port of the selected nodes: ACTIVE is up; DOWN, INIT or "
            "ARMED in the middle of a run is a link that dropped.", c.COUNT, PORT_STATES, width=16, height=10)
        .links(board.runbooks("FlopWatchIbLinkDowned", "FlopWatchIbLinkFlapping"))
        .with_target(c.query(f"max by (node, device, port) (flopwatch_nic_port_state{{{NODE}}})", PORT)),
        c.timeseries_panel(
            "Link state changes", "How often each port's logical or physical state changed in each "
            "interval, the ten highest: a flapping link changes every few minutes.", c.COUNT, width=8,
            height=10, bars=True)
        .with_target(c.query(
            f"topk(10, {_changes('flopwatch_nic_port_state')} + {_changes('flopwatch_nic_port_physical_state')})",
            PORT)),
    )

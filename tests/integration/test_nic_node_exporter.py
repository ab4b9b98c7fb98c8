"""Cross-check with a real peer: Debian's prometheus-node-exporter reads the same recorded sysfs tree.

InfiniBand hardware cannot run here, so both exporters read tests/fixtures/sysfs (the narrowest
seam). node_exporter is real and independent: every byte, packet and error count FlopWatch exports
must equal node_exporter's node_infiniband_* value for the same port (its node_infiniband_legacy_*
values where the kernel offers 64-bit counters_ext), and Ethernet link speeds must equal its
node_network_speed_bytes.
"""

from __future__ import annotations

import urllib.request
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from flopwatch.exporters.nic import NicCollector
from flopwatch.stack import NodeExporter

pytestmark = pytest.mark.integration

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "sysfs"

#: node_exporter's per-port counter -> FlopWatch's (metric, extra labels).
ERROR_PEERS = {
    "node_infiniband_symbol_error_total": "symbol_error",
    "node_infiniband_link_error_recovery_total": "link_error_recovery",
    "node_infiniband_port_errors_received_total": "port_rcv_errors",
    "node_infiniband_local_link_integrity_errors_total": "local_link_integrity_errors",
    "node_infiniband_excessive_buffer_overrun_errors_total": "excessive_buffer_overrun_errors",
    "node_infiniband_port_discards_transmitted_total": "port_xmit_discards",
    "node_infiniband_port_receive_remote_physical_errors_total": "port_rcv_remote_physical_errors",
    "node_infiniband_port_receive_switch_relay_errors_total": "port_rcv_switch_relay_errors",
    "node_infiniband_port_constraint_errors_transmitted_total": "port_xmit_constraint_errors",
    "node_infiniband_port_constraint_errors_received_total": "port_rcv_constraint_errors",
    "node_infiniband_vl15_dropped_total": "VL15_dropped",
}
TRAFFIC_PEERS = {  # (flopwatch metric, direction) -> node_exporter name (legacy name for counters_ext)
    ("flopwatch_nic_data_bytes_total", "tx"): "port_data_transmitted_bytes_total",
    ("flopwatch_nic_data_bytes_total", "rx"): "port_data_received_bytes_total",
    ("flopwatch_nic_packets_total", "tx"): "port_packets_transmitted_total",
    ("flopwatch_nic_packets_total", "rx"): "port_packets_received_total",
}
LEGACY = {
    "port_data_transmitted_bytes_total": "legacy_data_transmitted_bytes_total",
    "port_data_received_bytes_total": "legacy_data_received_bytes_total",
    "port_packets_transmitted_total": "legacy_packets_transmitted_total",
    "port_packets_received_total": "legacy_packets_received_total",
}

Key = tuple[str, frozenset]


def parse(text: str) -> dict[Key, float]:
    return {(sample.name, frozenset(sample.labels.items())): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def by_port(values: dict[Key, float], name: str) -> dict[tuple[str, str], float]:
    return {(labels["device"], labels["port"]): value
            for (sample, frozen), value in values.items() if sample == name
            for labels in [dict(frozen)]}


@pytest.fixture(scope="module")
def peer(tmp_path_factory) -> dict[Key, float]:
    procfs = tmp_path_factory.mktemp("procfs")  # neither collector reads /proc
    args = [f"--path.sysfs={FIXTURE}", f"--path.procfs={procfs}", "--collector.disable-defaults",
            "--collector.infiniband", "--collector.netclass"]
    with NodeExporter(extra_args=args) as exporter, \
            urllib.request.urlopen(exporter.url + "/metrics", timeout=10) as answer:
        values = parse(answer.read().decode())
    assert values, "node_exporter answered with no metrics"
    return values


@pytest.fixture(scope="module")
def ours() -> dict[Key, float]:
    collector = NicCollector("n1", str(FIXTURE))
    assert collector.update() == 0
    registry = CollectorRegistry()
    registry.register(collector)
    return parse(generate_latest(registry).decode())


def test_bytes_and_packets_equal_node_exporter(peer, ours):
    checked = 0
    for (metric, direction), peer_name in TRAFFIC_PEERS.items():
        mine = {(d, p): v for (n, f), v in ours.items() if n == metric
                for labels in [dict(f)] if labels["direction"] == direction
                for d, p in [(labels["device"], labels["port"])]}
        theirs = by_port(peer, "node_infiniband_" + peer_name)
        theirs.update(by_port(peer, "node_infiniband_" + LEGACY[peer_name]))  # 64-bit wins
        assert mine == theirs, f"{metric}{{direction={direction}}} differs from node_exporter's {peer_name}"
        checked += len(mine)
    assert checked >= 12  # mlx5_0 ports 1 and 2, mlx4_0 port 1; four counters each


def test_error_counters_equal_node_exporter(peer, ours):
    for peer_name, counter in ERROR_PEERS.items():
        mine = {(labels["device"], labels["port"]): value for (name, frozen), value in ours.items()
                if name == "flopwatch_nic_port_errors_total"
                for labels in [dict(frozen)] if labels["counter"] == counter}
        assert mine == by_port(peer, peer_name), f"{counter} differs from node_exporter's {peer_name}"
        assert mine, f"no {counter} series at all"
    assert by_port(ours, "flopwatch_nic_link_downed_total") == by_port(peer, "node_infiniband_link_downed_total")
    assert by_port(ours, "flopwatch_nic_xmit_wait_total") == \
        by_port(peer, "node_infiniband_port_transmit_wait_total")


def test_state_and_rate_equal_node_exporter(peer, ours):
    assert by_port(ours, "flopwatch_nic_port_rate_bytes_per_second") == \
        by_port(peer, "node_infiniband_rate_bytes_per_second")
    assert by_port(ours, "flopwatch_nic_port_state") == by_port(peer, "node_infiniband_state_id")
    assert by_port(ours, "flopwatch_nic_port_physical_state") == \
        by_port(peer, "node_infiniband_physical_state_id")


def test_ethernet_speed_equals_node_exporter(peer, ours):
    mine = {dict(f)["device"]: v for (n, f), v in ours.items()
            if n == "flopwatch_nic_net_speed_bytes_per_second"}
    theirs = {dict(f)["device"]: v for (n, f), v in peer.items() if n == "node_network_speed_bytes" and v > 0}
    assert mine == theirs
    assert len(mine) == 2

"""The NIC collector against recorded sysfs trees.

InfiniBand/RoCE hardware cannot run here: the seam is the sysfs tree itself. tests/fixtures/sysfs
holds a recorded tree (see its README): a ConnectX-7 IB HCA with two ports (mlx5_0), a ConnectX-3
on an old kernel with 64-bit counters in counters_ext (mlx4_0), a RoCE NIC whose standard counters
directory is empty but whose hw_counters are full (mlx5_2), and Ethernet interfaces.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from flopwatch.exporters.nic import NicCollector

FIXTURE = Path(__file__).parent / "fixtures" / "sysfs"
IB = FIXTURE / "class" / "infiniband"


def words(device: str, port: str, name: str, directory: str = "counters") -> int:
    return int((IB / device / "ports" / port / directory / name).read_text())


def registry_of(collector: NicCollector) -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(collector)
    return registry


def value(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, {"node": "n1", **labels})


@pytest.fixture
def fixture_registry() -> CollectorRegistry:
    collector = NicCollector("n1", str(FIXTURE))
    assert collector.update() == 0
    return registry_of(collector)


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A writable copy of the recorded tree, for tests that change it under the collector."""
    root = tmp_path / "sys"
    shutil.copytree(FIXTURE, root)
    return root


def test_ib_data_counters_are_words_times_four(fixture_registry):
    for port in ("1", "2"):
        assert value(fixture_registry, "flopwatch_nic_data_bytes_total", device="mlx5_0", port=port,
                     direction="tx") == words("mlx5_0", port, "port_xmit_data") * 4
        assert value(fixture_registry, "flopwatch_nic_data_bytes_total", device="mlx5_0", port=port,
                     direction="rx") == words("mlx5_0", port, "port_rcv_data") * 4
    assert value(fixture_registry, "flopwatch_nic_data_bytes_total", device="mlx5_0", port="1",
                 direction="tx") == 7_608_474_658_012
    assert value(fixture_registry, "flopwatch_nic_packets_total", device="mlx5_0", port="1",
                 direction="rx") == 5_128_771_320


def test_ib_errors_state_and_rate(fixture_registry):
    def errors(counter: str, port: str = "1") -> float | None:
        return value(fixture_registry, "flopwatch_nic_port_errors_total", device="mlx5_0", port=port,
                     counter=counter)

    assert errors("symbol_error") == 41
    assert errors("symbol_error", "2") == 65535
    assert errors("link_error_recovery") == 2
    assert errors("port_rcv_errors") == 3
    assert errors("port_xmit_discards") == 7
    assert errors("local_link_integrity_errors") == 0
    assert errors("excessive_buffer_overrun_errors") == 0
    assert value(fixture_registry, "flopwatch_nic_link_downed_total", device="mlx5_0", port="2") == 5
    assert value(fixture_registry, "flopwatch_nic_xmit_wait_total", device="mlx5_0", port="1") == 48_213_667
    assert value(fixture_registry, "flopwatch_nic_port_state", device="mlx5_0", port="1", state="ACTIVE") == 4
    assert value(fixture_registry, "flopwatch_nic_port_state", device="mlx5_0", port="2", state="DOWN") == 1
    assert value(fixture_registry, "flopwatch_nic_port_physical_state", device="mlx5_0", port="2",
                 state="Disabled") == 3
    assert value(fixture_registry, "flopwatch_nic_port_rate_bytes_per_second", device="mlx5_0",
                 port="1") == 400e9 / 8
    assert value(fixture_registry, "flopwatch_nic_info", device="mlx5_0", port="1", link_layer="InfiniBand",
                 firmware_version="28.39.1002", hca_type="MT4129", board_id="MT_0000000838") == 1


def test_64_bit_variants_preferred_over_saturated_32_bit_counters(fixture_registry):
    assert words("mlx4_0", "1", "port_xmit_data") == 2**32 - 1  # the fixture's saturated counter
    assert value(fixture_registry, "flopwatch_nic_data_bytes_total", device="mlx4_0", port="1",
                 direction="tx") == words("mlx4_0", "1", "port_xmit_data_64", "counters_ext") * 4
    assert value(fixture_registry, "flopwatch_nic_packets_total", device="mlx4_0", port="1",
                 direction="rx") == words("mlx4_0", "1", "port_rcv_packets_64", "counters_ext")


def test_roce_nic_with_empty_standard_counters_is_reported_as_such(fixture_registry):
    at = {"device": "mlx5_2", "port": "1"}
    assert value(fixture_registry, "flopwatch_nic_counters_available", **at) == 0
    assert value(fixture_registry, "flopwatch_nic_counters_available", device="mlx5_0", port="1") == 1
    for direction in ("tx", "rx"):  # absent, not zero
        assert value(fixture_registry, "flopwatch_nic_data_bytes_total", direction=direction, **at) is None
    assert value(fixture_registry, "flopwatch_nic_port_errors_total", counter="symbol_error", **at) is None
    assert value(fixture_registry, "flopwatch_nic_link_downed_total", **at) is None
    hw = {"np_ecn_marked_roce_packets": 181_904, "np_cnp_sent": 90_211, "rp_cnp_handled": 88_765,
          "out_of_sequence": 333, "local_ack_timeout_err": 17, "roce_slow_restart": 6}
    for counter, expected in hw.items():
        assert value(fixture_registry, "flopwatch_nic_hw_events_total", counter=counter, **at) == expected
    assert value(fixture_registry, "flopwatch_nic_hw_events_total", counter="lifespan", **at) is None
    assert value(fixture_registry, "flopwatch_nic_info", link_layer="Ethernet", firmware_version="22.36.1010",
                 hca_type="MT4125", board_id="MT_0000000359", **at) == 1


def test_ethernet_interfaces(fixture_registry):
    def net(name: str, device: str, **labels: str) -> float | None:
        return value(fixture_registry, name, device=device, **labels)

    assert net("flopwatch_nic_net_bytes_total", "ens1f0np0", direction="rx") == 73_221_904_118_302
    assert net("flopwatch_nic_net_bytes_total", "ens1f0np0", direction="tx") == 71_004_558_229_017
    assert net("flopwatch_nic_net_packets_total", "eno1", direction="tx") == 7_021_554
    assert net("flopwatch_nic_net_errors_total", "ens1f0np0", direction="rx") == 2
    assert net("flopwatch_nic_net_drops_total", "ens1f0np0", direction="rx") == 1_433
    assert net("flopwatch_nic_net_speed_bytes_per_second", "ens1f0np0") == 200_000 * 125_000
    assert net("flopwatch_nic_net_speed_bytes_per_second", "eno2") is None  # -1 while down
    assert net("flopwatch_nic_net_up", "eno1", operstate="up") == 1
    assert net("flopwatch_nic_net_up", "eno2", operstate="down") == 0
    assert net("flopwatch_nic_net_up", "lo", operstate="unknown") is None  # excluded by default


def test_missing_or_unreadable_file_skips_that_counter_and_counts_an_error(tree):
    collector = NicCollector("n1", str(tree))
    assert collector.update() == 0
    port = tree / "class" / "infiniband" / "mlx5_0" / "ports" / "1"
    (port / "counters" / "symbol_error").unlink()
    (port / "counters" / "port_rcv_errors").write_text("garbage\n")
    (port / "rate").unlink()
    assert collector.update() == 3
    registry = registry_of(collector)
    at = {"device": "mlx5_0", "port": "1"}
    assert value(registry, "flopwatch_nic_port_errors_total", counter="symbol_error", **at) is None
    assert value(registry, "flopwatch_nic_port_errors_total", counter="port_rcv_errors", **at) is None
    assert value(registry, "flopwatch_nic_port_rate_bytes_per_second", **at) is None
    assert value(registry, "flopwatch_nic_port_errors_total", counter="link_error_recovery", **at) == 2
    assert value(registry, "flopwatch_nic_data_bytes_total", direction="tx", **at) == 7_608_474_658_012
    stats = tree / "class" / "net" / "eno1" / "statistics"
    (stats / "rx_bytes").unlink()
    (stats / "rx_bytes").mkdir()  # unreadable as a file: EISDIR
    assert collector.update() == 4
    registry = registry_of(collector)
    assert value(registry, "flopwatch_nic_net_bytes_total", device="eno1", direction="rx") is None
    assert value(registry, "flopwatch_nic_net_bytes_total", device="eno1", direction="tx") == 2_114_009_871


def test_not_available_marker_is_absent_not_an_error(tree):
    port = tree / "class" / "infiniband" / "mlx5_0" / "ports" / "1"
    (port / "counters" / "port_xmit_wait").write_text("N/A (no PMA)\n")
    collector = NicCollector("n1", str(tree))
    assert collector.update() == 0
    assert value(registry_of(collector), "flopwatch_nic_xmit_wait_total", device="mlx5_0", port="1") is None


def test_nic_appearing_and_vanishing_at_run_time(tree):
    ib = tree / "class" / "infiniband"
    spare = tree.parent / "spare"
    shutil.move(ib / "mlx5_2", spare)
    collector = NicCollector("n1", str(tree))
    assert collector.update() == 0
    assert value(registry_of(collector), "flopwatch_nic_counters_available", device="mlx5_2", port="1") is None
    shutil.move(spare, ib / "mlx5_2")
    assert collector.update() == 0
    assert value(registry_of(collector), "flopwatch_nic_counters_available", device="mlx5_2", port="1") == 0
    shutil.rmtree(ib / "mlx5_0")
    shutil.rmtree(tree / "class" / "net" / "eno1")
    assert collector.update() == 0  # gone is not broken
    registry = registry_of(collector)
    assert value(registry, "flopwatch_nic_data_bytes_total", device="mlx5_0", port="1", direction="tx") is None
    assert value(registry, "flopwatch_nic_net_up", device="eno1", operstate="up") is None
    assert value(registry, "flopwatch_nic_data_bytes_total", device="mlx4_0", port="1", direction="tx") > 0


def test_machine_without_infiniband(tmp_path):
    shutil.copytree(FIXTURE / "class" / "net", tmp_path / "class" / "net")
    collector = NicCollector("n1", str(tmp_path))
    assert collector.update() == 0
    names = {family.name for family in collector.collect()}
    assert names == {"flopwatch_nic_net_up", "flopwatch_nic_net_speed_bytes_per_second",
                     "flopwatch_nic_net_bytes", "flopwatch_nic_net_packets", "flopwatch_nic_net_errors",
                     "flopwatch_nic_net_drops"}  # prometheus_client strips _total from counter names


def test_a_tree_laid_out_as_a_live_kernel_does(tmp_path):
    """On a live kernel class/net/* and class/infiniband/* are symlinks into devices/ (PCI
    functions, devices/virtual for lo and bridges). The recorded interfaces, placed that way
    with a container bridge and a veth beside them, read exactly as the plain fixture does, and
    the virtual interfaces stay out by default."""
    for kind, parent in (("net", "devices/pci0000:00/0000:00:03.0/net"), ("infiniband", "devices/pci0000:17")):
        for device in (FIXTURE / "class" / kind).iterdir():
            home = tmp_path / ("devices/virtual/net" if device.name == "lo" else parent) / device.name
            shutil.copytree(device, home)
            (tmp_path / "class" / kind).mkdir(parents=True, exist_ok=True)
            (tmp_path / "class" / kind / device.name).symlink_to(home)
    for virtual in ("docker0", "veth3f2a"):
        home = tmp_path / "devices/virtual/net" / virtual
        shutil.copytree(FIXTURE / "class/net/eno1", home)
        (tmp_path / "class/net" / virtual).symlink_to(home)
    (tmp_path / "devices/system").symlink_to(FIXTURE / "devices/system")
    live = NicCollector("n1", str(tmp_path))
    plain = NicCollector("n1", str(FIXTURE))
    assert live.update() == 0 and plain.update() == 0

    def samples(collector: NicCollector) -> dict:
        return {(s.name, tuple(sorted(s.labels.items()))): s.value
                for family in collector.collect() for s in family.samples}

    assert samples(live) == samples(plain)
    devices = {labels["device"] for _, pairs in samples(live) for labels in [dict(pairs)] if "device" in labels}
    assert devices == {"eno1", "eno2", "ens1f0np0", "mlx4_0", "mlx5_0", "mlx5_2"}

"""The NIC collector: RDMA ports (InfiniBand, RoCE) and Ethernet interfaces from sysfs.

Cross-node stragglers are usually the network, so every port's bytes, packets, error counters,
state and rate are exported on the agent's clock. The sysfs root is configurable
(`--sysfs-root`), so the same code runs against recorded trees in tests. A NIC appearing or
vanishing at run time is picked up or dropped on the next cycle. A file that cannot be read skips
that counter and counts an error (`flopwatch_collector_errors_total{collector="nic"}`) every
cycle, and so does a counter file missing from a port that showed it before; a file the kernel
never offered (an older driver) is simply absent.

Sample output (abridged):

    flopwatch_nic_info{node="n1",device="mlx5_0",port="1",link_layer="InfiniBand",...} 1.0
    flopwatch_nic_port_state{node="n1",device="mlx5_0",port="1",state="ACTIVE"} 4.0
    flopwatch_nic_port_rate_bytes_per_second{node="n1",device="mlx5_0",port="1"} 5e+10
    flopwatch_nic_data_bytes_total{node="n1",device="mlx5_0",port="1",direction="tx"} 7.6e+12
    flopwatch_nic_port_errors_total{node="n1",device="mlx5_0",port="1",counter="symbol_error"} 41.0
    flopwatch_nic_counters_available{node="n1",device="mlx5_2",port="1"} 0.0
    flopwatch_nic_hw_events_total{node="n1",device="mlx5_2",port="1",counter="np_cnp_sent"} 90211.0
    flopwatch_nic_net_bytes_total{node="n1",device="eno1",direction="rx"} 8.8e+09
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

from prometheus_client.core import Metric as Family

from flopwatch.catalog import nic as m
from flopwatch.config import DEFAULT_NET_EXCLUDE
from flopwatch.exporters.nic_sysfs import SysfsReader, SysfsScan

log = logging.getLogger(__name__)


class NicCollector:
    """prometheus_client custom collector: `update()` reads sysfs, `collect()` only renders."""

    name = "nic"

    def __init__(self, node: str, sysfs_root: str = "/sys", net_exclude: str = DEFAULT_NET_EXCLUDE) -> None:
        self.node = node
        self.reader = SysfsReader(sysfs_root, net_exclude)
        self._scan = SysfsScan()
        self._known: dict[tuple[str, str], frozenset[str]] = {}  # counter files each port has shown
        self._devices: set[str] = set()
        self._warned: set[str] = set()

    def update(self) -> int:
        scan = self.reader.scan()
        known: dict[tuple[str, str], frozenset[str]] = {}
        for key, files in scan.counter_files.items():
            known[key] = self._known.get(key, frozenset()) | files
            for name in sorted(known[key] - files):
                scan.problem(f"{key[0]} port {key[1]}: counter file {name} is missing")
        self._known = known  # a port that vanished forgets its counters
        self._log_changes(scan)
        for problem in scan.problems:
            if problem not in self._warned:  # say it once; the error counter keeps counting
                self._warned.add(problem)
                log.warning("nic: %s", problem)
        self._scan = scan
        return scan.errors

    def _log_changes(self, scan: SysfsScan) -> None:
        devices = {p.device for p in scan.ports} | {f"net:{n.device}" for n in scan.nets}
        if self._devices or scan.ports or scan.nets:
            for device in sorted(devices - self._devices):
                log.info("nic: %s appeared", device.removeprefix("net:"))
            for device in sorted(self._devices - devices):
                log.info("nic: %s vanished", device.removeprefix("net:"))
        self._devices = devices

    @property
    def last_scan(self) -> SysfsScan:
        """The last update's reading (the fabric collector maps these ports to their leaf)."""
        return self._scan

    def close(self) -> None:
        pass

    def collect(self) -> Iterator[Family]:
        scan, node = self._scan, self.node
        metrics = (m.INFO, m.COUNTERS_AVAILABLE, m.PORT_STATE, m.PORT_PHYSICAL_STATE, m.PORT_RATE, m.DATA,
                   m.PACKETS, m.ERRORS, m.LINK_DOWNED, m.XMIT_WAIT, m.HW_COUNTERS, m.NET_UP, m.NET_SPEED,
                   m.NET_BYTES, m.NET_PACKETS, m.NET_ERRORS, m.NET_DROPS)
        fams = {metric: metric.family() for metric in metrics}

        def put(metric: m.Metric, labels: list[str], value: float | None) -> None:
            if value is not None:
                fams[metric].add_metric([node, *labels], value)

        for p in scan.ports:
            at = [p.device, p.port]
            put(m.INFO, [*at, p.link_layer, p.firmware_version, p.hca_type, p.board_id], 1)
            put(m.COUNTERS_AVAILABLE, at, 1 if p.counters_available else 0)
            if p.state is not None:
                put(m.PORT_STATE, [*at, p.state[1]], p.state[0])
            if p.physical_state is not None:
                put(m.PORT_PHYSICAL_STATE, [*at, p.physical_state[1]], p.physical_state[0])
            put(m.PORT_RATE, at, p.rate_bytes)
            for direction, value in sorted(p.data.items()):
                put(m.DATA, [*at, direction], value)
            for direction, value in sorted(p.packets.items()):
                put(m.PACKETS, [*at, direction], value)
            for counter, value in sorted(p.errors.items()):
                put(m.ERRORS, [*at, counter], value)
            put(m.LINK_DOWNED, at, p.link_downed)
            put(m.XMIT_WAIT, at, p.xmit_wait)
            for counter, value in sorted(p.hw.items()):
                put(m.HW_COUNTERS, [*at, counter], value)
        for n in scan.nets:
            put(m.NET_UP, [n.device, n.operstate], 1 if n.operstate == "up" else 0)
            put(m.NET_SPEED, [n.device], n.speed_bytes)
            for metric, kind in ((m.NET_BYTES, "bytes"), (m.NET_PACKETS, "packets"),
                                 (m.NET_ERRORS, "errors"), (m.NET_DROPS, "dropped")):
                for direction in ("rx", "tx"):
                    put(metric, [n.device, direction], n.stats.get(f"{direction}_{kind}"))
        yield from (family for family in fams.values() if family.samples)

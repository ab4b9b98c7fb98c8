"""Reading RDMA ports and Ethernet interfaces from a sysfs tree (live /sys or a recorded copy).

Kept apart from the collector so the parsing rules can be tested against recorded trees and
benchmarked alone. What the kernel does not offer is left out; what it should offer but cannot be
read counts as an error in `SysfsScan.errors` with a one-line reason in `problems`.

Rules (Documentation/ABI/stable/sysfs-class-infiniband):
- port_xmit_data/port_rcv_data count 4-byte words: multiplied by 4. A `_64` variant (the
  pre-4.5 `counters_ext/` directory, or `counters/*_64`) is preferred over the 32-bit counter,
  which saturates at 2^32-1 on old kernels.
- `rate` reads like "400 Gb/sec (4X NDR)": Gb/s x 125,000,000 = bytes per second.
- `state`/`phys_state` read like "4: ACTIVE": the number and the kernel's word.
- A counter reading "N/A (no PMA)" is not available (absent, not an error).
- `hw_counters/lifespan` is the driver's cache time in ms, not a counter: skipped.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

#: Error counters exported under flopwatch_nic_port_errors_total{counter=<file name>}.
ERROR_COUNTERS = (
    "symbol_error", "link_error_recovery", "port_rcv_errors", "local_link_integrity_errors",
    "excessive_buffer_overrun_errors", "port_xmit_discards", "port_rcv_remote_physical_errors",
    "port_rcv_switch_relay_errors", "port_xmit_constraint_errors", "port_rcv_constraint_errors",
    "VL15_dropped",
)
#: (flopwatch direction, base counter name) for data and packets.
DATA_COUNTERS = (("tx", "port_xmit_data"), ("rx", "port_rcv_data"))
PACKET_COUNTERS = (("tx", "port_xmit_packets"), ("rx", "port_rcv_packets"))
HW_COUNTERS_SKIPPED = frozenset({"lifespan"})
NET_STATISTICS = ("rx_bytes", "tx_bytes", "rx_packets", "tx_packets", "rx_errors", "tx_errors",
                  "rx_dropped", "tx_dropped")
NOT_AVAILABLE = "N/A"
GBIT_TO_BYTES = 125_000_000
MBIT_TO_BYTES = 125_000
READ_SIZE = 4096  # every sysfs attribute fits in one page


@dataclass
class PortReading:
    device: str
    port: str
    link_layer: str = ""
    firmware_version: str = ""
    hca_type: str = ""
    board_id: str = ""
    state: tuple[int, str] | None = None
    physical_state: tuple[int, str] | None = None
    rate_bytes: float | None = None
    counters_available: bool = False
    data: dict[str, float] = field(default_factory=dict)      # direction -> bytes
    packets: dict[str, float] = field(default_factory=dict)   # direction -> packets
    errors: dict[str, float] = field(default_factory=dict)    # counter file -> count
    link_downed: float | None = None
    xmit_wait: float | None = None
    hw: dict[str, float] = field(default_factory=dict)        # hw_counters file -> count


@dataclass
class NetReading:
    device: str
    operstate: str
    speed_bytes: float | None = None
    stats: dict[str, float] = field(default_factory=dict)     # statistics file -> value


@dataclass
class SysfsScan:
    ports: list[PortReading] = field(default_factory=list)
    nets: list[NetReading] = field(default_factory=list)
    errors: int = 0
    problems: list[str] = field(default_factory=list)
    #: (device, port) -> counter files seen this scan, so the collector notices one vanishing.
    counter_files: dict[tuple[str, str], frozenset[str]] = field(default_factory=dict)

    def problem(self, message: str) -> None:
        self.errors += 1
        self.problems.append(message)


class Unavailable(Exception):
    """The file holds the kernel's 'N/A' marker: the counter is not offered, not broken."""


def read_text(path: str) -> str:
    """One small sysfs file, stripped. os.open/os.read: a buffered file object costs 2x more."""
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.read(fd, READ_SIZE).decode("ascii", "replace").strip()
    finally:
        os.close(fd)


def read_counter(path: str) -> float:
    """An integer counter file; raises OSError, ValueError or Unavailable."""
    text = read_text(path)
    if text.startswith(NOT_AVAILABLE):
        raise Unavailable(text)
    return float(int(text.split()[0], 0))


def parse_state(text: str) -> tuple[int, str]:
    number, sep, word = text.partition(":")
    if not sep:
        raise ValueError(f"expected 'N: WORD', got {text!r}")
    return int(number.strip()), word.strip()


def parse_rate(text: str) -> float:
    value, _, unit = text.partition(" ")
    if not unit.startswith("Gb/sec"):
        raise ValueError(f"expected 'N Gb/sec (...)', got {text!r}")
    return float(value) * GBIT_TO_BYTES


def _listdir(path: str) -> list[str] | None:
    """Entries without dot-files, or None when the directory is absent."""
    try:
        return sorted(name for name in os.listdir(path) if not name.startswith("."))
    except (FileNotFoundError, NotADirectoryError):
        return None


class SysfsReader:
    """Scans `<root>/class/infiniband` and `<root>/class/net` once per call to `scan()`."""

    def __init__(self, root: str, net_exclude: str = "") -> None:
        self.root = root
        self.ib_root = os.path.join(root, "class", "infiniband")
        self.net_root = os.path.join(root, "class", "net")
        self.net_exclude = re.compile(net_exclude) if net_exclude else None

    def scan(self) -> SysfsScan:
        scan = SysfsScan()
        for device in _listdir(self.ib_root) or ():
            self._scan_device(scan, device)
        for name in _listdir(self.net_root) or ():
            if self.net_exclude is None or not self.net_exclude.fullmatch(name):
                self._scan_net(scan, name)
        return scan

    # -- RDMA -----------------------------------------------------------------------------------
    def _scan_device(self, scan: SysfsScan, device: str) -> None:
        base = os.path.join(self.ib_root, device)
        local = SysfsScan()
        info = {name: self._optional_text(base, name) for name in ("fw_ver", "hca_type", "board_id")}
        ports = _listdir(os.path.join(base, "ports"))
        if ports is None:
            local.problem(f"{device}: no ports directory")
        readings = []
        for port in ports or ():
            if port.isdigit():
                reading = PortReading(device, port, firmware_version=info["fw_ver"],
                                      hca_type=info["hca_type"], board_id=info["board_id"])
                self._scan_port(local, reading, os.path.join(base, "ports", port))
                readings.append(reading)
        if local.errors and not os.path.isdir(base):
            return  # the device vanished while we read it: not an error, it is simply gone
        scan.ports += readings
        scan.errors += local.errors
        scan.problems += local.problems
        scan.counter_files.update(local.counter_files)

    @staticmethod
    def _optional_text(base: str, name: str) -> str:
        try:
            return read_text(os.path.join(base, name))
        except OSError:
            return ""

    def _scan_port(self, scan: SysfsScan, port: PortReading, path: str) -> None:
        where = f"{port.device} port {port.port}"
        port.link_layer = self._optional_text(path, "link_layer")
        for name, parse, attr in (("state", parse_state, "state"),
                                  ("phys_state", parse_state, "physical_state"),
                                  ("rate", parse_rate, "rate_bytes")):
            try:
                setattr(port, attr, parse(read_text(os.path.join(path, name))))
            except (OSError, ValueError) as error:
                scan.problem(f"{where}: cannot read {name}: {_reason(error)}")
        listed: set[str] = set()
        counters = self._read_dir(scan, where, path, "counters", listed)
        extended = self._read_dir(scan, where, path, "counters_ext", listed)
        hw = self._read_dir(scan, where, path, "hw_counters", listed, skip=HW_COUNTERS_SKIPPED)
        scan.counter_files[(port.device, port.port)] = frozenset(listed)
        port.counters_available = bool(counters or extended)
        for direction, base in DATA_COUNTERS:
            words = _first(base, extended, counters)
            if words is not None:
                port.data[direction] = words * 4
        for direction, base in PACKET_COUNTERS:
            packets = _first(base, extended, counters)
            if packets is not None:
                port.packets[direction] = packets
        port.errors = {name: counters[name] for name in ERROR_COUNTERS if name in counters}
        port.link_downed = counters.get("link_downed")
        port.xmit_wait = counters.get("port_xmit_wait")
        port.hw = hw

    @staticmethod
    def _read_dir(scan: SysfsScan, where: str, port_path: str, directory: str, listed: set[str], *,
                  skip: frozenset[str] = frozenset()) -> dict[str, float]:
        """Counter files of one directory; every listed name is added to `listed`."""
        values: dict[str, float] = {}
        path = os.path.join(port_path, directory)
        for name in _listdir(path) or ():
            if name in skip:
                continue
            listed.add(f"{directory}/{name}")
            try:
                values[name] = read_counter(os.path.join(path, name))
            except Unavailable:
                continue
            except (OSError, ValueError) as error:
                scan.problem(f"{where}: cannot read {directory}/{name}: {_reason(error)}")
        return values

    # -- Ethernet -------------------------------------------------------------------------------
    def _scan_net(self, scan: SysfsScan, name: str) -> None:
        base = os.path.join(self.net_root, name)
        local = SysfsScan()
        try:
            operstate = read_text(os.path.join(base, "operstate"))
        except OSError as error:
            local.problem(f"{name}: cannot read operstate: {_reason(error)}")
            operstate = "unknown"
        reading = NetReading(name, operstate)
        try:
            speed = int(read_text(os.path.join(base, "speed")))
            reading.speed_bytes = speed * MBIT_TO_BYTES if speed > 0 else None
        except (OSError, ValueError):
            pass  # EINVAL while the link is down, absent on virtual devices: no speed to report
        for stat in NET_STATISTICS:
            try:
                reading.stats[stat] = read_counter(os.path.join(base, "statistics", stat))
            except (OSError, ValueError, Unavailable) as error:
                local.problem(f"{name}: cannot read statistics/{stat}: {_reason(error)}")
        if local.errors and not os.path.isdir(base):
            return  # the interface vanished mid-read
        scan.nets.append(reading)
        scan.errors += local.errors
        scan.problems += local.problems


def _first(base: str, extended: dict[str, float], counters: dict[str, float]) -> float | None:
    for source, name in ((extended, base + "_64"), (counters, base + "_64"), (counters, base)):
        if name in source:
            return source[name]
    return None


def _reason(error: Exception) -> str:
    if isinstance(error, OSError):
        return error.strerror or type(error).__name__
    return str(error) or type(error).__name__

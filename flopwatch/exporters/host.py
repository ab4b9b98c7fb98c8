"""The host collector: the few host figures that corroborate a GPU straggler.

node_exporter remains the general host exporter. This collector adds only what the straggler
rules and reports need per GPU job without a cross-exporter join: CPU busy and steal per NUMA node
(the cores that feed a GPU), available memory, pressure stall (PSI) where the kernel has it, and
how many processes run on the GPUs.

Sources: `<procfs>/stat` per CPU (parsed here because psutil's per-CPU list drops CPU numbers, and
NUMA grouping needs them when a CPU is offline), `<sysfs>/devices/system/node/node*/cpulist` for
the NUMA layout, psutil for memory, `<procfs>/pressure/{cpu,memory,io}` for PSI, and the same PID
seam as job attribution for processes on GPUs. Both roots are configurable so tests run against
recorded trees.

Sample output:

    flopwatch_host_cpu_seconds_total{node="n1",numa_node="0",mode="busy"} 81234.5
    flopwatch_host_cpu_seconds_total{node="n1",numa_node="0",mode="steal"} 12.3
    flopwatch_host_cpus{node="n1",numa_node="0"} 64.0
    flopwatch_host_memory_available_bytes{node="n1"} 1.7e+12
    flopwatch_host_pressure_stalled_seconds_total{node="n1",resource="cpu",kind="some"} 33.2
    flopwatch_host_gpu_processes{node="n1"} 8.0
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import psutil
from prometheus_client.core import Metric as Family

from flopwatch.catalog import host as m
from flopwatch.exporters.attribution import GpuProcesses

log = logging.getLogger(__name__)

BUSY_FIELDS = (0, 1, 2, 5, 6)  # user, nice, system, irq, softirq in /proc/stat order
IDLE, IOWAIT, STEAL = 3, 4, 7
PSI_RESOURCES = ("cpu", "memory", "io")
MICROSECONDS = 1e-6
ALL = "all"

_PSUTIL_ROOT_LOCK = threading.Lock()


@contextlib.contextmanager
def psutil_procfs(root: str) -> Iterator[None]:
    """Point psutil at another procfs for the duration (its root is a module global)."""
    if root == "/proc":
        yield
        return
    with _PSUTIL_ROOT_LOCK:
        saved, psutil.PROCFS_PATH = psutil.PROCFS_PATH, root
        try:
            yield
        finally:
            psutil.PROCFS_PATH = saved


def parse_cpulist(text: str) -> list[int]:
    """'0-3,8,10-11' -> [0, 1, 2, 3, 8, 10, 11]."""
    cpus: list[int] = []
    for part in text.strip().split(","):
        if not part:
            continue
        low, _, high = part.partition("-")
        cpus += range(int(low), int(high or low) + 1)
    return cpus


def parse_stat(text: str, ticks_per_second: float) -> dict[int, tuple[float, float, float, float]]:
    """CPU number -> (busy, steal, iowait, idle) seconds from /proc/stat."""
    out: dict[int, tuple[float, float, float, float]] = {}
    for line in text.splitlines():
        if not line.startswith("cpu") or line.startswith("cpu "):
            continue
        name, *values = line.split()
        ticks = [int(v) for v in values] + [0] * (8 - len(values))
        out[int(name[3:])] = (sum(ticks[i] for i in BUSY_FIELDS) / ticks_per_second,
                              ticks[STEAL] / ticks_per_second, ticks[IOWAIT] / ticks_per_second,
                              ticks[IDLE] / ticks_per_second)
    return out


def parse_pressure(text: str) -> dict[str, float]:
    """'some avg10=.. total=123' lines -> {'some': seconds, 'full': seconds}."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        kind, *pairs = line.split()
        values = dict(pair.split("=", 1) for pair in pairs if "=" in pair)
        if "total" in values:
            out[kind] = int(values["total"]) * MICROSECONDS
    return out


@dataclass
class HostReading:
    cpu: dict[str, dict[str, float]] = field(default_factory=dict)   # numa node -> mode -> seconds
    cpus: dict[str, int] = field(default_factory=dict)
    memory_total: float | None = None
    memory_available: float | None = None
    pressure: dict[tuple[str, str], float] = field(default_factory=dict)
    gpu_processes: int | None = None


class HostCollector:
    """prometheus_client custom collector: `update()` reads /proc and /sys, `collect()` renders."""

    name = "host"

    def __init__(self, node: str, procfs_root: str = "/proc", sysfs_root: str = "/sys",
                 gpu_processes: Callable[[], Sequence[GpuProcesses]] | None = None) -> None:
        self.node = node
        self.procfs_root = procfs_root
        self.sysfs_root = sysfs_root
        self.gpu_processes = gpu_processes
        self.ticks_per_second = float(os.sysconf("SC_CLK_TCK"))
        self._reading = HostReading()
        self._warned: set[str] = set()

    def update(self) -> int:
        reading, errors = HostReading(), 0
        for step in (self._read_cpu, self._read_memory, self._read_pressure, self._read_gpu_processes):
            try:
                step(reading)
            except (OSError, ValueError, KeyError) as error:
                errors += 1
                self._warn_once(f"host: {step.__name__.removeprefix('_read_')}: {error}")
        self._reading = reading
        return errors

    def _warn_once(self, message: str) -> None:
        if message not in self._warned:
            self._warned.add(message)
            log.warning("%s", message)

    def numa_nodes(self) -> dict[int, str]:
        """CPU number -> NUMA node name; empty where sysfs shows no NUMA topology."""
        base = os.path.join(self.sysfs_root, "devices", "system", "node")
        layout: dict[int, str] = {}
        try:
            names = [n for n in os.listdir(base) if n.startswith("node") and n[4:].isdigit()]
        except OSError:
            return layout
        for name in names:
            try:
                with open(os.path.join(base, name, "cpulist")) as handle:
                    for cpu in parse_cpulist(handle.read()):
                        layout[cpu] = name[4:]
            except (OSError, ValueError):
                continue
        return layout

    def _read_cpu(self, reading: HostReading) -> None:
        with open(os.path.join(self.procfs_root, "stat")) as handle:
            per_cpu = parse_stat(handle.read(), self.ticks_per_second)
        layout = self.numa_nodes()
        for cpu, (busy, steal, iowait, idle) in sorted(per_cpu.items()):
            group = layout.get(cpu, ALL) if layout else ALL
            modes = reading.cpu.setdefault(group, {"busy": 0.0, "steal": 0.0, "iowait": 0.0, "idle": 0.0})
            modes["busy"] += busy
            modes["steal"] += steal
            modes["iowait"] += iowait
            modes["idle"] += idle
            reading.cpus[group] = reading.cpus.get(group, 0) + 1

    def _read_memory(self, reading: HostReading) -> None:
        with psutil_procfs(self.procfs_root):
            memory = psutil.virtual_memory()
        reading.memory_total, reading.memory_available = float(memory.total), float(memory.available)

    def _read_pressure(self, reading: HostReading) -> None:
        for resource in PSI_RESOURCES:
            try:
                with open(os.path.join(self.procfs_root, "pressure", resource)) as handle:
                    text = handle.read()
            except OSError:
                continue  # no PSI on this kernel (absent) or disabled (EOPNOTSUPP): not an error
            for kind, seconds in parse_pressure(text).items():
                reading.pressure[(resource, kind)] = seconds

    def _read_gpu_processes(self, reading: HostReading) -> None:
        if self.gpu_processes is None:
            return
        gpus = self.gpu_processes()
        known = [gpu.pids for gpu in gpus if gpu.pids is not None]
        if known:
            reading.gpu_processes = len({pid for pids in known for pid in pids})

    def close(self) -> None:
        pass

    def collect(self) -> Iterator[Family]:
        r, node = self._reading, self.node
        cpu, cpus, total, available, pressure, gpu = (
            m.CPU_SECONDS.family(), m.CPUS.family(), m.MEMORY_TOTAL.family(), m.MEMORY_AVAILABLE.family(),
            m.PRESSURE_STALLED.family(), m.GPU_PROCESSES.family())
        for group in sorted(r.cpu, key=lambda g: (len(g), g)):
            for mode, seconds in r.cpu[group].items():
                cpu.add_metric([node, group, mode], seconds)
            cpus.add_metric([node, group], r.cpus[group])
        if r.memory_total is not None:
            total.add_metric([node], r.memory_total)
        if r.memory_available is not None:
            available.add_metric([node], r.memory_available)
        for (resource, kind), seconds in sorted(r.pressure.items()):
            pressure.add_metric([node, resource, kind], seconds)
        if r.gpu_processes is not None:
            gpu.add_metric([node], r.gpu_processes)
        yield from (family for family in (cpu, cpus, total, available, pressure, gpu) if family.samples)

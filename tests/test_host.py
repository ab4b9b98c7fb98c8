"""The host collector against recorded /proc and /sys trees, and once against this machine's own.

The recorded trees (tests/fixtures/procfs, tests/fixtures/sysfs/devices/system/node) hold four
CPUs in two NUMA nodes with CPU 2 offline; GPU PIDs come through the same seam as attribution.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import psutil
import pytest
from prometheus_client import CollectorRegistry

from flopwatch.exporters.attribution import GpuProcesses
from flopwatch.exporters.host import HostCollector, parse_cpulist, parse_pressure

FIXTURES = Path(__file__).parent / "fixtures"
PROCFS, SYSFS = FIXTURES / "procfs", FIXTURES / "sysfs"
TICKS = float(os.sysconf("SC_CLK_TCK"))


def registry_of(collector: HostCollector) -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(collector)
    return registry


def value(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, {"node": "n1", **labels})


def test_cpu_per_numa_node_by_cpu_number():
    collector = HostCollector("n1", str(PROCFS), str(SYSFS))
    assert collector.update() == 0
    registry = registry_of(collector)

    def cpu(numa: str, mode: str) -> float | None:
        return value(registry, "flopwatch_host_cpu_seconds_total", numa_node=numa, mode=mode)

    # cpu0 + cpu1: user+nice+system+irq+softirq; cpu3 alone in node 1 (cpu2 is offline)
    assert cpu("0", "busy") == pytest.approx((1393 + 50 + 347 + 5 + 40 + 1512 + 40 + 360 + 10 + 30) / TICKS)
    assert cpu("0", "steal") == pytest.approx((11 + 12) / TICKS)
    assert cpu("1", "busy") == pytest.approx((1800 + 60 + 413 + 10 + 30) / TICKS)
    assert cpu("1", "iowait") == pytest.approx(155 / TICKS)
    assert cpu("1", "idle") == pytest.approx(8492 / TICKS)
    assert value(registry, "flopwatch_host_cpus", numa_node="0") == 2
    assert value(registry, "flopwatch_host_cpus", numa_node="1") == 1


def test_memory_and_pressure():
    collector = HostCollector("n1", str(PROCFS), str(SYSFS))
    collector.update()
    registry = registry_of(collector)
    assert value(registry, "flopwatch_host_memory_total_bytes") == 2113464320 * 1024
    assert value(registry, "flopwatch_host_memory_available_bytes") == 1700000000 * 1024
    assert psutil.PROCFS_PATH == "/proc"  # the fixture root did not leak into psutil
    stalled = "flopwatch_host_pressure_stalled_seconds_total"
    assert value(registry, stalled, resource="cpu", kind="some") == pytest.approx(33.2)
    assert value(registry, stalled, resource="cpu", kind="full") == 0
    assert value(registry, stalled, resource="memory", kind="full") == pytest.approx(0.75)
    assert value(registry, stalled, resource="io", kind="some") == pytest.approx(9.0)


def test_no_psi_and_no_numa(tmp_path):
    procfs = tmp_path / "proc"
    shutil.copytree(PROCFS, procfs)
    shutil.rmtree(procfs / "pressure")
    collector = HostCollector("n1", str(procfs), str(tmp_path / "sys-without-numa"))
    assert collector.update() == 0  # a kernel without PSI is not an error
    registry = registry_of(collector)
    assert value(registry, "flopwatch_host_pressure_stalled_seconds_total", resource="cpu", kind="some") is None
    assert value(registry, "flopwatch_host_cpus", numa_node="all") == 3


def test_unreadable_stat_counts_an_error_and_the_rest_flows(tmp_path):
    procfs = tmp_path / "proc"
    shutil.copytree(PROCFS, procfs)
    (procfs / "stat").unlink()
    collector = HostCollector("n1", str(procfs), str(SYSFS))
    assert collector.update() == 1
    registry = registry_of(collector)
    assert value(registry, "flopwatch_host_cpus", numa_node="0") is None
    assert value(registry, "flopwatch_host_memory_total_bytes") == 2113464320 * 1024


def test_processes_on_gpus_are_counted_once():
    gpus = [GpuProcesses(0, None, (10, 11)), GpuProcesses(1, None, (11, 12)), GpuProcesses(2, None, None)]
    collector = HostCollector("n1", str(PROCFS), str(SYSFS), gpu_processes=lambda: gpus)
    collector.update()
    assert value(registry_of(collector), "flopwatch_host_gpu_processes") == 3
    unknown = HostCollector("n1", str(PROCFS), str(SYSFS), gpu_processes=lambda: [GpuProcesses(0)])
    unknown.update()
    assert value(registry_of(unknown), "flopwatch_host_gpu_processes") is None  # unknown, not 0


def test_this_machine():
    collector = HostCollector("n1")
    assert collector.update() == 0
    registry = registry_of(collector)
    groups = {s.labels["numa_node"]: s.value for f in collector.collect() if f.name == "flopwatch_host_cpus"
              for s in f.samples}
    assert sum(groups.values()) == psutil.cpu_count()
    busy = sum(value(registry, "flopwatch_host_cpu_seconds_total", numa_node=g, mode="busy") for g in groups)
    assert busy > 0
    assert 0 < value(registry, "flopwatch_host_memory_available_bytes") <= psutil.virtual_memory().total


def test_parsers():
    assert parse_cpulist("0-3,8,10-11\n") == [0, 1, 2, 3, 8, 10, 11]
    assert parse_cpulist("") == []
    assert parse_pressure("some avg10=0.00 avg60=0.00 avg300=0.00 total=2500000\n") == {"some": 2.5}

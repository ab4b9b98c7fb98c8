"""Cost of one NIC, host and attribution collection, as ratios to references measured in the same run.

A typical 8-rail GPU node is laid out as a sysfs tree in a temporary directory: eight ConnectX-7
ports copied from tests/fixtures/sysfs (mlx5_0 port 1, with its counters and hw_counters) plus
the fixture's RoCE NIC, old-kernel HCA and Ethernet interfaces. Then, interleaved round by round
so machine noise hits all alike:

- FlopWatch: `NicCollector.update()` plus rendering its families (what the agent pays per cycle);
- floor: a Python loop that only os.open/os.read/os.close-s every file under the tree (no
  listing, no parsing): what any Python reader of these files must pay;
- node_exporter 1.5 (Debian) with only its infiniband and netclass collectors over the same tree:
  its own `node_scrape_collector_duration_seconds`, read from each scrape.

Attribution: eight real processes with Slurm variables, one per GPU, read through the real /proc
(`AttributionCollector.update()`), against the floor of reading their eight environ files.
Host: `HostCollector.update()` on the real /proc and /sys, against psutil.cpu_times(percpu=True)
plus psutil.virtual_memory().

    .venv/bin/python -m bench.nic_collection [--rounds 300]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import psutil
from prometheus_client.parser import text_string_to_metric_families

from flopwatch.exporters.attribution import AttributionCollector, GpuProcesses
from flopwatch.exporters.host import HostCollector
from flopwatch.exporters.nic import NicCollector
from flopwatch.stack import NodeExporter

FIXTURE = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "sysfs"
RAILS = 8


def build_tree(root: Path) -> int:
    """An 8-rail node's sysfs under root; returns the number of files."""
    shutil.copytree(FIXTURE / "class", root / "class")
    ib = root / "class" / "infiniband"
    template = ib / "mlx5_0"
    for rail in range(1, RAILS + 2):  # mlx5_1..mlx5_9, skipping the fixture's RoCE mlx5_2
        name = f"mlx5_{rail}"
        if name != "mlx5_2" and not (ib / name).exists():
            shutil.copytree(template, ib / name)
            shutil.rmtree(ib / name / "ports" / "2")
    shutil.rmtree(template / "ports" / "2")
    return sum(len(files) for _, _, files in os.walk(root))


def files_under(root: Path) -> list[str]:
    return [os.path.join(d, f) for d, _, files in os.walk(root) for f in files]


def median_ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1e3


def timed(fn: Callable[[], object]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def node_exporter_seconds(url: str) -> float:
    with urllib.request.urlopen(url, timeout=10) as answer:
        text = answer.read().decode()
    total = 0.0
    for family in text_string_to_metric_families(text):
        if family.name == "node_scrape_collector_duration_seconds":
            total += sum(s.value for s in family.samples if s.labels["collector"] in ("infiniband", "netclass"))
    return total


def nic_bench(rounds: int) -> None:
    with tempfile.TemporaryDirectory(prefix="flopwatch-bench-sysfs-") as tmp:
        root = Path(tmp)
        count = build_tree(root)
        paths = files_under(root / "class")
        collector = NicCollector("bench", str(root))

        def flopwatch() -> None:
            collector.update()
            list(collector.collect())

        def floor() -> None:
            for path in paths:
                fd = os.open(path, os.O_RDONLY)
                os.read(fd, 4096)
                os.close(fd)

        args = [f"--path.sysfs={root}", f"--path.procfs={root}", "--collector.disable-defaults",
                "--collector.infiniband", "--collector.netclass"]
        ours, raw, peer = [], [], []
        with NodeExporter(extra_args=args) as exporter:
            url = exporter.url + "/metrics"
            for _ in range(20):  # warm up all three
                flopwatch(), floor(), node_exporter_seconds(url)
            for _ in range(rounds):
                ours.append(timed(flopwatch))
                raw.append(timed(floor))
                peer.append(node_exporter_seconds(url))
        ports = sum(1 for p in collector._scan.ports)
        series = sum(len(f.samples) for f in collector.collect())
        print(f"NIC: {RAILS + 3} RDMA devices / {ports} ports + {len(collector._scan.nets)} Ethernet "
              f"interfaces, {count} files, {series} series, {rounds} rounds")
        row("FlopWatch NicCollector update + render", ours)
        row("floor: os.open+read+close every file", raw)
        row("node_exporter 1.5 infiniband+netclass", peer)
        print(f"  ratio FlopWatch / floor: {median_ms(ours) / median_ms(raw):.2f}")
        print(f"  ratio FlopWatch / node_exporter: {median_ms(ours) / median_ms(peer):.2f}")


def attribution_bench(rounds: int) -> None:
    env = {**os.environ, "SLURM_JOB_ID": "424242", "SLURM_JOB_USER": "bench"}
    children = [subprocess.Popen([sys.executable, "-c", "import time; print(1, flush=True); time.sleep(600)"],
                                 env=env, stdout=subprocess.PIPE) for _ in range(RAILS)]
    try:
        for child in children:
            child.stdout.readline()  # exec'd: /proc/<pid>/environ is the child's own now
        gpus = [GpuProcesses(i, f"GPU-{i}", (child.pid,)) for i, child in enumerate(children)]
        collector = AttributionCollector("bench", lambda: gpus, mapping_dir=None)
        paths = [f"/proc/{child.pid}/environ" for child in children]

        def floor() -> None:
            for path in paths:
                fd = os.open(path, os.O_RDONLY)
                os.read(fd, 1 << 16)
                os.close(fd)

        ours, raw = [], []
        for _ in range(20):
            collector.update(), floor()
        for _ in range(rounds):
            ours.append(timed(collector.update))
            raw.append(timed(floor))
        assert len(collector.claims()) == RAILS
        print(f"Attribution: {RAILS} GPUs, one real process each, via /proc/<pid>/environ, {rounds} rounds")
        row("FlopWatch AttributionCollector.update", ours)
        row("floor: read the 8 environ files", raw)
        print(f"  ratio FlopWatch / floor: {median_ms(ours) / median_ms(raw):.2f}")
    finally:
        for child in children:
            child.kill()
            child.wait()


def host_bench(rounds: int) -> None:
    collector = HostCollector("bench")

    def reference() -> None:
        psutil.cpu_times(percpu=True)
        psutil.virtual_memory()

    ours, ref = [], []
    for _ in range(20):
        collector.update(), reference()
    for _ in range(rounds):
        ours.append(timed(collector.update))
        ref.append(timed(reference))
    print(f"Host: this machine ({psutil.cpu_count()} CPUs), {rounds} rounds")
    row("FlopWatch HostCollector.update", ours)
    row("psutil cpu_times(percpu) + virtual_memory", ref)
    print(f"  ratio FlopWatch / psutil: {median_ms(ours) / median_ms(ref):.2f}")


def row(label: str, samples: list[float]) -> None:
    ordered = sorted(samples)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    print(f"  {label:<42} median {median_ms(samples):7.3f} ms   p99 {p99 * 1e3:7.3f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=300)
    args = parser.parse_args()
    print(f"load average at start: {os.getloadavg()[0]:.2f}")
    nic_bench(args.rounds)
    attribution_bench(args.rounds)
    host_bench(args.rounds)


if __name__ == "__main__":
    main()

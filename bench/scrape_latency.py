"""Scrape latency and idle CPU of the node agent, against Debian's node_exporter on the same machine.

The agent (`flopwatch agent`, simulated 8x H100 SXM with per-link NVLink, 1 s interval) serves
bytes it rendered on its own clock; node_exporter collects on every scrape. Both are scraped
sequentially and interleaved by the same keep-alive HTTP client, so machine noise hits both alike,
and the agent's figures are reported as ratios to node_exporter's. Then the agent sits unscraped
for a while and its CPU time (psutil, all threads) gives its idle cost as % of one core; that idle
rate, taken out of the agent's CPU time during the scrapes, leaves its CPU cost per scrape.

The targets: agent median <= 0.2x node_exporter's median while exposing at least as many
series; agent CPU <= 1% of one core at a 1 s interval.

    .venv/bin/python -m bench.scrape_latency [--scrapes 1000] [--cpu-seconds 60] [--json OUT]
"""

from __future__ import annotations

import argparse
import datetime
import http.client
import json
import os
import platform
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil

from flopwatch.stack import AgentProcess, MissingBinary, NodeExporter, ServerError

GPUS = 8
MODEL = "H100-SXM"
MEDIAN_RATIO_TARGET = 0.2
CPU_TARGET_PERCENT = 1.0


class Scraper:
    """One keep-alive HTTP/1.1 connection, used the same way for both targets."""

    def __init__(self, port: int) -> None:
        self.connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        self.latencies: list[float] = []
        self.body = b""

    def scrape(self) -> None:
        started = time.perf_counter()
        self.connection.request("GET", "/metrics")
        answer = self.connection.getresponse()
        body = answer.read()
        elapsed = time.perf_counter() - started
        if answer.status != 200:
            raise RuntimeError(f"scrape answered HTTP {answer.status}")
        self.latencies.append(elapsed)
        self.body = body

    def close(self) -> None:
        self.connection.close()


@dataclass
class TargetFigures:
    median_ms: float
    p99_ms: float
    series: int
    body_bytes: int
    cpu_ms_per_scrape: float


@dataclass
class Figures:
    date: str
    machine: str
    command: str
    scrapes: int
    agent: TargetFigures
    node_exporter: TargetFigures
    median_ratio: float
    p99_ratio: float
    agent_series_per_gpu: float
    agent_idle_cpu_percent: float
    cpu_seconds: float
    interval_s: float


def series_count(body: bytes) -> int:
    return sum(1 for line in body.splitlines() if line and not line.startswith(b"#"))


def per_gpu_series(body: bytes) -> float:
    return sum(1 for line in body.splitlines() if b'gpu="' in line and not line.startswith(b"#")) / GPUS


def cpu_seconds(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    return f"{cpu}, {psutil.cpu_count()} cores (load {load} at start), Python {platform.python_version()}"


def measure(scrapes: int, cpu_window: float, interval: float) -> Figures:
    started_at = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    host = machine()
    with AgentProcess(node="bench-node", model=MODEL, interval=interval, extra=["--log-level", "warning"]) as agent, \
            NodeExporter() as node:
        assert agent.proc is not None and node.proc is not None
        agent_ps, node_ps = psutil.Process(agent.proc.pid), psutil.Process(node.proc.pid)
        time.sleep(2 * interval)  # a few collection cycles: the agent's exposition is complete
        clients = {"agent": Scraper(agent.port), "node_exporter": Scraper(node.port)}
        try:
            for _ in range(min(50, scrapes)):  # warm up both (connections, caches, Go's GC)
                for client in clients.values():
                    client.scrape()
            for client in clients.values():
                client.latencies.clear()

            # Scrapes, interleaved so noise from the shared machine hits both targets alike.
            cpu_start = {"agent": cpu_seconds(agent_ps), "node_exporter": cpu_seconds(node_ps)}
            wall_start = time.monotonic()
            for _ in range(scrapes):
                clients["agent"].scrape()
                clients["node_exporter"].scrape()
            wall = time.monotonic() - wall_start
            spent = {
                "agent": cpu_seconds(agent_ps) - cpu_start["agent"],
                "node_exporter": cpu_seconds(node_ps) - cpu_start["node_exporter"],
            }
        finally:
            for client in clients.values():
                client.close()

        # Idle: nothing scrapes the agent any more, it only collects on its clock.
        time.sleep(interval)
        cpu_before, wall_before = cpu_seconds(agent_ps), time.monotonic()
        time.sleep(cpu_window)
        idle_wall = time.monotonic() - wall_before
        idle_rate = (cpu_seconds(agent_ps) - cpu_before) / idle_wall
        spent["agent"] -= idle_rate * wall  # what the scrapes cost beyond collecting

    def figures(name: str) -> TargetFigures:
        client = clients[name]
        return TargetFigures(
            median_ms=statistics.median(client.latencies) * 1e3,
            p99_ms=quantile(client.latencies, 0.99) * 1e3,
            series=series_count(client.body),
            body_bytes=len(client.body),
            cpu_ms_per_scrape=max(0.0, spent[name]) / scrapes * 1e3,
        )

    agent_fig, node_fig = figures("agent"), figures("node_exporter")
    return Figures(
        date=started_at,
        machine=host,
        command=" ".join([".venv/bin/python -m bench.scrape_latency", *sys.argv[1:]]).strip(),
        scrapes=scrapes,
        agent=agent_fig,
        node_exporter=node_fig,
        median_ratio=agent_fig.median_ms / node_fig.median_ms,
        p99_ratio=agent_fig.p99_ms / node_fig.p99_ms,
        agent_series_per_gpu=per_gpu_series(clients["agent"].body),
        agent_idle_cpu_percent=100 * idle_rate,
        cpu_seconds=idle_wall,
        interval_s=interval,
    )


def verdict(met: bool) -> str:
    return "met" if met else "**MISSED**"


def table(f: Figures) -> str:
    a, n = f.agent, f.node_exporter
    series_ok = a.series >= n.series
    return "\n".join(
        [
            f"{f.date} · {f.machine}",
            f"`{f.command}` · {f.scrapes} sequential scrapes of each, interleaved, one keep-alive client",
            "",
            "| | flopwatch agent (sim, 8x H100, per-link NVLink) | node_exporter 1.5 | agent / node_exporter |",
            "|---|---:|---:|---:|",
            f"| median scrape latency | {a.median_ms:.3f} ms | {n.median_ms:.3f} ms | {f.median_ratio:.3f} |",
            f"| p99 scrape latency | {a.p99_ms:.3f} ms | {n.p99_ms:.3f} ms | {f.p99_ratio:.3f} |",
            f"| series exposed | {a.series} ({f.agent_series_per_gpu:.0f} per GPU) | {n.series} | "
            f"{a.series / n.series:.2f} |",
            f"| body size | {a.body_bytes / 1024:.0f} KiB | {n.body_bytes / 1024:.0f} KiB | "
            f"{a.body_bytes / n.body_bytes:.2f} |",
            f"| CPU per scrape | {a.cpu_ms_per_scrape:.3f} ms | {n.cpu_ms_per_scrape:.3f} ms | "
            f"{a.cpu_ms_per_scrape / n.cpu_ms_per_scrape if n.cpu_ms_per_scrape else float('nan'):.3f} |",
            f"| agent CPU, unscraped, {f.interval_s:g} s interval, {f.cpu_seconds:.0f} s | "
            f"{f.agent_idle_cpu_percent:.2f}% of one core | | |",
            "",
            "| target | measured | verdict |",
            "|---|---|---|",
            f"| agent median <= {MEDIAN_RATIO_TARGET}x node_exporter's | {f.median_ratio:.3f}x | "
            f"{verdict(f.median_ratio <= MEDIAN_RATIO_TARGET)} |",
            f"| agent series >= node_exporter's | {a.series} vs {n.series} | {verdict(series_ok)} |",
            f"| agent CPU <= {CPU_TARGET_PERCENT:g}% of one core at 1 s | {f.agent_idle_cpu_percent:.2f}% | "
            f"{verdict(f.agent_idle_cpu_percent <= CPU_TARGET_PERCENT)} |",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.scrape_latency", description=__doc__.split("\n")[0])
    parser.add_argument("--scrapes", type=int, default=1000, help="scrapes of each target (default 1000)")
    parser.add_argument(
        "--cpu-seconds", type=float, default=60.0, help="how long to watch the unscraped agent's CPU (default 60)"
    )
    parser.add_argument("--interval", type=float, default=1.0, help="agent collection interval (default 1)")
    parser.add_argument("--json", metavar="OUT", help="also write the figures as JSON to OUT")
    args = parser.parse_args(argv)
    if args.scrapes < 1 or args.cpu_seconds <= 0:
        parser.error("--scrapes must be at least 1 and --cpu-seconds positive")
    try:
        figures = measure(args.scrapes, args.cpu_seconds, args.interval)
    except (MissingBinary, ServerError) as error:
        print(f"bench.scrape_latency: {error}", file=sys.stderr)
        return 1
    except (OSError, http.client.HTTPException, RuntimeError) as error:
        print(f"bench.scrape_latency: a scrape failed: {error}", file=sys.stderr)
        return 1
    except psutil.NoSuchProcess as error:
        print(f"bench.scrape_latency: a measured server died during the run (pid {error.pid})", file=sys.stderr)
        return 1
    print(table(figures))
    if args.json:
        Path(args.json).write_text(json.dumps(asdict(figures), indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

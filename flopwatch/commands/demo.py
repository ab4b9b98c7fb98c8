"""`flopwatch demo`: a simulated GPU node, a real Prometheus scraping it, live figures from PromQL.

Everything runs on loopback and stops on Ctrl-C or at the end of --duration, leaving no process.
"""

from __future__ import annotations

import argparse
import time

from rich.console import Console
from rich.live import Live
from rich.table import Table

from flopwatch import config as cfg
from flopwatch.cli import RuntimeFailure
from flopwatch.commands.agent import build_agent
from flopwatch.promql import PromClient, PromError
from flopwatch.stack import Prometheus, ServerError
from flopwatch.stack.servers import scrape_job

#: Column title -> PromQL per GPU. Telemetry-only MFU estimate: tensor activity x clock ratio.
PANEL_QUERIES = {
    "SM clock (MHz)": "flopwatch_gpu_sm_clock_hertz / 1e6",
    "power (W)": "flopwatch_gpu_power_watts",
    "temp (°C)": "flopwatch_gpu_temperature_celsius",
    "tensor active": "flopwatch_gpu_tensor_active_ratio",
    "MFU est.": "flopwatch_gpu_tensor_active_ratio * flopwatch_gpu_sm_clock_hertz"
                " / flopwatch_gpu_sm_clock_max_hertz",
    "NVLink GB/s": "sum by (node, gpu) (rate(flopwatch_gpu_nvlink_bytes_total[5s])) / 1e9",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--duration", type=float, default=120.0, metavar="SECONDS",
                        help="stop after this long (default 120; 0 runs until Ctrl-C)")
    parser.add_argument("--gpus", type=int, default=8, help="simulated GPUs (default 8)")
    parser.add_argument("--model", default="H100-SXM", help="simulated GPU model (default H100-SXM)")


def table(client: PromClient, gpus: int) -> Table:
    view = Table(title="FlopWatch demo: live per-GPU figures from PromQL")
    view.add_column("GPU", justify="right")
    for title in PANEL_QUERIES:
        view.add_column(title, justify="right")
    values: dict[str, dict[str, float]] = {}
    for title, expr in PANEL_QUERIES.items():
        for sample in client.query(expr):
            values.setdefault(sample.labels.get("gpu", "?"), {})[title] = sample.value
    for gpu in sorted(values, key=lambda g: int(g) if g.isdigit() else -1)[:gpus]:
        row = values[gpu]
        view.add_row(gpu, *(f"{row[t]:.2f}" if t in row else "-" for t in PANEL_QUERIES))
    return view


def run(args: argparse.Namespace) -> int:
    config = cfg.load(overrides={"backend": "sim", "sim.gpus": args.gpus, "sim.model": args.model,
                                 "interval": 1, "node": "demo-node-0"})
    console = Console(stderr=True)
    agent = build_agent(config)
    agent.collect_once()
    host, port = agent.serve("127.0.0.1", 0)
    import threading

    stop = threading.Event()
    collector = threading.Thread(target=agent.run, args=(config.interval, stop), daemon=True)
    collector.start()
    prometheus = Prometheus([scrape_job("flopwatch", [f"{host}:{port}"])])
    try:
        try:
            prometheus.start()
        except ServerError as error:
            raise RuntimeFailure(str(error)) from None
        client = PromClient(prometheus.url)
        console.print(f"agent http://{host}:{port}/metrics, Prometheus {prometheus.url}")
        deadline = time.monotonic() + args.duration if args.duration > 0 else float("inf")
        with Live(console=console, refresh_per_second=1) as live:
            while time.monotonic() < deadline:
                try:
                    live.update(table(client, args.gpus))
                except PromError as error:
                    raise RuntimeFailure(str(error)) from None
                time.sleep(min(2.0, max(0.0, deadline - time.monotonic())))
        console.print("demo finished: everything stopped.")
        return 0
    finally:
        stop.set()
        collector.join(timeout=5)
        prometheus.stop()
        if agent.http is not None:
            agent.http.stop()
        agent.close()

"""How many simulated nodes one simulator process serves at a 5 s scrape interval with a real
Prometheus scraping them all, and how fast history exports.

    .venv/bin/python -m bench.sim_capacity --nodes 1250 --seconds 120 --json out.json

Reports, for the measurement window after every target is up: the simulator's tick cost against
the interval, CPU (% of one core) and resident memory of the simulator and of Prometheus, failed
scrapes, series and ingestion rate from Prometheus's own metrics; then history export speed in
samples per second and as a multiple of wall-clock.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import psutil

from bench.fleet_prometheus import scraped_fleet
from flopwatch.sim import history
from flopwatch.sim.fleet import Fleet
from flopwatch.sim.scenario import Scenario, parse
from flopwatch.sim.serve import FleetServer

MODEL_8B = {"params": 8e9, "layers": 32, "heads": 32, "head_dim": 128, "seq_len": 8192}
MODEL_70B = {"params": 70e9, "layers": 80, "heads": 64, "head_dim": 128, "seq_len": 4096}


def fleet_scenario(nodes: int, interval: float = 5.0, job_nodes: int = 128) -> Scenario:
    """One job per `job_nodes` nodes (1,024 GPUs by default; alternating 70B and 8B models); a
    remainder stays idle (a fleet smaller than one job: one 8B job on every node)."""
    jobs = []
    for i, first in enumerate(range(0, nodes - job_nodes + 1, job_nodes)):
        model = MODEL_70B if i % 2 == 0 else MODEL_8B
        jobs.append({"id": f"job-{i:03d}", "nodes": f"{first}-{first + job_nodes - 1}", "model": model,
                     "tokens_per_step": 4194304, "target_mfu": 0.42, "step_jitter": 0.02})
    if not jobs:
        jobs.append({"id": "job-000", "nodes": f"0-{nodes - 1}", "model": MODEL_8B, "tokens_per_step": 1048576,
                     "target_mfu": 0.42})
    return parse({"name": f"capacity-{nodes}", "seed": 1, "duration": "1d", "scrape_interval": f"{interval:g}s",
                  "fleet": {"nodes": nodes, "gpus_per_node": 8, "gpu_model": "H100-SXM", "nics_per_node": 8},
                  "jobs": jobs,
                  "faults": [{"kind": "thermal_throttle", "node": 17 % nodes, "gpu": 3, "start": "0s"}]})


def cpu_seconds(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system


def serve_capacity(nodes: int, seconds: float) -> dict[str, float]:
    scenario = fleet_scenario(nodes)
    with scraped_fleet(scenario, evaluation_interval="5s", up_within=180, query_timeout=60) as scraped:
        server, prom, client = scraped.server, scraped.prometheus, scraped.client
        time.sleep(15)  # let the first full scrape round land
        me, prom_proc = psutil.Process(), psutil.Process(prom.proc.pid)
        cpu0, pcpu0, wall0 = cpu_seconds(me), cpu_seconds(prom_proc), time.monotonic()
        ticks_before = server.ticks
        time.sleep(seconds)
        wall = time.monotonic() - wall0
        window = f"{int(wall)}s"
        ticks = list(server.tick_seconds)[-(server.ticks - ticks_before):]
        up = 'up{job="sim"}'
        failed = f"sum(count_over_time({up}[{window}])) - sum(sum_over_time({up}[{window}]))"
        slowest = f'max(max_over_time(scrape_duration_seconds{{job="sim"}}[{window}]))'
        result = {
            "nodes": nodes, "gpus": nodes * 8, "window_s": round(wall, 1),
            "sim_cpu_pct_of_core": round(100 * (cpu_seconds(me) - cpu0) / wall, 1),
            "sim_rss_gib": round(me.memory_info().rss / 2**30, 2),
            "tick_mean_s": round(statistics.mean(ticks), 3), "tick_max_s": round(max(ticks), 3),
            "prometheus_cpu_pct_of_core": round(100 * (cpu_seconds(prom_proc) - pcpu0) / wall, 1),
            "prometheus_rss_gib": round(prom_proc.memory_info().rss / 2**30, 2),
            "targets_up": client.scalar('count(up{job="sim"} == 1)'),
            "failed_scrapes": client.scalar(failed),
            "head_series": client.scalar("prometheus_tsdb_head_series"),
            "samples_per_s": round(client.scalar(f"rate(prometheus_tsdb_head_samples_appended_total[{window}])"), 0),
            "series_per_node": round(client.scalar('avg(scrape_samples_scraped{job="sim"})'), 1),
            "scrape_duration_max_s": round(client.scalar(slowest), 4),
        }
        return result


def per_node_cost(nodes: int, ticks: int = 5) -> dict[str, float]:
    """In-process cost per node of one tick, without Prometheus: fleet physics and rendering."""
    fleet = Fleet(fleet_scenario(nodes), start_unix=time.time())
    server = FleetServer(fleet)
    for _ in range(3):
        server.tick(5.0)
    started = time.perf_counter()
    for _ in range(ticks):
        fleet.advance(5.0)
    advance = (time.perf_counter() - started) / ticks
    started = time.perf_counter()
    for _ in range(ticks):
        server.render_all()
    render = (time.perf_counter() - started) / ticks
    return {"nodes": nodes, "advance_ms_per_node": round(1e3 * advance / nodes, 3),
            "render_ms_per_node": round(1e3 * render / nodes, 3),
            "tick_s_at_1250_nodes": round(1250 * (advance + render) / nodes, 2),
            "load_average_1m": round(os.getloadavg()[0], 2)}


def export_speed(nodes: int, span: float, step: float) -> dict[str, float]:
    fleet = Fleet(fleet_scenario(nodes, step), start_unix=time.time() - span)
    with tempfile.TemporaryDirectory() as out:
        stats = history.export(fleet, out, span, step)
        size = sum(p.stat().st_size for p in Path(out).glob("*.gz"))
    return {"nodes": nodes, "span_s": span, "step_s": step, "samples": stats.samples,
            "seconds": round(stats.seconds, 1), "samples_per_s": round(stats.samples_per_second),
            "faster_than_wall_clock": round(span / stats.seconds),
            "gzip_bytes_per_sample": round(size / stats.samples, 2)}


def report(results: dict[str, dict[str, object]], json_path: str | None) -> None:
    """Each section as a Markdown table on stdout (a nested dict one row per entry), and all of it
    as JSON to `json_path`: how the measurement scripts hand back their figures."""
    for section, values in results.items():
        print(f"\n| {section} | value |\n|---|---|")
        for key, value in values.items():
            if isinstance(value, dict):
                for part, figures in value.items():
                    print(f"| {key}: {part} | {figures} |")
            else:
                print(f"| {key} | {value} |")
    if json_path:
        Path(json_path).write_text(json.dumps(results, indent=1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1250)
    parser.add_argument("--seconds", type=float, default=120)
    parser.add_argument("--export-nodes", type=int, default=16)
    parser.add_argument("--export-span", type=float, default=6 * 3600)
    parser.add_argument("--export-step", type=float, default=60)
    parser.add_argument("--skip-serve", action="store_true")
    parser.add_argument("--per-node", type=int, default=256, metavar="NODES",
                        help="also measure the in-process cost per node on a fleet this size (0: skip)")
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args()
    results: dict[str, dict[str, float]] = {}
    if not args.skip_serve:
        results["serve"] = serve_capacity(args.nodes, args.seconds)
    if args.per_node:
        results["per_node"] = per_node_cost(args.per_node)
    results["export"] = export_speed(args.export_nodes, args.export_span, args.export_step)
    report(results, args.json)  # type: ignore[arg-type]


if __name__ == "__main__":
    main()

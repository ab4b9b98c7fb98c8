"""How far one Prometheus goes with FlopWatch's rules, and the per-GPU figures docs/scaling.md
plans 100,000 GPUs with.

    .venv/bin/python -m bench.scale_prometheus --nodes 1250 --seconds 180 --json out.json

Three parts, each measured, none estimated:

- `influx`: line protocol per cycle of one agent and the sink's conversion time, against the
  agent's own collection cycle measured in the same run.
- `series`: series per node and per GPU of a simulated node (the same bytes a real agent renders
  for those collectors), with NVLink per GPU (the simulator's default) and per link, for a node in
  a training job and an idle one; samples per second per node follow at 5 s and 15 s.
- `tsdb`: bytes per sample on disk. `--tsdb-hours` of simulated history for `--tsdb-nodes` nodes is
  written into Prometheus's own TSDB blocks by `promtool tsdb create-blocks-from openmetrics`;
  bytes per sample = the block directories' size / the samples their meta.json counts.
- `serve`: one Prometheus (5 s scrapes, every rule file of alerts/ loaded) scraping `--nodes`
  simulated nodes served by one simulator process (bench/sim_capacity.py's fleet); after every
  target is up and every rule group has run, a `--seconds` window gives ingestion, CPU and memory
  of Prometheus, and each rule group's evaluation time from Prometheus's own
  `prometheus_rule_group_last_duration_seconds` (mean and max over the window, sampled by its
  self-scrape), missed iterations and failed evaluations.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import subprocess
import tempfile
import threading
import time
import timeit
import urllib.request
from collections import defaultdict
from functools import partial
from pathlib import Path

import psutil

from bench.sim_capacity import cpu_seconds, fleet_scenario
from flopwatch.promql import PromClient
from flopwatch.sim import history
from flopwatch.sim.fleet import Fleet
from flopwatch.sim.node import SimNodeAgent
from flopwatch.sim.serve import FleetServer
from flopwatch.stack import Prometheus
from flopwatch.stack.process import require_binary
from flopwatch.stack.servers import scrape_job

ROOT = Path(__file__).resolve().parents[1]
RULE_FILES = sorted(ROOT.glob("alerts/flopwatch-*.yml"))


# -- series per node and per GPU ---------------------------------------------------------------------
def _series(exposition: bytes) -> tuple[int, int]:
    """(all series, series with a gpu label) of one exposition."""
    total = per_gpu = 0
    for line in exposition.split(b"\n"):
        if line and not line.startswith(b"#"):
            total += 1
            per_gpu += b',gpu="' in line or b'{gpu="' in line
    return total, per_gpu


def series_counts() -> dict[str, float]:
    fleet = Fleet(fleet_scenario(130), start_unix=time.time())
    fleet.advance(30.0)  # a few steps, so every training series exists
    busy, idle = fleet.nodes[0], fleet.nodes[129]   # node 129: beyond the 128-node job, idle
    gpus = fleet.scenario.fleet.gpus_per_node
    out: dict[str, float] = {"gpus_per_node": gpus, "nics_per_node": fleet.scenario.fleet.nics_per_node}
    for per_link in (False, True):
        mode = "nvlink_per_link" if per_link else "nvlink_per_gpu"
        for name, node in (("training", busy), ("idle", idle)):
            total, per_gpu = _series(SimNodeAgent(fleet, node, per_link).render())
            out[f"{mode}_{name}_series_per_node"] = total
            out[f"{mode}_{name}_series_per_gpu"] = round(per_gpu / gpus, 1)
            out[f"{mode}_{name}_node_level_series"] = total - per_gpu
            for interval in (5, 15):
                out[f"{mode}_{name}_samples_per_s_per_node_at_{interval}s"] = round(total / interval, 1)
    return out


# -- what one agent sends to InfluxDB ----------------------------------------------------------------------
def sink_volume() -> dict[str, float]:
    """Line protocol per cycle of a real agent (simulated GPUs, this machine's NICs and host), and
    the sink's conversion cost, against rendering the same exposition (the agent's own work)."""
    from flopwatch import config as cfg
    from flopwatch.commands.agent import build_agent
    from flopwatch.exporters.influx import GZIP_LEVEL, LineProtocolEncoder

    out: dict[str, float] = {}
    for per_link in (True, False):
        mode = "nvlink_per_link" if per_link else "nvlink_per_gpu"
        config = cfg.load(overrides={"backend": "sim", "node": "gpu-node-0001", "listen": "127.0.0.1:0",
                                     "gpu.nvlink_per_link": per_link}, environ={})
        agent = build_agent(config)
        try:
            agent.collect_once()
            agent.collect_once()
            text = agent.exposition()
            encoder = LineProtocolEncoder()
            data, points, _ = encoder.encode(text, int(time.time() * 1000))
            encode = min(timeit.repeat(partial(encoder.encode, text, 1), number=20, repeat=5)) / 20
            squeeze = min(timeit.repeat(partial(gzip.compress, data, GZIP_LEVEL), number=5, repeat=3)) / 5
            squeeze9 = min(timeit.repeat(partial(gzip.compress, data, 9), number=5, repeat=3)) / 5  # client default
            cycle = min(timeit.repeat(agent.collect_once, number=5, repeat=3)) / 5
        finally:
            agent.close()
        out.update({f"{mode}_points_per_cycle": points, f"{mode}_bytes_per_cycle": len(data),
                    f"{mode}_gzip_bytes_per_cycle": len(gzip.compress(data, GZIP_LEVEL)),
                    f"{mode}_gzip9_bytes_per_cycle": len(gzip.compress(data, 9)),
                    f"{mode}_gzip9_ms": round(squeeze9 * 1000, 2),
                    f"{mode}_encode_ms": round(encode * 1000, 2), f"{mode}_gzip_ms": round(squeeze * 1000, 2),
                    f"{mode}_collect_cycle_ms": round(cycle * 1000, 2),
                    f"{mode}_encode_vs_cycle": round(encode / cycle, 3),
                    f"{mode}_mb_per_hour_at_5s": round(len(data) * 720 / 1e6, 1)})
    return out


# -- bytes per sample in Prometheus's TSDB --------------------------------------------------------------
def tsdb_bytes_per_sample(nodes: int, hours: float, step: float = 5.0) -> dict[str, float]:
    promtool = require_binary("promtool", "prometheus")
    span = hours * 3600
    start = float(int(time.time() - span - 600) // 7200 * 7200)  # align to Prometheus's 2 h block ranges
    fleet = Fleet(fleet_scenario(nodes, step), start_unix=start)
    with tempfile.TemporaryDirectory(prefix="flopwatch-tsdb-") as tmp:
        work = Path(tmp)
        stats = history.export(fleet, work / "history", span, step)
        om = work / "history.om"
        with open(om, "wb") as out:  # Prometheus text with ms timestamps -> OpenMetrics (seconds)
            for name in stats.files:
                with gzip.open(work / "history" / name, "rb") as chunk:
                    for line in chunk:
                        head, _, stamp = line.rstrip(b"\n").rpartition(b" ")
                        out.write(b"%s %d.%03d\n" % (head, int(stamp) // 1000, int(stamp) % 1000))
            out.write(b"# EOF\n")
        blocks = work / "blocks"
        started = time.perf_counter()
        subprocess.run([promtool, "tsdb", "create-blocks-from", "openmetrics", str(om), str(blocks)],
                       check=True, capture_output=True)
        seconds = time.perf_counter() - started
        samples = series = 0
        size = 0
        count = 0
        for meta in blocks.glob("*/meta.json"):
            data = json.loads(meta.read_text())
            samples += data["stats"]["numSamples"]
            series = max(series, data["stats"]["numSeries"])
            count += 1
            size += sum(f.stat().st_size for f in meta.parent.rglob("*") if f.is_file())
        chunk_bytes = sum(f.stat().st_size for f in blocks.glob("*/chunks/*"))
    return {"nodes": nodes, "hours": hours, "step_s": step, "blocks": count, "samples": samples,
            "exported_samples": stats.samples, "series_per_block_max": series, "block_bytes": size,
            "bytes_per_sample": round(size / samples, 3), "chunk_bytes_per_sample": round(chunk_bytes / samples, 3),
            "promtool_seconds": round(seconds, 1)}


# -- one Prometheus, the whole fleet, every rule ------------------------------------------------------
def serve_with_rules(nodes: int, seconds: float, interval: float = 5.0) -> dict[str, object]:
    if not RULE_FILES:
        raise SystemExit("alerts/flopwatch-*.yml: no rule files")
    fleet = Fleet(fleet_scenario(nodes, interval), start_unix=time.time())
    server = FleetServer(fleet)
    server.start()
    stop = threading.Event()
    ticker = threading.Thread(target=server.run, args=(0, stop), daemon=True)
    workdir = Path(tempfile.mkdtemp(prefix="flopwatch-bench-"))
    targets = server.write_file_sd(workdir / "targets.json")
    prom = Prometheus([{"job_name": "sim", "file_sd_configs": [{"files": [str(targets)]}]}],
                      rule_files=RULE_FILES, scrape_interval=f"{interval:g}s", evaluation_interval="15s",
                      extra_args=["--query.max-samples=200000000"])
    prom.config["scrape_configs"].append(scrape_job("prometheus", [f"{prom.host}:{prom.port}"], interval="5s"))
    try:
        prom.start(timeout=60)
        ticker.start()
        client = PromClient(prom.url, timeout=120)
        deadline = time.monotonic() + 300
        while (client.scalar('count(up{job="sim"} == 1)') or 0) < nodes:
            if time.monotonic() > deadline:
                raise SystemExit(f"not all {nodes} targets came up within 300 s")
            time.sleep(2)
        up_at = time.monotonic()
        time.sleep(75)  # a minute of samples behind every rate(...[1m]) and two rounds of every group
        me, prom_proc = psutil.Process(), psutil.Process(prom.proc.pid)
        cpu0, pcpu0, wall0 = cpu_seconds(me), cpu_seconds(prom_proc), time.monotonic()
        others0 = _other_processes({me.pid, prom_proc.pid})
        rss: list[float] = []
        ticks_before = server.ticks
        while time.monotonic() - wall0 < seconds:
            rss.append(prom_proc.memory_info().rss)
            time.sleep(5)
        wall = time.monotonic() - wall0
        window = f"{int(wall)}s"
        others = _busiest_others(others0, _other_processes({me.pid, prom_proc.pid}), wall)
        ticks = list(server.tick_seconds)[-(server.ticks - ticks_before):]
        groups: dict[str, dict[str, float]] = defaultdict(dict)
        queries = {
            "interval_s": "prometheus_rule_group_interval_seconds",
            "mean_s": f"avg_over_time(prometheus_rule_group_last_duration_seconds[{window}])",
            "max_s": f"max_over_time(prometheus_rule_group_last_duration_seconds[{window}])",
            "rules": "prometheus_rule_group_rules",
            "missed": f"increase(prometheus_rule_group_iterations_missed_total[{window}])",
        }
        for field, expr in queries.items():
            for sample in client.query(expr):
                groups[sample.labels["rule_group"].rsplit(";", 1)[-1]][field] = sample.value
        slowest_rules = _slowest_rules(prom.url)
        failures = client.scalar(f"sum(increase(prometheus_rule_evaluation_failures_total[{window}]))") or 0.0
        rule_core = sum(g.get("mean_s", 0) / g["interval_s"] for g in groups.values() if g.get("interval_s"))
        gpus = nodes * fleet.scenario.fleet.gpus_per_node
        result: dict[str, object] = {
            "nodes": nodes, "gpus": gpus, "scrape_interval_s": interval, "window_s": round(wall, 1),
            "seconds_targets_up_before_window": round(wall0 - up_at, 1),
            "head_series": client.scalar("prometheus_tsdb_head_series"),
            "samples_per_s": round(client.scalar(f"rate(prometheus_tsdb_head_samples_appended_total[{window}])"), 0),
            "series_per_node": round(client.scalar('avg(scrape_samples_scraped{job="sim"})'), 1),
            "failed_scrapes": client.scalar(f'sum(count_over_time(up{{job="sim"}}[{window}])) - '
                                            f'sum(sum_over_time(up{{job="sim"}}[{window}]))'),
            "prometheus_cpu_pct_of_core": round(100 * (cpu_seconds(prom_proc) - pcpu0) / wall, 1),
            "prometheus_rss_gib_mean": round(statistics.mean(rss) / 2**30, 2),
            "prometheus_rss_gib_max": round(max(rss) / 2**30, 2),
            "sim_cpu_pct_of_core": round(100 * (cpu_seconds(me) - cpu0) / wall, 1),
            "sim_tick_mean_s": round(statistics.mean(ticks), 3) if ticks else None,
            "rule_groups": len(groups),
            "rule_evaluation_failures": failures,
            "slowest_group_max_s": round(max(g.get("max_s", 0) for g in groups.values()), 3),
            "rule_cores_busy": round(rule_core, 3),
            "rule_core_seconds_per_s_per_1000_gpus": round(rule_core / (gpus / 1000), 4),
            "load_average_1m_at_end": round(os.getloadavg()[0], 2),
            "other_processes_pct_of_core": others,
            "groups": {name: {k: round(v, 4) for k, v in values.items()} for name, values in sorted(groups.items())},
            "slowest_rules_last_evaluation": slowest_rules,
        }
        return result
    finally:
        stop.set()
        ticker.join(30)
        prom.stop()
        server.stop()


def _other_processes(exclude: set[int]) -> dict[int, tuple[str, float]]:
    """pid -> (command line, CPU seconds) of every other process: the machine is shared."""
    out = {}
    for process in psutil.process_iter(["pid", "cmdline"]):
        if process.pid in exclude:
            continue
        try:
            out[process.pid] = (" ".join(process.info["cmdline"] or [])[:90], cpu_seconds(process))
        except (psutil.Error, TypeError):
            continue
    return out


def _busiest_others(before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]],
                    wall: float, top: int = 6) -> dict[str, float]:
    """What else ran during the window, by CPU share (% of one core; processes that ended during the
    window are missed, those that started in it count whole)."""
    used = [(after[pid][1] - before.get(pid, ("", 0.0))[1], after[pid][0]) for pid in after]
    total = sum(cpu for cpu, _ in used)
    ranked = sorted(used, reverse=True)[:top]
    busiest = {f"{name} [{i}]": round(100 * cpu / wall, 1) for i, (cpu, name) in enumerate(ranked)}
    return {"all_other_processes": round(100 * total / wall, 1), **busiest}


def _slowest_rules(url: str, top: int = 8) -> dict[str, float]:
    """The rules whose last evaluation took longest (from /api/v1/rules), to say where time goes."""
    with urllib.request.urlopen(f"{url}/api/v1/rules", timeout=60) as answer:
        groups = json.load(answer)["data"]["groups"]
    rules = [(rule["evaluationTime"], f"{group['name']}/{rule['name']}") for group in groups for rule in group["rules"]]
    return {name: round(seconds, 4) for seconds, name in sorted(rules, reverse=True)[:top]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1250)
    parser.add_argument("--seconds", type=float, default=180)
    parser.add_argument("--interval", type=float, default=5.0)
    parser.add_argument("--tsdb-nodes", type=int, default=8)
    parser.add_argument("--tsdb-hours", type=float, default=4.0)
    parser.add_argument("--skip-serve", action="store_true")
    parser.add_argument("--skip-tsdb", action="store_true")
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args()
    results: dict[str, object] = {"series": series_counts(), "influx": sink_volume()}
    if not args.skip_tsdb:
        results["tsdb"] = tsdb_bytes_per_sample(args.tsdb_nodes, args.tsdb_hours)
    if not args.skip_serve:
        results["serve"] = serve_with_rules(args.nodes, args.seconds, args.interval)
    for section, values in results.items():
        print(f"\n| {section} | value |\n|---|---|")
        for key, value in values.items():  # type: ignore[union-attr]
            if isinstance(value, dict):
                for group, figures in value.items():
                    print(f"| {key}: {group} | {figures} |")
            else:
                print(f"| {key} | {value} |")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()

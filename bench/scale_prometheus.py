"""How far one Prometheus goes with FlopWatch's rules, and the per-GPU figures docs/scaling.md
plans 100,000 GPUs with.

    .venv/bin/python -m bench.scale_prometheus --nodes 1250 --seconds 180 --json out.json
    .venv/bin/python -m bench.scale_prometheus --nodes 125,313,625,1250 --seconds 600 --skip-tsdb \
        --engine prometheus,victoriametrics --json sizes.json     # 1,000 to 10,000 GPUs, both engines

Three parts, each measured, none estimated:

- `influx`: line protocol per cycle of one agent and the sink's conversion time, against the
  agent's own collection cycle measured in the same run.
- `series`: series per node and per GPU of a simulated node (the same bytes a real agent renders
  for those collectors), with NVLink per GPU (the simulator's default) and per link, for a node in
  a training job and an idle one; samples per second per node follow at 5 s and 15 s.
- `tsdb`: bytes per sample on disk. `--tsdb-hours` of simulated history for `--tsdb-nodes` nodes is
  written into Prometheus's own TSDB blocks by `promtool tsdb create-blocks-from openmetrics`;
  bytes per sample = the block directories' size / the samples their meta.json counts.
- `serve`: one Prometheus (5 s scrapes) scraping `--nodes` simulated nodes served by one
  simulator process (bench/sim_capacity.py's fleet, served and scraped by the setup the benchmarks
  share, bench/fleet_prometheus.py). Phase 1 scrapes only; phase 2 reloads it with
  every rule file of alerts/. Each phase's window reads Prometheus's own /metrics directly: samples
  appended, every group's `prometheus_rule_group_last_duration_seconds` (sampled every 5 s),
  iterations run and missed, failed evaluations; and Prometheus's CPU time, and the simulator's
  (this process) in each window: on a saturated machine it has read more than bench/sim_cost.py
  measures on a quiet one. The CPU the rules need
  is phase 2's minus phase 1's, scaled by the share of iterations actually run (on a starved
  machine Prometheus skips them), which depends far less on what else runs than wall time does.
  `--exporter agent,dcgm` measures the same fleet twice in one run, its GPUs served by FlopWatch's
  agent and then by dcgm-exporter (beside an agent for steps, NICs and host), and reports the
  dcgm-exporter figures as ratios of the agent's. `--fabric` gives the fleet a rail-optimised
  topology (16 nodes per leaf group, one leaf per NIC rail, 4 spines) that its agents serve, so
  the fabric rules (alerts/flopwatch-fabric.yml) run on topology info as on a real site.
  `--engine prometheus,victoriametrics` then measures the same fleet and rule files through
  VictoriaMetrics (promscrape) and vmalert (bench/vm_engine.py) the same way, one after the other,
  with the VictoriaMetrics figures as ratios of Prometheus's; each engine's section records the
  machine's load averages (`uptime`'s three) at the start and end of its windows, and what else
  ran. `--warmup` shortens the wait after loading the rules (smoke runs and tests).
  Prometheus inherits this process's environment: `GOGC=200 python -m bench.scale_prometheus ...`
  measures it under another garbage-collection target (recorded as `prometheus_gogc`).
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import json
import os
import statistics
import subprocess
import tempfile
import time
import timeit
import urllib.request
from collections import defaultdict
from collections.abc import Collection
from contextlib import AbstractContextManager
from functools import partial
from pathlib import Path

import psutil

from bench.fleet_prometheus import FLEET_HISTORY_S, ScrapedFleet, failed_scrapes, scraped_fleet
from bench.sim_capacity import cpu_seconds, fleet_scenario, report
from flopwatch.sim import history
from flopwatch.sim.fleet import Fleet
from flopwatch.sim.node import SimNodeAgent
from flopwatch.sim.scenario import EXPORTERS, Scenario, node_name
from flopwatch.stack import Prometheus, releases
from flopwatch.stack.process import MissingBinary
from flopwatch.topology.model import Fabric

ROOT = Path(__file__).resolve().parents[1]
RULE_FILES = sorted(ROOT.glob("alerts/flopwatch-*.yml"))
ENGINES = ("prometheus", "victoriametrics")


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
    from flopwatch.exporters.influx import GZIP_LEVEL, LineProtocolEncoder
    from flopwatch.exporters.wiring import build_agent

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
    promtool = releases.binary("promtool")
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
def server_metrics(url: str, wanted: Collection[str], label: str) -> dict[tuple[str, str], float]:
    """(name, value of `label` or "") -> sum of the `wanted` series of a server's own /metrics, read
    directly (a self-scrape can time out on a loaded machine); a rule group's `file;` prefix dropped."""
    out: dict[tuple[str, str], float] = defaultdict(float)
    with urllib.request.urlopen(f"{url}/metrics", timeout=60) as answer:
        for raw in answer.read().decode().splitlines():
            name = raw.split("{", 1)[0].split(" ", 1)[0]
            if name not in wanted:
                continue
            key = raw.split(f'{label}="', 1)[1].split('"', 1)[0].rsplit(";", 1)[-1] if f'{label}="' in raw else ""
            out[(name, key)] += float(raw.rsplit(" ", 1)[1])
    return out


#: What the measurements read of Prometheus's own /metrics: rule groups, failures, head and samples.
OWN_METRICS = ("prometheus_rule_group_last_duration_seconds", "prometheus_rule_group_iterations_total",
               "prometheus_rule_group_iterations_missed_total", "prometheus_rule_group_interval_seconds",
               "prometheus_rule_evaluation_failures_total", "prometheus_tsdb_head_series",
               "prometheus_tsdb_head_samples_appended_total", "prometheus_rule_group_rules")


def _own_metrics(url: str) -> dict[tuple[str, str], float]:
    """(name, rule group or "") -> value from Prometheus's own /metrics."""
    return server_metrics(url, OWN_METRICS, "rule_group")


def _window(prom: Prometheus, seconds: float, sample_every: float = 5.0) -> dict[str, object]:
    """CPU and memory of Prometheus and of this process, its own counters at both ends, and
    samples of every group's last duration, over `seconds`."""
    me, proc = psutil.Process(), psutil.Process(prom.proc.pid)
    others0 = _other_processes({me.pid, proc.pid})
    # the simulator is this process: its CPU from the process clock (psutil counts in 10 ms ticks,
    # which read a small fleet's window as 0)
    first, cpu0, mine0, wall0 = _own_metrics(prom.url), cpu_seconds(proc), time.process_time(), time.monotonic()
    durations: dict[str, list[float]] = defaultdict(list)
    rss: list[float] = []
    while time.monotonic() - wall0 < seconds:
        rss.append(proc.memory_info().rss)
        for (name, group), value in _own_metrics(prom.url).items():
            if name == "prometheus_rule_group_last_duration_seconds":
                durations[group].append(value)
        time.sleep(max(0.0, min(sample_every, seconds - (time.monotonic() - wall0))))
    last, wall = _own_metrics(prom.url), time.monotonic() - wall0
    return {"wall": wall, "first": first, "last": last, "durations": durations, "rss": rss,
            "cpu": cpu_seconds(proc) - cpu0, "sim_cpu": time.process_time() - mine0,
            "others": _busiest_others(others0, _other_processes({me.pid, proc.pid}), wall)}


def bench_scenario(nodes: int, interval: float = 5.0, exporter: str = "agent", fabric: bool = False) -> Scenario:
    """The measured fleet (bench/sim_capacity.py's), its GPUs behind `exporter`, with a topology."""
    scenario = fleet_scenario(nodes, interval)
    scenario = dataclasses.replace(scenario, fleet=dataclasses.replace(scenario.fleet, exporter=exporter))
    if fabric:
        names = [node_name(i) for i in range(nodes)]
        scenario = dataclasses.replace(scenario, fabric=Fabric.rail_optimised(
            names, scenario.fleet.nics_per_node, nodes_per_leaf_group=16, spines=4))
    return scenario


def scrape_targets(scenario: Scenario) -> int:
    """The scrape targets the fleet serves: one per node, and dcgm-exporter's beside each agent."""
    return scenario.fleet.nodes * (1 if scenario.fleet.exporter == "agent" else 2)


def uptime() -> str:
    """The machine's load averages (1, 5, 15 minutes), as `uptime` prints them: the machine is shared."""
    return ", ".join(f"{load:.2f}" for load in os.getloadavg())


def serve_with_rules(nodes: int, seconds: float, interval: float = 5.0, tick: float | None = None,
                     rule_files: list[Path] = RULE_FILES, exporter: str = "agent",
                     fabric: bool = False, warmup: float = 75.0) -> dict[str, object]:
    """Phase 1 scrapes only; phase 2 reloads with every rule file. Rule CPU = phase 2's Prometheus
    CPU minus phase 1's, per evaluation actually run (a starved Prometheus skips iterations)."""
    if not rule_files:
        raise SystemExit("no rule files (flopwatch-*.yml) in the rules folder")
    scenario = bench_scenario(nodes, interval, exporter, fabric)
    # a slower tick than the scrape interval spares the CPU Prometheus needs; scrapes, series and
    # samples are the same (values change every `tick` seconds instead of every scrape)
    with measured_fleet(scenario, interval, tick) as scraped:
        return _measure_rules(scraped, seconds, interval, tick, rule_files, warmup)


def measured_fleet(scenario: Scenario, interval: float = 5.0, tick: float | None = None) -> AbstractContextManager:
    """The fleet and Prometheus the rule benchmarks measure on (bench/fleet_prometheus.py's
    scraped_fleet): no self-scrape, every target of the scenario, room for the heaviest query."""
    return scraped_fleet(scenario, scrape_interval=f"{interval:g}s", self_scrape=False, tick=tick or interval,
                         targets=scrape_targets(scenario), query_timeout=300,
                         extra_args=["--query.max-samples=200000000"], history=FLEET_HISTORY_S)


def _groups(rules: dict[str, object]) -> dict[str, dict[str, float]]:
    """Each rule group's iterations run and missed over a window, and its sampled durations."""
    first, last = rules["first"], rules["last"]
    groups: dict[str, dict[str, float]] = {}
    for (name, group), value in last.items():  # type: ignore[attr-defined]
        if name != "prometheus_rule_group_interval_seconds":
            continue
        done = last[("prometheus_rule_group_iterations_total", group)] - \
            first[("prometheus_rule_group_iterations_total", group)]  # type: ignore[index]
        missed = last[("prometheus_rule_group_iterations_missed_total", group)] - \
            first[("prometheus_rule_group_iterations_missed_total", group)]  # type: ignore[index]
        seen = rules["durations"].get(group) or [0.0]  # type: ignore[attr-defined]
        # iterations_total counts every scheduled iteration, the missed ones included
        groups[group] = {"interval_s": value, "rules": last[("prometheus_rule_group_rules", group)],
                         "iterations_run": done - missed, "missed": missed, "nominal": rules["wall"] / value,
                         "duration_mean_s": statistics.mean(seen), "duration_max_s": max(seen)}
    return groups


def rule_cores_needed(groups: dict[str, dict[str, float]], window_cores: float,
                      scrape_only_cores: float) -> tuple[float, float]:
    """(share of the groups' iterations run, cores their rules need): a window's cores over the
    scrape-only window's, per iteration run (on a starved machine the engine skips iterations)."""
    nominal = sum(g["nominal"] for g in groups.values())
    done_share = sum(g["iterations_run"] for g in groups.values()) / nominal if nominal else 1.0
    return done_share, max(0.0, window_cores - scrape_only_cores) / max(done_share, 1e-9)


def _measure_rules(scraped: ScrapedFleet, seconds: float, interval: float, tick: float | None,
                   rule_files: list[Path], warmup: float) -> dict[str, object]:
    server, prom, client = scraped.server, scraped.prometheus, scraped.client
    fleet, nodes = server.fleet, len(server.fleet.nodes)
    exporter = fleet.scenario.fleet.exporter
    machine_load_at_start = uptime()
    time.sleep(min(20.0, warmup))
    load_at_start = os.getloadavg()[0]
    scrape_only = _window(prom, seconds / 2)
    prom.config["rule_files"] = [str(path) for path in rule_files]
    prom.reload()
    time.sleep(warmup)  # a minute of samples behind every rate(...[1m]); every group has run
    ticks_before = server.ticks
    rules = _window(prom, seconds)
    ticks = list(server.tick_seconds)[-(server.ticks - ticks_before):]
    failed = client.scalar(failed_scrapes(rules["wall"]))
    first, last = rules["first"], rules["last"]
    groups = _groups(rules)
    gpus = nodes * fleet.scenario.fleet.gpus_per_node
    cpu_scrape = scrape_only["cpu"] / scrape_only["wall"]
    cpu_rules_window = rules["cpu"] / rules["wall"]
    done_share, rule_cores = rule_cores_needed(groups, cpu_rules_window, cpu_scrape)

    def appended(window: dict[str, object]) -> float:
        counter = "prometheus_tsdb_head_samples_appended_total", ""
        return (window["last"][counter] - window["first"][counter]) / window["wall"]  # type: ignore[index]

    return {
        "engine": "prometheus", "exporter": exporter, "nodes": nodes, "gpus": gpus, "scrape_interval_s": interval,
        "sim_tick_interval_s": tick or interval,
        "window_s_scrape_only": round(scrape_only["wall"], 1), "window_s_with_rules": round(rules["wall"], 1),
        "head_series": last[("prometheus_tsdb_head_series", "")],
        "series_per_node": round((client.scalar('sum(scrape_samples_scraped{job="sim"})') or 0) / nodes, 1),
        "samples_per_s_scrape_only": round(appended(scrape_only)),
        "samples_per_s_with_rules": round(appended(rules)),
        "samples_per_s_nominal": round(last[("prometheus_tsdb_head_series", "")] / interval),
        "failed_scrapes_with_rules": failed,
        "prometheus_cpu_cores_scrape_only": round(cpu_scrape, 3),
        "prometheus_cpu_cores_with_rules": round(cpu_rules_window, 3),
        "rule_iterations_run_share": round(done_share, 3),
        "rule_cores_needed": round(rule_cores, 3),
        "rule_core_seconds_per_s_per_1000_gpus": round(rule_cores / (gpus / 1000), 4),
        "prometheus_rss_gib_max": round(max(rules["rss"]) / 2**30, 2),
        "prometheus_gogc": os.environ.get("GOGC") or "100 (Go's default)",
        "missed_iterations": sum(g["missed"] for g in groups.values()),
        "sim_cpu_pct_of_core": round(100 * rules["sim_cpu"] / rules["wall"], 2),
        "sim_cpu_pct_of_core_scrape_only": round(100 * scrape_only["sim_cpu"] / scrape_only["wall"], 2),
        "sim_tick_mean_s": round(statistics.mean(ticks), 2) if ticks else None,
        "rule_evaluation_failures": last[("prometheus_rule_evaluation_failures_total", "")]
        - first[("prometheus_rule_evaluation_failures_total", "")],
        "slowest_group_max_s": round(max(g["duration_max_s"] for g in groups.values()), 3),
        "load_average_1m_at_start": round(load_at_start, 2),
        "load_average_1m_at_end": round(os.getloadavg()[0], 2),
        "uptime_load_at_start": machine_load_at_start, "uptime_load_at_end": uptime(),
        "other_processes_pct_of_core_scrape_only": scrape_only["others"],
        "other_processes_pct_of_core_with_rules": rules["others"],
        "groups": {name: {k: round(v, 4) for k, v in values.items()} for name, values in sorted(groups.items())},
        "slowest_rules_last_evaluation": _slowest_rules(prom.url),
    }


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


#: The figures an exporter's run is compared on (ratios).
RATIO_KEYS = ("rule_core_seconds_per_s_per_1000_gpus", "head_series", "series_per_node", "samples_per_s_with_rules",
              "prometheus_cpu_cores_scrape_only", "slowest_group_max_s")


def ratios(measured: dict[str, object], reference: dict[str, object],
           keys: Collection[str] = RATIO_KEYS) -> dict[str, float | None]:
    """`keys` of one run over the reference's measured in the same run (default: rule cost, head
    series and samples of one exporter's run); None where either is missing or the reference is 0."""
    out: dict[str, float | None] = {}
    for key in keys:
        mine, theirs = measured.get(key), reference.get(key)
        ok = isinstance(mine, int | float) and isinstance(theirs, int | float) and theirs
        out[key] = round(mine / theirs, 3) if ok else None  # type: ignore[operator]
    return out


def _serve_engines(engines: list[str], args: argparse.Namespace, rules: list[Path], exporter: str,
                   suffixed: bool) -> dict[str, object]:  # args.nodes: one fleet size
    """One `serve` section per engine on the same fleet, one after the other, and the second's
    ratios to the first's (VictoriaMetrics + vmalert over Prometheus)."""
    suffix = f"_{exporter}" if suffixed else ""
    measured: dict[str, dict[str, object]] = {}
    for engine in engines:
        if engine == "prometheus":
            measured[engine] = serve_with_rules(args.nodes, args.seconds, args.interval, args.tick, rules, exporter,
                                                args.fabric, args.warmup)
        else:
            from bench.vm_engine import serve_with_vmalert

            scenario = bench_scenario(args.nodes, args.interval, exporter, args.fabric)
            measured[engine] = serve_with_vmalert(scenario, args.seconds, args.interval, args.tick, rules,
                                                  args.warmup)
    out: dict[str, object] = {f"serve{suffix}" if engine == engines[0] else f"serve_{engine}{suffix}": figures
                              for engine, figures in measured.items()}
    if len(measured) == 2:
        from bench.vm_engine import engine_ratios

        out[f"ratio_victoriametrics_to_prometheus{suffix}"] = engine_ratios(measured["victoriametrics"],
                                                                            measured["prometheus"])
    return out


def fleet_sizes(parser: argparse.ArgumentParser, text: str) -> list[int]:
    """--nodes as node counts (`125,313`): different, each 1 or more; else the parser's error."""
    try:
        sizes = [int(size) for size in text.split(",") if size.strip()]
    except ValueError:
        parser.error(f"--nodes: expected node counts separated by commas, got {text!r}")
    if not sizes or min(sizes) < 1 or len(set(sizes)) < len(sizes):
        parser.error("--nodes: give one or more different fleet sizes of 1 node or more")
    return sizes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="1250", metavar="N[,N...]",
                        help="simulated nodes of 8 GPUs (default 1250: 10,000 GPUs), or sizes comma-separated, "
                        "measured one after the other (125,313,625,1250: 1,000 to 10,000 GPUs); with several, every "
                        "serve section's name ends in @<nodes>")
    parser.add_argument("--seconds", type=float, default=180)
    parser.add_argument("--interval", type=float, default=5.0)
    parser.add_argument("--tick", type=float, default=None,
                        help="simulator tick, seconds (default: the scrape interval)")
    parser.add_argument("--tsdb-nodes", type=int, default=8)
    parser.add_argument("--tsdb-hours", type=float, default=4.0)
    parser.add_argument("--skip-serve", action="store_true")
    parser.add_argument("--skip-tsdb", action="store_true")
    parser.add_argument("--rules", metavar="DIR", type=Path, default=ROOT / "alerts",
                        help="folder of rule files (flopwatch-*.yml) to measure; default: alerts/")
    parser.add_argument("--exporter", default="agent", metavar="NAMES",
                        help="agent, dcgm or dcgm-default, or a comma list measured one after the other in this "
                        "run (the first is the reference the others' ratios divide by)")
    parser.add_argument("--fabric", action="store_true",
                        help="serve a rail-optimised topology (16 nodes per leaf group, 4 spines) from the agents")
    parser.add_argument("--warmup", type=float, default=75.0,
                        help="seconds between loading the rules and measuring them (default 75: a minute of samples "
                        "behind every rate(...[1m])); the fleet settles min(20, this) before the scrape-only window")
    parser.add_argument("--engine", default="prometheus", metavar="NAMES",
                        help=f"{' or '.join(ENGINES)}, or both comma-separated: measured one after the other on the "
                        "same fleet and rule files (VictoriaMetrics scraping, vmalert evaluating), the second's "
                        "figures also as ratios of the first's")
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args()
    engines = [name.strip() for name in args.engine.split(",") if name.strip()]
    if not engines or any(name not in ENGINES for name in engines) or len(set(engines)) < len(engines):
        parser.error(f"--engine: expected {' and/or '.join(ENGINES)}, comma-separated, each once")
    exporters = [name.strip() for name in args.exporter.split(",") if name.strip()]
    if not exporters or any(name not in EXPORTERS for name in exporters):
        parser.error(f"--exporter: expected one or more of {', '.join(EXPORTERS)}, comma-separated")
    sizes = fleet_sizes(parser, args.nodes)
    results: dict[str, object] = {"series": series_counts(), "influx": sink_volume()}
    if not args.skip_tsdb:
        results["tsdb"] = tsdb_bytes_per_sample(args.tsdb_nodes, args.tsdb_hours)
    if not args.skip_serve:
        rules = sorted(args.rules.resolve().glob("flopwatch-*.yml"))
        try:
            for nodes in sizes:
                found = _serve_size(argparse.Namespace(**{**vars(args), "nodes": nodes}), engines, exporters, rules)
                results.update({f"{name}@{nodes}" if len(sizes) > 1 else name: figures
                                for name, figures in found.items()})
                if args.json:   # each size as it ends: a failure at the next keeps what was measured
                    Path(args.json).write_text(json.dumps(results, indent=1))
        except MissingBinary as error:
            parser.exit(2, f"{error}\n")
    report(results, args.json)  # type: ignore[arg-type]


def _serve_size(args: argparse.Namespace, engines: list[str], exporters: list[str],
                rules: list[Path]) -> dict[str, object]:
    """Every engine and exporter on one fleet size, and the exporters' ratios to the first's."""
    found: dict[str, object] = {}
    for exporter in exporters:
        found.update(_serve_engines(engines, args, rules, exporter, exporter != exporters[0]))
    for exporter in exporters[1:]:
        found[f"ratio_{exporter}_to_{exporters[0]}"] = ratios(found[f"serve_{exporter}"], found["serve"])  # type: ignore[arg-type]
    return found


if __name__ == "__main__":
    main()

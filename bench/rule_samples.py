"""Samples each rule file reads per GPU per second, from Prometheus's own query statistics: a
measure of rule cost that does not depend on what else the machine runs (CPU time does).

    .venv/bin/python -m bench.rule_samples --nodes 16 --history 330 --compare /tmp/old-rules

A simulated fleet (bench/scale_prometheus.py's, `--nodes` of 8 GPUs) is scraped by a real
Prometheus running the rule files of `--rules` (default alerts/) for `--history` seconds; then
every rule expression of those files (and of each `--compare` folder, read against the same
Prometheus: the raw series are the same, and the records they read are the ones it recorded) is
evaluated once through `/api/v1/query?stats=all`, and its `totalQueryableSamples` is divided by
its group's interval and the fleet's GPUs. A history shorter than a rule's window under-counts
that window; 330 s fills every 5-minute one.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.parse
import urllib.request
from collections import defaultdict
from pathlib import Path

import yaml

from bench.fleet_prometheus import scraped_fleet
from bench.scale_prometheus import bench_scenario, uptime
from flopwatch.durations import parse_duration

ROOT = Path(__file__).resolve().parents[1]


def rule_files(folder: Path) -> list[Path]:
    """The FlopWatch rule files of `folder` (none: not a rules folder)."""
    return sorted(folder.glob("flopwatch-*.yml"))


def samples_read(url: str, expr: str, at: float) -> int:
    """`totalQueryableSamples` of one instant query of `expr` at `at`."""
    query = urllib.parse.urlencode({"query": expr, "time": f"{at:.3f}", "stats": "all"})
    with urllib.request.urlopen(f"{url}/api/v1/query?{query}", timeout=300) as answer:
        body = json.load(answer)
    return int(body["data"]["stats"]["samples"]["totalQueryableSamples"])


def per_file(url: str, files: list[Path], gpus: int, at: float) -> dict[str, float]:
    """Samples read per GPU per second by each file's rules, evaluated once at `at`."""
    out: dict[str, float] = defaultdict(float)
    for path in files:
        for group in yaml.safe_load(path.read_text())["groups"]:
            # without its own interval a group runs at the fleet Prometheus's 15 s evaluation interval
            interval = parse_duration(group.get("interval", "15s"), f"{path.name}: {group['name']} interval")
            for rule in group["rules"]:
                out[path.name] += samples_read(url, rule["expr"], at) / interval / gpus
    return dict(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=16, help="simulated nodes of 8 GPUs (default 16)")
    parser.add_argument("--history", type=float, default=330.0,
                        help="seconds of scrapes and evaluations before measuring (default 330)")
    parser.add_argument("--rules", type=Path, default=ROOT / "alerts", help="the rules Prometheus runs")
    parser.add_argument("--compare", type=Path, action="append", default=[],
                        help="another folder of rule files whose expressions are measured beside them")
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args()
    for folder in [args.rules, *args.compare]:
        if not rule_files(folder):
            parser.error(f"no rule files (flopwatch-*.yml) in {folder}: give a folder like alerts/")
    if args.nodes < 1 or args.history < 0:
        parser.error("--nodes must be at least 1 and --history at least 0")
    scenario = bench_scenario(args.nodes)
    gpus = args.nodes * scenario.fleet.gpus_per_node
    with scraped_fleet(scenario, rule_files=rule_files(args.rules), self_scrape=False) as scraped:
        print(f"{gpus} GPUs scraped; waiting {args.history:g} s of history (load {uptime()})", file=sys.stderr)
        time.sleep(args.history)
        at = time.time()
        figures = {str(folder): per_file(scraped.prometheus.url, rule_files(folder), gpus, at)
                   for folder in [args.rules, *args.compare]}
    report = {"gpus": gpus, "history_s": args.history, "load": uptime(), "per_gpu_per_second": figures}
    for folder, files in figures.items():
        print(f"{folder}: {sum(files.values()):.1f} samples per GPU per second")
        for name, value in sorted(files.items()):
            print(f"  {name:32} {value:7.2f}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()

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

With `--eval-seconds S` it also watches Prometheus's own evaluations of `--rules` for S seconds
(each rule's `evaluationTime` in /api/v1/rules, every new evaluation counted once) and prints the
rules that cost the most wall time per second of their interval, per 1,000 GPUs: where the rule
CPU goes, rule by rule (wall time: read it on a quiet machine).
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
        intervals = group_intervals([path])
        for group in yaml.safe_load(path.read_text())["groups"]:
            interval = intervals[group["name"]]
            for rule in group["rules"]:
                out[path.name] += samples_read(url, rule["expr"], at) / interval / gpus
    return dict(out)


def count_new_evaluations(seen: dict[tuple[str, str, int], tuple[str, list[float]]],
                          groups: list[dict]) -> None:
    """Add each rule's duration to `seen` when /api/v1/rules reports a `lastEvaluation` not counted
    yet (keys: group, rule name, index in the group; values: the last one counted, the durations)."""
    for group in groups:
        for index, rule in enumerate(group["rules"]):
            key = (group["name"], rule["name"], index)
            last, durations = seen.get(key, ("", []))
            if rule.get("lastEvaluation") and rule["lastEvaluation"] != last:
                seen[key] = (rule["lastEvaluation"], [*durations, float(rule.get("evaluationTime", 0.0))])


def evaluation_seconds(url: str, watch: float, poll: float = 1.0) -> dict[tuple[str, str, int], list[float]]:
    """Each rule's evaluation durations over `watch` seconds of Prometheus's own evaluations."""
    seen: dict[tuple[str, str, int], tuple[str, list[float]]] = {}
    deadline = time.monotonic() + watch
    while time.monotonic() < deadline:
        with urllib.request.urlopen(f"{url}/api/v1/rules", timeout=60) as answer:
            count_new_evaluations(seen, json.load(answer)["data"]["groups"])
        time.sleep(poll)
    return {key: durations for key, (_, durations) in seen.items()}


def costliest(durations: dict[tuple[str, str, int], list[float]], intervals: dict[str, float],
              gpus: int, top: int) -> list[dict[str, object]]:
    """Rules by mean evaluation seconds per second of their interval, per 1,000 GPUs."""
    rows = [{"group": group, "rule": name, "index": index,
             "evaluations": len(values),
             "mean_ms": 1000 * sum(values) / len(values),
             "seconds_per_second_per_1000_gpus": sum(values) / len(values) / intervals[group] * 1000 / gpus}
            for (group, name, index), values in durations.items() if values]
    rows.sort(key=lambda row: -float(row["seconds_per_second_per_1000_gpus"]))
    return rows[:top]


def group_intervals(files: list[Path]) -> dict[str, float]:
    """Each group's evaluation interval (without its own, a group runs at the fleet Prometheus's
    15 s evaluation interval)."""
    return {group["name"]: parse_duration(group.get("interval", "15s"), f"{path.name}: {group['name']} interval")
            for path in files for group in yaml.safe_load(path.read_text())["groups"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=16, help="simulated nodes of 8 GPUs (default 16)")
    parser.add_argument("--history", type=float, default=330.0,
                        help="seconds of scrapes and evaluations before measuring (default 330)")
    parser.add_argument("--rules", type=Path, default=ROOT / "alerts", help="the rules Prometheus runs")
    parser.add_argument("--compare", type=Path, action="append", default=[],
                        help="another folder of rule files whose expressions are measured beside them")
    parser.add_argument("--eval-seconds", type=float, default=0.0,
                        help="also watch Prometheus's evaluations this long and list the costliest rules")
    parser.add_argument("--top", type=int, default=25, help="rules listed by --eval-seconds (default 25)")
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args()
    for folder in [args.rules, *args.compare]:
        if not rule_files(folder):
            parser.error(f"no rule files (flopwatch-*.yml) in {folder}: give a folder like alerts/")
    if args.nodes < 1 or args.history < 0:
        parser.error("--nodes must be at least 1 and --history at least 0")
    if args.eval_seconds < 0 or args.top < 1:
        parser.error("--eval-seconds must be at least 0 and --top at least 1")
    scenario = bench_scenario(args.nodes)
    gpus = args.nodes * scenario.fleet.gpus_per_node
    with scraped_fleet(scenario, rule_files=rule_files(args.rules), self_scrape=False) as scraped:
        print(f"{gpus} GPUs scraped; waiting {args.history:g} s of history (load {uptime()})", file=sys.stderr)
        time.sleep(args.history)
        at = time.time()
        figures = {str(folder): per_file(scraped.prometheus.url, rule_files(folder), gpus, at)
                   for folder in [args.rules, *args.compare]}
        load_before = uptime()
        rules = (costliest(evaluation_seconds(scraped.prometheus.url, args.eval_seconds),
                           group_intervals(rule_files(args.rules)), gpus, args.top)
                 if args.eval_seconds else [])
    report = {"gpus": gpus, "history_s": args.history, "load": uptime(), "per_gpu_per_second": figures,
              "costliest_rules": rules, "load_before_eval_watch": load_before}
    for folder, files in figures.items():
        print(f"{folder}: {sum(files.values()):.1f} samples per GPU per second")
        for name, value in sorted(files.items()):
            print(f"  {name:32} {value:7.2f}")
    if rules:
        print(f"costliest rules over {args.eval_seconds:g} s (load {load_before} -> {report['load']}):"
              " wall s/s per 1,000 GPUs, mean ms, group / rule")
        for row in rules:
            print(f"  {row['seconds_per_second_per_1000_gpus']:.4f}  {row['mean_ms']:8.1f}  "
                  f"{row['group']} / {row['rule']} #{row['index']}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()

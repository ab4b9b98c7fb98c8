"""What PromQL expressions cost, each timed as an instant query on a fleet with the rules loaded.

    .venv/bin/python -m bench.query_cost --queries bench/queries/straggler_rewrite.yml --nodes 125

One Prometheus (5 s scrapes) scrapes `--nodes` simulated nodes (bench/sim_capacity.py's fleet,
served and scraped as bench/fleet_prometheus.py does) with every rule file of `--rules` loaded, so
the records the expressions read exist. After `--warmup` seconds each expression of the queries
file (YAML: name -> PromQL) is sent `--rounds` times; Prometheus's own `execTotalTime` (stats=all)
is reported, median and least, with the series returned: a rule's cost before and after a rewrite,
where bench/scale_prometheus.py's process CPU is too noisy to tell a few milliseconds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import urllib.parse
import urllib.request
from pathlib import Path

import yaml

from bench.scale_prometheus import ROOT, bench_scenario, measured_fleet, uptime
from bench.sim_capacity import report
from flopwatch.stack.process import MissingBinary


def load_queries(path: Path) -> dict[str, str]:
    """name -> expression from a YAML mapping; a one-line error for anything else."""
    data = yaml.safe_load(path.read_text())
    if not isinstance(data, dict) or not data or not all(isinstance(v, str) and v.strip() for v in data.values()):
        raise ValueError(f"{path}: expected a YAML mapping of names to PromQL expressions")
    return {str(name): expr for name, expr in data.items()}


def exec_seconds(url: str, expr: str) -> tuple[float, int]:
    """Prometheus's own execution time of one instant query, and the series it returned."""
    query = urllib.parse.urlencode({"query": expr, "stats": "all"})
    with urllib.request.urlopen(f"{url}/api/v1/query?{query}", timeout=300) as answer:
        data = json.load(answer)["data"]
    return data["stats"]["timings"]["execTotalTime"], len(data["result"])


def measure(nodes: int, rules: Path, queries: dict[str, str], rounds: int, warmup: float) -> dict[str, object]:
    scenario = bench_scenario(nodes)
    with measured_fleet(scenario) as scraped:
        prom = scraped.prometheus
        prom.config["rule_files"] = [str(path) for path in sorted(rules.glob("flopwatch-*.yml"))]
        prom.reload()
        time.sleep(warmup)
        out: dict[str, object] = {"nodes": nodes, "rules": str(rules), "rounds": rounds, "uptime_load": uptime()}
        for name, expr in queries.items():
            timings, series = zip(*(exec_seconds(prom.url, expr) for _ in range(rounds)), strict=True)
            out[name] = {"median_ms": round(1000 * statistics.median(timings), 2),
                         "least_ms": round(1000 * min(timings), 2), "series": series[-1]}
        return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queries", type=Path, required=True, metavar="FILE", help="YAML: name -> PromQL expression")
    parser.add_argument("--rules", type=Path, default=ROOT / "alerts", metavar="DIR",
                        help="folder of rule files (flopwatch-*.yml) loaded; default: alerts/")
    parser.add_argument("--nodes", type=int, default=125, help="simulated nodes of 8 GPUs (default 125: 1,000 GPUs)")
    parser.add_argument("--rounds", type=int, default=15, help="times each expression is sent (default 15)")
    parser.add_argument("--warmup", type=float, default=150.0,
                        help="seconds between loading the rules and the first query (default 150)")
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args()
    try:
        queries = load_queries(args.queries)
    except (OSError, ValueError, yaml.YAMLError) as error:
        parser.exit(2, f"query_cost: {error}\n")
    if args.nodes < 1 or args.rounds < 1 or args.warmup < 0:
        parser.error("--nodes and --rounds must be 1 or more, --warmup 0 or more")
    try:
        results = measure(args.nodes, args.rules.resolve(), queries, args.rounds, args.warmup)
    except MissingBinary as error:
        parser.exit(2, f"{error}\n")
    report({"query_cost": results}, args.json)


if __name__ == "__main__":
    main()

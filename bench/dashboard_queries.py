"""What each dashboard costs Prometheus on a larger fleet: every panel query, as Grafana sends it,
timed against a reference query measured alternately in the same run.

    .venv/bin/python -m bench.dashboard_queries --nodes 256 --warmup 180 --json /tmp/dash.json

One Prometheus (5 s scrapes, alerts/*.yml loaded) scrapes `--nodes` simulated nodes (8 GPUs each,
one 1,024-GPU job per 128 nodes, a thermal straggler) from one simulator process. After every target
is up and `--warmup` seconds have passed, each target of each panel is sent like Grafana would for
the data so far: variables substituted (one job and node where a dashboard is about one, All
elsewhere), $__rate_interval = 20s (4 x the scrape interval), a range query at a 5 s step for
graphs, an instant query for stats and tables. Each is timed `--rounds` times, each time right after
the reference (`sum(rate(flopwatch_gpu_energy_joules_total[20s]))` over the same range: one rate per
GPU, summed), so the ratio holds on a loaded machine where the milliseconds do not.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

from bench.fleet_prometheus import scraped_fleet
from bench.sim_capacity import fleet_scenario
from flopwatch import dashboards
from flopwatch.promql import PromClient

ROOT = Path(__file__).resolve().parents[1]
RULE_FILES = sorted(p for p in (ROOT / "alerts").glob("*.yml") if p.name != "alertmanager.yml")
REFERENCE = "sum(rate(flopwatch_gpu_energy_joules_total[20s]))"
STEP_S = 5.0


def selections(job_id: str, node: str) -> dict[str, dict[str, str]]:
    """What a user looks at on each dashboard: All on fleet-wide ones, one job or node where it is about one."""
    return {
        "flopwatch-fleet": {"job_id": ".*"},
        "flopwatch-job": {"job_id": job_id, "node": ".*", "gpu": ".*"},
        "flopwatch-node": {"node": node, "gpu": ".*"},
        "flopwatch-network": {"node": ".*"},
        "flopwatch-reliability": {"job_id": ".*", "node": ".*"},
        "flopwatch-fabric": {"level": ".*", "switch": ".*"},
    }


def timed(client: PromClient, expr: str, instant: bool, start: float, end: float) -> tuple[float, int]:
    began = time.perf_counter()
    series = len(client.query(expr, at=end) if instant else client.query_range(expr, start, end, STEP_S))
    return time.perf_counter() - began, series


def measure(client: PromClient, start: float, end: float, rounds: int, job_id: str, node: str) -> dict:
    chosen = selections(job_id, node)
    reference: list[float] = []
    rows = []
    for uid, dashboard in dashboards.build_all().items():
        values = {**chosen[uid], "__rate_interval": "20s", "__range": f"{int(end - start)}s"}
        for panel in dashboards.panels(dashboard):
            for target in panel["targets"]:
                expr = dashboards.expand(target["expr"], values)
                instant = bool(target.get("instant"))
                times = []
                series = 0
                for _ in range(rounds):
                    reference.append(timed(client, REFERENCE, False, start, end)[0])
                    seconds, series = timed(client, expr, instant, start, end)
                    times.append(seconds)
                print(f"{uid} / {panel['title']} / {target['refId']}: {statistics.median(times) * 1000:.1f} ms",
                      file=sys.stderr, flush=True)
                rows.append({"dashboard": uid, "panel": panel["title"], "ref": target["refId"],
                             "instant": instant, "median_ms": statistics.median(times) * 1000, "series": series})
    ref_ms = statistics.median(reference) * 1000
    for row in rows:
        row["ratio"] = row["median_ms"] / ref_ms
    per_dashboard = {}
    for uid in dashboards.BUILDERS:
        mine = [r for r in rows if r["dashboard"] == uid]
        total = sum(r["median_ms"] for r in mine)
        per_dashboard[uid] = {"queries": len(mine), "total_ms": round(total, 1), "ratio": round(total / ref_ms, 1),
                              "max_series": max(r["series"] for r in mine)}
    return {"reference_ms": round(ref_ms, 2), "reference_spread_ms": [round(min(reference) * 1000, 2),
                                                                      round(max(reference) * 1000, 2)],
            "dashboards": per_dashboard,
            "costliest": [{k: (round(v, 2) if isinstance(v, float) else v) for k, v in r.items()}
                          for r in sorted(rows, key=lambda r: r["ratio"], reverse=True)[:12]]}


def run(nodes: int, warmup: float, rounds: int) -> dict:
    scenario = fleet_scenario(nodes)
    with scraped_fleet(scenario, rule_files=RULE_FILES) as scraped:
        client = scraped.client
        start = time.time()
        time.sleep(warmup)
        end = time.time()
        job_id = scenario.jobs[0].id
        node = "node0017" if nodes > 17 else "node0000"  # the thermal straggler's node
        result = measure(client, start, end, rounds, job_id, node)
        result.update({
            "nodes": nodes, "gpus": nodes * scenario.fleet.gpus_per_node, "range_s": round(end - start),
            "step_s": STEP_S, "rounds": rounds, "head_series": client.scalar("prometheus_tsdb_head_series"),
            "load_average_1m_at_end": round(os.getloadavg()[0], 2),
        })
        return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=256)
    parser.add_argument("--warmup", type=float, default=180, help="seconds of data before timing")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args()
    result = run(args.nodes, args.warmup, args.rounds)
    text = json.dumps(result, indent=1)
    if args.json:
        Path(args.json).write_text(text)
    print(text)


if __name__ == "__main__":
    main()

"""How long `flopwatch report` takes for a week of a 1,024-GPU cluster, against a 128-GPU week
measured in the same run (the ratio is what carries over between machines).

    .venv/bin/python -m bench.report_week --nodes 128 --reference-nodes 16 --step 300 --json out.json

(--data DIR keeps each loaded week in DIR and reuses it on the next run: loading 1,024 GPUs takes
minutes, building the report seconds.)

Each fleet is simulated for 7 days and remote-written into its own throwaway Prometheus (the
detection benchmark's encoder and fleet sampler, only the series the report reads, one sample
every --step seconds), then the report is built through its public API with the default
settings; build time excludes loading. Prints and writes series, samples, load time, build time
and the number of queries.
"""

from __future__ import annotations

import argparse
import json
import re
import time
from pathlib import Path

from flopwatch.detect import remote_write
from flopwatch.detect.engine import exact_nodes_for
from flopwatch.detect.fast_sampler import supported_names
from flopwatch.detect.sampler import FleetSampler, Recorder
from flopwatch.report import ReportSettings, build, write
from flopwatch.report.queries import QueryBuilder, probe_queries
from flopwatch.report.window import Window, grid_for
from flopwatch.sim.fleet import Fleet
from flopwatch.sim.scenario import Scenario, parse
from flopwatch.stack import Prometheus

DAY = 86400.0
MODEL_70B = {"params": 70e9, "layers": 80, "heads": 64, "head_dim": 128, "seq_len": 4096}
MODEL_8B = {"params": 8e9, "layers": 32, "heads": 32, "head_dim": 128, "seq_len": 8192}


def week_scenario(nodes: int) -> Scenario:
    """Half the nodes in a week-long job, a quarter in a 4-day job, an eighth in a 2-day job, the rest
    idle; a thermal straggler, a lost GPU and an XID."""
    half, quarter, eighth = nodes // 2, nodes // 4, max(1, nodes // 8)
    return parse({
        "name": f"report-bench-{nodes}", "seed": 3, "duration": "7d", "scrape_interval": "60s",
        "fleet": {"nodes": nodes, "gpus_per_node": 8, "gpu_model": "H100-SXM", "nics_per_node": 2},
        "jobs": [
            {"id": "pretrain", "nodes": f"0-{half - 1}", "tokens_per_step": 4194304 * max(1, half // 8),
             "target_mfu": 0.4, "model": MODEL_70B, "user": "alice"},
            {"id": "sweep", "nodes": f"{half}-{half + quarter - 1}", "tokens_per_step": 2097152,
             "target_mfu": 0.2, "start": "1d", "end": "5d", "model": MODEL_8B, "user": "bob"},
            {"id": "finetune", "nodes": f"{half + quarter}-{half + quarter + eighth - 1}",
             "tokens_per_step": 1048576, "target_mfu": 0.35, "start": "4d", "end": "6d", "model": MODEL_8B,
             "user": "carol"},
        ],
        "faults": [
            {"kind": "thermal_throttle", "node": 1, "gpu": 2, "start": "2d", "duration": "2h", "slowdown": 0.1},
            {"kind": "gpu_lost", "node": 2, "gpu": 1, "start": "3d", "duration": "30m"},
            {"kind": "xid", "node": half, "gpu": 0, "xid": 13, "start": "2d", "duration": "1m"},
        ],
    })


def report_series(step: float) -> set[str]:
    settings, window = ReportSettings(), Window(0.0, 7 * DAY)
    promql = QueryBuilder(settings, window, grid_for(window, step), step)
    queries = [*promql.range_queries(), *promql.counter_queries(), *promql.total_queries(window),
               *promql.hardware_candidates(),
               promql.straggler_arrivals(), promql.power_fallback(), *probe_queries(settings, window),
               promql.straggler_detail("d", "", "j", "0", "n", "0", 0.0, 600.0), promql.gpu_job("o", "", "n", "0", 0)]
    return set(re.findall(r"flopwatch_[a-z0-9_]+", " ".join(q.expr for q in queries))) & supported_names()


def load(fleet: Fleet, url: str, span: float, step: float) -> tuple[int, int]:
    """Remote-write `span` of the fleet; returns (series, samples)."""
    names = report_series(step)
    sampler = FleetSampler(fleet, names, exact_nodes_for(fleet.scenario))
    recorder = Recorder(lambda labels: dict(labels)["__name__"] in names)
    samples = 0
    while fleet.t < span - 1e-9:
        fleet.advance(step)
        recorder.add(round(fleet.now_unix * 1000), sampler.sample())
        if recorder.pending_ticks >= 144 or fleet.t >= span - 1e-9:
            block = recorder.flush()
            if block is not None:
                remote_write.post(url + "/api/v1/write", remote_write.encode_request(
                    block.label_bytes, block.values, block.present, block.timestamps_ms))
                samples += block.samples
    return len(recorder.labels), samples


def measure(nodes: int, step: float, out: Path | None, data: Path | None = None) -> dict[str, float]:
    """Load (or reuse, from `data`) a simulated week of `nodes` nodes and time the report's build."""
    marker = data / "loaded.json" if data is not None else None
    if marker is not None and marker.exists():
        loaded_week = json.loads(marker.read_text())
        start, end, series, samples, loaded = (loaded_week[k] for k in ("start", "end", "series", "samples",
                                                                         "load_s"))
    else:
        start = float(int(time.time() // step * step - 7 * DAY))
        end = start + 7 * DAY
    if data is not None:
        data.mkdir(parents=True, exist_ok=True)
    with Prometheus(remote_write_receiver=True, out_of_order_window="30d", workdir=data,
                    extra_args=["--storage.tsdb.retention.time=10y"]) as prom:
        if marker is None or not marker.exists():
            fleet = Fleet(week_scenario(nodes), start_unix=start)
            began = time.perf_counter()
            series, samples = load(fleet, prom.url, 7 * DAY, step)
            loaded = round(time.perf_counter() - began, 1)
            if marker is not None:
                marker.write_text(json.dumps({"start": start, "end": end, "series": series, "samples": samples,
                                              "load_s": loaded}))
        queries = []
        began = time.perf_counter()
        report = build(prom.url, Window(start, end), ReportSettings(),
                       progress=lambda done, total, title: queries.append(done))
        seconds = time.perf_counter() - began
    if out is not None:
        write(report, out, pdf=False)
    stragglers = len(report.section("stragglers").tables[0].rows)
    return {"gpus": nodes * 8, "series": series, "samples": samples, "load_s": loaded,
            "build_s": round(seconds, 2), "queries": max(queries or [0]), "stragglers": stragglers}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=128, help="nodes of 8 GPUs in the measured fleet")
    parser.add_argument("--reference-nodes", type=int, default=16, help="nodes of the reference fleet")
    parser.add_argument("--step", type=float, default=300.0, help="seconds between samples")
    parser.add_argument("--json", type=Path, help="write the figures here")
    parser.add_argument("--out", type=Path, help="write the big fleet's report here")
    parser.add_argument("--data", type=Path, help="keep each loaded week in DIR/<gpus> and reuse it next time")
    args = parser.parse_args()
    reference = measure(args.reference_nodes, args.step, None,
                        args.data / str(args.reference_nodes * 8) if args.data else None)
    print("reference", reference, flush=True)
    big = measure(args.nodes, args.step, args.out, args.data / str(args.nodes * 8) if args.data else None)
    print("measured", big, flush=True)
    result = {"step": args.step, "reference": reference, "measured": big,
              "build_ratio": round(big["build_s"] / reference["build_s"], 2),
              "samples_ratio": round(big["samples"] / reference["samples"], 2)}
    print(json.dumps(result, indent=1))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()

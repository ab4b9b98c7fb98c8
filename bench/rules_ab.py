"""Rule CPU of two rule folders, taken in turn on one fleet and one Prometheus.

    .venv/bin/python -m bench.rules_ab --reference OLD/alerts --candidate alerts --nodes 125 \
        --rounds 2 --json ab.json

bench/scale_prometheus.py measures one rule folder per run as the Prometheus CPU with rules minus
the CPU of a scrape-only window before them; two runs of the same folder on this machine have read
rule CPU 5-10% apart, more than the change a rule rewrite makes. Here both folders run on the same
simulated fleet (bench/sim_capacity.py's, served and scraped as bench/fleet_prometheus.py does) and
the same Prometheus, each loaded in turn (reference, candidate, candidate, reference, ... so that a
drift over the run weighs on both alike): after each reload `--warmup` seconds pass (every rate
and `_over_time` window of a minute fills), then Prometheus's CPU is read over `--seconds`. Each
window's rule CPU is its CPU minus the scrape-only window's at the start, per 1,000 GPUs and per
iteration run (a starved Prometheus skips some); the candidate's figure over the reference's is
given per pair of windows and for the means, with both folders' windows listed, and each group's
mean evaluation time per second of the window (wall time, waiting for a core included: where the
time went, not what it cost).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import yaml

from bench.scale_prometheus import _groups, _window, bench_scenario, measured_fleet, rule_cores_needed, uptime
from bench.sim_capacity import report
from flopwatch.stack import Prometheus
from flopwatch.stack.process import MissingBinary


def order(rounds: int) -> list[str]:
    """Which folder each window loads: reference and candidate alternate, in mirrored pairs
    (R C C R R C ...), so that a drift over the run is spread over both."""
    out: list[str] = []
    for i in range(rounds):
        out += ["reference", "candidate"] if i % 2 == 0 else ["candidate", "reference"]
    return out


def group_names(folder: Path) -> set[str]:
    """The rule groups a folder's files define."""
    return {group["name"] for path in sorted(folder.glob("flopwatch-*.yml"))
            for group in (yaml.safe_load(path.read_text()) or {}).get("groups", [])}


def rule_cores(window: dict[str, object], scrape_only_cores: float, loaded: set[str]) -> float:
    """The cores a window's rules need, counting the iterations of the groups loaded only (a group
    the folder before had and this one has not must not read as skipped iterations)."""
    groups = {name: figures for name, figures in _groups(window).items() if name in loaded}
    return rule_cores_needed(groups, window["cpu"] / window["wall"], scrape_only_cores)[1]  # type: ignore[operator]


def summary(windows: list[dict[str, object]]) -> dict[str, object]:
    """Per folder: each window's rule cores per 1,000 GPUs, their mean and spread; the candidate
    over the reference for the means and for each pair of neighbouring windows."""
    by: dict[str, list[float]] = {"reference": [], "candidate": []}
    for window in windows:
        by[window["rules"]].append(window["rule_core_seconds_per_s_per_1000_gpus"])  # type: ignore[index]
    out: dict[str, object] = {}
    for name, values in by.items():
        out[f"{name}_per_window"] = values
        out[f"{name}_mean"] = round(statistics.mean(values), 4) if values else None
        out[f"{name}_spread"] = round(max(values) - min(values), 4) if values else None
    pairs = [round(c / r, 3) for r, c in zip(by["reference"], by["candidate"], strict=False) if r]
    out["candidate_over_reference_per_pair"] = pairs
    mean_r, mean_c = out["reference_mean"], out["candidate_mean"]
    out["candidate_over_reference"] = round(mean_c / mean_r, 3) if mean_r and mean_c is not None else None  # type: ignore[operator]
    return out


def _load(prom: Prometheus, folder: Path) -> None:
    prom.config["rule_files"] = [str(path) for path in sorted(folder.glob("flopwatch-*.yml"))]
    prom.reload()


def measure(nodes: int, folders: dict[str, Path], rounds: int, seconds: float, warmup: float) -> dict[str, object]:
    scenario = bench_scenario(nodes)
    gpus = nodes * scenario.fleet.gpus_per_node
    with measured_fleet(scenario) as scraped:
        prom = scraped.prometheus
        load_at_start = uptime()
        time.sleep(min(20.0, warmup))
        scrape_only = _window(prom, seconds / 2)
        scrape_cores = scrape_only["cpu"] / scrape_only["wall"]  # type: ignore[operator]
        windows: list[dict[str, object]] = []
        for name in order(rounds):
            _load(prom, folders[name])
            time.sleep(warmup)
            window = _window(prom, seconds)
            loaded = group_names(folders[name])
            cores = rule_cores(window, scrape_cores, loaded)
            busy = {group: round(1000 * figures["duration_mean_s"] / figures["interval_s"], 2)
                    for group, figures in _groups(window).items() if group in loaded}
            windows.append({"rules": name, "rule_core_seconds_per_s_per_1000_gpus": round(cores / (gpus / 1000), 4),
                            "prometheus_cpu_cores": round(window["cpu"] / window["wall"], 3),  # type: ignore[operator]
                            "load_average_1m_at_end": uptime(),
                            # wall time, waiting for a core included: where the time went, not what it cost
                            "group_busy_ms_per_s": busy, "groups_busy_ms_per_s": round(sum(busy.values()), 2)})
    return {"nodes": nodes, "gpus": gpus, "seconds_per_window": seconds, "warmup_s": warmup,
            "prometheus_cpu_cores_scrape_only": round(scrape_cores, 3),
            "reference": str(folders["reference"]), "candidate": str(folders["candidate"]),
            "uptime_load_at_start": load_at_start, "uptime_load_at_end": uptime(),
            "windows": windows, **summary(windows)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reference", type=Path, required=True, metavar="DIR",
                        help="folder of the reference rule files (flopwatch-*.yml)")
    parser.add_argument("--candidate", type=Path, required=True, metavar="DIR",
                        help="folder of the rule files compared with it")
    parser.add_argument("--nodes", type=int, default=125, help="simulated nodes of 8 GPUs (default 125: 1,000 GPUs)")
    parser.add_argument("--rounds", type=int, default=2, help="pairs of windows (default 2)")
    parser.add_argument("--seconds", type=float, default=120, help="seconds each window measures (default 120)")
    parser.add_argument("--warmup", type=float, default=75.0,
                        help="seconds between loading a folder and measuring it (default 75)")
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args()
    folders = {"reference": args.reference.resolve(), "candidate": args.candidate.resolve()}
    for name, folder in folders.items():
        if not sorted(folder.glob("flopwatch-*.yml")):
            parser.error(f"--{name}: no rule files (flopwatch-*.yml) in {folder}")
    if args.nodes < 1 or args.rounds < 1 or args.seconds <= 0 or args.warmup < 0:
        parser.error("--nodes and --rounds must be 1 or more, --seconds over 0, --warmup 0 or more")
    try:
        results = measure(args.nodes, folders, args.rounds, args.seconds, args.warmup)
    except MissingBinary as error:
        parser.exit(2, f"{error}\n")
    report({"rules_ab": results}, args.json)


if __name__ == "__main__":
    main()

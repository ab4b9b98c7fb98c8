"""The same fleet and rule files as bench/scale_prometheus.py's Prometheus, through VictoriaMetrics
(single node, promscrape) and vmalert: CPU, memory, evaluation durations and missed evaluations
measured the same way, so one run can quote one engine as ratios of the other.

VictoriaMetrics scrapes the simulated fleet with a promscrape config equal to the Prometheus one
(5 s scrapes, file_sd, timeout = interval); vmalert reads from it (`-datasource.url`,
`-remoteRead.url` for alert state) and writes recording rules back (`-remoteWrite.url`), at
`-evaluationInterval` 15 s like Prometheus' `evaluation_interval`, each group's own `interval`
honoured. Alerting rules make vmalert insist on a notifier: a real Alertmanager, not measured.

vmalert (Debian's 1.79) refuses to start on a file with anything it does not know: the rule files
go through flopwatch.stack.vmalert_rules first, which takes out what it names and reports it.
"""

from __future__ import annotations

import functools
import os
import statistics
import tempfile
import time
import urllib.request
from collections import defaultdict
from pathlib import Path
from typing import Any

import psutil
import yaml

from bench.fleet_prometheus import FLEET_HISTORY_S, failed_scrapes, served_fleet, sim_scrape_job, wait_targets
from bench.scale_prometheus import (
    _busiest_others,
    _other_processes,
    rule_cores_needed,
    scrape_targets,
    server_metrics,
    uptime,
)
from bench.sim_capacity import cpu_seconds
from flopwatch.promql import PromClient, PromError
from flopwatch.sim.fleet import Fleet
from flopwatch.sim.scenario import Scenario
from flopwatch.stack import Alertmanager, VictoriaMetrics, VmAlert
from flopwatch.stack.vmalert_rules import vmalert_rules

NULL_ALERTMANAGER = {"route": {"receiver": "null"}, "receivers": [{"name": "null"}]}


# -- vmalert's own /metrics ------------------------------------------------------------------------------
def vmalert_metrics(url: str) -> dict[tuple[str, str], float]:
    """(name, group or "") -> value of vmalert's per-group iteration figures and error counters; the
    duration summary's quantiles are left out (its _sum and _count give exact means per window)."""
    return server_metrics(url, ("vmalert_iteration_total", "vmalert_iteration_missed_total",
                                "vmalert_iteration_interval_seconds", "vmalert_iteration_duration_seconds_sum",
                                "vmalert_iteration_duration_seconds_count", "vmalert_execution_errors_total",
                                "vmalert_execution_total"), "group")


def _rows_inserted(victoria_url: str) -> float:
    """Samples VictoriaMetrics has taken in (scraped, and vmalert's recording rules written back),
    from its own /metrics: what Prometheus's samples-appended counter counts."""
    with urllib.request.urlopen(f"{victoria_url}/metrics", timeout=60) as answer:
        return sum(float(line.rsplit(" ", 1)[1]) for line in answer.read().decode().splitlines()
                   if line.startswith("vm_rows_inserted_total{"))


def _window(engine: list[psutil.Process], victoria_url: str | None, vmalert_url: str | None, seconds: float,
            sample_every: float = 5.0) -> dict[str, Any]:
    """CPU and RSS of the engine's processes and of this one (the simulator), vmalert's counters at
    both ends and each group's mean duration between samples (one or two iterations each); rows
    VictoriaMetrics took in per second (0 without `victoria_url`: a window of other processes)."""
    me = psutil.Process()
    mine = {me.pid, *(process.pid for process in engine)}
    others0, load0 = _other_processes(mine), os.getloadavg()[0]
    read = (lambda: vmalert_metrics(vmalert_url)) if vmalert_url else dict
    rows = (lambda: _rows_inserted(victoria_url)) if victoria_url else float
    # the simulator is this process: its CPU from the process clock (psutil's 10 ms ticks read a
    # small fleet's window as 0)
    first, rows0, me0 = read(), rows(), time.process_time()
    cpu0, wall0 = [cpu_seconds(process) for process in engine], time.monotonic()
    durations: dict[str, list[float]] = defaultdict(list)
    rss: list[list[float]] = []
    previous = first
    while time.monotonic() - wall0 < seconds:
        rss.append([process.memory_info().rss for process in engine])
        time.sleep(max(0.0, min(sample_every, seconds - (time.monotonic() - wall0))))
        now = read()
        for (name, group), count in now.items():
            if name == "vmalert_iteration_duration_seconds_count" and count > previous.get((name, group), 0):
                spent = now[("vmalert_iteration_duration_seconds_sum", group)] - \
                    previous.get(("vmalert_iteration_duration_seconds_sum", group), 0)
                durations[group].append(spent / (count - previous.get((name, group), 0)))
        previous = now
    wall = time.monotonic() - wall0
    cpu = [cpu_seconds(process) - before for process, before in zip(engine, cpu0, strict=True)]
    return {"wall": wall, "rows_per_s": (rows() - rows0) / wall, "first": first,
            "last": previous, "durations": durations, "rss": rss, "cpu": sum(cpu), "cpu_each": cpu,
            "sim_cpu": time.process_time() - me0, "load_1m_at_start": load0,
            "others": _busiest_others(others0, _other_processes(mine), wall)}


def _groups(window: dict[str, Any]) -> dict[str, dict[str, float]]:
    first, last = window["first"], window["last"]
    out = {}
    for (name, group), interval in last.items():
        if name != "vmalert_iteration_interval_seconds":
            continue

        def delta(counter: str, group: str = group) -> float:
            return last.get((counter, group), 0.0) - first.get((counter, group), 0.0)

        runs = delta("vmalert_iteration_total")
        spent = delta("vmalert_iteration_duration_seconds_sum")
        mean = spent / runs if runs else 0.0
        # vmalert's quantiles, sampled every few seconds, can miss the slowest run of a window of
        # few runs; the slowest took at least the mean.
        seen = [*(window["durations"].get(group) or [0.0]), mean]
        out[group] = {"interval_s": interval, "iterations_run": runs,
                      "missed": delta("vmalert_iteration_missed_total"), "nominal": window["wall"] / interval,
                      "duration_mean_s": mean, "duration_max_s": max(seen)}
    return out


# -- VictoriaMetrics + vmalert, the whole fleet, every rule ---------------------------------------------
def _promscrape_config(targets: Path, interval: float) -> dict[str, Any]:
    """What bench/scale_prometheus.py gives Prometheus: 5 s scrapes timing out at the interval."""
    every = f"{interval:g}s"
    return {"global": {"scrape_interval": every, "scrape_timeout": every},
            "scrape_configs": [sim_scrape_job(targets)]}


def serve_with_vmalert(scenario: Scenario, seconds: float, interval: float = 5.0, tick: float | None = None,
                       rule_files: list[Path] = (),  # type: ignore[assignment]
                       warmup: float = 75.0) -> dict[str, Any]:
    """Phase 1: VictoriaMetrics scrapes only; phase 2: vmalert evaluates every rule file against it.
    Rule CPU = phase 2's CPU of both minus phase 1's of VictoriaMetrics, per evaluation actually run."""
    workdir = Path(tempfile.mkdtemp(prefix="flopwatch-bench-vm-"))
    rules, removals = vmalert_rules(list(rule_files), workdir / "rules")
    if not rules:
        raise SystemExit("vmalert accepts none of the rule files; see `vmalert -dryRun -rule=FILE`")
    targets_expected = scrape_targets(scenario)
    with served_fleet(scenario, tick or interval, FLEET_HISTORY_S) as (server, targets):
        scrape = workdir / "promscrape.yml"
        scrape.write_text(yaml.safe_dump(_promscrape_config(targets, interval)))
        victoria = VictoriaMetrics(extra_args=[f"-promscrape.config={scrape}", "-search.maxUniqueTimeseries=100000000",
                                               "-search.maxQueryDuration=300s"])
        alertmanager = Alertmanager(NULL_ALERTMANAGER)
        vmalert: VmAlert | None = None
        try:
            victoria.start(timeout=60)
            alertmanager.start(timeout=60)
            client = PromClient(victoria.url, timeout=300)
            wait_targets(client, targets_expected, 300, "VictoriaMetrics")
            load_at_start = uptime()
            time.sleep(min(20.0, warmup))
            vm_proc = psutil.Process(victoria.proc.pid)
            scrape_only = _window([vm_proc], victoria.url, None, seconds / 2)
            vmalert = VmAlert(rules, victoria.url, notifiers=[alertmanager.url], evaluation_interval="15s",
                              extra_args=[f"-remoteRead.url={victoria.url}"])
            vmalert.start(timeout=60)
            time.sleep(warmup)  # a minute of samples behind every rate(...[1m]); every group has run
            ticks_before = server.ticks
            with_rules = _window([vm_proc, psutil.Process(vmalert.proc.pid)], victoria.url, vmalert.url, seconds)
            ticks = list(server.tick_seconds)[-(server.ticks - ticks_before):]
            failing = sorted(vmalert.rule_errors())   # from the API: the same in every release
            # vmalert stops before the last queries: at 10,000 GPUs its own queries kept
            # VictoriaMetrics at its concurrency limit, which answered the next one with a 503.
            vmalert.stop()
            vmalert = None
            failed = _answered(client, failed_scrapes(with_rules["wall"]))
            series = _answered(client, 'sum(scrape_samples_scraped{job="sim"})') or 0
            report = _report(server.fleet, targets_expected, interval, tick, scrape_only, with_rules, failed, series,
                             ticks, removals, failing)
            return {**report, "uptime_load_at_start": load_at_start, "uptime_load_at_end": uptime()}
        finally:
            for process in (vmalert, alertmanager, victoria):
                if process is not None:
                    process.stop()


def _answered(client: PromClient, expr: str, attempts: int = 6, how: str = "scalar", at: float | None = None) -> Any:
    """A query's value (`how`: the client's `scalar`, or `query` for its samples; at `at`, or now),
    asked again after a pause while VictoriaMetrics answers 503 (busy: its concurrent-request
    limit), which it does under a starved fleet."""
    ask = getattr(client, how)
    if at is not None:
        ask = functools.partial(ask, at=at)
    for attempt in range(1, attempts):
        try:
            return ask(expr)
        except PromError as error:
            if error.status != 503:
                raise
            time.sleep(5.0 * attempt)
    return ask(expr)                            # the last try: its error, if any, is the caller's


def _report(fleet: Fleet, targets: int, interval: float, tick: float | None, scrape_only: dict[str, Any],
            rules: dict[str, Any], failed: float | None, series: float, ticks: list[float],
            removals: list[dict[str, str]], failing: list[str]) -> dict[str, Any]:
    """The figures, named as bench/scale_prometheus.py names Prometheus's where they mean the same."""
    groups = _groups(rules)
    nodes, gpus = len(fleet.nodes), len(fleet.nodes) * fleet.scenario.fleet.gpus_per_node
    cpu_scrape = scrape_only["cpu"] / scrape_only["wall"]
    cpu_rules = rules["cpu"] / rules["wall"]
    done_share, rule_cores = rule_cores_needed(groups, cpu_rules, cpu_scrape)
    first, last = rules["first"], rules["last"]
    rss = [sum(sample) for sample in rules["rss"]]
    return {
        "engine": "victoriametrics", "nodes": nodes, "gpus": gpus, "targets": targets, "scrape_interval_s": interval,
        "sim_tick_interval_s": tick or interval,
        "window_s_scrape_only": round(scrape_only["wall"], 1), "window_s_with_rules": round(rules["wall"], 1),
        "series_per_node": round(series / nodes, 1),
        "samples_per_s_scrape_only": round(scrape_only["rows_per_s"]),
        "samples_per_s_with_rules": round(rules["rows_per_s"]),
        "failed_scrapes_with_rules": failed,
        "cpu_cores_scrape_only": round(cpu_scrape, 3), "cpu_cores_with_rules": round(cpu_rules, 3),
        "victoria_metrics_cpu_cores_with_rules": round(rules["cpu_each"][0] / rules["wall"], 3),
        "vmalert_cpu_cores": round(rules["cpu_each"][1] / rules["wall"], 3),
        "rule_iterations_run_share": round(done_share, 3),
        "rule_cores_needed": round(rule_cores, 3),
        "rule_core_seconds_per_s_per_1000_gpus": round(rule_cores / (gpus / 1000), 4),
        "rss_gib_max": round(max(rss) / 2**30, 2),
        "victoria_metrics_rss_gib_max": round(max(sample[0] for sample in rules["rss"]) / 2**30, 2),
        "vmalert_rss_gib_max": round(max(sample[1] for sample in rules["rss"]) / 2**30, 2),
        "sim_cpu_pct_of_core": round(100 * rules["sim_cpu"] / rules["wall"], 2),
        "sim_cpu_pct_of_core_scrape_only": round(100 * scrape_only["sim_cpu"] / scrape_only["wall"], 2),
        "sim_tick_mean_s": round(statistics.mean(ticks), 2) if ticks else None,
        "rule_evaluation_failures": last.get(("vmalert_execution_errors_total", ""), 0.0)
        - first.get(("vmalert_execution_errors_total", ""), 0.0),
        "rules_in_error_at_end": failing,
        "missed_iterations": sum(g["missed"] for g in groups.values()),
        "slowest_group_max_s": round(max(g["duration_max_s"] for g in groups.values()), 3),
        "load_average_1m_at_start": round(scrape_only["load_1m_at_start"], 2),
        "load_average_1m_at_end": round(os.getloadavg()[0], 2),
        "other_processes_pct_of_core_scrape_only": scrape_only["others"],
        "other_processes_pct_of_core_with_rules": rules["others"],
        "vmalert_removed": removals,
        "groups": {name: {k: round(v, 4) for k, v in values.items()} for name, values in sorted(groups.items())},
    }


# figure of a VictoriaMetrics run -> the same figure of a Prometheus run
_SAME_FIGURE = {"cpu_cores_scrape_only": "prometheus_cpu_cores_scrape_only",
                "cpu_cores_with_rules": "prometheus_cpu_cores_with_rules", "rss_gib_max": "prometheus_rss_gib_max",
                **{key: key for key in ("rule_core_seconds_per_s_per_1000_gpus", "rule_iterations_run_share",
                                        "slowest_group_max_s", "series_per_node", "samples_per_s_with_rules")}}


def engine_ratios(victoria: dict[str, Any], prometheus: dict[str, Any]) -> dict[str, Any]:
    """VictoriaMetrics + vmalert's figures over Prometheus's measured in the same run, and each
    group's mean evaluation duration likewise (None where Prometheus's is zero or absent)."""
    def ratio(mine: Any, theirs: Any) -> float | None:
        ok = isinstance(mine, int | float) and isinstance(theirs, int | float) and theirs
        return round(mine / theirs, 3) if ok else None

    out: dict[str, Any] = {key: ratio(victoria.get(key), prometheus.get(same)) for key, same in _SAME_FIGURE.items()}
    theirs = prometheus.get("groups", {})
    out["group_duration_mean"] = {name: ratio(group["duration_mean_s"], theirs.get(name, {}).get("duration_mean_s"))
                                  for name, group in victoria.get("groups", {}).items()}
    return out

"""What the two-tier layout costs (shards judge ranks, the global tier judges jobs), measured on one
shard, so docs/scaling.md plans 100,000 GPUs from measured figures.

    .venv/bin/python -m bench.tiers --nodes 125,313 --seconds 150 --json tiers.json
    .venv/bin/python -m bench.tiers --nodes 125 --job-gpus 64 --json small-jobs.json   # 15 jobs of 64 GPUs

For each fleet size (`--nodes`, 8 GPUs a node), the same simulated fleet (bench/sim_capacity.py's:
one 1,024-GPU job per 128 nodes, or jobs of `--job-gpus`) is served once and measured twice, one
after the other, each after `--warmup` seconds and over `--seconds`:

1. reference: one Prometheus evaluating the single-Prometheus rule set (alerts/flopwatch-*.yml),
   no remote write;
2. tiers: one replica of a shard, configured by flopwatch.mixin.tiers.prometheus_config (the shard
   rule set, remote write of `forwarded_names` with the replica label dropped), writing to a
   single-node VictoriaMetrics (`-dedup.minScrapeInterval` = the scrape interval) over which vmalert
   runs the global rule set with the flags flopwatch.mixin.tiers.vmalert_args gives it.

Both send alerts to the same Alertmanager (not measured). The shard writes to the single node's own
write path and vmalert reads its query API directly: no stand-in for the cluster's URL paths
(flopwatch/stack/vm_paths.py) sits between them, whose Python proxy would take CPU from the two
cores it measures. One replica is measured; an HA pair sends each series twice (the global store
ingests both and keeps one per interval).

Figures, each from the servers' own counters over the window: Prometheus's CPU (psutil and its
process_cpu_seconds_total), rule evaluation seconds per second (prometheus_rule_group_duration_seconds),
resident memory, head series; remote write's bytes, samples, failed, retried, dropped (by the keep
relabelling) and pending samples (prometheus_remote_storage_*); VictoriaMetrics's and vmalert's CPU
and memory, rows taken in and written, series stored, each global group's evaluation durations;
what is forwarded by name (series, and samples per second counted in the shard's head), the names
the global rules read apart from those forwarded for the report and dashboards; and the series
vmalert records by name (how many per job).
Each per-second figure is also given per 1,000 GPUs, and with two or more sizes the marginal cost
per 1,000 GPUs between the smallest and the largest. The machine's load (`uptime`) and the busiest
other processes are recorded with each window. Servers come from FLOPWATCH_SERVERS (recorded).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import hashlib
import json
import sys
import tempfile
import time
import urllib.request
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

import psutil
import yaml

from bench.fleet_prometheus import failed_scrapes, served_fleet, sim_scrape_job, wait_targets
from bench.scale_prometheus import (
    OWN_METRICS,
    RULE_FILES,
    _groups,
    fleet_sizes,
    ratios,
    scrape_targets,
    server_metrics,
    uptime,
)
from bench.sim_capacity import fleet_scenario, report
from bench.vm_engine import NULL_ALERTMANAGER, _answered, _window
from bench.vm_engine import _groups as vmalert_groups
from flopwatch.mixin import config as mixin_config
from flopwatch.mixin import tiers
from flopwatch.mixin.config import MixinConfig, duration_seconds
from flopwatch.mixin.topology import AlertmanagerPeer, GlobalTier, Shard, Topology
from flopwatch.promql import PromClient
from flopwatch.sim.scenario import Scenario
from flopwatch.stack import Alertmanager, Prometheus, VictoriaMetrics, VmAlert, releases
from flopwatch.stack.process import MissingBinary
from flopwatch.stack.vm_paths import INSERT_PATHS
from flopwatch.stack.vmalert_rules import vmalert_rules

SHARD, REPLICA = "shard-1", "a"
#: Seconds the shard's remote write gets, after the window, to send what it holds up to its end.
CATCH_UP_TIMEOUT_S = 60.0
#: The GPUs of a node of bench/sim_capacity.py's fleet: --job-gpus counts whole nodes.
GPUS_PER_NODE = 8
#: As bench/scale_prometheus.py gives its Prometheus: a whole-fleet query must not hit the default limit.
MAX_SAMPLES = ("--query.max-samples=200000000",)
VICTORIA_FLAGS = ("-search.maxUniqueTimeseries=100000000", "-search.maxQueryDuration=300s")
#: Prometheus's remote-write counters and gauges (summed over its queues; one here).
REMOTE_COUNTERS = ("bytes_total", "metadata_bytes_total", "samples_total", "samples_in_total", "samples_failed_total",
                   "samples_retried_total", "samples_dropped_total", "sent_batch_duration_seconds_sum",
                   "sent_batch_duration_seconds_count")
REMOTE_GAUGES = ("samples_pending", "shards", "highest_timestamp_in_seconds", "queue_highest_sent_timestamp_seconds")
REMOTE_PREFIX = "prometheus_remote_storage_"
#: Prometheus's own counters read at both ends of a window, beside bench/scale_prometheus.py's.
PROMETHEUS_COUNTERS = (*OWN_METRICS, "prometheus_rule_group_duration_seconds_sum", "process_cpu_seconds_total",
                       *(REMOTE_PREFIX + name for name in (*REMOTE_COUNTERS, *REMOTE_GAUGES)))
VMALERT_WRITES = ("vmalert_remotewrite_sent_rows_total", "vmalert_remotewrite_sent_bytes_total",
                  "vmalert_remotewrite_errors_total", "vmalert_alerts_sent_total")
#: Figures given per 1,000 GPUs (and as the marginal cost between sizes): section -> keys.
PER_1000_GPUS: Mapping[str, tuple[str, ...]] = {
    "reference": ("cpu_cores", "rule_evaluation_s_per_s", "head_series", "samples_appended_per_s", "rss_gib_max"),
    "shard": ("cpu_cores", "rule_evaluation_s_per_s", "head_series", "samples_appended_per_s", "rss_gib_max"),
    "remote_write": ("bytes_per_s", "metadata_bytes_per_s", "samples_per_s", "forwarded_head_series"),
    "global": ("victoria_metrics_cpu_cores", "victoria_metrics_rss_gib_max", "rows_taken_in_per_s",
               "series_stored", "vmalert_cpu_cores", "vmalert_rss_gib_max", "vmalert_rows_written_per_s",
               "vmalert_evaluation_s_per_s"),
}
#: The shard's figures compared with the reference's (ratio shard / reference).
COMPARED = ("cpu_cores", "cpu_cores_own_counter", "rule_evaluation_s_per_s", "rss_gib_max", "head_series",
            "samples_appended_per_s", "rule_iterations_run_share")


# -- arithmetic on counters (pure) -------------------------------------------------------------------
def counter_rates(first: Mapping[tuple[str, str], float], last: Mapping[tuple[str, str], float], wall: float,
                  names: Collection[str]) -> dict[str, float]:
    """name -> (last - first) / wall of each counter (key (name, "")); a counter absent at both ends is 0."""
    return {name: (last.get((name, ""), 0.0) - first.get((name, ""), 0.0)) / wall for name in names}


def per_1000_gpus(figures: Mapping[str, Any], gpus: int, keys: Collection[str]) -> dict[str, float | None]:
    """Each of `keys` divided by the thousands of GPUs measured (None where the figure is absent)."""
    return {key: round(figures[key] / (gpus / 1000), 4) if isinstance(figures.get(key), int | float) else None
            for key in keys}


def marginal_per_1000_gpus(small: Mapping[str, Any], large: Mapping[str, Any], keys: Collection[str]
                           ) -> dict[str, float | None]:
    """What 1,000 more GPUs add to each of `keys`: the slope between two sizes (each with `gpus`),
    which leaves out what a server costs whatever its fleet (an intercept per 1,000 GPUs would not)."""
    more = (large["gpus"] - small["gpus"]) / 1000
    if more <= 0:
        raise ValueError(f"the larger size ({large['gpus']} GPUs) must have more GPUs than the smaller "
                         f"({small['gpus']})")
    out: dict[str, float | None] = {}
    for key in keys:
        a, b = small.get(key), large.get(key)
        out[key] = round((b - a) / more, 4) if isinstance(a, int | float) and isinstance(b, int | float) else None
    return out


def remote_write_figures(first: Mapping[tuple[str, str], float], last: Mapping[tuple[str, str], float],
                         wall: float, gpus: int, head_series: float, forwarded_series: float) -> dict[str, float]:
    """Bytes and samples a shard sent to the global tier over a window, from Prometheus's
    prometheus_remote_storage_* counters at both ends, and the forwarded share of its head series
    and of its samples (samples_in counts every sample appended, dropped those the keep relabelling
    left behind)."""
    rate = {name.removeprefix(REMOTE_PREFIX): value for name, value in
            counter_rates(first, last, wall, [REMOTE_PREFIX + name for name in REMOTE_COUNTERS]).items()}

    def now(name: str) -> float:
        return last.get((REMOTE_PREFIX + name, ""), 0.0)

    batches = rate["sent_batch_duration_seconds_count"]
    return {
        "bytes_per_s": round(rate["bytes_total"], 1), "metadata_bytes_per_s": round(rate["metadata_bytes_total"], 1),
        "samples_per_s": round(rate["samples_total"], 1), "samples_in_per_s": round(rate["samples_in_total"], 1),
        "samples_dropped_per_s": round(rate["samples_dropped_total"], 1),
        "samples_failed_per_s": round(rate["samples_failed_total"], 3),
        "samples_retried_per_s": round(rate["samples_retried_total"], 3),
        "bytes_per_sample": round(rate["bytes_total"] / rate["samples_total"], 3) if rate["samples_total"] else None,
        "batches_per_s": round(batches, 2),
        "batch_mean_s": round(rate["sent_batch_duration_seconds_sum"] / batches, 4) if batches else None,
        "samples_pending_at_end": now("samples_pending"), "queue_shards_at_end": now("shards"),
        "lag_s_at_end": round(now("highest_timestamp_in_seconds") - now("queue_highest_sent_timestamp_seconds"), 1),
        "forwarded_head_series": forwarded_series,
        "forwarded_share_of_head_series": round(forwarded_series / head_series, 4) if head_series else None,
        "forwarded_share_of_samples": round(rate["samples_total"] / rate["samples_in_total"], 4)
        if rate["samples_in_total"] else None,
        "bytes_per_s_per_gpu": round(rate["bytes_total"] / gpus, 2),
    }


def with_topology(mixin: MixinConfig, write_url: str, read_url: str, alertmanager_url: str) -> MixinConfig:
    """The settings with a topology of one shard (replica REPLICA) over a global tier at these URLs."""
    return dataclasses.replace(mixin, topology=Topology(
        (Shard(SHARD, (REPLICA,)),), GlobalTier(write_url, read_url),
        (AlertmanagerPeer(alertmanager_url, "127.0.0.1:9094"),)))   # the peer: gossip is not run here


def write_rules(files: Mapping[str, str], folder: Path) -> list[Path]:
    """Rule files (name -> text) written into `folder`; their paths, sorted."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / name).write_text(text)
    return sorted(folder / name for name in files)


def rules_digest(paths: Collection[Path]) -> str:
    """The first 12 hex digits of sha256 over the rule files (sorted by name): which rules ran."""
    digest = hashlib.sha256()
    for path in sorted(paths, key=lambda path: path.name):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:12]


# -- measuring -----------------------------------------------------------------------------------------
def _sent_up_to(url: str, moment: float, timeout: float) -> float | None:
    """Seconds until a Prometheus's remote write had sent every sample up to `moment` (its queues'
    highest sent timestamp), or None if it had not within `timeout`."""
    started = time.monotonic()
    gauge = REMOTE_PREFIX + "queue_highest_sent_timestamp_seconds"
    while time.monotonic() - started < timeout:
        sent = server_metrics(url, (gauge,), "remote_name").values()
        if sent and min(sent) >= moment:
            return round(time.monotonic() - started, 1)
        time.sleep(0.5)
    return None


def _series_by_name(client: PromClient, names: Collection[str], at: float | None = None) -> dict[str, float]:
    """name -> series of that name the server holds at `at` (or now; names with none left out);
    asked again while VictoriaMetrics answers 503 (busy)."""
    if not names:
        return {}
    answer = _answered(client, f'count by (__name__) ({{__name__=~"{"|".join(sorted(names))}"}})', how="query",
                       at=at)
    return {sample.labels["__name__"]: sample.value for sample in answer}


def _samples_by_name(client: PromClient, names: Collection[str], seconds: float) -> dict[str, float]:
    """name -> samples per second Prometheus appended under that name over the last `seconds`
    (what remote write forwards of it: a name's share of the bytes); one query per name, since
    count_over_time drops the name it would be grouped by."""
    window = f"{int(seconds)}s"
    counts = {name: client.scalar(f"sum(count_over_time({name}[{window}]))") for name in sorted(names)}
    return {name: count / int(seconds) for name, count in counts.items() if count}


def _head_by_name(client: PromClient) -> dict[str, float]:
    """name -> series Prometheus holds now, every name (to say where two servers' head series differ)."""
    return {sample.labels["__name__"]: sample.value for sample in client.query('count by (__name__) ({__name__!=""})')}


def series_differences(measured: Mapping[str, float], reference: Mapping[str, float], top: int = 12
                       ) -> dict[str, float]:
    """The names whose series counts differ most between two servers (measured - reference), largest first."""
    differences = {name: measured.get(name, 0.0) - reference.get(name, 0.0) for name in {*measured, *reference}}
    ranked = sorted(differences.items(), key=lambda item: (-abs(item[1]), item[0]))
    return {name: difference for name, difference in ranked[:top] if difference}


def _group_times(url: str) -> dict[str, float]:
    """Each rule group's last evaluation time (s) from /api/v1/rules, slowest first."""
    with urllib.request.urlopen(f"{url}/api/v1/rules", timeout=60) as answer:
        groups = json.load(answer)["data"]["groups"]
    times = sorted(((group["evaluationTime"], group["name"]) for group in groups), reverse=True)
    return {name: round(seconds, 4) for seconds, name in times}


def _prometheus_window(prom: Prometheus, others: list[psutil.Process], victoria_url: str | None,
                       vmalert_url: str | None, seconds: float) -> tuple[dict[str, Any], dict[str, Any]]:
    """(Prometheus's figures, the window of bench/vm_engine.py over Prometheus and `others`), with
    Prometheus's own counters read at both ends."""
    first = server_metrics(prom.url, PROMETHEUS_COUNTERS, "rule_group")
    window = _window([psutil.Process(prom.proc.pid), *others], victoria_url, vmalert_url, seconds)
    last = server_metrics(prom.url, PROMETHEUS_COUNTERS, "rule_group")
    wall = window["wall"]
    rates = counter_rates(first, last, wall, ("process_cpu_seconds_total", "prometheus_rule_group_duration_seconds_sum",
                                              "prometheus_tsdb_head_samples_appended_total",
                                              "prometheus_rule_evaluation_failures_total"))
    groups = _groups({"first": first, "last": last, "wall": wall, "durations": {}})
    done = sum(group["iterations_run"] for group in groups.values()) / sum(g["nominal"] for g in groups.values())
    figures = {
        "window_s": round(wall, 1), "cpu_cores": round(window["cpu_each"][0] / wall, 3),
        "cpu_cores_own_counter": round(rates["process_cpu_seconds_total"], 3),
        "rule_evaluation_s_per_s": round(rates["prometheus_rule_group_duration_seconds_sum"], 4),
        "rule_iterations_run_share": round(done, 3),
        "missed_iterations": sum(group["missed"] for group in groups.values()),
        "rule_evaluation_failures": round(rates["prometheus_rule_evaluation_failures_total"] * wall),
        "rss_gib_max": round(max(sample[0] for sample in window["rss"]) / 2**30, 3),
        "head_series": last[("prometheus_tsdb_head_series", "")],
        "samples_appended_per_s": round(rates["prometheus_tsdb_head_samples_appended_total"], 1),
        "simulator_cpu_pct_of_core": round(100 * window["sim_cpu"] / wall, 2),
        "load_average_1m_at_start": round(window["load_1m_at_start"], 2),
        "other_processes_pct_of_core": window["others"],
        "slowest_groups_last_evaluation_s": dict(list(_group_times(prom.url).items())[:6]),
    }
    return figures, {**window, "prometheus_first": first, "prometheus_last": last}


def reference_phase(scenario: Scenario, targets_file: Path, alertmanager: str, seconds: float,
                    warmup: float) -> dict[str, Any]:
    """One Prometheus with the single-Prometheus rule set (alerts/), no remote write."""
    every = mixin_config.load(None).scrape_interval
    prom = Prometheus([sim_scrape_job(targets_file)], rule_files=RULE_FILES, scrape_interval=every,
                      evaluation_interval=tiers.EVALUATION_INTERVAL, alertmanagers=[alertmanager],
                      extra_args=MAX_SAMPLES)
    try:
        prom.start(timeout=60)
        client = PromClient(prom.url, timeout=300)
        wait_targets(client, scrape_targets(scenario), 300)
        load_at_start = uptime()
        time.sleep(warmup)
        figures, window = _prometheus_window(prom, [], None, None, seconds)
        forwarded = _series_by_name(client, tiers.forwarded_names(mixin_config.load(None)))
        return {**figures, "forwarded_name_series": sum(forwarded.values()), "forwarded_series_by_name": forwarded,
                "head_series_by_name": _head_by_name(client),
                "failed_scrapes": client.scalar(failed_scrapes(window["wall"])), "rule_files": len(RULE_FILES),
                "rules_sha256": rules_digest(RULE_FILES),
                "uptime_load_at_start": load_at_start, "uptime_load_at_end": uptime()}
    finally:
        prom.stop()


def tiers_phase(scenario: Scenario, targets_file: Path, alertmanager: str, seconds: float, warmup: float,
                workdir: Path) -> dict[str, dict[str, Any]]:
    """One shard replica remote-writing to VictoriaMetrics, vmalert evaluating the global rule set
    over it: sections shard, remote_write and global."""
    base = mixin_config.load(None)
    victoria = VictoriaMetrics(dedup_interval=base.scrape_interval, extra_args=VICTORIA_FLAGS)
    prom: Prometheus | None = None
    vmalert: VmAlert | None = None
    try:
        victoria.start(timeout=60)
        config = with_topology(base, victoria.url + INSERT_PATHS["prometheus/api/v1/write"], victoria.url, alertmanager)
        shard_files = write_rules(tiers.shard_rules(config), workdir / "shard")
        global_files, removed = vmalert_rules(write_rules(tiers.global_rules(config), workdir / "global"),
                                              workdir / "global-vmalert")
        prom = Prometheus.from_config(tiers.prometheus_config(
            config, SHARD, REPLICA, rule_files=[str(path) for path in shard_files],
            scrape_configs=[sim_scrape_job(targets_file)]), extra_args=MAX_SAMPLES)
        prom.start(timeout=60)
        client = PromClient(prom.url, timeout=300)
        wait_targets(client, scrape_targets(scenario), 300)
        # VmAlert's own flags name the same store; vmalert_args (the product's) come last and win
        vmalert = VmAlert([], victoria.url, evaluation_interval=tiers.EVALUATION_INTERVAL,
                          extra_args=tiers.vmalert_args(config, [str(path) for path in global_files]))
        vmalert.start(timeout=60)
        load_at_start = uptime()
        time.sleep(warmup)
        vmalert_before = server_metrics(vmalert.url, VMALERT_WRITES, "group")
        shard, window = _prometheus_window(prom, [psutil.Process(victoria.proc.pid), psutil.Process(vmalert.proc.pid)],
                                           victoria.url, vmalert.url, seconds)
        window["vmalert_writes"] = counter_rates(vmalert_before, server_metrics(vmalert.url, VMALERT_WRITES, "group"),
                                                 window["wall"], VMALERT_WRITES)
        window["vmalert_failing"] = sorted(vmalert.rule_errors())
        ended = time.time()
        vmalert.stop()      # its queries would keep VictoriaMetrics busy for the last ones
        vmalert = None
        # the series both hold are counted at the window's end, once remote write has sent it all:
        # counted as each finished, the shard's head held records the store had not been sent yet
        window["remote_write_catch_up_s"] = _sent_up_to(prom.url, ended, CATCH_UP_TIMEOUT_S)
        victoria.flush()
        global_tier = _global_figures(config, PromClient(victoria.url, timeout=300), window, _recorded(global_files),
                                      ended)
        shard |= {"failed_scrapes": client.scalar(failed_scrapes(window["wall"])), "rule_files": len(shard_files),
                  "rules_sha256": rules_digest(shard_files), "global_rules_sha256": rules_digest(global_files),
                  "head_series_by_name": _head_by_name(client),
                  "uptime_load_at_start": load_at_start, "uptime_load_at_end": uptime()}
        remote = _forwarded_figures(config, client, window, scenario.fleet.nodes * scenario.fleet.gpus_per_node,
                                    shard["head_series"], ended)
        return {"shard": shard, "remote_write": remote, "global": global_tier | {"vmalert_removed": removed}}
    finally:
        for server in (vmalert, prom, victoria):
            if server is not None:
                server.stop()


def _forwarded_figures(config: MixinConfig, client: PromClient, window: dict[str, Any], gpus: int,
                       head_series: float, ended: float) -> dict[str, Any]:
    """remote_write_figures over the window, and what is forwarded by name: series (at the window's
    end) and samples per second from the shard's head, those the global rules read apart from the
    rest (forwarded for the report and dashboards on the global tier)."""
    forwarded = tiers.forwarded_names(config)
    by_name = _series_by_name(client, forwarded, ended)
    sent_by_name = _samples_by_name(client, forwarded, window["wall"])
    for_rules = set(tiers.global_rule_inputs(config))   # the global rules' names alone
    remote = remote_write_figures(window["prometheus_first"], window["prometheus_last"], window["wall"], gpus,
                                  head_series, sum(by_name.values()))
    return remote | {
        "forwarded_names": len(forwarded), "forwarded_names_for_global_rules": len(for_rules),
        "forwarded_series_for_global_rules": sum(n for name, n in by_name.items() if name in for_rules),
        "forwarded_series_not_for_global_rules": sum(n for name, n in by_name.items() if name not in for_rules),
        "forwarded_samples_per_s_for_global_rules": round(
            sum(n for name, n in sent_by_name.items() if name in for_rules), 1),
        "forwarded_samples_per_s_by_head": round(sum(sent_by_name.values()), 1),
        "forwarded_names_sha256": hashlib.sha256("\n".join(forwarded).encode()).hexdigest()[:12],
        "forwarded_series_by_name": by_name,
        "forwarded_samples_per_s_by_name": {name: round(n, 2) for name, n in sent_by_name.items()}}


def _global_figures(config: MixinConfig, store: PromClient, window: dict[str, Any], recorded: set[str],
                    ended: float) -> dict[str, Any]:
    """VictoriaMetrics's and vmalert's figures over the window (processes 1 and 2 of it), and the
    series the store holds at its end: all, forwarded, still carrying the replica label (none: it is
    dropped before writing), and recorded by vmalert, by name."""
    wall, writes = window["wall"], window["vmalert_writes"]
    groups = vmalert_groups(window)
    spent = sum(group["duration_mean_s"] * group["iterations_run"] for group in groups.values())
    nominal = sum(group["nominal"] for group in groups.values())
    replica_label = config.topology.replica_label if config.topology else ""
    recorded_series = _series_by_name(store, recorded, ended)
    return {
        "victoria_metrics_cpu_cores": round(window["cpu_each"][1] / wall, 3),
        "victoria_metrics_rss_gib_max": round(max(sample[1] for sample in window["rss"]) / 2**30, 3),
        "rows_taken_in_per_s": round(window["rows_per_s"], 1),
        "series_stored": _answered(store, 'count({__name__!=""})') or 0.0,
        "forwarded_series_stored": sum(_series_by_name(store, tiers.forwarded_names(config), ended).values()),
        "remote_write_catch_up_s": window["remote_write_catch_up_s"],
        "series_with_replica_label": _answered(store, f'count({{{replica_label}!=""}})') or 0.0,
        "series_recorded_by_vmalert": sum(recorded_series.values()),
        "vmalert_cpu_cores": round(window["cpu_each"][2] / wall, 3),
        "vmalert_rss_gib_max": round(max(sample[2] for sample in window["rss"]) / 2**30, 3),
        "vmalert_rows_written_per_s": round(writes["vmalert_remotewrite_sent_rows_total"], 1),
        "vmalert_bytes_written_per_s": round(writes["vmalert_remotewrite_sent_bytes_total"], 1),
        "vmalert_write_errors": round(writes["vmalert_remotewrite_errors_total"] * wall),
        "vmalert_evaluation_s_per_s": round(spent / wall, 4),
        "vmalert_iterations_run_share": round(sum(g["iterations_run"] for g in groups.values()) / nominal, 3),
        "vmalert_missed_iterations": sum(group["missed"] for group in groups.values()),
        "vmalert_rules_in_error_at_end": window["vmalert_failing"],
        "groups": {name: {key: round(value, 4) for key, value in group.items()}
                   for name, group in sorted(groups.items())},
        "series_by_recorded_name": recorded_series,
    }


def _recorded(paths: Collection[Path]) -> set[str]:
    """The names the rule files record."""
    return {rule["record"] for path in paths for group in (yaml.safe_load(path.read_text()) or {}).get("groups") or []
            for rule in group["rules"] if "record" in rule}


def measure_size(nodes: int, seconds: float, warmup: float, job_gpus: int | None) -> dict[str, dict[str, Any]]:
    """The reference and the tiers on one fleet, one after the other, and what compares them."""
    base = mixin_config.load(None)
    scenario = fleet_scenario(nodes, duration_seconds(base.scrape_interval),
                              **({"job_nodes": job_gpus // GPUS_PER_NODE} if job_gpus else {}))
    gpus = nodes * scenario.fleet.gpus_per_node
    jobs = len(scenario.jobs)
    fleet = {"nodes": nodes, "gpus": gpus, "jobs": jobs,
             "gpus_in_jobs": sum(len(job.nodes) for job in scenario.jobs) * scenario.fleet.gpus_per_node,
             "scrape_interval": base.scrape_interval, "window_s": seconds, "warmup_s": warmup}
    alertmanager = Alertmanager(NULL_ALERTMANAGER)
    try:
        alertmanager.start(timeout=60)
        with served_fleet(scenario) as (_server, targets_file):
            reference = reference_phase(scenario, targets_file, alertmanager.url, seconds, warmup)
            with tempfile.TemporaryDirectory(prefix="flopwatch-bench-tiers-") as work:
                measured = tiers_phase(scenario, targets_file, alertmanager.url, seconds, warmup, Path(work))
    finally:
        alertmanager.stop()
    sections: dict[str, dict[str, Any]] = {"fleet": fleet, "reference": reference, **measured}
    sections["ratio_shard_to_reference"] = ratios(measured["shard"], reference, COMPARED)
    sections["head_series_shard_minus_reference"] = series_differences(
        measured["shard"].pop("head_series_by_name"), reference.pop("head_series_by_name"))
    per_1000 = {}
    for section, keys in PER_1000_GPUS.items():
        per_1000 |= {f"{section}.{key}": value for key, value in per_1000_gpus(sections[section], gpus, keys).items()}
    sections["per_1000_gpus"] = per_1000
    return sections


def flat(sections: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """`section.key` -> figure of every PER_1000_GPUS figure, and the fleet's size (for marginal_per_1000_gpus)."""
    out: dict[str, Any] = {"gpus": sections["fleet"]["gpus"]}
    for section, keys in PER_1000_GPUS.items():
        out |= {f"{section}.{key}": sections[section].get(key) for key in keys}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="125", metavar="N[,N...]",
                        help="simulated nodes of 8 GPUs, or sizes comma-separated (125,313: 1,000 and 2,504 GPUs)")
    parser.add_argument("--seconds", type=float, default=150, help="each window, after the warm-up (default 150)")
    parser.add_argument("--warmup", type=float, default=90,
                        help="seconds between every target up (and vmalert started) and the window (default 90)")
    parser.add_argument("--job-gpus", type=int, default=None, metavar="GPUS",
                        help="GPUs per job, a multiple of 8 (default: one 1,024-GPU job per 128 nodes)")
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args()
    sizes = fleet_sizes(parser, args.nodes)
    if args.job_gpus is not None and (args.job_gpus < GPUS_PER_NODE or args.job_gpus % GPUS_PER_NODE):
        parser.error(f"--job-gpus: expected a multiple of {GPUS_PER_NODE} GPUs (whole nodes), got {args.job_gpus}")
    if args.seconds <= 0 or args.warmup < 0:
        parser.error("--seconds must be above 0 and --warmup 0 or more")
    results: dict[str, Any] = {"run": {
        "command": " ".join(["python -m bench.tiers", *sys.argv[1:]]), "servers": releases.current(),
        "started_utc": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M"), "uptime_at_start": uptime(),
        "cpus": psutil.cpu_count()}}
    measured = {}
    try:
        for nodes in sorted(sizes):
            measured[nodes] = measure_size(nodes, args.seconds, args.warmup, args.job_gpus)
            results |= {f"{name}@{nodes}": figures for name, figures in measured[nodes].items()}
            if args.json:     # each size as it ends: a failure at the next keeps what was measured
                Path(args.json).write_text(json.dumps(results, indent=1))
    except MissingBinary as error:
        parser.exit(2, f"{error}\n")
    if len(measured) > 1:
        small, large = measured[min(measured)], measured[max(measured)]
        results["marginal_per_1000_gpus"] = marginal_per_1000_gpus(flat(small), flat(large), list(flat(small))[1:])
    results["run"]["finished_utc"] = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M")
    results["run"]["uptime_at_end"] = uptime()
    report(results, args.json)


if __name__ == "__main__":
    main()

"""bench/tiers.py: the arithmetic that turns the servers' counters into the figures docs/scaling.md
plans with (rates, per 1,000 GPUs, the marginal cost between sizes, the remote-write figures), the
topology it measures, and one tiny run through real servers (2 nodes, 16 GPUs: Prometheus,
VictoriaMetrics, vmalert and Alertmanager from FLOPWATCH_SERVERS)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import usage_error

from bench import tiers
from bench.sim_capacity import fleet_scenario
from flopwatch.mixin import config as mixin_config
from flopwatch.mixin import tiers as mixin_tiers
from flopwatch.stack import releases

ROOT = Path(__file__).resolve().parents[1]
P = tiers.REMOTE_PREFIX


def test_counter_rates_are_differences_per_second_and_an_absent_counter_is_zero():
    first = {("a", ""): 10.0, ("b", ""): 5.0, ("a", "group"): 99.0}
    last = {("a", ""): 40.0, ("b", ""): 5.0, ("a", "group"): 0.0}
    assert tiers.counter_rates(first, last, 15.0, ["a", "b", "c"]) == {"a": 2.0, "b": 0.0, "c": 0.0}


def test_figures_per_1000_gpus_divide_by_the_thousands_measured():
    figures = {"bytes_per_s": 50_000.0, "head_series": 250_000, "note": "text"}
    assert tiers.per_1000_gpus(figures, 2500, ["bytes_per_s", "head_series", "note", "absent"]) == {
        "bytes_per_s": 20_000.0, "head_series": 100_000.0, "note": None, "absent": None}


def test_the_marginal_cost_is_the_slope_between_sizes_without_the_fixed_part():
    # a server costing 0.1 core whatever its fleet and 0.2 per 1,000 GPUs
    small = {"gpus": 1000, "cpu": 0.3, "missing": None}
    large = {"gpus": 2500, "cpu": 0.6, "missing": 1.0}
    assert tiers.marginal_per_1000_gpus(small, large, ["cpu", "missing"]) == {"cpu": 0.2, "missing": None}
    assert tiers.per_1000_gpus(large, 2500, ["cpu"]) == {"cpu": 0.24}     # the fixed part inflates this one
    with pytest.raises(ValueError, match="must have more GPUs"):
        tiers.marginal_per_1000_gpus(large, small, ["cpu"])


def test_remote_write_figures_from_prometheus_counters():
    first = {(P + "bytes_total", ""): 1_000.0, (P + "samples_total", ""): 100.0, (P + "samples_in_total", ""): 500.0,
             (P + "samples_dropped_total", ""): 400.0, (P + "sent_batch_duration_seconds_sum", ""): 1.0,
             (P + "sent_batch_duration_seconds_count", ""): 10.0}
    last = {(P + "bytes_total", ""): 31_000.0, (P + "samples_total", ""): 1_100.0,
            (P + "samples_in_total", ""): 5_500.0, (P + "samples_dropped_total", ""): 4_400.0,
            (P + "samples_failed_total", ""): 0.0, (P + "samples_retried_total", ""): 10.0,
            (P + "sent_batch_duration_seconds_sum", ""): 2.0, (P + "sent_batch_duration_seconds_count", ""): 30.0,
            (P + "samples_pending", ""): 7.0, (P + "shards", ""): 4.0,
            (P + "highest_timestamp_in_seconds", ""): 1000.0, (P + "queue_highest_sent_timestamp_seconds", ""): 995.0}
    out = tiers.remote_write_figures(first, last, 10.0, 2000, head_series=10_000, forwarded_series=2_500)
    assert out["bytes_per_s"] == 3_000.0
    assert out["samples_per_s"] == 100.0 and out["samples_in_per_s"] == 500.0
    assert out["samples_dropped_per_s"] == 400.0 and out["samples_retried_per_s"] == 1.0
    assert out["bytes_per_sample"] == 30.0
    assert out["batches_per_s"] == 2.0 and out["batch_mean_s"] == 0.05
    assert out["forwarded_share_of_head_series"] == 0.25 and out["forwarded_share_of_samples"] == 0.2
    assert out["lag_s_at_end"] == 5.0 and out["samples_pending_at_end"] == 7.0
    assert out["bytes_per_s_per_gpu"] == 1.5


def test_nothing_sent_gives_no_ratio_rather_than_a_division_by_zero():
    out = tiers.remote_write_figures({}, {}, 10.0, 16, head_series=0, forwarded_series=0)
    assert out["bytes_per_sample"] is None and out["batch_mean_s"] is None
    assert out["forwarded_share_of_head_series"] is None and out["forwarded_share_of_samples"] is None


def test_series_differences_rank_by_size_and_leave_out_equal_names():
    shard = {"a": 10.0, "b": 5.0, "c": 1.0}
    reference = {"a": 10.0, "b": 8.0, "d": 2.0}
    assert tiers.series_differences(shard, reference) == {"b": -3.0, "d": -2.0, "c": 1.0}
    assert list(tiers.series_differences(shard, reference, top=1)) == ["b"]


def test_the_measured_shard_writes_the_forwarded_names_to_the_given_store():
    base = mixin_config.load(None)
    config = tiers.with_topology(base, "http://127.0.0.1:1/api/v1/write", "http://127.0.0.1:1", "http://127.0.0.1:2")
    prometheus = mixin_tiers.prometheus_config(config, tiers.SHARD, tiers.REPLICA, rule_files=[], scrape_configs=[])
    (write,) = prometheus["remote_write"]
    assert write["url"] == "http://127.0.0.1:1/api/v1/write"
    assert write["write_relabel_configs"][0]["regex"] == "|".join(mixin_tiers.forwarded_names(config))
    assert "-datasource.url=http://127.0.0.1:1" in mixin_tiers.vmalert_args(config, [])


def test_jobs_of_a_given_size_and_the_default_of_one_per_128_nodes():
    assert [job.nodes[0] for job in fleet_scenario(313).jobs] == [0, 128]
    small = fleet_scenario(125, job_nodes=8).jobs
    assert len(small) == 15 and [len(job.nodes) for job in small] == [8] * 15
    assert len(fleet_scenario(100).jobs[0].nodes) == 100     # a fleet smaller than a job: one job on all


@pytest.mark.parametrize("argv, wrong", [(["--nodes", "ten"], "--nodes"), (["--job-gpus", "12"], "--job-gpus"),
                                         (["--nodes", "4,4"], "--nodes")])
def test_bad_arguments_exit_2_with_one_line(argv, wrong, monkeypatch, capsys):
    assert wrong in usage_error(tiers.main, argv, monkeypatch, capsys)


@pytest.mark.integration
@pytest.mark.slow
def test_a_tiny_run_measures_both_tiers(tmp_path: Path):
    for program in ("prometheus", "victoria-metrics", "vmalert", "alertmanager"):
        releases.binary(program)                        # a missing one fails naming its package
    out = tmp_path / "out.json"
    # 20 s of warmup: vmalert starts each group up to one evaluation interval (15 s) late, so a
    # shorter run can end before a group has recorded anything
    done = subprocess.run([sys.executable, "-m", "bench.tiers", "--nodes", "2", "--seconds", "8", "--warmup", "20",
                           "--json", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(out.read_text())
    remote, shard, reference, store = (results[f"{name}@2"]
                                       for name in ("remote_write", "shard", "reference", "global"))
    assert results["fleet@2"]["gpus"] == 16
    assert remote["bytes_per_s"] > 0 and remote["samples_per_s"] > 0
    assert remote["samples_failed_per_s"] == 0
    assert 0 < remote["forwarded_share_of_head_series"] < 1
    # what the agents export is the same fleet on both servers; recorded series (names with a colon)
    # differ by design (job-level records are the global tier's) and by how far their windows filled
    exported = {name for name in reference["forwarded_series_by_name"] if ":" not in name and name != "ALERTS"}
    assert exported >= {"flopwatch_gpu_sm_clock_hertz", "flopwatch_train_steps_total", "up"}
    shard_by_name, reference_by_name = remote["forwarded_series_by_name"], reference["forwarded_series_by_name"]
    apart = {name: (shard_by_name.get(name, 0), reference_by_name[name]) for name in exported
             if shard_by_name.get(name, 0) != reference_by_name[name]}
    assert sum(shard_by_name.get(name, 0) for name in exported) == pytest.approx(
        sum(reference_by_name[name] for name in exported), rel=0.05), f"(shard, reference) series: {apart}"
    assert set(remote["forwarded_series_by_name"]) <= set(mixin_tiers.forwarded_names(mixin_config.load(None)))
    assert store["remote_write_catch_up_s"] is not None, "the shard's remote write never sent the window's end"
    assert store["forwarded_series_stored"] == pytest.approx(remote["forwarded_head_series"], rel=0.1), (
        "the store holds a different number of forwarded series than the shard's head")
    assert store["series_with_replica_label"] == 0
    assert store["series_recorded_by_vmalert"] > 0 and store["vmalert_rules_in_error_at_end"] == []
    assert shard["head_series"] > 0 and reference["head_series"] > 0
    assert results["per_1000_gpus@2"]["remote_write.bytes_per_s"] == pytest.approx(remote["bytes_per_s"] / 0.016,
                                                                                   rel=1e-3)

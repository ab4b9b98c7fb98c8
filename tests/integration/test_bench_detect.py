"""The detection benchmark end to end: simulated fleets through a real Prometheus (remote write,
range queries) and real promtool, in both releases FlopWatch supports (`server_release`: Debian's
Prometheus 2.42 and the current upstream one), so the shipped rules are held to the suite's targets
on each. GPUs, NVML and NICs are simulated (flopwatch.sim); every rule is evaluated by Prometheus or
promtool themselves."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import program

from flopwatch.detect import detect, promtool
from flopwatch.detect import rules as rule_files
from flopwatch.detect.detect import run_scenario
from flopwatch.sim.scenario import parse

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
MODEL = {"params": 8e9, "layers": 32, "heads": 32, "head_dim": 128, "seq_len": 8192}
RULES = """
groups:
  - name: small
    interval: 5s
    rules:
      - record: job_id:flopwatch_model_flops:rate1m
        expr: sum by (job_id) (rate(flopwatch_train_model_flops_total[1m]))
      - record: job_id:flopwatch_peak_flops:sum
        expr: >-
          sum by (job_id) (flopwatch_gpu_job_info * on (node, gpu) group_left
          flopwatch_gpu_peak_dense_flops{dtype="bf16"})
      - record: job_id:flopwatch_mfu:ratio
        expr: job_id:flopwatch_model_flops:rate1m / job_id:flopwatch_peak_flops:sum
      - record: job_id_rank:flopwatch_arrival:ratio
        expr: >-
          sum without (phase) (increase(flopwatch_train_phase_seconds_total{phase=~"data|compute|other"}[30s]))
          / on (job_id) group_left quantile by (job_id) (0.5,
            sum without (phase) (increase(flopwatch_train_phase_seconds_total{phase=~"data|compute|other"}[30s])))
      - alert: FlopWatchStraggler
        expr: >-
          job_id_rank:flopwatch_arrival:ratio > 1.04
          and on (node, gpu) flopwatch_gpu_clock_event_active{reason="sw_thermal"} == 1
        for: 10s
        labels: {severity: page, cause: thermal}
      - alert: FlopWatchGpuXid
        expr: >-
          increase(flopwatch_gpu_xid_errors_total[5m]) > 0
          or flopwatch_gpu_xid_errors_total unless flopwatch_gpu_xid_errors_total offset 1m
        labels: {severity: ticket}
"""


def tiny(duration: str = "12m") -> dict:
    return {"name": "tiny", "seed": 3, "duration": duration, "scrape_interval": "5s",
            "fleet": {"nodes": 2, "gpus_per_node": 8, "nics_per_node": 2},
            "jobs": [{"id": "j", "nodes": "0-1", "tokens_per_step": 262144, "target_mfu": 0.42,
                      "step_jitter": 0.02, "model": MODEL}],
            "faults": [{"kind": "thermal_throttle", "node": 1, "gpu": 2, "start": "3m", "duration": "4m",
                        "slowdown": 0.1},
                       {"kind": "xid", "node": 0, "gpu": 5, "xid": 13, "start": "8m", "duration": "1m"}]}


@pytest.fixture
def small_rules(tmp_path, server_release) -> Path:
    """RULES in a file, checked by the release's promtool."""
    path = tmp_path / "rules.yml"
    path.write_text(RULES)
    subprocess.run([program("promtool"), "check", "rules", str(path)], check=True, capture_output=True)
    return path


def test_engine_names_the_thermal_gpu_and_the_xid_and_records_mfu(small_rules):
    score, result = run_scenario(parse(tiny()), small_rules)
    fired = [(e.alertname, e.labels["node"], e.labels["gpu"], e.fired_at - result.start_unix)
             for e in result.episodes]
    assert ("FlopWatchStraggler", "node0001", "2") in [f[:3] for f in fired]
    assert ("FlopWatchGpuXid", "node0000", "5") in [f[:3] for f in fired]
    assert all(e.true for e in score.episodes)
    assert [f.detected for f in score.faults] == [True, True]
    thermal = score.faults[0]
    assert 0 < thermal.latency <= 60 and thermal.cause_right
    # the recorded MFU came back through write-back of three chained recording rules
    assert result.stats["rule_samples"] > 0 and score.mfu == []  # 12 minutes hold no 10-minute steady stretch
    mfu = result.observed["job_id:flopwatch_mfu:ratio"]
    assert mfu and 0.3 < mfu[0][2][-1] < 0.5


def test_engine_agrees_with_promtool_on_the_shipped_rules(server_release):
    """The exact cross-check on alerts/: the engine and promtool evaluate the shipped rules on one
    schedule (promtool.comparable_engine: every rule at the smallest interval, each record after
    those it reads, samples on the steps) and give the same alerts, labels, firing and resolution
    steps. (On the shipped groups' own intervals they cannot agree step for step: promtool runs
    every group at one interval, in an order of its own.)"""
    scenario = parse({**tiny("10m"), "fleet": {"nodes": 1, "gpus_per_node": 8, "nics_per_node": 2},
                      "jobs": [{**tiny()["jobs"][0], "nodes": "0"}],
                      "faults": [{"kind": "thermal_throttle", "node": 0, "gpu": 2, "start": "2m", "duration": "4m",
                                  "slowdown": 0.1},
                                 {"kind": "nic_link_flap", "node": 0, "nic": 1, "start": "3m", "duration": "5m"},
                                 {"kind": "xid", "node": 0, "gpu": 5, "xid": 13, "start": "7m"}]})
    engine = promtool.comparable_engine(rule_files.load(ROOT / "alerts", scenario.scrape_interval))
    ours = engine.run(scenario)
    theirs = promtool.run(scenario, engine.rules)

    def steps(episodes, start: float) -> list[tuple]:
        return sorted((e.alertname, tuple(sorted(e.labels.items())), e.fired_at - start,
                       None if e.resolved_at is None else e.resolved_at - start) for e in episodes)

    assert {e.alertname for e in ours.episodes} >= {"FlopWatchStraggler", "FlopWatchGpuXid"}
    assert steps(ours.episodes, ours.start_unix) == steps(theirs, 0)


def test_quick_suite_meets_the_detection_targets(server_release):
    """The shipped suite's quick run (`bench detect --quick`) through the shipped rules and
    Alertmanager routing: every fault found and named by its cause, no false page."""
    suite = [s for s in map(detect.quick, detect.load_suite(ROOT / "flopwatch" / "detect" / "scenarios")) if s]
    summary = detect.run_suite(suite, ROOT / "alerts").summary
    figures = {key: summary[key] for key in ("faults", "detected", "precision", "recall", "cause_accuracy",
                                             "false_pages", "latency_median_s", "latency_max_s")}
    print(f"{server_release}: {figures}")
    assert summary["faults"] >= 4 and summary["pages"], figures
    assert summary["precision"] >= 0.95 and summary["recall"] >= 0.95, figures
    assert summary["cause_accuracy"] >= 0.9 and summary["false_pages"] == 0, figures


def test_cli_runs_a_suite_and_writes_json(tmp_path, small_rules):
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "tiny.yml").write_text(json.dumps(tiny("10m")))
    out = tmp_path / "report.json"
    answer = subprocess.run([sys.executable, "-m", "flopwatch", "bench", "detect", "--scenarios", str(suite),
                             "--rules", str(small_rules), "--json", str(out)], capture_output=True, text=True,
                            timeout=300, check=False)
    assert answer.returncode == 0, answer.stderr
    report = json.loads(out.read_text())
    assert report["summary"]["faults"] == 2 and report["summary"]["detected"] == 2
    assert "precision" in answer.stdout and "Targets" in answer.stdout


def test_cli_bad_input_is_one_line(tmp_path):
    answer = subprocess.run([sys.executable, "-m", "flopwatch", "bench", "detect", "--scenarios",
                             str(tmp_path / "missing")], capture_output=True, text=True, timeout=60, check=False)
    assert answer.returncode == 2
    assert answer.stderr.strip().count("\n") == 0 and "no such scenario file" in answer.stderr

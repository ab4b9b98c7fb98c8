"""The detection benchmark on a fleet behind dcgm-exporter (`fleet.exporter: dcgm`): its DCGM_FI_*
series and the steps of an agent with its GPU collector and attribution off go through the shipped
rules in a real Prometheus (flopwatch/detect/engine.py). DCGM, GPUs and NICs are simulated."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from flopwatch import resources
from flopwatch.detect.detect import run_scenario
from flopwatch.sim.scenario import parse

pytestmark = pytest.mark.integration

MODEL = {"params": 8e9, "layers": 32, "heads": 32, "head_dim": 128, "seq_len": 8192}


def small(exporter: str, faults: list[dict]) -> dict:
    return {"name": f"dcgm-{exporter}", "seed": 5, "duration": "14m", "scrape_interval": "5s",
            "fleet": {"nodes": 2, "gpus_per_node": 8, "nics_per_node": 2, "exporter": exporter},
            "jobs": [{"id": "4242", "nodes": "0-1", "tokens_per_step": 262144, "target_mfu": 0.42,
                      "step_jitter": 0.02, "model": MODEL}],
            "faults": faults}


FAULTS = [{"kind": "thermal_throttle", "node": 1, "gpu": 2, "start": "3m", "duration": "5m", "slowdown": 0.1},
          {"kind": "xid", "node": 0, "gpu": 5, "xid": 13, "start": "9m", "duration": "1m"}]


def test_faults_behind_dcgm_exporter_are_named_by_the_shipped_rules():
    score, result = run_scenario(parse(small("dcgm", FAULTS)), resources.folder("alerts"))
    by_kind = {fault.kind: fault for fault in score.faults}
    assert by_kind["thermal_throttle"].detected and by_kind["thermal_throttle"].cause_right
    assert by_kind["xid"].detected and by_kind["xid"].detected_by == "FlopWatchGpuXid"
    assert not [e for e in score.episodes if not e.true]
    xid = next(e for e in result.episodes if e.alertname == "FlopWatchGpuXid")
    assert (xid.labels["node"], xid.labels["gpu"], xid.labels["xid"], xid.labels["job_id"]) == (
        "node0000", "5", "13", "4242")                 # the job from dcgm-exporter's hpc_job


def test_a_healthy_fleet_behind_dcgm_exporter_stays_silent_and_gets_goodput():
    _, result = run_scenario(parse(small("dcgm", [])), resources.folder("alerts"))
    assert result.episodes == []
    goodput = [values for labels, _, values in result.observed.get("job_id:flopwatch_goodput:ratio", [])
               if labels.get("job_id") == "4242"]
    assert goodput and goodput[0][-1] > 0.5            # allocated GPUs from hpc_job: goodput exists


def test_the_cli_runs_a_suite_under_both_exporters_and_compares_them(tmp_path):
    suite = tmp_path / "suite"
    suite.mkdir()
    scenario = small("agent", FAULTS[:1])
    scenario["duration"] = "8m"
    (suite / "one.yml").write_text(json.dumps(scenario))
    out = tmp_path / "report.json"
    answer = subprocess.run([sys.executable, "-m", "flopwatch", "bench", "detect", "--scenarios", str(suite),
                             "--exporter", "agent,dcgm-default", "--json", str(out)],
                            capture_output=True, text=True, timeout=300, check=False)
    assert answer.returncode == 0, answer.stderr
    report = json.loads(out.read_text())
    assert set(report) == {"agent", "dcgm-default"}
    assert report["agent"]["summary"]["detected"] == report["dcgm-default"]["summary"]["detected"] == 1
    # the same fault, found by its rank's steps either way; only the agent's clock-event reason names it
    assert report["agent"]["summary"]["cause_accuracy"] == 1.0
    assert report["dcgm-default"]["summary"]["cause_accuracy"] == 0.0
    assert "By exporter" in answer.stdout and "dcgm-default" in answer.stdout


def test_an_unknown_exporter_is_one_line_and_exit_2(tmp_path):
    answer = subprocess.run([sys.executable, "-m", "flopwatch", "bench", "detect", "--exporter", "nvidia-smi"],
                            capture_output=True, text=True, timeout=60, check=False)
    assert answer.returncode == 2
    assert answer.stderr.strip().count("\n") == 0 and "--exporter" in answer.stderr

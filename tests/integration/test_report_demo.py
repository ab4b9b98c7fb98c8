"""`flopwatch demo --duration 60` end to end: its own report against the simulator's ground truth
over the same span, within 1% as for the week.

The demo's Prometheus scrapes the simulated fleet live, each node on its own phase, so the demo
advances the fleet between two rounds of scrapes, stops it before it reports, and writes the
truth (`truth.json`, the format `flopwatch sim --truth-out` writes, plus the span) over exactly
the ticks every node was scraped at. Everything here is real but the GPUs and jobs: Prometheus
with the shipped rules, Alertmanager, the report's command line.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration


def rows(path: Path, key: str) -> dict[str, dict[str, str]]:
    with path.open() as handle:
        return {row[key]: row for row in csv.DictReader(handle)}


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo") / "report"
    result = subprocess.run([sys.executable, "-m", "flopwatch", "demo", "--duration", "60", "--out", str(out)],
                            env={**os.environ, "COLUMNS": "120"}, capture_output=True, text=True, timeout=300,
                            check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    assert (out / "report.html").exists() and "demo summary" in result.stderr, result.stderr[-2000:]
    return out, json.loads((out / "truth.json").read_text()), result.stderr


def test_the_demo_reports_over_exactly_the_ticks_it_ran(demo):
    _, truth, stderr = demo
    span = truth["span"]
    assert span["aligned"] and not span["caveat"], f"the demo's scrapes did not line up with its ticks: {span}"
    assert span["simulated_seconds"] == span["ticks"] * truth["scrape_interval"] >= 60
    assert span["to"] - span["from"] >= 60
    assert "did not line up" not in stderr


def test_the_demo_report_is_within_one_percent_of_the_truth(demo):
    out, truth, _ = demo
    span = truth["span"]
    errors: dict[str, float] = {}

    def close(name: str, got: float, want: float) -> None:
        errors[name] = abs(got - want) / want
        assert got == pytest.approx(want, rel=0.01), name

    usage, mfu = rows(out / "gpu_hours_by_job.csv", "job_id"), rows(out / "mfu_by_job.csv", "job_id")
    goodput = rows(out / "goodput_by_job.csv", "job_id")
    assert set(usage) == set(truth["jobs"])
    flops = 0.0
    for job_id, job in truth["jobs"].items():
        close(f"{job_id} GPU-hours", float(usage[job_id]["gpu_hours"]), job["allocated_seconds"] * job["ranks"] / 3600)
        close(f"{job_id} MFU", float(mfu[job_id]["mfu"]), job["mfu"])
        assert 0 < float(goodput[job_id]["goodput"]) <= 1.0, job_id
        flops += job["mfu"] * job["allocated_seconds"] * job["ranks"] * job["peak_flops"]
    peak = next(iter(truth["jobs"].values()))["peak_flops"]
    cluster = next(iter(rows(out / "gpu_hours_by_cluster.csv", "cluster").values()))
    close("GPU-hours available", float(cluster["gpu_hours"]), span["gpus"] * span["simulated_seconds"] / 3600)
    close("GPU-hours allocated", float(cluster["allocated"]), truth["gpu_hours"])
    fleet_mfu = float(next(iter(rows(out / "mfu_by_cluster.csv", "cluster").values()))["fleet_mfu"])
    close("fleet MFU", fleet_mfu, flops / (span["gpus"] * span["simulated_seconds"] * peak))
    energy = float(next(iter(rows(out / "energy_by_cluster.csv", "cluster").values()))["kwh"])
    close("energy", energy, truth["energy_joules"] / 3.6e6)
    print("demo report against the truth:", {k: f"{100 * v:.3f}%" for k, v in errors.items()})

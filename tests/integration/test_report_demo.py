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
import re
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


def test_the_demo_summarizes_its_straggler_and_leaves_no_process(demo):
    """What the demo prints: the injected straggler, the job's MFU, the report; and the demo's own
    Prometheus and Alertmanager (by the addresses it printed) are gone after it."""
    out, _, stderr = demo
    assert "injected thermal_throttle on node0003 GPU 5 (job llm-8b)" in stderr
    assert "job llm-8b: MFU" in stderr
    assert "node0003" in stderr  # the straggler table names the injected node
    report = re.search(r"report: (\S+report\.html)", stderr)
    assert report and Path(report.group(1)) == out / "report.html", stderr[-2000:]
    html = Path(report.group(1)).read_text()
    assert "llm-8b" in html and "<svg" in html
    addresses = re.findall(r"(?:Prometheus|Alertmanager)\s+http://(127\.0\.0\.1:\d+)", stderr)
    assert len(set(addresses)) == 2, stderr[:2000]
    for address in set(addresses):
        left = subprocess.run(["pgrep", "-f", f"listen-address={address}"], capture_output=True, text=True,
                              check=False).stdout
        assert not left.strip(), f"the demo left the server on {address} running"

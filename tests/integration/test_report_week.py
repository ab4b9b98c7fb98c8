"""`flopwatch report` over a simulated week of a 128-GPU fleet loaded into a real Prometheus,
checked against the simulator's ground truth; an empty Prometheus gives a "no data" report.

Faked: only the GPUs, NICs and training jobs (flopwatch.sim, the same series real agents export).
The week reaches Prometheus through remote write (flopwatch.detect's vectorised encoder and fleet
sampler, the detection benchmark's loader), one sample every 5 minutes of every series the report
reads; Prometheus, its PromQL and the report's command line are real.
"""

from __future__ import annotations

import csv
import re
import time
from collections import Counter
from datetime import datetime
from pathlib import Path

import numpy as np
import pytest

from flopwatch import cli
from flopwatch.detect import remote_write
from flopwatch.detect.engine import exact_nodes_for
from flopwatch.detect.fast_sampler import supported_names
from flopwatch.detect.sampler import FleetSampler, Recorder
from flopwatch.report.queries import QueryBuilder, probe_queries
from flopwatch.report.settings import ReportSettings
from flopwatch.report.window import Window, grid_for
from flopwatch.sim.fleet import Fleet
from flopwatch.sim.scenario import parse
from flopwatch.stack import Prometheus

pytestmark = pytest.mark.integration

DAY = 86400.0
STEP = 300.0
LLAMA_70B = {"params": 70e9, "layers": 80, "heads": 64, "head_dim": 128, "seq_len": 4096}
LLAMA_8B = {"params": 8e9, "layers": 32, "heads": 32, "head_dim": 128, "seq_len": 8192}
#: 16 nodes x 8 GPUs: a week-long job on 64 GPUs, a 3-day job at 18% MFU on 32, a 2-day fine-tune on
#: 16, two nodes idle all week, and one fault of each kind the report counts.
WEEK = {
    "name": "report-week", "seed": 11, "duration": "7d", "scrape_interval": "300s",
    "fleet": {"nodes": 16, "gpus_per_node": 8, "gpu_model": "H100-SXM", "nics_per_node": 2},
    "jobs": [
        {"id": "llm-70b", "nodes": "0-7", "user": "alice", "tokens_per_step": 2097152, "target_mfu": 0.42,
         "model": LLAMA_70B},
        {"id": "llm-8b", "nodes": "8-11", "user": "bob", "tokens_per_step": 1048576, "target_mfu": 0.18,
         "start": "1d", "end": "4d", "model": LLAMA_8B},
        {"id": "finetune", "nodes": "12-13", "user": "carol", "tokens_per_step": 524288, "target_mfu": 0.35,
         "start": "108h", "end": "156h", "model": LLAMA_8B},
    ],
    "faults": [
        {"kind": "thermal_throttle", "node": 3, "gpu": 5, "start": "2d", "duration": "2h", "slowdown": 0.1},
        {"kind": "power_cap", "node": 9, "gpu": 1, "start": "60h", "duration": "90m", "slowdown": 0.08},
        {"kind": "gpu_lost", "node": 6, "gpu": 4, "start": "3d", "duration": "30m"},
        {"kind": "nvlink_errors", "node": 10, "gpu": 3, "start": "78h", "duration": "1h"},
        {"kind": "hw_slowdown", "node": 3, "gpu": 2, "start": "5d", "duration": "1h", "slowdown": 0.1},
        {"kind": "xid", "node": 3, "gpu": 2, "xid": 48, "start": "123h", "duration": "1m"},
        {"kind": "pcie_downgrade", "node": 13, "gpu": 6, "start": "126h", "duration": "2h", "slowdown": 0.05},
        {"kind": "xid", "node": 12, "gpu": 0, "xid": 13, "start": "6d", "duration": "1m"},
        {"kind": "slow_nic", "node": 1, "nic": 0, "start": "146h", "duration": "1h"},
    ],
}
STRAGGLER_FAULTS = {"thermal_throttle", "power_cap", "hw_slowdown", "pcie_downgrade"}


def report_series() -> set[str]:
    """Every FlopWatch series name the report's queries read (that a simulated node exports)."""
    settings, window = ReportSettings(), Window(0.0, 7 * DAY)
    promql = QueryBuilder(settings, window, grid_for(window, STEP), STEP)
    queries = [*promql.range_queries(), *promql.counter_queries(), *promql.total_queries(window),
               *promql.hardware_candidates(),
               promql.straggler_arrivals(), promql.power_fallback(), *probe_queries(settings, window),
               promql.straggler_detail("d", "", "j", "0", "n", "0", 0.0, 600.0), promql.gpu_job("o", "", "n", "0", 0)]
    return set(re.findall(r"flopwatch_[a-z0-9_]+", " ".join(q.expr for q in queries))) & supported_names()


def load_history(fleet: Fleet, url: str, span: float, step: float) -> int:
    """Advance `fleet` by `span` in ticks of `step`, remote-writing what a scrape at each tick
    would store (stale markers included); returns the samples written."""
    names = report_series()
    sampler = FleetSampler(fleet, names, exact_nodes_for(fleet.scenario))
    recorder = Recorder(lambda labels: dict(labels)["__name__"] in names)
    written = 0

    def flush() -> None:
        nonlocal written
        block = recorder.flush()
        if block is not None:
            remote_write.post(url + "/api/v1/write", remote_write.encode_request(
                block.label_bytes, block.values, block.present, block.timestamps_ms))
            written += block.samples

    while fleet.t < span - 1e-9:
        fleet.advance(step)
        recorder.add(round(fleet.now_unix * 1000), sampler.sample())
        if recorder.pending_ticks >= 288:
            flush()
    flush()
    return written


def read_csv(path: Path) -> list[dict[str, str]]:
    with path.open() as handle:
        return list(csv.DictReader(handle))


@pytest.fixture(scope="module")
def week(tmp_path_factory):
    """The simulated week in a real Prometheus, and the report's files from the command line."""
    out = tmp_path_factory.mktemp("report")
    start = float(int(time.time() // STEP * STEP - 7 * DAY))
    fleet = Fleet(parse(WEEK), start_unix=start)
    with Prometheus(remote_write_receiver=True, out_of_order_window="30d",
                    extra_args=["--storage.tsdb.retention.time=10y"]) as prom:
        samples = load_history(fleet, prom.url, 7 * DAY, STEP)
        code = cli.main(["report", "--prometheus", prom.url, "--from", str(int(start)), "--to",
                         str(int(fleet.now_unix)), "--out", str(out), "--price-kwh", "0.12",
                         "--price-gpu-hour", "2.5", "--no-pdf", "--quiet"])
    assert code == 0
    return {"out": out, "fleet": fleet, "truth": fleet.truth.as_dict(), "samples": samples}


def test_the_week_reached_prometheus(week):
    assert week["samples"] > 5_000_000  # ~4,600 series x 2,016 ticks
    assert (week["out"] / "report.html").stat().st_size > 20_000
    for name in ("report.md", "summary.csv", "gpu_hours_by_job.csv", "mfu_by_job.csv", "straggler_incidents.csv",
                 "hardware_incidents.csv", "energy_by_job.csv", "lemon_nodes.csv", "goodput_by_job.csv"):
        assert (week["out"] / name).exists(), name


def test_gpu_hours_match_ground_truth(week):
    truth = week["truth"]
    cluster = read_csv(week["out"] / "gpu_hours_by_cluster.csv")
    assert len(cluster) == 1
    assert float(cluster[0]["allocated"]) == pytest.approx(truth["gpu_hours"], rel=0.01)
    assert float(cluster[0]["gpu_hours"]) == pytest.approx(128 * 7 * 24, rel=0.01)
    jobs = {row["job_id"]: row for row in read_csv(week["out"] / "gpu_hours_by_job.csv")}
    assert set(jobs) == set(truth["jobs"])
    for job_id, job in truth["jobs"].items():
        assert float(jobs[job_id]["gpu_hours"]) == pytest.approx(job["allocated_seconds"] * job["ranks"] / 3600,
                                                                 rel=0.01), job_id
        assert int(jobs[job_id]["gpus"]) == job["ranks"]
    assert {row["user"] for row in jobs.values()} == {"alice", "bob", "carol"}


def test_energy_matches_ground_truth(week):
    truth_kwh = week["truth"]["energy_joules"] / 3.6e6
    cluster = read_csv(week["out"] / "energy_by_cluster.csv")
    assert float(cluster[0]["kwh"]) == pytest.approx(truth_kwh, rel=0.01)
    assert float(cluster[0]["energy_cost"]) == pytest.approx(truth_kwh * 0.12, rel=0.01)
    # per-job energy plus the GPUs nobody held adds up to the whole
    jobs = sum(float(row["kwh"]) for row in read_csv(week["out"] / "energy_by_job.csv"))
    assert jobs + float(cluster[0]["idle_kwh"]) == pytest.approx(truth_kwh, rel=0.01)


def test_mfu_matches_ground_truth(week):
    truth = week["truth"]
    jobs = {row["job_id"]: row for row in read_csv(week["out"] / "mfu_by_job.csv")}
    for job_id, job in truth["jobs"].items():
        assert float(jobs[job_id]["mfu"]) == pytest.approx(job["mfu"], rel=0.01), job_id
        # the simulated tensor activity is built to give the job's MFU: the telemetry-only estimate
        assert float(jobs[job_id]["telemetry_mfu"]) == pytest.approx(job["mfu"], abs=0.01), job_id
    peak = next(iter(truth["jobs"].values()))["peak_flops"]
    flops = sum(j["mfu"] * j["allocated_seconds"] * j["ranks"] * j["peak_flops"] for j in truth["jobs"].values())
    cluster = read_csv(week["out"] / "mfu_by_cluster.csv")[0]
    assert float(cluster["fleet_mfu"]) == pytest.approx(flops / (128 * peak * 7 * DAY), rel=0.01)


def test_badput_by_cause_matches_ground_truth(week):
    """Data loading and checkpoints are measured the same way by the simulator and the report; the
    straggler share follows the rules' definition (mean - min wait), documented in docs/report.md."""
    truth = week["truth"]
    jobs = {row["job_id"]: row for row in read_csv(week["out"] / "goodput_by_job.csv")}
    for job_id, job in truth["jobs"].items():
        allocated = job["allocated_seconds"]
        for cause in ("data", "checkpoint"):
            assert float(jobs[job_id][cause]) == pytest.approx(job["badput_seconds"][cause] / allocated,
                                                               abs=0.002), (job_id, cause)
        assert 0.85 < float(jobs[job_id]["goodput"]) < 1.0


def test_straggler_incidents_match_injected_faults(week):
    faults = [f for f in week["truth"]["faults"] if f["kind"] in STRAGGLER_FAULTS]
    rows = read_csv(week["out"] / "straggler_incidents.csv")
    assert len(rows) == len(faults)
    found = {(r["node"], r["gpu"], r["job_id"], r["cause"]): r for r in rows}
    start = week["fleet"].start_unix
    for fault in faults:
        row = found[(fault["node"], str(fault["gpu"]), fault["job_id"], fault["cause"])]
        began = datetime.fromisoformat(row["start"].replace("Z", "+00:00")).timestamp()
        bucket = 3600  # a week in hour-long buckets: times are known to a bucket
        assert abs(began - (start + fault["start"])) <= bucket, fault
        assert float(row["duration"]) == pytest.approx(fault["end"] - fault["start"], abs=2 * bucket), fault
        assert float(row["slowdown"]) == pytest.approx(fault["slowdown"], abs=0.02), fault
        assert float(row["gpu_hours_lost"]) > 0


def test_hardware_incidents_match_injected_faults(week):
    faults = week["truth"]["faults"]
    xids = Counter(str(f["xid"]) for f in faults if f["xid"] is not None)
    by_code = {row["xid"]: int(row["events"]) for row in read_csv(week["out"] / "xids_by_code.csv")}
    assert by_code == dict(xids)
    rows = read_csv(week["out"] / "hardware_incidents.csv")
    kinds = Counter(row["kind"] for row in rows)
    expected_at = {
        "GPU lost": {(f["node"], str(f["gpu"])) for f in faults if f["kind"] == "gpu_lost"},
        "uncorrectable ECC": {(f["node"], str(f["gpu"])) for f in faults if f["xid"] == 48},
        "NVLink errors": {(f["node"], str(f["gpu"])) for f in faults if f["kind"] == "nvlink_errors"},
        "InfiniBand errors": {(f["node"], f"{f['device']}:1") for f in faults if f["kind"] in ("slow_nic",
                                                                                                "nic_link_flap")},
        "PCIe downgrade": {(f["node"], str(f["gpu"])) for f in faults if f["kind"] == "pcie_downgrade"},
    }
    for kind, where in expected_at.items():
        assert {(r["node"], r["gpu"]) for r in rows if r["kind"] == kind} == where, kind
    assert kinds["XID"] == sum(xids.values())
    assert sum(kinds.values()) == sum(xids.values()) + sum(len(w) for w in expected_at.values())
    lost = next(r for r in rows if r["kind"] == "GPU lost")
    assert lost["job_id"] == "llm-70b"
    # node 3: a thermal straggler, a hardware slowdown and a double-bit ECC error, days apart
    assert [row["node"] for row in read_csv(week["out"] / "lemon_nodes.csv")] == ["node0003"]


def test_report_reads_like_a_report(week):
    markdown = (week["out"] / "report.md").read_text()
    for title in ("## Summary", "## Recommendations", "## GPU-hours", "## MFU", "## Goodput", "## Straggler incidents",
                  "## Hardware incidents and lemon nodes", "## Energy and cost"):
        assert title in markdown
    job = week["truth"]["jobs"]["llm-8b"]
    hours = job["allocated_seconds"] / 3600
    assert f"Job llm-8b ran at {100 * job['mfu']:.0f}% MFU on {job['ranks']} GPUs for {hours:.0f} h" in markdown
    assert "Drain node node0003" in markdown
    assert "No data in the window before" in markdown
    assert "failed (" not in markdown  # every query ran
    html = (week["out"] / "report.html").read_text()
    assert html.count('<svg xmlns="http://www.w3.org/2000/svg" class="chart"') >= 4
    assert not re.search(r"<script|<link|<img|<iframe|\b(?:src|href)=\"(?:https?:)?//", html)


def test_empty_prometheus_gives_a_report_that_says_there_is_no_data(tmp_path, capsys):
    with Prometheus() as prom:
        code = cli.main(["report", "--prometheus", prom.url, "--last", "7d", "--out", str(tmp_path), "--no-pdf",
                         "--quiet"])
    assert code == 0
    captured = capsys.readouterr()
    assert "There is no data" in captured.err
    html = (tmp_path / "report.html").read_text()
    markdown = (tmp_path / "report.md").read_text()
    for text in (html, markdown):
        assert "There is no data: this Prometheus holds no FlopWatch series" in text
    assert not list(tmp_path.glob("*.csv"))


def test_stragglers_come_from_the_alerts_when_prometheus_has_them(tmp_path):
    """A day whose Prometheus also holds ALERTS{alertname="FlopWatchStraggler"} series, as its rule
    evaluation stores them: the incident is the alert's span and carries the alert's cause (here a
    deliberately different one than the telemetry shows, to tell the two paths apart)."""
    day = {
        "name": "alerts-day", "seed": 5, "duration": "1d", "scrape_interval": "300s",
        "fleet": {"nodes": 4, "gpus_per_node": 8, "gpu_model": "H100-SXM", "nics_per_node": 1},
        "jobs": [{"id": "llm-8b", "nodes": "0-2", "tokens_per_step": 1048576, "target_mfu": 0.4, "model": LLAMA_8B}],
        "faults": [{"kind": "thermal_throttle", "node": 1, "gpu": 3, "start": "8h", "duration": "2h",
                    "slowdown": 0.1}],
    }
    start = float(int(time.time() // STEP * STEP - DAY))
    fleet = Fleet(parse(day), start_unix=start)
    fault = fleet.truth.faults[0]
    labels = remote_write.sorted_labels("ALERTS", {
        "alertname": "FlopWatchStraggler", "alertstate": "firing", "job_id": "llm-8b", "rank": str(fault["rank"]),
        "node": fault["node"], "gpu": str(fault["gpu"]), "cause": "power", "severity": "page"})
    stamps = np.arange(start + fault["start"] + 60, start + fault["end"], 15.0)
    alerts = remote_write.encode_request([remote_write.encode_labels(labels)], np.ones((1, stamps.size)),
                                         np.ones((1, stamps.size), dtype=bool), (stamps * 1000).astype(np.int64))
    with Prometheus(remote_write_receiver=True, out_of_order_window="30d") as prom:
        load_history(fleet, prom.url, DAY, STEP)
        remote_write.post(prom.url + "/api/v1/write", alerts)
        assert cli.main(["report", "--prometheus", prom.url, "--from", str(int(start)), "--to",
                         str(int(fleet.now_unix)), "--out", str(tmp_path), "--no-pdf", "--quiet"]) == 0
    rows = read_csv(tmp_path / "straggler_incidents.csv")
    assert [(r["job_id"], r["node"], r["gpu"], r["rank"], r["cause"]) for r in rows] == [
        ("llm-8b", fault["node"], str(fault["gpu"]), str(fault["rank"]), "power")]
    assert float(rows[0]["slowdown"]) == pytest.approx(fault["slowdown"], abs=0.02)
    assert "From the FlopWatchStraggler alerts this Prometheus evaluated" in (tmp_path / "report.md").read_text()

"""`flopwatch report` on windows the data does not fill, against the simulator's ground truth over
exactly the time the samples cover: a few minutes of data in an hour's window, a window that begins
before the first sample and ends after the last, a 20-minute scrape gap, a Prometheus restarted in
the middle, and jobs that start and end inside a bucket.

The fleet is simulated and remote-written tick by tick, as test_report_week does; a tick that is
not written (a gap) is also left out of the truth, so the truth is "what happened while samples
were taken". GPU-hours, MFU, goodput and badput must be within 1%, as for the week.
"""

from __future__ import annotations

import csv
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from flopwatch import cli
from flopwatch.detect import remote_write
from flopwatch.detect.engine import exact_nodes_for
from flopwatch.detect.sampler import FleetSampler, Recorder
from flopwatch.sim.fleet import Fleet
from flopwatch.sim.scenario import parse
from flopwatch.stack import Prometheus
from tests.integration.test_report_week import LLAMA_8B, report_series

pytestmark = pytest.mark.integration


def scenario(scrape: str, jobs: list[dict]) -> dict:
    return {"name": "report-window", "seed": 3, "duration": "1d", "scrape_interval": scrape,
            "fleet": {"nodes": 4, "gpus_per_node": 8, "gpu_model": "H100-SXM", "nics_per_node": 1},
            "jobs": jobs, "faults": []}


def job(job_id: str, nodes: str, mfu: float, **extra: object) -> dict:
    return {"id": job_id, "nodes": nodes, "user": "alice", "tokens_per_step": 1048576, "target_mfu": mfu,
            "model": LLAMA_8B, **extra}


@dataclass
class Covered:
    """The truth summed over the ticks that were written (what the samples cover)."""

    allocated_s: dict[str, float] = field(default_factory=dict)   # job -> GPU-seconds
    flops: dict[str, float] = field(default_factory=dict)
    badput: dict[str, dict[str, float]] = field(default_factory=dict)
    productive_s: dict[str, float] = field(default_factory=dict)  # rank-seconds
    gpu_seconds: float = 0.0                                      # every GPU, reporting
    energy_j: float = 0.0
    unseen_energy_j: float = 0.0   # of each tick written after one that was not: before a run's first sample
    peak: float = 0.0

    def mfu(self, job_id: str) -> float:
        return self.flops[job_id] / (self.allocated_s[job_id] * self.peak)


def _snapshot(fleet: Fleet) -> dict:
    jobs = {j: (t.allocated_s * t.ranks, t.model_flops, dict(t.badput_s), t.productive_s * t.ranks)
            for j, t in fleet.truth.jobs.items()}
    return {"jobs": jobs, "energy": fleet.truth.energy_joules}


def load(fleet: Fleet, url: str, ticks: int, skip: range = range(0), restart: Prometheus | None = None,
         covered: Covered | None = None) -> Covered:
    """Advance `fleet` `ticks` scrape intervals, remote-writing every tick but those in `skip`
    (restarting `restart` in the middle of the skipped ticks); the truth of the written ticks."""
    covered = covered or Covered()
    step = fleet.scenario.scrape_interval
    names = report_series()
    sampler = FleetSampler(fleet, names, exact_nodes_for(fleet.scenario))
    recorder = Recorder(lambda labels: dict(labels)["__name__"] in names)
    gpus = fleet.scenario.fleet.nodes * fleet.scenario.fleet.gpus_per_node
    covered.peak = next(iter(fleet.truth.jobs.values())).peak_flops

    def flush() -> None:
        block = recorder.flush()
        if block is not None:
            remote_write.post(url + "/api/v1/write", remote_write.encode_request(
                block.label_bytes, block.values, block.present, block.timestamps_ms))

    for tick in range(ticks):
        before = _snapshot(fleet)
        fleet.advance(step)
        samples = sampler.sample()
        if tick in skip:
            if restart is not None and tick == skip[len(skip) // 2]:
                flush()
                restart.kill()
                restart.restart()
            continue
        after = _snapshot(fleet)
        recorder.add(round(fleet.now_unix * 1000), samples)
        covered.gpu_seconds += gpus * step
        covered.energy_j += after["energy"] - before["energy"]
        if tick == 0 or tick - 1 in skip:
            covered.unseen_energy_j += after["energy"] - before["energy"]
        for job_id, (alloc, flops, badput, productive) in after["jobs"].items():
            alloc0, flops0, badput0, productive0 = before["jobs"][job_id]
            covered.allocated_s[job_id] = covered.allocated_s.get(job_id, 0.0) + alloc - alloc0
            covered.flops[job_id] = covered.flops.get(job_id, 0.0) + flops - flops0
            covered.productive_s[job_id] = covered.productive_s.get(job_id, 0.0) + productive - productive0
            causes = covered.badput.setdefault(job_id, {})
            for cause, seconds in badput.items():
                causes[cause] = causes.get(cause, 0.0) + seconds - badput0.get(cause, 0.0)
        if recorder.pending_ticks >= 200:
            flush()
    flush()
    return covered


def rows(path: Path, key: str = "job_id") -> dict[str, dict[str, str]]:
    with path.open() as handle:
        return {row[key]: row for row in csv.DictReader(handle)}


def report(url: str, start: float, end: float, out: Path) -> Path:
    assert cli.main(["report", "--prometheus", url, "--from", str(int(start)), "--to", str(int(end)),
                     "--out", str(out), "--no-pdf", "--quiet"]) == 0
    return out


def check(out: Path, covered: Covered, fleet: Fleet) -> dict[str, float]:
    """Every figure within 1% of the covered truth; returns the relative errors, for the record."""
    errors: dict[str, float] = {}

    def close(name: str, got: float, want: float) -> None:
        errors[name] = abs(got - want) / want
        assert got == pytest.approx(want, rel=0.01), name

    ranks = {j: t.ranks for j, t in fleet.truth.jobs.items()}
    usage = rows(out / "gpu_hours_by_job.csv")
    mfu = rows(out / "mfu_by_job.csv")
    goodput = rows(out / "goodput_by_job.csv")
    for job_id, seconds in covered.allocated_s.items():
        if not seconds:
            assert job_id not in usage
            continue
        close(f"{job_id} GPU-hours", float(usage[job_id]["gpu_hours"]), seconds / 3600)
        close(f"{job_id} MFU", float(mfu[job_id]["mfu"]), covered.mfu(job_id))
        # goodput's straggler share follows the rules' definition, not the simulator's (docs/report.md):
        # it may differ by a few points; time the samples do not cover must not show up as restarts
        truth_goodput = covered.productive_s[job_id] / seconds
        # the time ranks spent in steps (goodput + data + straggler shares): counters that read
        # past their samples once made it, and goodput, exceed the allocated time on short data
        causes = covered.badput[job_id]
        stepped = covered.productive_s[job_id] + (causes.get("straggler", 0.0) + causes.get("data", 0.0)) * ranks[
            job_id]
        row = goodput[job_id]
        close(f"{job_id} step time", sum(float(row[k]) for k in ("goodput", "data", "straggler")), stepped / seconds)
        assert float(row["goodput"]) <= 1.0, job_id
        errors[f"{job_id} goodput"] = abs(float(goodput[job_id]["goodput"]) - truth_goodput) / truth_goodput
        assert float(goodput[job_id]["goodput"]) == pytest.approx(truth_goodput, abs=0.05), job_id
        # the step still running when the data ends is in neither steps nor checkpoints: one
        # step's share of the covered time is the counters' resolution (9% for 21-s steps in 4 min)
        truth = fleet.truth.jobs[job_id]
        one_step = truth.allocated_s / max(truth.steps, 1) * ranks[job_id] / seconds
        restart = covered.badput[job_id].get("restart", 0.0) * ranks[job_id] / seconds
        assert restart - 0.005 <= float(goodput[job_id]["restart"]) <= restart + one_step + 0.005, job_id
        for cause in ("data", "checkpoint"):
            want = covered.badput[job_id].get(cause, 0.0) * ranks[job_id] / seconds
            assert float(goodput[job_id][cause]) == pytest.approx(want, abs=0.002), (job_id, cause)
    cluster = next(iter(rows(out / "gpu_hours_by_cluster.csv", "cluster").values()))
    close("GPU-hours available", float(cluster["gpu_hours"]), covered.gpu_seconds / 3600)
    close("GPU-hours allocated", float(cluster["allocated"]), sum(covered.allocated_s.values()) / 3600)
    flops = sum(covered.flops.values())
    fleet_mfu = float(next(iter(rows(out / "mfu_by_cluster.csv", "cluster").values()))["fleet_mfu"])
    close("fleet MFU", fleet_mfu, flops / (covered.gpu_seconds * covered.peak))
    # an energy counter runs from the driver's start, so what it counted before a run's first
    # sample (a new series, or one back after a gap) is no sample's: the report leaves it out
    energy = float(next(iter(rows(out / "energy_by_cluster.csv", "cluster").values()))["kwh"])
    close("energy", energy, (covered.energy_j - covered.unseen_energy_j) / 3.6e6)
    return errors


TWO_JOBS = [job("llm-a", "0-1", 0.42), job("llm-b", "2", 0.30)]


def test_four_minutes_of_data_in_an_hour_window(tmp_path):
    """The demo's case: 4 minutes of 5-second samples, reported over the last hour."""
    end = float(int(time.time()))
    fleet = Fleet(parse(scenario("5s", TWO_JOBS)), start_unix=end - 240)
    with Prometheus(remote_write_receiver=True, out_of_order_window="1d") as prom:
        covered = load(fleet, prom.url, 48)
        out = report(prom.url, end - 3600, fleet.now_unix, tmp_path)
    errors = check(out, covered, fleet)
    markdown = (out / "report.md").read_text()
    assert "held GPUs idle" not in markdown and "its largest loss is restart" not in markdown
    assert "too little" in markdown, "the report must say its figures cover too little for recommendations"
    print("4 minutes in 1h:", {k: f"{100 * v:.2f}%" for k, v in errors.items()})


def test_window_starting_before_the_first_sample_and_ending_after_the_last(tmp_path):
    now = float(int(time.time()))
    start = now - 2 * 3600
    fleet = Fleet(parse(scenario("15s", TWO_JOBS)), start_unix=start + 1800)
    with Prometheus(remote_write_receiver=True, out_of_order_window="1d") as prom:
        covered = load(fleet, prom.url, 240)   # an hour of data, from 30 min in to 30 min before the end
        out = report(prom.url, start, now, tmp_path)
    errors = check(out, covered, fleet)
    print("window wider than the data:", {k: f"{100 * v:.2f}%" for k, v in errors.items()})


def test_twenty_minute_scrape_gap(tmp_path):
    end = float(int(time.time()))
    fleet = Fleet(parse(scenario("15s", TWO_JOBS)), start_unix=end - 3 * 3600)
    with Prometheus(remote_write_receiver=True, out_of_order_window="1d") as prom:
        covered = load(fleet, prom.url, 720, skip=range(300, 380))   # 80 ticks of 15 s: 20 minutes
        out = report(prom.url, end - 3 * 3600, fleet.now_unix, tmp_path)
    errors = check(out, covered, fleet)
    assert "No GPU data" in (out / "report.md").read_text()
    print("20-minute gap:", {k: f"{100 * v:.2f}%" for k, v in errors.items()})


def test_prometheus_restarted_mid_window(tmp_path):
    end = float(int(time.time()))
    fleet = Fleet(parse(scenario("15s", TWO_JOBS)), start_unix=end - 2 * 3600)
    with Prometheus(remote_write_receiver=True, out_of_order_window="1d") as prom:
        covered = load(fleet, prom.url, 480, skip=range(200, 212), restart=prom)   # down 3 minutes
        out = report(prom.url, end - 2 * 3600, fleet.now_unix, tmp_path)
    errors = check(out, covered, fleet)
    print("Prometheus restart:", {k: f"{100 * v:.2f}%" for k, v in errors.items()})


def test_jobs_starting_and_ending_inside_buckets(tmp_path):
    """A 6-hour window has 3-minute buckets; the jobs start and end in the middle of them."""
    jobs = [job("early", "0-1", 0.42, end="7650s"), job("late", "2-3", 0.35, start="4575s", end="18105s")]
    end = float(int(time.time()))
    fleet = Fleet(parse(scenario("15s", jobs)), start_unix=end - 6 * 3600)
    with Prometheus(remote_write_receiver=True, out_of_order_window="1d") as prom:
        covered = load(fleet, prom.url, 1440)
        out = report(prom.url, end - 6 * 3600, fleet.now_unix, tmp_path)
    errors = check(out, covered, fleet)
    print("jobs inside buckets:", {k: f"{100 * v:.2f}%" for k, v in errors.items()})


@pytest.mark.parametrize("offset", [0.0, 2.5, 4.5])
def test_a_minute_of_data_in_any_phase_against_the_buckets(tmp_path, offset):
    """A minute of 5-second samples, `offset` seconds before the end of a minute bucket. Counters
    per bucket extrapolated toward the bucket's edges once read up to 9% high on such data (a new
    series' first value came on top of it) and goodput above 100%; every figure must now be within
    1% of the truth, and goodput at most 1, whatever the phase."""
    end = float(int(time.time()))
    fleet = Fleet(parse(scenario("5s", TWO_JOBS)), start_unix=end - 60 - offset)
    with Prometheus(remote_write_receiver=True, out_of_order_window="1d") as prom:
        covered = load(fleet, prom.url, 12)
        out = report(prom.url, end - 3600, end, tmp_path)
    errors = check(out, covered, fleet)
    print(f"a minute, {offset:g} s out of phase:", {k: f"{100 * v:.2f}%" for k, v in errors.items()})

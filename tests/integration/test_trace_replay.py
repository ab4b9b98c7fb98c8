"""The three published What-if traces (OSDI'25; shipped in flopwatch/traces/whatif_data) replayed
end to end: each worker's steps through the
training client (`StepMonitor.record_step`, with its pipeline stage and data-parallel rank), real
Unix datagram sockets, the agent's own step intake, and the shipped rules in a real Prometheus
(remote write, faster than wall-clock). The study's results are the truth: which worker or stage
is at fault, and the share of step time lost (1 - 1/S).

Faked: the clock (steps end when the replay's time passes them) and GPU attribution (one
flopwatch_gpu_job_info per worker's GPU); durations are divided by a time scale so that a minute of
simulated time holds enough steps (ratios, and so every figure compared here, do not change).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from flopwatch.detect.replay import ReplayedJob, ReplayResult, replay
from flopwatch.traces import whatif

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
#: Step times after scaling: AR 4.7 s, ST 2.2 s, SE 4.6 s.
SCALES = {"AR": 10.0, "ST": 1.0, "SE": 2.0}
#: Long enough for the 10-minute hold of the pipeline ticket and a full 5-minute window after it.
MINUTES = 16
TOLERANCE = 0.05


@pytest.fixture(scope="module")
def result() -> ReplayResult:
    jobs = [ReplayedJob(name, whatif.load(whatif.shipped(name)), scale) for name, scale in SCALES.items()]
    return replay(jobs, ROOT / "alerts", MINUTES * 60)


def _study(name: str) -> whatif.StudyResult:
    return whatif.study_result(whatif.shipped(name).with_name(f"result-{name}.json"))


def test_ar_pages_the_one_bad_worker_and_nobody_else(result: ReplayResult):
    trace = whatif.load(whatif.shipped("AR"))
    bad = next(w for w in trace.workers if (w.dp_rank, w.stage) == (0, 0))
    pages = result.fired("FlopWatchStraggler", "AR")
    assert [(page["rank"], page["stage"], page["dp_rank"]) for page in pages] == [(str(bad.rank), "0", "0")]
    assert result.fired("FlopWatchPipelineImbalance", "AR") == []    # stage 3 is ~5% heavier: by design


def test_st_files_a_ticket_for_its_last_stage_and_pages_nobody(result: ReplayResult):
    assert result.fired("FlopWatchStraggler", "ST") == []
    assert [t["stage"] for t in result.fired("FlopWatchPipelineImbalance", "ST")] == ["3"]
    assert all(t["severity"] == "ticket" for t in result.fired("FlopWatchPipelineImbalance", "ST"))


def test_se_reports_scattered_imbalance_and_its_heavy_stage_and_pages_nobody(result: ReplayResult):
    assert result.fired("FlopWatchStraggler", "SE") == []
    assert [t["stage"] for t in result.fired("FlopWatchPipelineImbalance", "SE")] == ["1"]
    scattered = result.mean("job_id_class:flopwatch_step_time_lost:ratio", "SE", **{"class": "scattered"})
    worker = result.mean("job_id_class:flopwatch_step_time_lost:ratio", "SE", **{"class": "worker"})
    assert scattered is not None and worker is not None
    assert scattered > 0.1 > worker


@pytest.mark.parametrize("name", ["AR", "ST", "SE"])
def test_share_of_step_time_lost_agrees_with_the_what_if_analysis(result: ReplayResult, name: str):
    lost = result.mean("job_id:flopwatch_step_time_lost:ratio", name)
    assert lost is not None
    assert lost == pytest.approx(_study(name).lost_share, abs=TOLERANCE), (name, lost, _study(name).lost_share)


def test_the_classes_name_each_traces_culprit(result: ReplayResult):
    def share(job: str, cls: str) -> float:
        value = result.mean("job_id_class:flopwatch_step_time_lost:ratio", job, **{"class": cls})
        assert value is not None
        return value

    assert max(("worker", "stage", "scattered"), key=lambda c: share("AR", c)) == "worker"
    assert max(("worker", "stage", "scattered"), key=lambda c: share("ST", c)) == "stage"
    assert max(("worker", "stage", "scattered"), key=lambda c: share("SE", c)) == "scattered"

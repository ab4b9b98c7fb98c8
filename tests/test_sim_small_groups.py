"""Stages that slow mid-run (`pipeline.reweight`), faults on a replayed trace's workers, and the
detection suite's small-peer-group scenarios: their truth names the culprit and the class."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from flopwatch.sim.fleet import Fleet
from flopwatch.sim.jobs import PHASES
from flopwatch.sim.scenario import ScenarioError, load, parse
from flopwatch.traces import whatif

MODEL = {"params": 8e9, "layers": 32, "heads": 32, "head_dim": 128, "seq_len": 8192}
SUITE = Path(__file__).resolve().parents[1] / "flopwatch" / "detect" / "scenarios"
ST = whatif.shipped("ST")


def pipeline_job(pipeline: dict, faults=()) -> Fleet:
    """pp 4 x dp 2 on one node, with these pipeline settings."""
    return Fleet(parse({"name": "p", "seed": 5, "duration": "20m", "fleet": {"nodes": 1, "gpus_per_node": 8},
                        "jobs": [{"id": "j", "nodes": "0", "tokens_per_step": 131072, "target_mfu": 0.4,
                                  "model": MODEL, "pipeline": pipeline}], "faults": list(faults)}))


def st_job(faults=(), gpus_per_node: int = 8) -> Fleet:
    """The study's ST trace (dp 2 x pp 4), looped, with these faults."""
    if not ST.is_file():
        pytest.fail(f"the What-if traces are missing: expected {ST}")
    return Fleet(parse({"name": "t", "seed": 5, "duration": "20m",
                        "fleet": {"nodes": 8 // gpus_per_node, "gpus_per_node": gpus_per_node},
                        "jobs": [{"id": "st", "trace": "whatif:ST", "loop": True}], "faults": list(faults)}))


def arrival(step) -> np.ndarray:
    return step.phases["data"] + step.phases["compute"] + step.phases["other"]


# -- pipeline.reweight -------------------------------------------------------------------------
def test_reweight_changes_a_stages_work_from_its_time_on_and_nothing_else():
    plain = pipeline_job({"stages": 4, "micro_batches": 8}).jobs["j"].runner
    later = pipeline_job({"stages": 4, "micro_batches": 8,
                          "reweight": [{"at": "30s", "stage_weights": [1, 1, 1.3, 1]}]}).jobs["j"].runner
    changed = 0
    while later.clock < 90:
        before = later.clock
        a, b = plain.step(), later.step()
        if before < 30:
            assert a.wall == b.wall and all(np.array_equal(a.phases[p], b.phases[p]) for p in PHASES)
            continue
        changed += 1
        ratio = b.phases["compute"] / a.phases["compute"]   # the same draws, another weight
        np.testing.assert_allclose(ratio, np.where(later.stage == 2, 1.3, 1.0))
        assert b.wall > a.wall
    assert changed > 10


def test_a_stage_slowing_together_is_stage_class_time_lost_and_names_that_stage():
    fleet = pipeline_job({"stages": 4, "micro_batches": 8,
                          "reweight": [{"at": "2m", "stage_weights": [1, 1, 1.3, 1]}]})
    for _ in range(120):
        fleet.advance(5.0)
    truth = fleet.truth.as_dict()
    job = truth["jobs"]["j"]
    assert job["slow_stage"] == 2 and job["lost"]["culprit"] == "stage"
    assert job["lost"]["by_class"]["worker"] == pytest.approx(0.0, abs=1e-9)
    assert truth["faults"] == []   # imbalance, not a fault: nothing to page


def test_reweight_back_to_balanced_still_names_the_stage_that_slowed():
    runner = pipeline_job({"stages": 4, "stage_weights": [1, 1.1, 1, 1], "reweight": [
        {"at": "1m", "stage_weights": [1, 1, 1, 1.5]}, {"at": "2m", "stage_weights": [1, 1, 1, 1]}]}).jobs["j"].runner
    assert runner.slow_stage() == 3   # the most imbalanced weights the job ever has
    assert runner.spec.pipeline.reweight[1] == (120.0, (1.0, 1.0, 1.0, 1.0))


@pytest.mark.parametrize(("reweight", "message"), [
    ([{"at": "1m", "stage_weights": [1, 2]}], "jobs[0].pipeline.reweight[0].stage_weights: expected a list of 4"),
    ([{"at": "2m", "stage_weights": [1, 1, 1, 2]}, {"at": "1m", "stage_weights": [1, 1, 1, 1]}],
     "jobs[0].pipeline.reweight[1].at: must come after the previous change's"),
    ([{"stage_weights": [1, 1, 1, 2]}], "jobs[0].pipeline.reweight[0].at: required field is missing"),
    ([{"at": "1m", "weights": [1, 1, 1, 2]}], "jobs[0].pipeline.reweight[0].weights: unknown field"),
    ({"at": "1m"}, "jobs[0].pipeline.reweight: expected a list"),
])
def test_reweight_errors_name_the_field(reweight, message):
    with pytest.raises(ScenarioError) as err:
        pipeline_job({"stages": 4, "reweight": reweight})
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


# -- faults on a replayed trace's workers --------------------------------------------------------
def test_a_throttled_trace_worker_computes_slower_and_waits_less_before_the_step_grows():
    """Rank 2 (stage 1) at 1/1.4 speed: its extra compute comes out of its wait for the heavy last
    stage first; the step grows only by what its slack cannot hold, and everyone waits that long."""
    plain = st_job().jobs["st"].runner
    slow = st_job([{"kind": "thermal_throttle", "node": 0, "gpu": 2, "start": 0, "slowdown": 0.2857}])
    slow.advance(5.0)   # the fault's speed reaches the trace job's runner
    runner = slow.jobs["st"].runner
    assert runner.slow.speed.tolist() == [1, 1, 1 - 0.2857, 1, 1, 1, 1, 1]
    c, m = PHASES.index("compute"), PHASES.index("comm")
    grew = 0
    for _ in range(40):
        plain.trace_index = runner.trace_index   # the same recorded step for both
        recorded = runner.trace_phases[runner.trace_index % len(runner.trace_phases)]
        a, b = plain.step(), runner.step()
        extra = recorded[2, c] / (1 - 0.2857) - recorded[2, c]
        slack = recorded[2, m] - recorded[:, m].min()
        grown = max(0.0, extra - slack)
        assert b.phases["compute"][2] == pytest.approx(a.phases["compute"][2] / (1 - 0.2857))
        assert b.wall == pytest.approx(a.wall + grown)
        others = np.arange(8) != 2
        np.testing.assert_allclose(b.phases["comm"][others], a.phases["comm"][others] + grown)
        np.testing.assert_allclose(sum(b.phases.values()), b.wall)   # every worker's step is the wall
        assert b.lost_seconds == pytest.approx(a.lost_seconds + grown)
        assert b.lost_by_class["worker"] == pytest.approx(a.lost_by_class["worker"] + grown)
        grew += grown > 0
    assert 0 < grew < 40   # some steps absorb it all, some do not
    assert float(arrival(b)[2] / arrival(a)[2]) == pytest.approx(1.4, rel=0.01)


def test_slowing_the_traces_bottleneck_lengthens_every_step_by_its_extra_compute():
    plain = st_job().jobs["st"].runner
    fleet = st_job([{"kind": "hw_slowdown", "node": 0, "gpu": 7, "start": 0, "slowdown": 0.2}])
    fleet.advance(5.0)
    runner = fleet.jobs["st"].runner
    for _ in range(40):
        plain.trace_index = runner.trace_index
        a, b = plain.step(), runner.step()
        extra = a.phases["compute"][7] / 0.8 - a.phases["compute"][7]
        assert b.wall - a.wall == pytest.approx(extra, rel=0.1)   # rank 7 has (almost) no slack to hide it


def test_host_faults_on_a_trace_add_a_share_of_its_recorded_step():
    fleet = st_job([{"kind": "gc_pause", "node": 3, "start": 0, "slowdown": 0.1}], gpus_per_node=1)
    for _ in range(2):   # host faults reach a job from the tick after its nodes are assigned
        fleet.advance(5.0)
    runner = fleet.jobs["st"].runner
    mean_wall = float(runner.trace_phases.sum(axis=2)[:, 0].mean())
    assert runner.healthy_step == pytest.approx(mean_wall) and 2.0 < mean_wall < 2.5   # not the FLOPs' step
    np.testing.assert_allclose(runner.slow.other_extra, np.where(np.arange(8) == 3, 0.1 * mean_wall, 0.0))
    step = runner.step()
    assert step.phases["other"][3] == pytest.approx(0.1 * mean_wall)


def test_a_trace_without_faults_replays_as_before():
    runner = st_job().jobs["st"].runner
    for i in range(40):
        step, recorded = runner.step(), runner.trace_phases[i % len(runner.trace_phases)]
        assert step.wall == float(recorded[0].sum())
        assert all(np.array_equal(step.phases[p], recorded[:, PHASES.index(p)]) for p in PHASES)


# -- the suite's small-peer-group scenarios ----------------------------------------------------
def growth(path: Path) -> tuple[dict, np.ndarray]:
    """Run a scenario: its truth, and each rank's mean arrival while its fault (or reweight) holds
    over its mean arrival before."""
    scenario = load(path)
    fleet = Fleet(scenario)
    (state,) = fleet.jobs.values()
    cut = scenario.faults[0].start if scenario.faults else scenario.jobs[0].pipeline.reweight[0][0]
    before, during, last = [], [], None
    while fleet.t < scenario.duration:
        fleet.advance(scenario.scrape_interval)
        step = state.last_step
        if step is not None and step is not last:
            last = step
            if step.start < cut:
                before.append(arrival(step))
            elif step.start > cut + 60 and (not scenario.faults or step.start < scenario.faults[0].end):
                during.append(arrival(step))
    return fleet.truth.as_dict(), np.mean(during, axis=0) / np.mean(before, axis=0)


@pytest.mark.parametrize(("name", "kind", "node", "gpu", "rank", "cause", "factor"), [
    ("pipeline-pp8-stage-of-one-thermal", "thermal_throttle", "node0000", 5, 5, "thermal", 1.25),
    ("pipeline-pp8-stage-of-one-unexplained", "silent_slowdown", "node0005", 0, 5, "unknown", 1.25),
    ("pipeline-pp4-dp2-slow-worker", "thermal_throttle", "node0000", 3, 3, "thermal", 1.4),
    ("trace-whatif-st-slow-worker", "thermal_throttle", "node0000", 2, 2, "thermal", 1.4),
])
def test_small_group_scenarios_name_the_slow_rank(name, kind, node, gpu, rank, cause, factor):
    truth, grew = growth(SUITE / f"{name}.yml")
    [fault] = truth["faults"]
    assert (fault["kind"], fault["node"], fault["gpu"], fault["rank"], fault["cause"]) == (kind, node, gpu, rank, cause)
    assert fault["start"] > 0   # mid-run: the rank has a history of its own before it slows
    slow = rank
    assert grew[slow] == pytest.approx(factor, abs=0.02)
    assert np.delete(grew, slow) == pytest.approx(1.0, abs=0.01)
    (job,) = truth["jobs"].values()
    if name.startswith("trace"):   # the study's heavy last stage stays the largest class
        assert (job["lost"]["culprit"], job["slow_stage"]) == ("stage", 3)
        assert job["lost"]["by_class"]["worker"] > 0
    else:
        assert (job["lost"]["culprit"], job["slow_stage"]) == ("worker", None)


def test_the_stage_slowing_together_scenario_is_imbalance_only():
    truth, grew = growth(SUITE / "pipeline-pp4-dp2-slow-stage.yml")
    (job,) = truth["jobs"].values()
    assert truth["faults"] == [] and (job["lost"]["culprit"], job["slow_stage"]) == ("stage", 2)
    assert grew[[4, 5]] == pytest.approx([1.3, 1.3], abs=0.02)   # both data-parallel ranks of stage 2
    assert np.delete(grew, [4, 5]) == pytest.approx(1.0, abs=0.01)

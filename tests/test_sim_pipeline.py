"""Pipeline, sequence-imbalance and trace jobs in the simulator, and their ground truth."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from flopwatch.sim.fleet import Fleet
from flopwatch.sim.scenario import ScenarioError, parse
from flopwatch.traces import whatif

MODEL = {"params": 8e9, "layers": 32, "heads": 32, "head_dim": 128, "seq_len": 8192}
TRACES = whatif.shipped("AR").parent     # the study's traces as FlopWatch ships them


def scenario(faults=(), **job):
    return parse({"name": "p", "seed": 3, "duration": "30m", "fleet": {"nodes": 4, "gpus_per_node": 8},
                  "jobs": [{"id": "j", "nodes": "0-3", "tokens_per_step": 1048576, "target_mfu": 0.4,
                            "step_jitter": 0.02, "model": MODEL, **job}], "faults": list(faults)})


def run(seconds=600.0, faults=(), **job):
    fleet = Fleet(scenario(faults, **job))
    for _ in range(int(seconds / 5)):
        fleet.advance(5.0)
    return fleet, fleet.truth.as_dict()["jobs"]["j"]


def per_stage_compute(fleet):
    state = fleet.jobs["j"]
    compute = state.counters.phase_seconds[1] / state.counters.steps
    return [float(compute[state.runner.stage == s].mean()) for s in range(state.runner.stage.max() + 1)]


def test_a_one_stage_pipeline_is_the_plain_job():
    a = Fleet(scenario()).jobs["j"].runner
    b = Fleet(scenario(pipeline={"stages": 1, "micro_batches": 1})).jobs["j"].runner
    for _ in range(5):
        x, y = a.step(), b.step()
        assert x.wall == y.wall
        for phase in x.phases:
            assert np.array_equal(x.phases[phase], y.phases[phase])


def test_layout_is_megatron_order():
    runner = Fleet(scenario(pipeline={"stages": 4, "micro_batches": 8})).jobs["j"].runner
    assert runner.stage.tolist() == [r // 8 for r in range(32)]
    assert runner.dp_rank.tolist() == [r % 8 for r in range(32)]


def test_one_f_one_b_step_waits_for_the_bottleneck_and_the_bubble():
    runner = Fleet(scenario(pipeline={"stages": 4, "stage_weights": [1, 1, 1, 1.6], "micro_batches": 8})).jobs[
        "j"].runner
    step = runner.step()
    arrival = step.phases["data"] + step.phases["compute"] + step.phases["other"]
    bubble = (4 - 1) / 8 * np.median(arrival)   # fill and drain at the typical stage's pace
    assert step.wall == pytest.approx(arrival.max() + bubble + runner.comm_exposed + runner.optimizer)
    total = sum(step.phases.values())
    np.testing.assert_allclose(total, step.wall)
    assert step.phases["comm"][runner.stage == 3].mean() < step.phases["comm"][runner.stage == 0].mean()


def test_a_heavy_stage_paces_the_micro_batches_but_not_the_bubble():
    """1F1B with one heavy stage k: step = M t_k + (P - 1) t_typ, so the bubble stays the balanced one."""
    m, p = 8, 4
    heavy = Fleet(scenario(pipeline={"stages": p, "stage_weights": [1, 1, 1, 2.0], "micro_batches": m})).jobs[
        "j"].runner
    flat = Fleet(scenario(pipeline={"stages": p, "micro_batches": m})).jobs["j"].runner
    for runner in (heavy, flat):
        runner.compute_base = 1.0   # one unit of compute per micro-batch pass: compare spans directly
    spans = {}
    for name, runner in (("heavy", heavy), ("flat", flat)):
        step = runner.step()
        arrival = step.phases["data"] + step.phases["compute"] + step.phases["other"]
        spans[name] = (step.wall - runner.comm_exposed - runner.optimizer, float(np.median(arrival)),
                       float(arrival.max()))
    for span, typical, slowest in spans.values():
        assert span - slowest == pytest.approx((p - 1) / m * typical)   # the bubble: P - 1 typical slots
    (heavy_span, typical, slowest), (flat_span, _, flat_slowest) = spans["heavy"], spans["flat"]
    assert slowest > 1.9 * typical
    # the old (M + P - 1) / M x max(arrival) would add the heavy stage's excess to the bubble as well
    assert heavy_span < (m + p - 1) / m * slowest - 0.9 * (p - 1) / m * (slowest - typical)
    assert flat_span == pytest.approx((m + p - 1) / m * flat_slowest, rel=0.02)   # balanced: as before


@pytest.mark.parametrize("weights", [[1, 1, 1, 1], [1, 1, 1, 1.6]])
def test_pipeline_job_runs_at_its_target_mfu(weights):
    """The calibration uses the same span as the steps: a heavy stage does not skew the job's MFU."""
    _, truth = run(pipeline={"stages": 4, "stage_weights": weights, "micro_batches": 8})
    assert truth["mfu"] == pytest.approx(0.4, rel=0.01)


def test_heavy_last_stage_is_stage_imbalance():
    fleet, truth = run(pipeline={"stages": 4, "stage_weights": [1, 1, 1, 1.6], "micro_batches": 8})
    compute = per_stage_compute(fleet)
    assert compute[3] / np.mean(compute[:3]) == pytest.approx(1.6, rel=0.02)
    lost = truth["lost"]
    assert lost["culprit"] == "stage"
    assert lost["by_class"]["stage"] > 0.15 and lost["by_class"]["worker"] < 1e-9
    assert lost["share"] == pytest.approx(sum(lost["by_class"].values()), rel=1e-9)
    # the share lost and the straggler badput are one measure: the mean wait of each step
    assert truth["badput"]["straggler"] > 0.15
    assert lost["share"] == pytest.approx(truth["badput_seconds"]["straggler"] / truth["step_seconds"])


def test_lost_time_is_the_mean_wait_not_the_heavy_stages_own_work():
    """Truth counts what the others wait for the heavy stage, as the What-if study does on ST."""
    runner = Fleet(scenario(pipeline={"stages": 4, "stage_weights": [1, 1, 1, 1.6], "micro_batches": 8})).jobs[
        "j"].runner
    for _ in range(5):
        step = runner.step()
        comm, compute = step.phases["comm"], step.phases["compute"]
        assert step.lost_seconds == pytest.approx(float(comm.mean() - comm.min()))   # max - mean arrival
        assert step.lost_seconds == pytest.approx(step.waiting)
        assert sum(step.lost_by_class.values()) == pytest.approx(step.lost_seconds)
        assert step.lost_by_class["worker"] == pytest.approx(0.0, abs=1e-12)   # no fault
        # "every rank at its typical compute" would count all of the heavy stage's extra work
        assert step.lost_seconds < 0.8 * float(compute.max() - np.median(compute))


def test_lost_classes_remove_faults_then_stage_weights():
    thermal = [{"kind": "thermal_throttle", "node": 0, "gpu": 1, "start": "0s", "duration": "1h", "slowdown": 0.3}]
    fleet = Fleet(scenario(thermal, pipeline={"stages": 2, "stage_weights": [1, 1.2], "micro_batches": 8}))
    fleet.advance(5.0)
    runner = fleet.jobs["j"].runner
    assert runner.slow.speed[1] < 0.8
    step = runner.step()
    arrival = step.phases["data"] + step.phases["compute"] + step.phases["other"]
    assert step.lost_seconds == pytest.approx(float(arrival.max() - arrival.mean()))
    by_class = step.lost_by_class
    assert by_class["worker"] > by_class["stage"] > by_class["scattered"] > 0
    assert sum(by_class.values()) == pytest.approx(step.lost_seconds)


def test_sequence_imbalance_is_scattered_and_the_slowest_rank_moves():
    fleet = Fleet(scenario(pipeline={"stages": 4, "micro_batches": 8}, sequence_imbalance=0.3))
    runner = fleet.jobs["j"].runner
    slowest = {int(np.argmax(runner.step().phases["compute"])) for _ in range(30)}
    assert len(slowest) > 10
    _, truth = run(pipeline={"stages": 4, "micro_batches": 8}, sequence_imbalance=0.3)
    assert truth["lost"]["culprit"] == "scattered" and truth["lost"]["by_class"]["stage"] < 1e-9


def test_bad_worker_among_imbalanced_stages():
    thermal = [{"kind": "thermal_throttle", "node": 1, "gpu": 2, "start": "1m", "duration": "20m", "slowdown": 0.3}]
    fleet, truth = run(faults=thermal, pipeline={"stages": 4, "stage_weights": [1, 1, 1, 1.15], "micro_batches": 8},
                       sequence_imbalance=0.1)
    assert truth["lost"]["culprit"] == "worker"
    assert truth["lost"]["by_class"]["stage"] > 0.02 and truth["lost"]["by_class"]["scattered"] > 0.01
    state = fleet.jobs["j"]
    compute = state.counters.phase_seconds[1] / state.counters.steps
    peers = compute[state.runner.stage == 1]
    assert int(np.argmax(compute)) == 10 and compute[10] > 1.2 * np.median(peers)


def test_straggler_badput_is_per_step_mean_wait():
    fleet = Fleet(scenario(sequence_imbalance=0.2))
    runner = fleet.jobs["j"].runner
    step = runner.step()
    wait = step.phases["comm"] - step.phases["comm"].min()
    assert step.waiting == pytest.approx(float(wait.mean()))


@pytest.mark.parametrize(("job", "message"), [
    ({"pipeline": {"stages": 4, "stage_weights": [1, 1]}}, "jobs[0].pipeline.stage_weights: expected a list of 4"),
    ({"pipeline": {"stages": 5}}, "jobs[0].pipeline.stages: the job's 32 ranks do not split evenly into 5"),
    ({"pipeline": {"stages": 2, "stage_weights": [1, "x"]}}, "jobs[0].pipeline.stage_weights.1: expected a number"),
    ({"sequence_imbalance": -1}, "jobs[0].sequence_imbalance: expected a number from 0 to 5"),
    ({"loop": True}, "jobs[0].loop: only a job with `trace:` takes this field"),
])
def test_scenario_errors_name_the_field(job, message):
    with pytest.raises(ScenarioError) as err:
        scenario(**job)
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


def test_trace_job_errors(tmp_path):
    pd = pytest.importorskip("pandas")
    pd.DataFrame({"dp_rank": [0], "stage": [0], "rank": [0], "step": [1], "optype": ["gc"]}).to_parquet(
        tmp_path / "trace-x.parquet")
    (tmp_path / "s.yml").write_text("")
    with pytest.raises(ScenarioError, match=r"jobs\[0\]\.trace: .*trace-x.parquet: missing column 'start_ts'"):
        parse({"name": "t", "duration": "5m", "fleet": {"nodes": 1},
               "jobs": [{"id": "t", "trace": "trace-x.parquet"}]}, str(tmp_path / "s.yml"))


@pytest.fixture
def st_trace() -> Path:
    path = TRACES / "trace-ST.parquet"
    if not path.is_file():
        pytest.fail(f"the What-if traces are missing: expected {path} (shared/ beside the checkout)")
    return path


def test_trace_job_replays_the_recorded_phases(st_trace, tmp_path):
    from flopwatch.traces import whatif

    (tmp_path / "t.yml").write_text("")
    sc = parse({"name": "t", "duration": "30m", "fleet": {"nodes": 2, "gpus_per_node": 8},
                "jobs": [{"id": "st", "trace": str(st_trace), "loop": True}]},
               str(tmp_path / "t.yml"))
    assert sc.jobs[0].nodes == [0] and sc.jobs[0].end is None
    fleet = Fleet(sc)
    trace = whatif.load(st_trace)
    runner = fleet.jobs["st"].runner
    first = runner.step()
    assert first.wall == pytest.approx(float(trace.step_seconds[0].max()))
    np.testing.assert_allclose(first.phases["compute"], trace.phase("compute")[0])
    for _ in range(len(trace.steps) - 1):
        runner.step()
    assert runner.step().wall == pytest.approx(first.wall)   # loops
    for _ in range(60):
        fleet.advance(5.0)
    compute = fleet.jobs["st"].counters.phase_seconds[1] / fleet.jobs["st"].counters.steps
    assert compute[runner.stage == 3].mean() > 1.5 * compute[runner.stage == 0].mean()


def test_trace_path_is_relative_to_the_scenario_and_plays_once(st_trace, tmp_path):
    link = tmp_path / "traces"
    link.symlink_to(st_trace.parent)
    sc = parse({"name": "t", "duration": "30m", "fleet": {"nodes": 1, "gpus_per_node": 8},
                "jobs": [{"id": "st", "trace": "traces/trace-ST.parquet", "time_scale": 2}]},
               str(tmp_path / "s.yml"))
    from flopwatch.traces import whatif

    once = float(whatif.load(st_trace).step_seconds.max(axis=1).sum())
    assert sc.jobs[0].end == pytest.approx(2 * once)


def trace_fleet(name: str, tmp_path: Path, **job) -> Fleet:
    path = TRACES / f"trace-{name}.parquet"
    if not path.is_file():
        pytest.fail(f"the What-if traces are missing: expected {path} (shared/ beside the checkout)")
    (tmp_path / "t.yml").write_text("")
    return Fleet(parse({"name": "t", "duration": "20m", "fleet": {"nodes": 8, "gpus_per_node": 8},
                        "jobs": [{"id": name, "trace": str(path), "loop": True, **job}]}, str(tmp_path / "t.yml")))


def test_trace_truth_is_the_studys_per_step_slowdown(tmp_path):
    from flopwatch.traces import whatif

    fleet = trace_fleet("ST", tmp_path)
    runner = fleet.jobs["ST"].runner
    study = whatif.study_result(TRACES / "result-ST.json")
    trace = whatif.load(TRACES / "trace-ST.parquet")
    expected = []
    for _ in range(len(trace.steps) + 3):   # past the end: the loop starts again
        step = runner.step()
        expected.append(step.wall * (1 - 1 / study.per_step[trace.steps[len(expected) % len(trace.steps)]]))
        assert step.waiting == pytest.approx(expected[-1]) and step.lost_seconds == pytest.approx(expected[-1])
    fleet = trace_fleet("ST", tmp_path)
    for _ in range(60):
        fleet.advance(5.0)
    truth = fleet.truth.as_dict()["jobs"]["ST"]
    assert truth["source"] == "trace"
    assert truth["lost"]["share"] == pytest.approx(truth["badput_seconds"]["straggler"] / truth["step_seconds"])
    assert truth["lost"]["share"] == pytest.approx(study.lost_share, abs=0.01)
    productive = truth["step_seconds"] - truth["badput_seconds"]["straggler"]   # a trace loads no data
    assert truth["goodput"] == pytest.approx(productive / truth["allocated_seconds"])
    assert fleet.truth.faults == []   # stage imbalance: no worker to blame


def test_a_trace_whose_study_blames_one_worker_names_it_in_the_truth(tmp_path):
    from flopwatch.traces import whatif

    fleet = trace_fleet("AR", tmp_path, time_scale=0.25, nodes="3-4")
    runner = fleet.jobs["AR"].runner
    study = whatif.study_result(TRACES / "result-AR.json")
    assert study.worker_share > 0.5
    [fault] = fleet.truth.faults
    rank = fault["rank"]
    assert (runner.dp_rank[rank], runner.stage[rank]) == (0, 0) == (fault["dp_rank"], fault["stage"])
    assert (fault["node"], fault["gpu"]) == ("node0003", rank % 8)   # placed on the job's own nodes
    assert fault["kind"] == "trace_worker" and fault["cause"] == "unknown" and fault["job_id"] == "AR"
    assert (fault["start"], fault["end"]) == (0.0, 1200.0)
    assert fault["slowdown"] == pytest.approx(study.by_dp_rank[0] - 1)
    # the blamed worker is the one the trace shows slow
    compute = runner.trace_phases[:, :, 1].mean(axis=0)
    assert int(np.argmax(compute)) == rank
    assert trace_fleet("SE", tmp_path).truth.faults == []

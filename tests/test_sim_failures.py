"""Interruptions drawn at Llama 3's rate and mix: the draws, what an interruption does to the job and
its telemetry, and the ground truth it leaves (flopwatch/sim/failures.py)."""

from __future__ import annotations

import dataclasses
import math

import pytest

from flopwatch.sim import failures
from flopwatch.sim.fleet import Fleet
from flopwatch.sim.scenario import ScenarioError, parse


def _scenario(failures_key: dict, duration: str = "2h", nodes: int = 2, checkpoint: str = "10m") -> dict:
    return {
        "name": "t", "seed": 3, "duration": duration, "scrape_interval": "5s",
        "fleet": {"nodes": nodes, "gpus_per_node": 8, "gpu_model": "H100-SXM", "nics_per_node": 8},
        "jobs": [{"id": "j", "nodes": f"0-{nodes - 1}", "tokens_per_step": 524288, "target_mfu": 0.42,
                  "model": {"params": 8e9, "layers": 32, "heads": 32, "head_dim": 128, "seq_len": 8192},
                  "checkpoint_every": checkpoint, "checkpoint_seconds": "10s"}],
        "failures": failures_key,
    }


def test_the_llama3_preset_is_its_published_rate_and_mix():
    assert sum(count for _, count, _ in failures.LLAMA3_CAUSES) == 419
    per_1k = failures.LLAMA3_PER_GPU_HOUR * 1000
    assert per_1k == pytest.approx(419 / (54 * 24 * 16384) * 1000) and 0.0197 < per_1k < 0.0198


def test_draws_follow_the_rate_and_the_seed():
    spec = parse(_scenario({"preset": "llama3", "rate_scale": 100}, duration="30d", nodes=128)).failures
    job = parse(_scenario({}, duration="30d", nodes=128)).jobs[0]
    drawn = failures.draw(spec, [job], 8, 8, 30 * 86400)
    # 1,024 GPUs at 100x Llama 3's rate: one failure every ~29.7 minutes of running, and each
    # stops the job for ~10 minutes: 30 days hold ~1,090 interruptions.
    running = 30 * 86400 - sum(i.end - i.start for i in drawn)
    expected = failures.LLAMA3_PER_GPU_HOUR * 100 * 1024 * running / 3600
    assert abs(len(drawn) - expected) < 4 * math.sqrt(expected)
    faulty = sum(i.cause == "faulty_gpu" for i in drawn) / len(drawn)
    assert abs(faulty - 148 / 419) < 0.05
    assert [i.start for i in failures.draw(spec, [job], 8, 8, 30 * 86400)] == [i.start for i in drawn]
    other = dataclasses.replace(spec, seed=spec.seed + 1)
    assert [i.start for i in failures.draw(other, [job], 8, 8, 30 * 86400)] != [i.start for i in drawn]


def test_an_interruption_stops_the_job_and_it_redoes_the_steps_since_its_checkpoint():
    scenario = parse(_scenario({"preset": "llama3", "rate_scale": 3000, "seed": 1}))
    fleet = Fleet(scenario)
    first = fleet.interruptions[0]
    state = fleet.jobs["j"]
    while fleet.t < first.start + 10:
        fleet.advance(5.0)
    steps_at_stop = state.counters.step_count
    stopped_iteration = state.runner.steps - state.runner.replay_steps
    while fleet.t < first.end - 10:
        fleet.advance(5.0)
    assert state.counters.step_count == steps_at_stop            # no step while it is down
    while not first.restarted:
        fleet.advance(5.0)
    fleet.advance(5.0)
    assert state.counters.iteration < stopped_iteration          # resumed from the checkpoint
    assert first.lost_steps == stopped_iteration - state.checkpoint_iteration > 0
    record = state.truth.interruptions[0]
    assert record["lost_steps"] == first.lost_steps and record["restart_seconds"] >= first.end - first.start
    node = fleet.nodes[first.node]
    if first.xid is not None:
        assert node.gpus[first.gpu].xids.get(first.xid) == 1
    if first.nic is not None:
        assert node.nics[first.nic].link_downed == 1


def test_a_nodes_job_sums_never_go_back_across_an_interruption_and_its_restart():
    """The job's phase and checkpoint sums per node (what the agent keeps monotonic) only grow while
    the job stops, restarts and redoes the steps since its checkpoint, and grow again after it."""
    from prometheus_client.parser import text_string_to_metric_families

    from flopwatch.sim.node import SimNodeAgent

    scenario = parse(_scenario({"preset": "llama3", "rate_scale": 3000, "seed": 1}, checkpoint="2m"))
    fleet = Fleet(scenario, start_unix=1.7e9)
    first = fleet.interruptions[0]
    state = fleet.jobs["j"]
    agents = [SimNodeAgent(fleet, node, gpus=False) for node in fleet.nodes]

    def sums() -> dict[tuple[str, str], float]:
        lines = b"\n".join(line for agent in agents for line in agent.render().split(b"\n")
                           if line.startswith((b"flopwatch_train_job_phase_", b"flopwatch_train_job_checkpoint_")))
        return {(sample.labels["node"], sample.labels.get("phase", sample.labels.get("kind"))): sample.value
                for family in text_string_to_metric_families(lines.decode() + "\n") for sample in family.samples}

    while fleet.t < first.start - 150:
        fleet.advance(5.0)
    before = last = sums()
    assert len(before) == 2 * 6 and before["node0000", "save"] > 0
    while fleet.t < first.end + 300:
        fleet.advance(5.0)
        now = sums()
        assert now.keys() == last.keys()
        went_back = {key: (last[key], value) for key, value in now.items() if value < last[key]}
        assert not went_back, f"t={fleet.t:g}: {went_back}"
        last = now
    assert first.restarted and first.lost_steps > 0 and state.truth.lost_steps > 0   # it redid steps
    assert all(last[key] > before[key] for key in before if key[1] in ("compute", "comm", "save"))


def test_truth_has_every_interruption_its_telemetry_cause_and_ettr():
    scenario = parse(_scenario({"preset": "llama3", "rate_scale": 3000, "seed": 2}))
    fleet = Fleet(scenario)
    while fleet.t < scenario.duration:
        fleet.advance(5.0)
    job = fleet.truth.as_dict()["jobs"]["j"]
    assert len(job["interruptions"]) == sum(i.fired for i in fleet.interruptions) > 0
    assert {i["telemetry_cause"] for i in job["interruptions"]} <= {"gpu_lost", "xid", "nic_down", "none"}
    assert job["ettr"] == pytest.approx(job["goodput"] + job["badput"]["straggler"] + job["badput"]["data"],
                                        abs=0.01)
    restart = job["badput"]["restart"]
    down = sum(min(i.end, scenario.duration) - i.start for i in fleet.interruptions if i.fired) / scenario.duration
    assert restart == pytest.approx(down, abs=0.01)
    faults = [f for f in fleet.truth.faults if f["index"] >= failures.TRUTH_INDEX]
    assert len(faults) == len(fleet.interruptions)


@pytest.mark.parametrize(("key", "message"), [
    ({"preset": "meta"}, "failures.preset: unknown preset 'meta' (known: llama3)"),
    ({"rate_scale": -1}, "failures.rate_scale: expected a number from 0 to 1e+06"),
    ({"typo": 1}, "failures.typo: unknown field"),
])
def test_a_wrong_failures_key_is_one_clear_error(key, message):
    with pytest.raises(ScenarioError, match=message.replace("(", r"\(").replace(")", r"\)").replace("+", r"\+")):
        parse(_scenario(key))


def test_young_daly():
    assert failures.young_daly(60, 178459) == pytest.approx(math.sqrt(2 * 60 * 178459))
    assert failures.young_daly(0, 100) == math.inf

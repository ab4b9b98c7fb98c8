"""Synchronous-training physics and fault effects of the fleet simulator."""

from __future__ import annotations

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from flopwatch.sim.fleet import Fleet
from flopwatch.sim.jobs import PHASES, JobRunner
from flopwatch.sim.node import SimNodeAgent
from flopwatch.sim.scenario import parse

MODEL_8B = {"params": 8e9, "layers": 32, "heads": 32, "head_dim": 128, "seq_len": 8192}


def scenario(nodes=4, faults=(), jitter=0.02, mfu=0.42, duration="30m", tokens=524288, seed=5, **job):
    return parse({
        "name": "t", "seed": seed, "duration": duration, "scrape_interval": "5s",
        "fleet": {"nodes": nodes, "gpus_per_node": 8, "gpu_model": "H100-SXM", "nics_per_node": 8},
        "jobs": [{"id": "j", "nodes": f"0-{nodes - 1}", "model": MODEL_8B, "tokens_per_step": tokens,
                  "target_mfu": mfu, "step_jitter": jitter, **job}],
        "faults": list(faults),
    })


def runner(nodes=4, **kw) -> JobRunner:
    fleet = Fleet(scenario(nodes, **kw))
    return fleet.jobs["j"].runner


def test_every_rank_spends_the_same_wall_time_per_step():
    job = runner()
    job.slow.speed[5] = 0.9
    for _ in range(50):
        step = job.step()
        total = sum(step.phases[phase] for phase in PHASES)
        np.testing.assert_allclose(total, step.wall, rtol=1e-12)


def test_slowed_rank_has_the_longest_compute_and_the_others_wait():
    job = runner(nodes=8)
    slowdown = 0.08
    job.slow.speed[13] = 1 - slowdown
    compute = np.zeros(job.ranks)
    comm = np.zeros(job.ranks)
    for _ in range(200):
        step = job.step()
        compute += step.phases["compute"]
        comm += step.phases["comm"]
        assert step.phases["comm"][13] == pytest.approx(job.comm_exposed, abs=0.3 * job.target_wall)
    assert int(np.argmax(compute)) == 13
    assert int(np.argmin(comm)) == 13
    excess = compute[13] / np.median(compute) - 1
    injected = 1 / (1 - slowdown) - 1
    assert excess == pytest.approx(injected, rel=0.2)
    # the others' extra comm (wait) matches the straggler's extra compute
    assert np.median(comm) - comm[13] == pytest.approx(compute[13] - np.median(compute), rel=0.3)


@pytest.mark.parametrize(("nodes", "jitter", "mfu"), [(4, 0.02, 0.42), (16, 0.05, 0.35), (128, 0.02, 0.5)])
def test_healthy_job_runs_at_target_mfu(nodes, jitter, mfu):
    job = runner(nodes=nodes, jitter=jitter, mfu=mfu)
    walls = [job.step().wall for _ in range(400)]
    peak = job.fleet.gpu_model.peak_dense_flops["bf16"]
    achieved = job.flops_per_step * len(walls) / (sum(walls) * job.ranks * peak)
    assert achieved == pytest.approx(mfu, rel=0.01)


def test_fleet_truth_mfu_matches_target_in_steady_state():
    fleet = Fleet(scenario(nodes=4, duration="30m", checkpoint_every="1h"))
    while fleet.t < 1200:
        fleet.advance(5)
    truth = fleet.truth.jobs["j"]
    # steady state: skip the first minute, average the per-interval truth
    series = [mfu for t, mfu, _ in truth.series if t > 60]
    assert np.mean(series) == pytest.approx(0.42, rel=0.01)


def exposition_values(agent: SimNodeAgent) -> dict[tuple, float]:
    values = {}
    for family in text_string_to_metric_families(agent.render().decode()):
        for sample in family.samples:
            values[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return values


@pytest.mark.slow
def test_counters_never_go_backwards():
    fleet = Fleet(scenario(faults=[{"kind": "nic_link_flap", "node": 1, "nic": 2, "start": "1m"},
                                   {"kind": "nvlink_errors", "node": 2, "gpu": 1, "start": "1m"}]))
    agents = [SimNodeAgent(fleet, node) for node in fleet.nodes]
    previous: list[dict] = [{} for _ in agents]
    for _ in range(60):
        fleet.advance(5)
        for i, agent in enumerate(agents):
            values = exposition_values(agent)
            for key, value in values.items():
                name = key[0]
                if name.endswith(("_total", "_count", "_sum", "_bucket")) and key in previous[i]:
                    assert value >= previous[i][key], key
            previous[i] = values


def gpu_value(fleet, agent, name, **labels):
    values = exposition_values(agent)
    wanted = tuple(sorted({"node": agent.agent.node, **labels}.items()))
    return values.get((name, wanted))


@pytest.mark.slow
def test_thermal_fault_starts_and_ends_on_time_with_matching_telemetry():
    fleet = Fleet(scenario(faults=[{"kind": "thermal_throttle", "node": 1, "gpu": 3, "start": "5m",
                                    "duration": "5m", "slowdown": 0.1}]))
    agent = SimNodeAgent(fleet, fleet.nodes[1])
    seen = {}
    while fleet.t < 900:
        fleet.advance(5)
        seen[fleet.t] = (
            gpu_value(fleet, agent, "flopwatch_gpu_clock_event_active", gpu="3", reason="sw_thermal"),
            gpu_value(fleet, agent, "flopwatch_gpu_sm_clock_hertz", gpu="3"),
            gpu_value(fleet, agent, "flopwatch_gpu_temperature_celsius", gpu="3"),
        )
    assert seen[300][0] == 0          # tick [295, 300): before the fault
    assert seen[305][0] == 1          # tick [300, 305): fault active
    assert seen[600][0] == 1 and seen[605][0] == 0
    assert seen[305][1] == pytest.approx(0.9 * 1980e6)
    assert seen[600][2] >= 87 > seen[300][2]
    ranks = fleet.jobs["j"].counters
    assert int(np.argmax(ranks.phase_seconds[PHASES.index("compute")])) == 1 * 8 + 3


def test_gpu_lost_stalls_the_job_then_it_restarts_and_redoes_lost_steps():
    fleet = Fleet(scenario(faults=[{"kind": "gpu_lost", "node": 2, "gpu": 6, "start": "10m", "duration": "3m"}],
                           checkpoint_every="4m"))
    agent = SimNodeAgent(fleet, fleet.nodes[2])
    steps = {}
    while fleet.t < 1500:
        fleet.advance(5)
        steps[fleet.t] = fleet.jobs["j"].counters.step_count
        if fleet.t == 700:
            assert gpu_value(fleet, agent, "flopwatch_gpu_up", gpu="6") == 0
            assert gpu_value(fleet, agent, "flopwatch_gpu_xid_errors_total", gpu="6", xid="79") == 1
            assert gpu_value(fleet, agent, "flopwatch_gpu_up", gpu="5") == 1
    assert steps[780] == steps[605]   # stalled while the GPU is lost
    assert steps[1500] > steps[900]   # running again after restart
    truth = fleet.truth.jobs["j"]
    assert truth.lost_steps > 0
    assert truth.badput_s["restart"] >= 180
    assert gpu_value(fleet, agent, "flopwatch_gpu_up", gpu="6") == 1
    # the node's replayed steps and their seconds, as the agent's intake counts them: every redone
    # step once per local rank, and the truth's lost-progress seconds once per local rank
    assert gpu_value(fleet, agent, "flopwatch_train_replayed_steps_total", job_id="j") == truth.lost_steps * 8
    assert gpu_value(fleet, agent, "flopwatch_train_replayed_step_seconds_total", job_id="j") == pytest.approx(
        truth.badput_s["lost_progress"] * 8)


def test_nic_faults_raise_the_matching_counters():
    fleet = Fleet(scenario(faults=[{"kind": "slow_nic", "node": 1, "nic": 3, "start": "1m", "duration": "10m"},
                                   {"kind": "nic_link_flap", "node": 2, "nic": 0, "start": "1m", "duration": "10m"}]))
    while fleet.t < 600:
        fleet.advance(5)
    slow, flap, healthy = fleet.nodes[1].nics[3], fleet.nodes[2].nics[0], fleet.nodes[3].nics[0]
    assert slow.symbol_error / (540 / 3600) > 120      # over the IBTA limit per hour
    assert slow.xmit_wait > 0 and slow.rate_bytes_per_s == healthy.rate_bytes_per_s / 2
    assert slow.xmit_bytes < healthy.xmit_bytes
    assert flap.link_downed >= 8 and flap.link_error_recovery >= 16
    assert healthy.link_downed == 0 and healthy.symbol_error < 5


@pytest.mark.parametrize(("kind", "phase"), [("dataloader_stall", "data"), ("host_cpu_contention", "other"),
                                             ("gc_pause", "other")])
def test_host_side_faults_lengthen_non_gpu_phases(kind, phase):
    fleet = Fleet(scenario(faults=[{"kind": kind, "node": 3, "start": "0s", "slowdown": 0.1}]))
    while fleet.t < 300:
        fleet.advance(5)
    seconds = fleet.jobs["j"].counters.phase_seconds[PHASES.index(phase)]
    on_node = seconds[24:32]
    elsewhere = seconds[:24]
    assert on_node.min() > 3 * np.median(elsewhere)
    compute = fleet.jobs["j"].counters.phase_seconds[PHASES.index("compute")]
    assert compute[24:32].mean() == pytest.approx(compute[:24].mean(), rel=0.02)


def test_deterministic_for_a_seed():
    def run(seed):
        fleet = Fleet(scenario(seed=seed, faults=[{"kind": "power_cap", "node": 0, "gpu": 1, "start": "1m"}]))
        while fleet.t < 300:
            fleet.advance(5)
        exposition = SimNodeAgent(fleet, fleet.nodes[0]).render().decode().splitlines()
        # the agent's own timing series are wall-clock measurements, not simulation
        return fleet.truth.as_dict(), [line for line in exposition if "flopwatch_collector_" not in line]

    assert run(9) == run(9)
    assert run(9)[0] != run(10)[0]


def test_truth_names_each_fault_culprit():
    fleet = Fleet(scenario(faults=[{"kind": "hw_slowdown", "node": 2, "gpu": 5, "start": "2m", "duration": "1m"},
                                   {"kind": "slow_nic", "node": 1, "nic": 4, "start": "3m"}]))
    first, second = fleet.truth.as_dict()["faults"]
    assert (first["node"], first["gpu"], first["rank"], first["cause"]) == ("node0002", 5, 21, "hw_slowdown")
    assert (first["start"], first["end"]) == (120, 180)
    assert (second["device"], second["cause"], second["job_id"]) == ("mlx5_4", "nic", "j")


def test_host_cpu_contention_shows_in_host_cpu_series():
    fleet = Fleet(scenario(faults=[{"kind": "host_cpu_contention", "node": 2, "start": "1m"}]))
    agents = {i: SimNodeAgent(fleet, fleet.nodes[i]) for i in (1, 2)}
    before = {i: exposition_values(a) for i, a in agents.items()}
    while fleet.t < 180:
        fleet.advance(5)
    after = {i: exposition_values(a) for i, a in agents.items()}

    def busy_fraction(i):
        key = ("flopwatch_host_cpu_seconds_total", tuple(sorted(
            {"node": f"node000{i}", "numa_node": "0", "mode": "busy"}.items())))
        cpus = after[i][("flopwatch_host_cpus", (("node", f"node000{i}"), ("numa_node", "0")))]
        return (after[i][key] - before[i][key]) / (fleet.t * cpus)

    assert busy_fraction(2) > 0.6
    assert busy_fraction(1) < 0.2

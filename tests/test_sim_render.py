"""The simulator's fast node agents serve the same bytes as the agent's plain GPU collector would.

SimGpuCollector skips the per-GPU reads while every GPU answers; the reference agent reads every GPU
through the real GpuCollector every cycle. Over faults that change GPU series (a thermal straggler,
an XID, NVLink errors, a PCIe downgrade) and a GPU lost and recovered (the real collector's
backoff and read errors), every line of every node's exposition must match, tick after tick, but
the two that time the collectors themselves.
"""

from __future__ import annotations

import pytest

from flopwatch.sim.fleet import Fleet
from flopwatch.sim.node import SimNodeAgent
from flopwatch.sim.scenario import parse

MODEL_8B = {"params": 8e9, "layers": 32, "heads": 32, "head_dim": 128, "seq_len": 8192}
#: The agent's timing of itself differs between any two agents.
TIMING = (b"flopwatch_collector_duration_seconds", b"flopwatch_collector_last_success_timestamp_seconds")


def faulty_fleet() -> Fleet:
    return Fleet(parse({
        "name": "render", "seed": 3, "duration": "30m", "scrape_interval": "5s",
        "fleet": {"nodes": 5, "gpus_per_node": 8, "gpu_model": "H100-SXM", "nics_per_node": 8},
        "jobs": [{"id": "j", "nodes": "0-3", "model": MODEL_8B, "tokens_per_step": 524288, "target_mfu": 0.42,
                  "start": "20s", "checkpoint_every": "2m"}],
        "faults": [{"kind": "thermal_throttle", "node": 0, "gpu": 3, "start": "30s", "duration": "1m"},
                   {"kind": "gpu_lost", "node": 1, "gpu": 6, "start": "40s", "duration": "30s"},
                   {"kind": "nvlink_errors", "node": 2, "gpu": 1, "start": "30s", "duration": "2m"},
                   {"kind": "pcie_downgrade", "node": 3, "gpu": 2, "start": "45s", "duration": "1m"},
                   {"kind": "xid", "node": 3, "gpu": 5, "xid": 48, "start": "1m", "duration": "1m"}],
    }), start_unix=1.7e9)


def comparable(exposition: bytes) -> list[bytes]:
    return [line for line in exposition.split(b"\n") if not line.startswith(TIMING)]


@pytest.mark.parametrize("per_link", [False, True])
def test_fast_node_agents_serve_what_the_plain_collector_serves(per_link: bool) -> None:
    fleet = faulty_fleet()
    fast = [SimNodeAgent(fleet, node, per_link) for node in fleet.nodes]
    plain = [SimNodeAgent(fleet, node, per_link, reference=True) for node in fleet.nodes]
    fast_ticks = 0
    while fleet.t < 200:   # past every fault's start and end, the lost GPU's retries and return
        fleet.advance(5.0)
        for node, mine, theirs in zip(fleet.nodes, fast, plain, strict=True):
            assert comparable(mine.render()) == comparable(theirs.render()), f"{node.name} at t={fleet.t:g}"
        fast_ticks += all(agent.agent.collectors[0].fast for agent in fast)
    # the lost GPU took the real collector's path: up 0 and its read errors, then back
    lost = fast[1].render().decode()
    assert 'flopwatch_gpu_read_errors_total{node="node0001",gpu="6",error="gpu_lost"}' in lost
    assert 'flopwatch_gpu_up{node="node0001",gpu="6"} 1.0' in lost
    assert fast_ticks > 0 if not per_link else fast_ticks == 0


def test_each_ranks_arrival_counter_is_its_data_compute_and_other_phases() -> None:
    from prometheus_client.parser import text_string_to_metric_families

    fleet = faulty_fleet()
    agent = SimNodeAgent(fleet, fleet.nodes[0], False)
    while fleet.t < 90:     # past the thermal straggler's start, so ranks differ
        fleet.advance(5.0)
    phases: dict[tuple[str, str], dict[str, float]] = {}
    arrival: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(agent.render().decode()):
        for sample in family.samples:
            key = (sample.labels.get("job_id", ""), sample.labels.get("rank", ""))
            if sample.name == "flopwatch_train_phase_seconds_total":
                phases.setdefault(key, {})[sample.labels["phase"]] = sample.value
            elif sample.name == "flopwatch_train_arrival_seconds_total":
                arrival[key] = sample.value
    assert len(arrival) == 8 and arrival.keys() == phases.keys()
    for key, value in arrival.items():
        assert value == pytest.approx(phases[key]["data"] + phases[key]["compute"] + phases[key]["other"])
        assert value < sum(phases[key].values())      # comm and optimizer are left out


def test_a_node_with_a_finished_and_a_running_job_shows_each_jobs_step_histogram_once_per_render() -> None:
    """The node's collectors hand the renderer label lists they keep from tick to tick; a second
    job's histogram on the same node must be added beside the first's, never into its kept list
    (which would grow the first job's buckets render after render)."""
    from prometheus_client.parser import text_string_to_metric_families

    fleet = Fleet(parse({
        "name": "two-jobs", "seed": 5, "duration": "20m", "scrape_interval": "5s",
        "fleet": {"nodes": 3, "gpus_per_node": 8, "gpu_model": "H100-SXM", "nics_per_node": 8},
        "jobs": [{"id": "a", "nodes": "0-1", "model": MODEL_8B, "tokens_per_step": 524288, "target_mfu": 0.42,
                  "start": "0s", "end": "2m"},
                 {"id": "b", "nodes": "0-2", "model": MODEL_8B, "tokens_per_step": 524288, "target_mfu": 0.4,
                  "start": "2m"}],
    }), start_unix=1.7e9)
    agent = SimNodeAgent(fleet, fleet.nodes[0])
    both = 0
    while fleet.t < 300:
        fleet.advance(5.0)
        counts: dict[str, int] = {}
        buckets: dict[str, int] = {}
        for family in text_string_to_metric_families(agent.render().decode()):
            for sample in family.samples:
                if sample.name == "flopwatch_train_step_seconds_count":
                    counts[sample.labels["job_id"]] = counts.get(sample.labels["job_id"], 0) + 1
                elif sample.name == "flopwatch_train_step_seconds_bucket":
                    buckets[sample.labels["job_id"]] = buckets.get(sample.labels["job_id"], 0) + 1
        assert all(count == 1 for count in counts.values()), f"t={fleet.t:g}: {counts}"
        assert len(set(buckets.values())) <= 1, f"t={fleet.t:g}: {buckets}"
        both += counts.keys() == {"a", "b"}
    assert both > 10   # the finished job's series linger beside the running one's


def _train_samples(exposition: bytes, prefix: bytes = b"flopwatch_train_") -> list:
    """The samples of the lines that start with `prefix` (parsing a whole node's text is slow)."""
    from prometheus_client.parser import text_string_to_metric_families

    lines = b"\n".join(line for line in exposition.split(b"\n") if line.startswith(prefix))
    return [sample for family in text_string_to_metric_families(lines.decode() + "\n") for sample in family.samples]


def job_sums_and_rank_sums(exposition: bytes) -> tuple[dict, dict]:
    """(job, phase or kind) -> the node's job sum as rendered, and the same keys summed over the
    node's per-rank series."""
    sums: dict[tuple[str, str], float] = {}
    ranks: dict[tuple[str, str], float] = {}
    for sample in _train_samples(exposition):
        labels = sample.labels
        if sample.name == "flopwatch_train_job_phase_seconds_total":
            sums[labels["job_id"], labels["phase"]] = sample.value
        elif sample.name == "flopwatch_train_job_checkpoint_seconds_total":
            sums[labels["job_id"], labels["kind"]] = sample.value
        elif sample.name == "flopwatch_train_phase_seconds_total":
            key = (labels["job_id"], labels["phase"])
            ranks[key] = ranks.get(key, 0.0) + sample.value
        elif sample.name == "flopwatch_train_checkpoint_seconds_total":
            key = (labels["job_id"], labels["kind"])
            ranks[key] = ranks.get(key, 0.0) + sample.value
    return sums, ranks


def test_each_nodes_job_sums_are_its_own_ranks_series_summed_per_job_phase_and_kind() -> None:
    """Job b runs on nodes 0-2 (each node sums its own eight ranks); job a, finished, lingers on
    node 0 beside b and keeps its own sums. The per-rank series stay as they were."""
    from flopwatch.sim.jobs import PHASES

    fleet = Fleet(parse({
        "name": "two-jobs", "seed": 5, "duration": "20m", "scrape_interval": "5s",
        "fleet": {"nodes": 3, "gpus_per_node": 8, "gpu_model": "H100-SXM", "nics_per_node": 8},
        "jobs": [{"id": "a", "nodes": "0-1", "model": MODEL_8B, "tokens_per_step": 524288, "target_mfu": 0.42,
                  "end": "2m", "checkpoint_every": "1m", "checkpoint_seconds": "5s"},
                 {"id": "b", "nodes": "0-2", "model": MODEL_8B, "tokens_per_step": 524288, "target_mfu": 0.4,
                  "start": "2m", "checkpoint_every": "1m", "checkpoint_seconds": "7s"}],
        "faults": [{"kind": "thermal_throttle", "node": 1, "gpu": 3, "start": "2m30s", "duration": "5m"}],
    }), start_unix=1.7e9)
    agents = [SimNodeAgent(fleet, node, gpus=False) for node in fleet.nodes]
    both = 0
    while fleet.t < 300:
        fleet.advance(5.0)
        per_node = []
        for agent in agents:
            sums, ranks = job_sums_and_rank_sums(agent.render())
            assert sums.keys() == ranks.keys(), f"t={fleet.t:g}"
            assert {kind for _, kind in sums} <= {*PHASES, "save"}
            for key, value in sums.items():
                assert value == pytest.approx(ranks[key], rel=1e-12, abs=1e-9), f"{key} at t={fleet.t:g}"
            per_node.append(sums)
        jobs_on_0 = {job for job, _ in per_node[0]}
        assert {job for job, _ in per_node[2]} <= {"b"}
        if jobs_on_0 == {"a", "b"}:
            both += 1
            assert per_node[0]["a", "save"] == 8 * 5.0 and per_node[0]["b", "compute"] > 0
            assert per_node[0]["a", "compute"] != per_node[1]["a", "compute"]   # the nodes' own ranks
    assert both > 10
    # the straggling GPU makes node 1's sum its own: not the job's total split evenly
    assert len({sums["b", "comm"] for sums in per_node}) == 3
    assert per_node[0]["b", "save"] > 0

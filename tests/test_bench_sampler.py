"""The benchmark's fast fleet reader against the agents' own expositions, and the Recorder's
blocks and stale markers. Only the simulator is involved (no GPU, no server)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from flopwatch.catalog import train
from flopwatch.detect.fast_sampler import FastSampler, supported_names
from flopwatch.detect.remote_write import STALE_NAN_BITS
from flopwatch.detect.sampler import ExactSampler, FleetSampler, Recorder, parse_series
from flopwatch.sim.fleet import Fleet
from flopwatch.sim.scenario import load, parse

EVERY_FAULT = Path(__file__).resolve().parents[1] / "flopwatch" / "sim" / "scenarios" / "every-fault.yml"
MODEL = {"params": 8e9, "layers": 32, "heads": 32, "head_dim": 128, "seq_len": 8192}


def as_dict(groups, names):
    out = {}
    for labels, values in groups:
        for series, value in zip(labels, list(values), strict=True):
            if dict(series)["__name__"] in names:
                out[series] = value
    return out


def same(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))


def compare(fleet, nodes, ticks, every):
    names = supported_names()
    fast, exact = FastSampler(fleet, nodes, names), ExactSampler(fleet, nodes)
    checked = 0
    for tick in range(ticks):
        fleet.advance(fleet.scenario.scrape_interval)
        if tick % every:
            continue
        a, b = as_dict(fast.sample(), names), as_dict(exact.sample(), names)
        assert a.keys() == b.keys(), (tick, sorted(a.keys() ^ b.keys())[:5])
        wrong = [(k, a[k], b[k]) for k in a if not same(a[k], b[k])]
        assert not wrong, (tick, wrong[:5])
        checked += len(a)
    return checked


def test_fast_reader_equals_the_agent_exposition_through_every_fault_kind():
    """Every series the fast path produces, value for value, at every other tick while every fault
    kind is on (the GPU-losing kind excepted: the benchmark reads such nodes exactly)."""
    scenario = parse({
        "name": "all-kinds", "seed": 9, "duration": "12m",
        "fleet": {"nodes": 6, "gpus_per_node": 4, "nics_per_node": 2},
        "jobs": [{"id": "j", "nodes": "0-5", "model": MODEL, "tokens_per_step": 262144, "target_mfu": 0.4,
                  "checkpoint_every": "5m", "checkpoint_seconds": "15s"}],
        "faults": [
            {"kind": "thermal_throttle", "node": 0, "gpu": 1, "start": "1m", "duration": "6m"},
            {"kind": "power_cap", "node": 0, "gpu": 2, "start": "2m", "duration": "6m"},
            {"kind": "hw_slowdown", "node": 1, "gpu": 0, "start": "1m", "duration": "6m"},
            {"kind": "pcie_downgrade", "node": 1, "gpu": 3, "start": "3m", "duration": "6m"},
            {"kind": "nvlink_errors", "node": 2, "gpu": 1, "start": "1m", "duration": "6m"},
            {"kind": "xid", "node": 2, "gpu": 2, "xid": 13, "start": "4m", "duration": "1m"},
            {"kind": "slow_nic", "node": 2, "nic": 1, "start": "2m", "duration": "6m"},
            {"kind": "nic_link_flap", "node": 3, "nic": 0, "start": "1m", "duration": "8m"},
            {"kind": "gc_pause", "node": 3, "start": "2m", "duration": "6m"},
            {"kind": "host_cpu_contention", "node": 4, "start": "1m", "duration": "6m"},
            {"kind": "dataloader_stall", "node": 5, "start": "2m", "duration": "6m"},
        ],
    })
    assert compare(Fleet(scenario, 1.7e9), list(range(6)), 144, 2) > 30_000


def test_fast_reader_equals_the_agent_exposition_on_a_fabric_through_its_faults():
    """The fabric info series (the agent's own fabric collector) and the ports of a degrading leaf,
    a slow uplink and a flapping cable, series for series, on a rail-optimised fabric."""
    scenario = parse({
        "name": "fabric", "seed": 2, "duration": "10m", "fleet": {"nodes": 6, "gpus_per_node": 2, "nics_per_node": 2},
        "fabric": {"rail_optimised": True, "nodes_per_leaf": 3, "spines": 2},
        "jobs": [{"id": "j", "nodes": "0-4", "model": MODEL, "tokens_per_step": 131072, "target_mfu": 0.4}],
        "faults": [{"kind": "switch_degrade", "switch": "leaf1-r0", "mode": "errors", "start": "1m", "duration": "4m"},
                   {"kind": "switch_degrade", "switch": "leaf2-r1", "mode": "rate", "start": "1m"},
                   {"kind": "uplink_slow", "switch": "leaf2-r0", "uplink": "spine1", "start": "2m"},
                   {"kind": "cable_flap", "node": 1, "nic": 1, "start": "1m"}],
    })
    names = supported_names()
    assert {"flopwatch_fabric_link_info", "flopwatch_fabric_switch_info"} <= names
    fleet = Fleet(scenario, 1.7e9)
    assert compare(fleet, list(range(6)), 96, 3) > 5_000
    links = [dict(k) for k in as_dict(FastSampler(fleet, [4], names).sample(), names)
             if dict(k)["__name__"] == "flopwatch_fabric_link_info"]
    assert sorted((x["device"], x["switch"], x["rail"]) for x in links) == [("mlx5_0", "leaf2-r0", "0"),
                                                                            ("mlx5_1", "leaf2-r1", "1")]


def test_fast_reader_follows_jobs_starting_ending_and_expiring():
    scenario = parse({
        "name": "churn", "seed": 4, "duration": "14m", "fleet": {"nodes": 3, "gpus_per_node": 4, "nics_per_node": 2},
        "jobs": [{"id": "a", "nodes": "0-1", "end": "6m", "model": MODEL, "tokens_per_step": 131072,
                  "target_mfu": 0.4, "checkpoint_every": "2m", "checkpoint_seconds": "10s"},
                 {"id": "b", "nodes": "1-2", "start": "8m", "model": MODEL, "tokens_per_step": 131072,
                  "target_mfu": 0.4}],
    })
    assert compare(Fleet(scenario, 1.7e9), [0, 1, 2], 168, 2) > 5_000


def test_fleet_sampler_reads_everything_exactly_when_the_rules_need_an_unsupported_series():
    scenario = load(EVERY_FAULT)
    fleet = Fleet(scenario, 1.7e9)
    assert FleetSampler(fleet, {"flopwatch_gpu_up"}, [4]).exact_nodes == [4]
    every = FleetSampler(fleet, {"flopwatch_collector_duration_seconds"}, [])
    assert every.exact_nodes == list(range(scenario.fleet.nodes))


def test_parse_series_adds_the_scrape_labels_and_unescapes():
    labels = parse_series('flopwatch_x{node="n1",gpu="0",reason="a\\"b"}', "n1")
    assert labels == (("__name__", "flopwatch_x"), ("gpu", "0"), ("instance", "n1"), ("job", "flopwatch"),
                      ("node", "n1"), ("reason", 'a"b'))


def bits(value: float) -> int:
    import struct

    return struct.unpack("<Q", struct.pack("<d", value))[0]


def test_recorder_blocks_carry_stale_markers_where_series_end_across_flushes():
    a = (("__name__", "m"), ("k", "a"))
    b = (("__name__", "m"), ("k", "b"))
    both, only_a = (a, b), (a,)
    recorder = Recorder(keep=lambda labels: True)
    recorder.add(1000, [(both, [1.0, 2.0])])
    recorder.add(2000, [(only_a, [3.0])])
    first = recorder.flush()
    assert first.labels == [a, b]
    assert first.present.tolist() == [[True, True], [True, True]]
    assert bits(first.values[1, 1]) == STALE_NAN_BITS
    recorder.add(3000, [])
    second = recorder.flush()
    assert second.labels == [a] and bits(second.values[0, 0]) == STALE_NAN_BITS
    recorder.add(4000, [(both, [5.0, 6.0])])
    third = recorder.flush()
    assert third.values.tolist() == [[5.0], [6.0]] and third.timestamps_ms.tolist() == [4000]


def test_recorder_keeps_only_selected_series():
    keep = (("__name__", "m"), ("k", "a"))
    drop = (("__name__", "m"), ("k", "b"))
    recorder = Recorder(keep=lambda labels: dict(labels)["k"] == "a")
    recorder.add(1000, [((keep, drop), [1.0, 2.0])])
    block = recorder.flush()
    assert block.labels == [keep] and block.values.tolist() == [[1.0]]


def test_fast_reader_equals_the_agents_for_a_pipeline_job_and_a_trace_job():
    """Stage and dp_rank labels, the comm floor gauge, and a trace job whose last node is half used."""
    from flopwatch.traces import whatif

    jobs = [{"id": "p", "nodes": "0-3", "model": MODEL, "tokens_per_step": 262144, "target_mfu": 0.4,
             "pipeline": {"stages": 4, "stage_weights": [1, 1, 1, 1.3], "micro_batches": 8},
             "sequence_imbalance": 0.2}]
    jobs.append({"id": "st", "nodes": "4-5", "trace": str(whatif.shipped("ST")), "loop": True, "time_scale": 0.5})
    scenario = parse({"name": "pipes", "seed": 2, "duration": "10m",
                      "fleet": {"nodes": 6, "gpus_per_node": 4, "nics_per_node": 2}, "jobs": jobs,
                      "faults": [{"kind": "thermal_throttle", "node": 1, "gpu": 1, "start": "1m", "duration": "5m"}]})
    fleet = Fleet(scenario, 1.7e9)
    assert compare(fleet, list(range(6)), 96, 3) > 5_000
    names = {"flopwatch_train_comm_min_seconds", "flopwatch_train_steps_total"}
    series = [dict(k) | {"value": v} for k, v in as_dict(FastSampler(fleet, [0, 3, 5], names).sample(),
                                                         names).items()]
    floors = [x for x in series if x["__name__"] == "flopwatch_train_comm_min_seconds"]
    assert floors and all(x["value"] > 0 for x in floors)   # a floor once a block of 16 steps completed
    ranks = {(x["job_id"], x["rank"]): x for x in series if x["__name__"] == "flopwatch_train_steps_total"}
    assert (ranks["p", "15"]["stage"], ranks["p", "15"]["dp_rank"]) == ("3", "3")   # 4 a stage, Megatron order
    assert (ranks["p", "1"]["stage"], ranks["p", "1"]["dp_rank"]) == ("0", "1")
    if len(jobs) == 2:   # ST: 8 workers on the 4-GPU nodes 4 and 5; worker 7 is dp 1 of stage 3
        assert (ranks["st", "7"]["stage"], ranks["st", "7"]["dp_rank"]) == ("3", "1")


def test_fast_reader_sums_each_nodes_ranks_of_a_job_as_the_agents_do_a_partly_used_node_included():
    """The per node and job phase and checkpoint sums, against the agents' and against the node's own
    per-rank series: 8 trace workers on 3-GPU nodes leave the last node two ranks."""
    from flopwatch.traces import whatif

    scenario = parse({"name": "sums", "seed": 2, "duration": "10m",
                      "fleet": {"nodes": 4, "gpus_per_node": 3, "nics_per_node": 1},
                      "jobs": [{"id": "st", "nodes": "0-2", "trace": str(whatif.shipped("ST")), "loop": True,
                                "time_scale": 0.5},
                               {"id": "j", "nodes": "3", "model": MODEL, "tokens_per_step": 131072,
                                "target_mfu": 0.4, "checkpoint_every": "1m", "checkpoint_seconds": "5s"}]})
    fleet = Fleet(scenario, 1.7e9)
    assert compare(fleet, [0, 2, 3], 48, 3) > 2_000   # node 1 left out: placed nodes need not be consecutive
    names = {metric.name for metric in (train.JOB_PHASE_SECONDS, train.JOB_CHECKPOINT_SECONDS, train.PHASE_SECONDS,
                              train.CHECKPOINT_SECONDS)}
    assert names <= supported_names()
    sums: dict[tuple[str, str, str], float] = {}
    ranks: dict[tuple[str, str, str], list[float]] = {}
    for labels, value in as_dict(FastSampler(fleet, [0, 2, 3], names).sample(), names).items():
        x = dict(labels)
        key = (x["node"], x["job_id"], x.get("phase", x.get("kind", "")))
        if "rank" in x:
            ranks.setdefault(key, []).append(value)
        else:
            sums[key] = value
    assert sums.keys() == ranks.keys() and len(sums) == 3 * 6
    assert {node for node, *_ in sums} == {"node0000", "node0002", "node0003"}
    assert len(ranks["node0002", "st", "compute"]) == 2 and len(ranks["node0000", "st", "compute"]) == 3
    for key, value in sums.items():
        assert value == pytest.approx(sum(ranks[key]), rel=1e-12, abs=1e-9), key
    assert sums["node0003", "j", "save"] == 3 * fleet.jobs["j"].counters.checkpoint_seconds[0] > 0   # 3 ranks

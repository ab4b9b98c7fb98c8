"""The simulator's fabric: the scenario's `fabric:` key and what switch, uplink and cable faults do
to ports, jobs and the truth. Only the simulator (no server)."""

from __future__ import annotations

import numpy as np
import pytest

from flopwatch.sim.fleet import Fleet
from flopwatch.sim.scenario import ScenarioError, parse

MODEL = {"params": 8e9, "layers": 32, "heads": 32, "head_dim": 128, "seq_len": 8192}


def scenario(faults=(), fabric=None, jobs=None):
    """8 nodes of 4 GPUs and 2 NICs; groups of 4 nodes (leaf1-r0/r1 over nodes 0-3, leaf2-r* over 4-7),
    two spines. Job `span` runs on nodes 0-5 (both groups), `inside` on 6-7 (group 2 only)."""
    return parse({
        "name": "fabric", "seed": 5, "duration": "20m",
        "fleet": {"nodes": 8, "gpus_per_node": 4, "nics_per_node": 2},
        "fabric": fabric or {"rail_optimised": True, "nodes_per_leaf": 4, "spines": 2},
        "jobs": jobs or [{"id": job, "nodes": nodes, "model": MODEL, "tokens_per_step": 262144, "target_mfu": 0.4,
                          "checkpoint_every": 0}
                         for job, nodes in (("span", "0-5"), ("inside", "6-7"))],
        "faults": list(faults),
    })


def run(fleet: Fleet, until: float) -> None:
    while fleet.t < until:
        fleet.advance(5)


def comm_floor(fleet: Fleet, job: str) -> float:
    """The step's collective itself: the least comm of any rank (the last to arrive waits for none)."""
    return float(fleet.jobs[job].last_step.phases["comm"].min())


def test_a_degrading_leaf_errors_every_port_beneath_it_and_slows_its_jobs_by_their_comm_share():
    fleet = Fleet(scenario([{"kind": "switch_degrade", "switch": "leaf2-r1", "mode": "errors", "start": "2m",
                             "duration": "10m", "slowdown": 0.6}]))
    run(fleet, 110)
    healthy = {job: comm_floor(fleet, job) for job in ("span", "inside")}
    before = {(n.index, nic.index): nic.symbol_error for n in fleet.nodes for nic in n.nics}
    run(fleet, 600)
    for job in ("span", "inside"):   # both have ranks under leaf2-r1 (nodes 4-5 and 6-7)
        exposed = fleet.jobs[job].runner.comm_exposed
        assert healthy[job] == pytest.approx(exposed)
        assert comm_floor(fleet, job) == pytest.approx(exposed * 1.6)
    per_hour = {k: (nic.symbol_error - before[k]) / (490 / 3600)
                for k, nic in ((k, fleet.nodes[k[0]].nics[k[1]]) for k in before)}
    under = {(n, 1) for n in range(4, 8)}
    assert all(per_hour[k] > 500 for k in under)                       # IBTA allows 120 an hour
    assert all(per_hour[k] < 60 for k in per_hour if k not in under)   # rail 0 and group 1 stay healthy
    assert all(fleet.nodes[n].nics[1].link_error_recovery > 0 for n in range(4, 8))


def test_rate_and_flap_modes_halve_the_rate_or_flap_every_port_of_the_leaf():
    fleet = Fleet(scenario([{"kind": "switch_degrade", "switch": "leaf1-r0", "mode": "rate", "start": "1m"},
                            {"kind": "switch_degrade", "switch": "leaf2-r0", "mode": "flap", "start": "1m"}]))
    run(fleet, 600)
    rate = [fleet.nodes[n].nics[0] for n in range(4)]
    flap = [fleet.nodes[n].nics[0] for n in range(4, 8)]
    other = fleet.nodes[0].nics[1]
    assert all(nic.rate_bytes_per_s == other.rate_bytes_per_s / 2 for nic in rate)
    assert all(nic.xmit_wait > 10 * other.xmit_wait > 0 for nic in rate)
    assert all(nic.link_downed >= 8 for nic in flap) and other.link_downed == 0


def test_a_flapping_leaf_downs_every_link_as_it_starts_then_once_a_minute():
    fleet = Fleet(scenario([{"kind": "switch_degrade", "switch": "leaf2-r0", "mode": "flap", "start": "1m"}]))
    run(fleet, 65)      # the first tick of the fault
    assert [fleet.nodes[n].nics[0].link_downed for n in range(4, 8)] == [1, 1, 1, 1]
    run(fleet, 115)     # no second flap within its first minute
    assert [fleet.nodes[n].nics[0].link_downed for n in range(4, 8)] == [1, 1, 1, 1]
    run(fleet, 190)
    assert [fleet.nodes[n].nics[0].link_downed for n in range(4, 8)] == [3, 3, 3, 3]
    assert fleet.nodes[0].nics[0].link_downed == 0


def test_a_degrading_spine_of_one_rail_slows_jobs_crossing_it_and_names_the_spine():
    """With a spine plane per rail (spine1-r0 over leaf1-r0 and leaf2-r0), a slow spine slows every
    job crossing it (span, on both groups), the rail-0 ports span uses wait, and neither the job
    inside group 2 nor rail 1 sees anything."""
    fabric = {"rail_optimised": True, "nodes_per_leaf": 4, "spines": 1, "rail_spines": True}
    fleet = Fleet(scenario([{"kind": "spine_degrade", "switch": "spine1-r0", "start": "2m", "slowdown": 0.5}],
                           fabric=fabric))
    [truth] = fleet.truth.as_dict()["faults"]
    assert (truth["switch"], truth["level"], truth["cause"], truth["leaves"], truth["jobs"]) == \
        ("spine1-r0", "spine", "congestion", ["leaf1-r0", "leaf2-r0"], ["span"])
    assert truth["ports"] == [[f"node{n:04d}", "mlx5_0"] for n in range(8)]
    run(fleet, 300)
    assert comm_floor(fleet, "span") == pytest.approx(fleet.jobs["span"].runner.comm_exposed * 1.5)
    assert comm_floor(fleet, "inside") == pytest.approx(fleet.jobs["inside"].runner.comm_exposed)
    # span's rail-0 ports under group 1 (2 of 5 peers beyond) and group 2 (4 of 5 beyond) wait
    assert [fleet.nodes[n].nics[0].faults.congestion for n in (0, 4)] == pytest.approx([0.5 * 2 / 5, 0.5 * 4 / 5])
    assert all(fleet.nodes[n].nics[1].faults.congestion == 0 for n in range(8))
    assert all(fleet.nodes[n].nics[0].faults.congestion == 0 for n in (6, 7))


def test_a_slow_uplink_slows_jobs_crossing_it_and_spares_jobs_inside_the_leaf():
    fleet = Fleet(scenario([{"kind": "uplink_slow", "switch": "leaf2-r0", "uplink": "spine1", "start": "2m",
                             "duration": "15m", "slowdown": 0.5}]))
    run(fleet, 120)
    waits = {(n.index, nic.index): nic.xmit_wait for n in fleet.nodes for nic in n.nics}
    run(fleet, 600)
    span, inside = fleet.jobs["span"].runner, fleet.jobs["inside"].runner
    assert comm_floor(fleet, "span") == pytest.approx(span.comm_exposed * 1.5)
    assert comm_floor(fleet, "inside") == pytest.approx(inside.comm_exposed)
    rate = {k: (fleet.nodes[k[0]].nics[k[1]].xmit_wait - w) / 480 for k, w in waits.items()}
    # span's nodes 4-5 on rail 0: 4 of their 5 peers lie beyond leaf2-r0 -> waits 0.5 x 4/5 of the time
    for node in (4, 5):
        assert rate[(node, 0)] == pytest.approx(2e7 * (0.5 * 0.8 + 0.01 * _load(fleet, node, 0)), rel=1e-4)
    background = [rate[k] for k in rate if k not in {(4, 0), (5, 0)}]
    assert max(background) < 2e7 * 0.01 + 1 and min(rate[(6, 0)], rate[(7, 0)]) > 0   # busy ports wait a little


def _load(fleet: Fleet, node: int, nic: int) -> float:
    port = fleet.nodes[node].nics[nic]
    return min(1.0, port.bytes_per_s / port.rate_bytes_per_s)


def test_the_truth_names_the_switch_the_uplink_and_the_cable():
    fleet = Fleet(scenario([
        {"kind": "switch_degrade", "switch": "leaf1-r1", "mode": "flap", "start": "1m"},
        {"kind": "uplink_slow", "switch": "leaf2-r0", "uplink": "spine2", "start": "2m"},
        {"kind": "cable_flap", "node": 6, "nic": 1, "start": "3m", "duration": "2m"},
    ]))
    switch, uplink, cable = fleet.truth.as_dict()["faults"]
    assert (switch["switch"], switch["level"], switch["cause"], switch["node"]) == ("leaf1-r1", "leaf", "flap", None)
    assert switch["ports"] == [[f"node{n:04d}", "mlx5_1"] for n in range(4)] and switch["jobs"] == ["span"]
    assert (uplink["switch"], uplink["uplink"], uplink["cause"], uplink["jobs"]) == \
        ("leaf2-r0", "spine2", "congestion", ["span"])
    assert (cable["node"], cable["device"], cable["switch"], cable["cause"]) == ("node0006", "mlx5_1", "leaf2-r1",
                                                                                 "nic")
    run(fleet, 300)
    assert fleet.nodes[6].nics[1].link_downed >= 1 and fleet.nodes[7].nics[1].link_downed == 0


def test_a_job_inside_one_leaf_group_is_untouched_by_every_uplink_of_it():
    fleet = Fleet(scenario([{"kind": "uplink_slow", "switch": f"leaf2-r{r}", "uplink": f"spine{s}", "start": "0s"}
                            for r in (0, 1) for s in (1, 2)],
                           jobs=[{"id": "inside", "nodes": "4-7", "model": MODEL, "tokens_per_step": 262144,
                                  "target_mfu": 0.4}]))
    run(fleet, 120)
    assert comm_floor(fleet, "inside") == pytest.approx(fleet.jobs["inside"].runner.comm_exposed)
    assert np.all([nic.faults.congestion == 0 for n in fleet.nodes for nic in n.nics])


@pytest.mark.parametrize(("fault", "fabric", "message"), [
    ({"kind": "switch_degrade", "switch": "leaf9-r0", "start": "1m"}, None,
     r"faults\[0\]\.switch: 'leaf9-r0' is no leaf switch of the fabric \(leaves: leaf1-r0, leaf1-r1"),
    ({"kind": "switch_degrade", "switch": "spine1", "start": "1m"}, None, "is no leaf switch"),
    ({"kind": "spine_degrade", "switch": "leaf1-r0", "start": "1m"}, None,
     r"faults\[0\]\.switch: 'leaf1-r0' is no spine switch of the fabric \(spines: spine1, spine2\)"),
    ({"kind": "spine_degrade", "switch": "spine1", "uplink": "core", "start": "1m"}, None,
     r"faults\[0\]\.uplink: unknown field"),
    ({"kind": "switch_degrade", "switch": "leaf1-r0", "mode": "melt", "start": "1m"}, None,
     r"faults\[0\]\.mode: expected one of errors, rate, flap"),
    ({"kind": "uplink_slow", "switch": "leaf1-r0", "uplink": "spine7", "start": "1m"}, None,
     r"faults\[0\]\.uplink: leaf1-r0 has no uplink to 'spine7' \(it has: spine1, spine2\)"),
    ({"kind": "uplink_slow", "switch": "leaf1-r0", "node": 3, "start": "1m"}, None,
     r"faults\[0\]\.node: unknown field"),
    ({"kind": "cable_flap", "node": 8, "nic": 0, "start": "1m"}, None, "node 8 is out of range"),
    ({"kind": "switch_degrade", "switch": "leaf1-r0", "start": "1m"}, {"rail_optimised": True, "rails": "r.yml"},
     "fabric.rails: a rail_optimised fabric is generated"),
    ({"kind": "switch_degrade", "switch": "leaf1-r0", "start": "1m"}, {"spines": 2},
     "fabric: expected `rail_optimised: true` or `topology:`"),
])
def test_fabric_faults_and_fabrics_that_are_wrong_are_one_line_errors(fault, fabric, message):
    with pytest.raises(ScenarioError, match=message):
        scenario([fault], fabric)


def test_fabric_faults_need_a_fabric():
    data = {"name": "x", "duration": "10m", "fleet": {"nodes": 2},
            "faults": [{"kind": "cable_flap", "node": 0, "nic": 0, "start": "1m"}]}
    with pytest.raises(ScenarioError, match=r"faults\[0\]: a cable_flap fault needs the scenario's `fabric:`"):
        parse(data)


def test_a_fabric_from_a_slurm_topology_conf_and_a_rails_file(tmp_path):
    (tmp_path / "topology.conf").write_text(
        "# two leaves under one spine\nSwitchName=leaf1 Nodes=node[0000-0003]\n"
        "SwitchName=leaf2 Nodes=node[0004-0007]\nSwitchName=spine Switches=leaf[1-2]\n")
    (tmp_path / "s.yml").write_text("")
    base = {"name": "conf", "duration": "10m", "fleet": {"nodes": 8, "gpus_per_node": 4, "nics_per_node": 2},
            "fabric": {"topology": "topology.conf"},
            "jobs": [{"id": "j", "nodes": "0-7", "model": MODEL, "tokens_per_step": 262144, "target_mfu": 0.4}],
            "faults": [{"kind": "uplink_slow", "switch": "leaf2", "uplink": "spine", "start": "1m"},
                       {"kind": "cable_flap", "node": 1, "nic": 1, "start": "5m"}]}
    sc = parse(base, str(tmp_path / "s.yml"))
    assert sc.fabric.uplinks("leaf2") == ("spine",) and sc.faults[1].switch == "leaf1"
    fleet = Fleet(sc)
    run(fleet, 120)
    assert comm_floor(fleet, "j") == pytest.approx(fleet.jobs["j"].runner.comm_exposed * 1.5)
    assert [nic.faults.congestion > 0 for nic in fleet.nodes[4].nics] == [True, True]   # no rails: every NIC
    (tmp_path / "bad.conf").write_text("SwitchName=leaf1 Nodes=node[0000-0009]\n")
    with pytest.raises(ScenarioError, match=r"fabric: .*bad\.conf:1"):
        parse({**base, "fabric": {"topology": "bad.conf"}, "faults": []}, str(tmp_path / "s.yml"))

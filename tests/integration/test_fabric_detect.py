"""The shipped fabric detection scenarios through the shipped rules, scored as `flopwatch bench
detect` scores them, with the figures the fabric work is held to: every switch, uplink, spine and
cable fault named by the right switch or link within 60 s, at most one page per switch fault
(Alertmanager's routing and inhibitions from alerts/alertmanager.yml, replayed by pages.py),
a degrading leaf named by its own cause (a flapping leaf reads `flap`, not `errors`), the per-NIC
faults still named at their port, and no switch alert outside a fault (the healthy stretches of
the fault scenarios and a healthy fabric fleet).

Real Prometheus (the detection engine: remote write, range queries over alerts/); the GPUs, NICs
and switches are simulated. To fit CI, the scenarios run with one GPU per node instead of eight,
and end 3 minutes after their last fault (the healthy fleet after 45 minutes): the fabric, its
ports, the jobs' layout across leaves and the faults are the files' own. A lone GPU has its
node's eight NICs to itself, so its collectives take an eighth of the time; each job's tokens per
step are cut by 8 x 8, so that communication keeps about its share of the step (what a fabric
fault slows: the spanning job runs 6-8% slower under the slow uplink or spine, against 9.5% with
eight GPUs).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from flopwatch import yamlfile
from flopwatch.detect.detect import run_scenario
from flopwatch.detect.fabric_scoring import FABRIC_KINDS, FABRIC_LATENCY_TARGET_S, SWITCH_KINDS
from flopwatch.detect.pages import AlertmanagerConfig
from flopwatch.detect.scoring import ScenarioScore
from flopwatch.sim.scenario import parse

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = ROOT / "flopwatch" / "detect" / "scenarios"
FAULT_SCENARIOS = ("fabric-512gpu-rail", "fabric-uplink-128gpu", "fabric-spine-128gpu")
HEALTHY_MINUTES = 45
PER_NIC_KINDS = {"slow_nic", "nic_link_flap"}


def shrunk(name: str) -> dict[str, Any]:
    """The shipped scenario with one GPU per node, each job's tokens per step cut by the square of
    its GPUs per node (compute shrinks as much as communication does), ending 3 minutes after its
    last fault."""
    data = yamlfile.load(SCENARIOS / f"{name}.yml", "scenario file")
    gpus = data["fleet"]["gpus_per_node"]
    data["fleet"]["gpus_per_node"] = 1
    for job in data["jobs"]:
        job["tokens_per_step"] = job["tokens_per_step"] // gpus**2
    ends = [_minutes(f["start"]) + _minutes(f.get("duration", "0m")) for f in data.get("faults", [])]
    data["duration"] = f"{max(ends) + 3}m" if ends else f"{HEALTHY_MINUTES}m"
    return data


def _minutes(text: str) -> int:
    assert text.endswith("m"), text   # the shipped fabric scenarios write whole minutes
    return int(text[:-1])


def run(name: str) -> ScenarioScore:
    config = AlertmanagerConfig.load(ROOT / "alerts" / "alertmanager.yml")
    path = SCENARIOS / f"{name}.yml"
    score, _ = run_scenario(parse(shrunk(name), str(path)), ROOT / "alerts", alertmanager=config)
    return score


def false_switch_alerts(score: ScenarioScore) -> list[tuple[str, dict[str, str], float]]:
    """Alerts located at a switch (no node) that no fault explains."""
    return [(e.alertname, e.labels, e.fired_at) for e in score.episodes
            if not e.true and "switch" in e.labels and "node" not in e.labels]


@pytest.fixture(scope="module")
def scores() -> dict[str, ScenarioScore]:
    return {name: run(name) for name in FAULT_SCENARIOS}


def test_every_fabric_fault_is_named_within_a_minute_with_one_page(scores) -> None:
    fabric = [(name, f) for name, s in scores.items() for f in s.faults if f.kind in FABRIC_KINDS]
    assert {f.kind for _, f in fabric} == FABRIC_KINDS  # a leaf, an uplink, a spine and a cable
    for name, fault in fabric:
        where = f"{name}: {fault.kind} {fault.target}"
        assert fault.detected and fault.latency is not None, f"{where}: not named"
        assert fault.latency <= FABRIC_LATENCY_TARGET_S, f"{where}: named after {fault.latency:.0f} s"
        if fault.kind in SWITCH_KINDS:
            assert fault.pages == 1, f"{where}: {fault.pages} pages"


def test_a_degrading_leaf_is_named_by_its_own_cause(scores) -> None:
    leaves = [f for f in scores["fabric-512gpu-rail"].faults if f.kind == "switch_degrade"]
    assert sorted(f.cause for f in leaves) == ["errors", "flap", "rate"]
    for fault in leaves:
        assert fault.cause_right, f"{fault.target} ({fault.cause}) read as {fault.causes}"


def test_per_nic_faults_still_name_their_port(scores) -> None:
    nics = [f for f in scores["fabric-512gpu-rail"].faults if f.kind in PER_NIC_KINDS]
    assert len(nics) == 2
    assert all(f.detected for f in nics), [(f.kind, f.target, f.detected_by) for f in nics]


def test_no_switch_alert_outside_a_fault(scores) -> None:
    for name, score in scores.items():
        assert score.healthy_gpu_hours > 0
        assert false_switch_alerts(score) == [], name
        assert score.false_pages == 0, name


def test_a_healthy_fabric_fleet_raises_no_switch_alert() -> None:
    score = run("healthy-noise")
    assert score.fabric and score.healthy_gpu_hours >= 32 * HEALTHY_MINUTES / 60
    switch_alerts = [e for e in score.episodes if "switch" in e.labels and "node" not in e.labels]
    assert switch_alerts == []

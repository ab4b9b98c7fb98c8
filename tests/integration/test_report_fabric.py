"""The report's lemon switches and cables against a simulated rail-optimised fleet: a leaf degrading
with errors under 6 nodes and one flapping cable elsewhere.

The shipped fabric rules run over the simulated samples in the detection benchmark's engine (a real
Prometheus evaluates them); the raw series and the switches' shared-fault record are remote-written
into the Prometheus the report reads, as a live one would hold them. The report must list the
degraded leaf first among the lemon switches (with its cause and its nodes) and the flapping cable
with both ends, and leave the healthy leaves out.
"""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from flopwatch import resources
from flopwatch.catalog import fabric, nic
from flopwatch.detect import remote_write
from flopwatch.detect import rules as bench_rules
from flopwatch.detect.engine import START_UNIX, PrometheusEngine, exact_nodes_for
from flopwatch.detect.sampler import FleetSampler, Recorder
from flopwatch.report.fabric import SHARED_FAULT
from flopwatch.sim.fleet import Fleet
from flopwatch.sim.scenario import parse
from flopwatch.stack import Prometheus
from tests.integration.test_report_step_time import write_rule_results
from tests.integration.test_report_week import LLAMA_8B, report_series
from tests.integration.test_report_windows import report

pytestmark = pytest.mark.integration

SCENARIO = {
    "name": "report-fabric", "seed": 11, "duration": "25m", "scrape_interval": "5s",
    "fleet": {"nodes": 12, "gpus_per_node": 8, "gpu_model": "H100-SXM", "nics_per_node": 2},
    "fabric": {"rail_optimised": True, "nodes_per_leaf": 6, "spines": 1},
    "jobs": [{"id": "llm", "nodes": "0-11", "user": "alice", "tokens_per_step": 1048576, "target_mfu": 0.4,
              "model": LLAMA_8B, "step_jitter": 0.02}],
    "faults": [
        {"kind": "switch_degrade", "switch": "leaf2-r1", "mode": "errors", "start": "8m", "duration": "10m"},
        {"kind": "cable_flap", "node": 1, "nic": 0, "start": "10m", "duration": "4m"},
    ],
}


def load(fleet: Fleet, url: str, ticks: int) -> None:
    """Remote-write what scrapes of the fleet would store: the report's series and the topology."""
    names = report_series() | {fabric.LINK_INFO.name, fabric.SWITCH_INFO.name, nic.ERRORS.name,
                               nic.LINK_DOWNED.name}
    sampler = FleetSampler(fleet, names, exact_nodes_for(fleet.scenario))
    recorder = Recorder(lambda labels: dict(labels)["__name__"] in names)
    for tick in range(ticks):
        fleet.advance(fleet.scenario.scrape_interval)
        recorder.add(round(fleet.now_unix * 1000), sampler.sample())
        if recorder.pending_ticks >= 100 or tick == ticks - 1:
            block = recorder.flush()
            if block is not None:
                remote_write.post(url + "/api/v1/write", remote_write.encode_request(
                    block.label_bytes, block.values, block.present, block.timestamps_ms))


@pytest.fixture(scope="module")
def out(tmp_path_factory) -> Path:
    scenario = parse(SCENARIO)
    shipped = bench_rules.load(resources.folder("alerts"), 15.0)
    records = bench_rules.RuleSet(shipped.recording, shipped.files)
    result = PrometheusEngine(records, observe=(SHARED_FAULT,)).run(scenario)
    with Prometheus(remote_write_receiver=True, out_of_order_window="1d",
                    extra_args=["--storage.tsdb.retention.time=10y"]) as prom:
        load(Fleet(scenario, start_unix=START_UNIX), prom.url, round(scenario.duration / scenario.scrape_interval))
        write_rule_results(prom.url, result, 15.0)
        return report(prom.url, START_UNIX, START_UNIX + scenario.duration, tmp_path_factory.mktemp("report"))


def table(path: Path) -> list[dict[str, str]]:
    with path.open() as handle:
        return list(csv.DictReader(handle))


def test_the_degraded_leaf_is_the_first_lemon_switch_and_no_healthy_leaf_is_one(out: Path) -> None:
    switches = table(out / "lemon_switches.csv")
    assert switches, "no lemon switch listed"
    first = switches[0]
    assert (first["switch"], first["level"], first["cause"], first["occasions"]) == ("leaf2-r1", "leaf", "errors", "1")
    assert first["nodes"] == ", ".join(f"node{i:04d}" for i in range(6, 12))
    assert 8 * 60 <= float(first["degraded"]) <= 13 * 60   # 10 minutes, and the 2-minute rates after
    assert int(first["errors"]) > 6 * 0.3 * 8 * 60 * 0.8   # 6 ports at ~0.3/s for the 10 minutes, nearly
    assert {row["switch"] for row in switches} == {"leaf2-r1"}   # the cable's leaf: one node, no lemon


def test_the_flapping_cable_is_listed_with_both_ends(out: Path) -> None:
    cables = table(out / "lemon_cables.csv")
    flapping = [row for row in cables if int(row["flaps"]) > 0]
    assert [(row["node"], row["port"], row["switch"]) for row in flapping] == [
        ("node0001", "mlx5_0/1", "leaf1-r0 (leaf)")]
    assert int(flapping[0]["flaps"]) >= 3
    erroring = {(row["node"], row["switch"]) for row in cables if int(row["flaps"]) == 0}
    assert erroring == {(f"node{i:04d}", "leaf2-r1 (leaf)") for i in range(6, 12)}   # background errors are no lemon

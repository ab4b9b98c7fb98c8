"""Scenario files: the DESIGN.md format parses; every error is one line naming the field; CLI exit 2."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from flopwatch.sim.scenario import FAULT_KINDS, ScenarioError, load, parse, parse_duration
from flopwatch.sim.scenarios import shipped

BASE = {
    "name": "t", "seed": 1, "duration": "20m", "scrape_interval": "5s",
    "fleet": {"nodes": 4, "gpus_per_node": 8, "gpu_model": "H100-SXM", "nics_per_node": 8},
    "jobs": [{"id": "j", "nodes": "0-3", "tokens_per_step": 1e6, "target_mfu": 0.4,
              "model": {"params": 8e9, "layers": 32, "heads": 32, "head_dim": 128, "seq_len": 4096}}],
    "faults": [{"kind": "thermal_throttle", "node": 1, "gpu": 3, "start": "5m", "duration": "10m",
                "slowdown": 0.08}],
}


def with_change(path: str, value):
    data = yaml.safe_load(yaml.safe_dump(BASE))
    target = data
    keys = path.split(".")
    for key in keys[:-1]:
        target = target[int(key)] if key.isdigit() else target[key]
    last = keys[-1]
    if value is ...:
        del target[last]
    else:
        target[int(last) if last.isdigit() else last] = value
    return data


def test_design_example_parses():
    scenario = parse(BASE)
    assert scenario.duration == 1200 and scenario.scrape_interval == 5
    assert scenario.jobs[0].nodes == [0, 1, 2, 3]
    fault = scenario.faults[0]
    assert (fault.start, fault.end, fault.cause, fault.target) == (300, 900, "thermal", "gpu")


@pytest.mark.parametrize(("text", "seconds"), [("30s", 30), ("5m", 300), ("2h", 7200), ("7d", 604800),
                                               (90, 90), ("1m30s", 90), ("250ms", 0.25), ("90", 90)])
def test_durations(text, seconds):
    assert parse_duration(text, "x") == seconds


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        ("faults.0.kind", "meteor_strike", "faults[0].kind: unknown fault kind 'meteor_strike'"),
        ("faults.0.node", 4, "faults[0].node: node 4 is out of range (the fleet has nodes 0-3)"),
        ("faults.0.gpu", 8, "faults[0].gpu: GPU 8 is out of range"),
        ("faults.0.start", "soon", "faults[0].start: expected a duration"),
        ("faults.0.start", "25m", "faults[0].start: the fault would start after the scenario ends"),
        ("duration", "-5m", "duration: a duration cannot be negative"),
        ("duration", "forever", "duration: expected a duration like 30s"),
        ("jobs.0.nodes", "0-9", "jobs[0].nodes: node 9 is out of range"),
        ("jobs.0.nodes", "3-1", "jobs[0].nodes: range '3-1' runs backwards"),
        ("jobs.0.target_mfu", 1.5, "jobs[0].target_mfu: expected a number from 0.01 to 0.9"),
        ("jobs.0.model.params", ..., "jobs[0].model.params: required field is missing"),
        ("jobs.0.colour", "red", "jobs[0].colour: unknown field"),
        ("fleet.gpu_model", "Z9000", "fleet.gpu_model: unknown GPU model 'Z9000'"),
        ("fleet.nodes", 2.5, "fleet.nodes: expected a whole number"),
        ("scrape_interval", "1h", "scrape_interval: expected 0.5s to 5m"),
    ],
)
def test_errors_name_the_field(path, value, message):
    with pytest.raises(ScenarioError) as caught:
        parse(with_change(path, value))
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


def test_overlapping_jobs_on_one_node_are_refused():
    data = with_change("jobs", BASE["jobs"] + [{**BASE["jobs"][0], "id": "k", "nodes": "3"}])
    with pytest.raises(ScenarioError, match="node 3 is in both 'j' and 'k'"):
        parse(data)


def test_xid_fault_needs_a_code():
    data = with_change("faults", [{"kind": "xid", "node": 0, "gpu": 0, "start": "1m"}])
    with pytest.raises(ScenarioError, match=r"faults\[0\]\.xid: required field is missing"):
        parse(data)


def test_every_shipped_scenario_loads_and_every_fault_kind_is_exercised():
    kinds = set()
    for path in shipped().values():
        kinds |= {fault.kind for fault in load(path).faults}
    assert kinds == set(FAULT_KINDS)


def test_cli_scenario_error_is_one_line_exit_2(tmp_path):
    bad = tmp_path / "bad.yml"
    bad.write_text(yaml.safe_dump(with_change("faults.0.kind", "meteor_strike")))
    result = subprocess.run([sys.executable, "-m", "flopwatch", "sim", "--scenario", str(bad)],
                            check=False, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "faults[0].kind: unknown fault kind 'meteor_strike'" in lines[0]
    assert "Traceback" not in result.stderr


def test_checkpoints_must_be_shorter_than_their_period():
    job = {**BASE["jobs"][0], "checkpoint_every": "1m", "checkpoint_seconds": "2m"}
    with pytest.raises(ScenarioError, match=r"jobs\[0\]\.checkpoint_seconds: must be shorter"):
        parse(with_change("jobs", [job]))
    job["checkpoint_every"] = 0
    assert parse(with_change("jobs", [job])).jobs[0].checkpoint_every == float("inf")


def test_a_toy_model_whose_step_would_take_microseconds_is_refused():
    """The simulator advances step by step: a sub-millisecond healthy step would make one tick take
    minutes, so the scenario says so instead of hanging."""
    toy = {"params": 1e6, "layers": 2, "heads": 2, "head_dim": 8, "seq_len": 8}
    with pytest.raises(ScenarioError, match=r"jobs\[0\]: a healthy step of 'j' would take .* ms; the simulator "
                                            r"needs 50 ms or more"):
        parse(with_change("jobs.0.model", toy))
    parse(with_change("jobs.0.tokens_per_step", 2e4))  # 8B model, 20k tokens on 32 GPUs: ~66 ms, accepted

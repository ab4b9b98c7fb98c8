"""bench/remediate_latency.py end to end on one small fault: a simulated XID 48 through the real
rules in a real Prometheus (the detection engine), its draining alert through a real Alertmanager
routed by alerts/alertmanager.yml as shipped, `flopwatch remediate run --execute` and a real
Slurm 22.05, on both server releases. The figure's parts must be real and add up."""

from __future__ import annotations

import pytest

from bench import remediate_latency as bench
from flopwatch import resources
from flopwatch.detect import rules as rule_files
from flopwatch.sim.scenario import parse

pytestmark = pytest.mark.integration

MODEL = {"params": 8e9, "layers": 32, "heads": 32, "head_dim": 128, "seq_len": 8192}
SCENARIO = {"name": "one-xid", "duration": "8m", "scrape_interval": "5s",
            "fleet": {"nodes": 1, "gpus_per_node": 8, "nics_per_node": 1},
            "jobs": [{"id": "j", "nodes": "0", "model": MODEL, "tokens_per_step": 262144, "target_mfu": 0.4}],
            "faults": [{"kind": "xid", "node": 0, "gpu": 3, "xid": 48, "start": "6m", "duration": "1m"}]}


def test_one_xid_from_fault_to_drained_in_slurm(server_release: str) -> None:
    rules_path = resources.folder("alerts")
    report = bench.detect_report([parse(SCENARIO)], rules_path)
    (fault,) = bench.drain_faults(report, rule_files.load(rules_path, 5.0).rules)
    assert fault.alert == "FlopWatchGpuXidCritical" and fault.labels["xid"] == "48"
    assert fault.labels["severity"] == "page" and fault.before == ()
    assert 0 < fault.detection_s <= fault.interval_s + 5      # the first evaluation after the scrape showing it

    trial = bench.one_round([fault], "page", 0, poll=0.05)

    assert trial["reasons"] == {fault.name: "flopwatch: FlopWatchGpuXidCritical GPU 3 XID 48"}
    routed, webhook, scontrol = (trial[key][fault.name] for key in ("alertmanager_s", "webhook_s", "scontrol_s"))
    assert routed >= 10.0, "the page route's group_wait (10s as shipped) is paid before the webhook"
    assert routed > webhook > 0 and scontrol > 0
    (entry,) = bench.compose([fault], {"page": [trial]})["faults"]
    page = entry["wirings"]["page"]
    assert page["group_wait_s"] == 10.0
    assert page["fault_to_drain_s"]["median"] == pytest.approx(fault.detection_s + routed, abs=0.01)

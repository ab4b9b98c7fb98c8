"""A real Prometheus scrapes a 64-node simulated fleet through file_sd (the demo end to end is
tests/integration/test_report_demo.py)."""

from __future__ import annotations

import time

import pytest
from helpers import wait_for

from flopwatch.promql import PromClient
from flopwatch.sim.fleet import Fleet
from flopwatch.sim.scenario import parse
from flopwatch.stack import Prometheus
from integration.fleets import serving

pytestmark = pytest.mark.integration

MODEL = {"params": 8e9, "layers": 32, "heads": 32, "head_dim": 128, "seq_len": 8192}


def fleet_scenario(nodes: int) -> dict:
    return {
        "name": "it", "seed": 2, "duration": "1h", "scrape_interval": "1s",
        "fleet": {"nodes": nodes, "gpus_per_node": 8, "gpu_model": "H100-SXM", "nics_per_node": 8},
        "jobs": [{"id": "big", "nodes": "0-47", "model": MODEL, "tokens_per_step": 262144, "target_mfu": 0.45},
                 {"id": "small", "nodes": "48-59", "model": MODEL, "tokens_per_step": 65536,
                  "target_mfu": 0.35}],
        "faults": [{"kind": "thermal_throttle", "node": 7, "gpu": 2, "start": "0s", "slowdown": 0.1}],
    }



def test_prometheus_scrapes_64_simulated_nodes_via_file_sd(tmp_path):
    fleet = Fleet(parse(fleet_scenario(64)), start_unix=time.time())
    with serving(fleet) as server:
        targets = server.write_file_sd(tmp_path / "targets.json")
        with Prometheus([{"job_name": "sim", "file_sd_configs": [{"files": [str(targets)]}]}]) as prom:
            client = PromClient(prom.url)
            wait_for(lambda: client.scalar("count(up == 1)") == 64, 60, "64 targets up")
            assert client.scalar("count(up == 0) or vector(0)") == 0
            nodes = {s.labels["node"] for s in client.query("flopwatch_gpu_up")}
            assert nodes == {node.name for node in fleet.nodes}
            assert {s.labels["instance"] for s in client.query("up")} == nodes
            assert client.scalar("count(flopwatch_gpu_up == 1)") == 512
            assert client.scalar("count(flopwatch_gpu_job_info)") == 60 * 8
            # the straggler is visible as the rank with the most compute per step, and as a throttled GPU
            wait_for(lambda: client.scalar("count(flopwatch_train_steps_total)") == 480, 60, "train series")
            time.sleep(20)
            worst = client.query(
                'topk(1, sum without (phase) (rate(flopwatch_train_phase_seconds_total{phase="compute",'
                'job_id="big"}[15s])) / rate(flopwatch_train_steps_total{job_id="big"}[15s]))')
            assert (worst[0].labels["node"], worst[0].labels["gpu"], worst[0].labels["rank"]) == ("node0007", "2", "58")
            throttled = client.query('flopwatch_gpu_clock_event_active{reason="sw_thermal"} == 1')
            assert [(s.labels["node"], s.labels["gpu"]) for s in throttled] == [("node0007", "2")]
            # job MFU from the exported counters agrees with the simulator's truth
            mfu = client.scalar(
                'sum(rate(flopwatch_train_model_flops_total{job_id="small"}[15s])) / sum('
                'flopwatch_gpu_peak_dense_flops{dtype="bf16"} * on (node, gpu) group_left (job_id) '
                'flopwatch_gpu_job_info{job_id="small"})')
            assert mfu == pytest.approx(0.35, rel=0.08)

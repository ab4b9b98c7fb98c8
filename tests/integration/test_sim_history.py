"""History export loads into a real VictoriaMetrics and reads back exactly what was simulated."""

from __future__ import annotations

import time

import pytest
from helpers import wait_for

from flopwatch.promql import PromClient
from flopwatch.sim import history
from flopwatch.sim.fleet import Fleet
from flopwatch.sim.scenario import parse
from flopwatch.stack import VictoriaMetrics

pytestmark = pytest.mark.integration


def test_exported_history_reads_back_from_victoria_metrics(tmp_path):
    span, step = 3 * 3600.0, 60.0
    scenario = parse({
        "name": "hist", "seed": 4, "duration": "3h", "scrape_interval": "60s",
        "fleet": {"nodes": 4, "gpus_per_node": 8, "gpu_model": "H100-SXM", "nics_per_node": 2},
        "jobs": [{"id": "j", "nodes": "0-2", "tokens_per_step": 524288, "target_mfu": 0.4, "end": "2h",
                  "model": {"params": 8e9, "layers": 32, "heads": 32, "head_dim": 128, "seq_len": 8192}}],
        "faults": [{"kind": "xid", "node": 1, "gpu": 2, "xid": 48, "start": "30m"}],
    })
    start = float(int(time.time() - span - 120))
    fleet = Fleet(scenario, start_unix=start)
    stats = history.export(fleet, tmp_path, span, step)
    assert stats.ticks == span / step
    assert stats.samples > 100_000
    with VictoriaMetrics() as vm:
        loaded = history.load_into_victoria_metrics(vm.url, tmp_path, {"job": "flopwatch"})
        assert loaded == stats.samples
        client = PromClient(vm.url)
        end = fleet.now_unix
        # imported rows become searchable shortly after the flush: wait for every GPU's last sample
        wait_for(lambda: sum(s.value for s in client.query("count(flopwatch_gpu_up)", at=end)) >= 32, 60,
                 "VictoriaMetrics to show the imported GPUs")
        # the job ended at 2h; its step series expire 5 minutes later, like the intake's
        after_job = start + 2 * 3600 + 120
        steps = client.query('sum(flopwatch_train_steps_total{job_id="j"})', at=after_job)[0].value
        assert steps == fleet.jobs["j"].counters.steps.sum()
        assert client.query("count(flopwatch_train_steps_total)", at=end) == []
        energy = client.query("sum(flopwatch_gpu_energy_joules_total)", at=end)[0].value
        simulated = sum(gpu.c.energy_j for node in fleet.nodes for gpu in node.gpus)
        assert energy == pytest.approx(simulated, rel=1e-6)
        xids = client.query('flopwatch_gpu_xid_errors_total{xid="48"}', at=end)
        assert [(s.labels["node"], s.labels["gpu"], s.value) for s in xids] == [("node0001", "2", 1.0)]
        # the job ended at 2h: its GPUs lose the job_info series, the idle node never had one
        assert client.query("count(flopwatch_gpu_job_info)", at=start + 3600)[0].value == 24
        assert client.query("count(flopwatch_gpu_job_info)", at=end) == []
        # one sample per step per series, with the extra label the loader added
        power = 'flopwatch_gpu_power_watts{node="node0003",gpu="0"}'
        assert client.query(f"count_over_time({power}[{int(span)}s])", at=end)[0].value == span / step
        assert client.query(power, at=end)[0].labels["job"] == "flopwatch"

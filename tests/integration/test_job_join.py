"""A real Prometheus joins GPU and NIC series to job_id through flopwatch_gpu_job_info.

The agent runs in-process on the simulated GPU backend (no GPU here) with the real NIC collector
over the recorded sysfs tree and real attribution from a temporary Slurm mapping directory, laid
out as deploy/slurm/prolog.sh leaves it. Prometheus (Debian package) scrapes it and evaluates the
recording rules below; the test compares the rules' results with the raw series and watches a
job's series go when its epilog runs.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import yaml
from helpers import wait_for

from flopwatch import config as cfg
from flopwatch.exporters.wiring import build_agent
from flopwatch.promql import PromClient
from flopwatch.stack import Prometheus
from flopwatch.stack.servers import scrape_job

pytestmark = pytest.mark.integration

SYSFS = Path(__file__).resolve().parents[1] / "fixtures" / "sysfs"
RULES = {"groups": [{"name": "job-join", "interval": "1s", "rules": [
    # info on the many side: a GPU shared by two jobs yields one result per job
    {"record": "job_id:flopwatch_gpu_power_watts:sum",
     "expr": "sum by (job_id) (flopwatch_gpu_job_info * on(node, gpu) group_left flopwatch_gpu_power_watts)"},
    {"record": "job_id:flopwatch_gpu:count", "expr": "count by (job_id) (flopwatch_gpu_job_info)"},
    {"record": "job_id:flopwatch_nic_data_bytes:sum",
     "expr": "sum by (job_id) (flopwatch_nic_job_info * on(node, device, port) group_left "
             "sum by (node, device, port) (flopwatch_nic_data_bytes_total))"},
]}]}



def by_job(client: PromClient, expr: str) -> dict[str, float]:
    return {sample.labels.get("job_id", ""): sample.value for sample in client.query(expr)}


@pytest.fixture
def mapping(tmp_path: Path) -> Path:
    root = tmp_path / "gpu-jobs"
    (root / "users").mkdir(parents=True)
    for gpu, jobs in {"0": "81723\n", "1": "81723\n", "2": "81723\n81799\n", "3": "81799\n"}.items():
        (root / gpu).write_text(jobs)
    (root / "users" / "81723").write_text("alice\n")
    (root / "users" / "81799").write_text("bob\n")
    return root


def test_recording_rule_joins_gpu_and_nic_series_to_jobs(tmp_path, mapping):
    config = cfg.load(overrides={
        "backend": "sim", "node": "join-node", "interval": 1, "listen": "127.0.0.1:0", "sim.gpus": 4,
        "nic.sysfs_root": str(SYSFS), "attribution.mapping_dir": str(mapping),
        "attribution.nic_rails": "0=mlx5_0,3=mlx4_0", "collectors.host": False,
    }, environ={})
    agent = build_agent(config)
    agent.collect_once()
    host, port = agent.serve("127.0.0.1", 0)
    stop = threading.Event()
    loop = threading.Thread(target=agent.run, args=(1.0, stop), daemon=True)
    loop.start()
    rules = tmp_path / "rules.yml"
    rules.write_text(yaml.safe_dump(RULES))
    try:
        with Prometheus([scrape_job("flopwatch", [f"{host}:{port}"])], rule_files=[rules]) as prom:
            client = PromClient(prom.url)
            wait_for(lambda: set(by_job(client, "job_id:flopwatch_gpu_power_watts:sum")) == {"81723", "81799"},
                     20, "the power join for both jobs")
            stop.set()  # freeze the exposition so raw series and rule results can be compared exactly
            loop.join(timeout=5)
            frozen = agent.exposition()
            time.sleep(3.5)  # a scrape and a rule evaluation after the last collection
            assert agent.exposition() == frozen

            power = {s.labels["gpu"]: s.value for s in client.query('flopwatch_gpu_power_watts{node="join-node"}')}
            assert len(power) == 4
            joined = by_job(client, "job_id:flopwatch_gpu_power_watts:sum")
            assert joined["81723"] == pytest.approx(power["0"] + power["1"] + power["2"], rel=1e-12)
            assert joined["81799"] == pytest.approx(power["2"] + power["3"], rel=1e-12)
            assert by_job(client, "job_id:flopwatch_gpu:count") == {"81723": 3, "81799": 2}
            users = {(s.labels["gpu"], s.labels["job_id"]): s.labels["user"]
                     for s in client.query("flopwatch_gpu_job_info")}
            assert users[("2", "81799")] == "bob" and users[("0", "81723")] == "alice"

            nic = by_job(client, "job_id:flopwatch_nic_data_bytes:sum")
            rail_bytes = {s.labels["device"]: s.value for s in client.query(
                'sum by (device) (flopwatch_nic_data_bytes_total{port="1", device=~"mlx5_0|mlx4_0"})')}
            assert nic == {"81723": rail_bytes["mlx5_0"], "81799": rail_bytes["mlx4_0"]}
            assert rail_bytes["mlx5_0"] == 7_608_474_658_012 + 7_493_620_887_628  # the fixture's tx + rx

            # the epilog of 81799 runs: its lines and user file go, its series go with them
            (mapping / "2").write_text("81723\n")
            (mapping / "3").unlink()
            (mapping / "users" / "81799").unlink()
            agent.collect_once()
            wait_for(lambda: set(by_job(client, "job_id:flopwatch_gpu:count")) == {"81723"},
                     20, "job 81799's series to go stale")
            assert not client.query('flopwatch_gpu_job_info{job_id="81799"}')
            assert not client.query('flopwatch_nic_job_info{job_id="81799"}')
    finally:
        stop.set()
        agent.http.stop()
        agent.close()

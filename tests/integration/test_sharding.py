"""Sharded Prometheus with a global tier of pre-aggregated series only (docs/scaling.md).

A simulated fleet is split between two Prometheus shards (each with every rule of alerts/ and its
own `cluster` external label) that remote-write only recording-rule results (`level:metric:ops`
names) to one VictoriaMetrics, the global store. A third Prometheus scrapes the whole fleet as
the reference. Global MFU computed from the shards' sums must equal the reference's own rules:
numerators and denominators add across shards, ratios do not.

Both releases (the `server_release` matrix): Debian's packages (Prometheus 2.42, VictoriaMetrics
1.79) and the current ones built by scripts/build-servers.sh. Only the GPUs are simulated
(flopwatch's fleet simulator); Prometheus and VictoriaMetrics are real.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from flopwatch.promql import PromClient
from flopwatch.sim.serve import FleetServer
from flopwatch.stack import Prometheus, VictoriaMetrics
from integration.fleets import serving, two_jobs_48_gpus

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("server_release")]

ROOT = Path(__file__).resolve().parents[2]
RULE_FILES = sorted(ROOT.glob("alerts/flopwatch-*.yml"))
SHARDS = {"shard-1": range(0, 3), "shard-2": range(3, 6)}   # jobs stay inside a shard
TOLERANCE = 0.005                                            # 0.5 pp of MFU

#: Global figures from the shards' pre-aggregated series -> the reference's own rule.
GLOBAL = {
    "sum(job_id:flopwatch_model_flops:rate1m) / sum(cluster:flopwatch_peak_flops:sum)": "fleet:flopwatch_mfu:ratio",
    "sum(job_id:flopwatch_model_flops:rate1m) / sum(job_id:flopwatch_peak_flops:sum)": "cluster:flopwatch_mfu:ratio",
}


def shard_targets(server: FleetServer, nodes: range, path: Path) -> Path:
    path.write_text(json.dumps([server.targets()[i] for i in nodes]))
    return path


def test_global_mfu_from_shards_pre_aggregated_series_equals_one_prometheus(tmp_path):
    assert RULE_FILES, "alerts/flopwatch-*.yml: no rule files to evaluate"
    with serving(two_jobs_48_gpus("sharded", seed=5), 1.0) as server:
        vm = VictoriaMetrics()
        keep_recorded = [{"source_labels": ["__name__"], "regex": ".+:.+", "action": "keep"}]
        reference = Prometheus([{"job_name": "flopwatch",
                                 "file_sd_configs": [{"files": [str(server.write_file_sd(tmp_path / "all.json"))]}]}],
                               rule_files=RULE_FILES, scrape_interval="1s", evaluation_interval="5s")
        shards = {name: Prometheus([{"job_name": "flopwatch", "file_sd_configs": [
                                       {"files": [str(shard_targets(server, nodes, tmp_path / f"{name}.json"))]}]}],
                                   rule_files=RULE_FILES, scrape_interval="1s", evaluation_interval="5s",
                                   external_labels={"cluster": name},
                                   remote_write=[{"url": "", "write_relabel_configs": keep_recorded,
                                                  "queue_config": {"batch_send_deadline": "1s"}}])
                  for name, nodes in SHARDS.items()}
        try:
            vm.start()
            reference.start()
            for shard in shards.values():
                shard.config["remote_write"][0]["url"] = f"{vm.url}/api/v1/write"
                shard.start()
            ref, glob = PromClient(reference.url), PromClient(vm.url)

            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and ref.scalar("count(flopwatch_gpu_up)") != 48:
                time.sleep(1)
            assert ref.scalar("count(flopwatch_gpu_up)") == 48
            # a minute behind every rate(...[1m]), and the shards' results forwarded
            time.sleep(70)
            # MFU needs the peaks, recorded once a minute (a group first runs anywhere within its
            # interval), and VictoriaMetrics shows what was written after its query latency offset
            deadline = time.monotonic() + 150
            while True:
                got = {query: glob.scalar(query) for query in GLOBAL}
                want = {query: ref.scalar(record) for query, record in GLOBAL.items()}
                off = {q: (got[q], want[q]) for q in GLOBAL
                       if got[q] is None or want[q] is None or abs(got[q] - want[q]) > TOLERANCE}
                if not off or time.monotonic() > deadline:
                    break
                time.sleep(2)
            assert not off, off

            # the global tier holds recorded series only, from both shards
            assert glob.query('count({__name__!~".+:.+"})') == []
            clusters = {s.labels["cluster"] for s in glob.query("cluster:flopwatch_peak_flops:sum")}
            assert clusters == set(SHARDS)
            # idle GPUs count in the fleet figure only: 48 GPUs' peak vs the 40 the jobs hold
            peaks = glob.scalar("sum(cluster:flopwatch_peak_flops:sum)")
            allocated = glob.scalar("sum(job_id:flopwatch_peak_flops:sum)")
            assert peaks == pytest.approx(allocated * 48 / 40, rel=1e-9)
            fleet_mfu = want["sum(job_id:flopwatch_model_flops:rate1m) / sum(cluster:flopwatch_peak_flops:sum)"]
            expected = (0.42 * 24 + 0.30 * 16) / 48
            assert fleet_mfu == pytest.approx(expected, abs=0.03)
        finally:
            for shard in shards.values():
                shard.stop()
            reference.stop()
            vm.stop()

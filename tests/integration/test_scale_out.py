"""Scale-out: a simulated fleet scraped by Prometheus, remote-written to VictoriaMetrics, with the
recording rules of alerts/ evaluated twice: by Prometheus over its own TSDB, and by vmalert over
VictoriaMetrics. The MFU rules must agree, so either place can hold the global rules, and no rule
fails to evaluate in vmalert.

Both releases (the `server_release` matrix): Debian's packages (Prometheus 2.42, VictoriaMetrics
and vmalert 1.79, Alertmanager 0.25) and the current ones built by scripts/build-servers.sh. Only
the GPUs are simulated (flopwatch's fleet simulator serves one target per node); Prometheus,
VictoriaMetrics, vmalert and Alertmanager are real.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from flopwatch.promql import PromClient
from flopwatch.stack import Alertmanager, Prometheus, VictoriaMetrics, VmAlert
from flopwatch.stack.vmalert_rules import vmalert_rules
from integration.fleets import serving, two_jobs_48_gpus

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("server_release")]

ROOT = Path(__file__).resolve().parents[2]
RULE_FILES = sorted(ROOT.glob("alerts/flopwatch-*.yml"))

#: Recording rules that must agree, and how close (absolute: 0.5 pp of MFU).
COMPARED = ("job_id:flopwatch_mfu:ratio", "job_id:flopwatch_hfu:ratio", "cluster:flopwatch_mfu:ratio",
            "fleet:flopwatch_mfu:ratio")
TOLERANCE = 0.005


def by_labels(client: PromClient, expr: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {tuple(sorted((k, v) for k, v in s.labels.items() if k not in ("__name__", "ruler"))): s.value
            for s in client.query(expr)}


def compare(prom: PromClient, victoria: PromClient) -> list[tuple]:
    """(record, labels, Prometheus's value, vmalert's value) for every disagreement."""
    out: list[tuple] = []
    for record in COMPARED:
        ours, theirs = by_labels(prom, record), by_labels(victoria, record)
        if not ours or set(ours) != set(theirs):
            out.append((record, ours, theirs))
            continue
        out += [(record, key, value, theirs[key]) for key, value in ours.items()
                if abs(theirs[key] - value) > TOLERANCE]
    return out


def test_mfu_rules_in_vmalert_over_victoria_metrics_agree_with_prometheus(tmp_path):
    assert RULE_FILES, "alerts/flopwatch-*.yml: no rule files to evaluate"
    with serving(two_jobs_48_gpus("scale-out", seed=3), 1.0) as server:
        targets = server.write_file_sd(tmp_path / "targets.json")
        alertmanager = Alertmanager({"route": {"receiver": "null"}, "receivers": [{"name": "null"}]})
        vm = VictoriaMetrics()
        # raw series only: vmalert computes the recording rules on the VictoriaMetrics side
        forward_raw = [{"source_labels": ["__name__"], "regex": ".+:.+", "action": "drop"}]
        prometheus = Prometheus([{"job_name": "flopwatch", "file_sd_configs": [{"files": [str(targets)]}]}],
                                rule_files=RULE_FILES, scrape_interval="1s", evaluation_interval="5s",
                                external_labels={"cluster": "shard-1"},
                                remote_write=[{"url": "", "write_relabel_configs": forward_raw,
                                               "queue_config": {"batch_send_deadline": "1s"}}])
        try:
            alertmanager.start()
            vm.start()
            prometheus.config["remote_write"][0]["url"] = f"{vm.url}/api/v1/write"
            prometheus.start()
            # Debian's vmalert 1.79 predates keep_firing_for (the fabric alerts): taken out for it
            # (tests/integration/test_vmalert.py holds what each release takes out).
            vmalert_files, _ = vmalert_rules(RULE_FILES, tmp_path / "vmalert-rules")
            vmalert = VmAlert(vmalert_files, vm.url, notifiers=[alertmanager.url], external_labels={"ruler": "vmalert"})
            vmalert.start()
            prom, victoria = PromClient(prometheus.url), PromClient(vm.url)

            # the fleet flows through Prometheus into VictoriaMetrics, every GPU of every node
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                if victoria.scalar("count(flopwatch_gpu_up)") == 48 and prom.scalar("count(flopwatch_gpu_up)") == 48:
                    break
                time.sleep(1)
            first_data = time.monotonic()
            assert victoria.scalar('count(flopwatch_gpu_up{cluster="shard-1"})') == 48
            assert victoria.query('count({__name__=~".+:.+", ruler!="vmalert"})') == [], \
                "Prometheus's own rule results must not be forwarded"

            # rate(...[1m]) differs between Prometheus (extrapolates, divides by the full range) and
            # MetricsQL until a minute of samples exists: compare from then on, until both agree
            time.sleep(max(0.0, first_data + 65 - time.monotonic()))
            # vmalert's MFU waits for its peaks group (once a minute) and each step of the chain
            # for VictoriaMetrics to show the step before (its query latency offset): up to two
            # minutes more before its first MFU
            deadline = time.monotonic() + 150
            while True:
                disagreements = compare(prom, victoria)
                if not disagreements or time.monotonic() > deadline:
                    break
                time.sleep(2)
            assert not disagreements, disagreements
            mfu = by_labels(prom, "job_id:flopwatch_mfu:ratio")
            assert mfu[(("job_id", "job-a"),)] == pytest.approx(0.42, abs=0.03)
            assert mfu[(("job_id", "job-b"),)] == pytest.approx(0.30, abs=0.03)
            # no rule has failed in vmalert's own account, the compared ones among those run (the
            # daily and weekly groups, at 5 minutes, may not have run yet)
            evaluated = {rule["name"] for rule in vmalert.rules() if not rule["lastEvaluation"].startswith("0001-")}
            assert set(COMPARED) <= evaluated
            assert (vmalert.rule_errors(), vmalert.failed_executions()) == ({}, 0)
            assert vmalert.running()
        finally:
            prometheus.stop()       # before the server it remote-writes to
            for process in (locals().get("vmalert"), vm, alertmanager):
                if process is not None:
                    process.stop()

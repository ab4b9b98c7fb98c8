"""The rule files run on VictoriaMetrics' vmalert: VictoriaMetrics scrapes a simulated fleet every
5 s, vmalert evaluates alerts/*.yml against it (recording rules written back by remote write) and
notifies a real Alertmanager; the injected thermal straggler fires the same FlopWatchStraggler
alert, naming node, GPU, rank and cause, that Prometheus fires. Debian's vmalert (1.79) predates
`keep_firing_for`: the uplink and spine alerts' hold is taken out for it (and only that, a test holds).

Only the GPUs are simulated (flopwatch.sim, one target per node); VictoriaMetrics, vmalert
(Debian package `victoria-metrics`) and Alertmanager are real, all on 127.0.0.1.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from flopwatch.commands.demo import alertmanager_config, rule_files
from flopwatch.promql import PromClient
from flopwatch.sim.fleet import Fleet, node_name
from flopwatch.sim.serve import FleetServer
from flopwatch.stack import Alertmanager, VictoriaMetrics, VmAlert
from flopwatch.stack.vmalert_rules import vmalert_rules
from flopwatch.stack.webhook import WebhookReceiver
from integration.fleets import llm_8b_32_ranks

pytestmark = pytest.mark.integration

SCRAPE_S = 5
WARMUP_TIMEOUT_S = 120   # vmalert reads each recording rule back through VictoriaMetrics: a
ALERT_TIMEOUT_S = 120    # chain of N rules lags about N evaluations behind Prometheus
SLOW_NODE, SLOW_GPU = 1, 3


def vmalert_alerts(url: str) -> list[dict]:
    with urllib.request.urlopen(url + "/api/v1/alerts", timeout=10) as answer:
        return json.load(answer)["data"]["alerts"] or []


#: What Debian's vmalert 1.79 refuses in the shipped rules: the fabric alerts' keep_firing_for.
REJECTED_BY_VMALERT_1_79 = {("FlopWatchUplinkDegraded", "field keep_firing_for"),
                            ("FlopWatchSpineDegraded", "field keep_firing_for")}


def test_vmalert_rejects_only_the_fabric_alerts_hold(tmp_path: Path) -> None:
    _, removals = vmalert_rules(rule_files(), tmp_path / "rules")
    assert {(r["rule"], r["removed"]) for r in removals} == REJECTED_BY_VMALERT_1_79, removals


def test_vmalert_fires_the_same_straggler_alert(tmp_path: Path) -> None:
    rules, _ = vmalert_rules(rule_files(), tmp_path / "rules")
    fleet = Fleet(llm_8b_32_ranks("vmalert-thermal", seed=12, nodes=4, scrape_s=SCRAPE_S))
    for _ in range(24):
        fleet.advance(SCRAPE_S)
    fleet.start_unix = time.time() - fleet.t
    server = FleetServer(fleet)
    stop = threading.Event()
    ticker = threading.Thread(target=server.run, args=(0, stop), daemon=True)
    server.start()
    targets = server.write_file_sd(tmp_path / "targets.json")
    scrape = tmp_path / "scrape.yml"
    scrape.write_text(yaml.safe_dump({
        "global": {"scrape_interval": f"{SCRAPE_S}s"},
        "scrape_configs": [{"job_name": "flopwatch", "file_sd_configs": [{"files": [str(targets)]}]}],
    }))
    try:
        with WebhookReceiver() as webhook, Alertmanager(alertmanager_config(webhook.url)) as alertmanager, \
                VictoriaMetrics(extra_args=[f"-promscrape.config={scrape}"]) as victoria, \
                VmAlert(rules, victoria.url, notifiers=[alertmanager.url],
                        evaluation_interval=f"{SCRAPE_S}s") as vmalert:
            ticker.start()
            client = PromClient(victoria.url)
            deadline = time.monotonic() + WARMUP_TIMEOUT_S
            # until every rank is in the peer group (not the first, partial count)
            while [s.value for s in client.query("job_id:flopwatch_straggler_ranks:count")] != [32] \
                    and time.monotonic() < deadline:
                time.sleep(2)
            assert [s.value for s in client.query("job_id:flopwatch_straggler_ranks:count")] == [32]
            assert not [a for a in vmalert_alerts(vmalert.url) if a["labels"].get("severity") == "page"]

            with server.lock:
                fleet.inject("thermal_throttle", SLOW_NODE, gpu=SLOW_GPU, duration=3600, slowdown=0.08)
            injected = time.monotonic()
            page = webhook.wait_for(lambda a: a.get("status") == "firing"
                                    and a["labels"].get("alertname") == "FlopWatchStraggler", ALERT_TIMEOUT_S)
            latency = time.monotonic() - injected
            fired = [a for a in vmalert_alerts(vmalert.url) if a["labels"].get("severity") == "page"
                     and a.get("state") == "firing"]
    finally:
        stop.set()
        if ticker.is_alive():
            ticker.join(timeout=30)
        server.stop()

    assert page is not None, f"vmalert sent no straggler alert within {ALERT_TIMEOUT_S}s: {webhook.alerts}"
    labels = page["labels"]
    assert (labels["node"], labels["gpu"], labels["rank"], labels["cause"], labels["job_id"]) == (
        node_name(SLOW_NODE), str(SLOW_GPU), str(SLOW_NODE * 8 + SLOW_GPU), "thermal", "llm-8b")
    assert f"{node_name(SLOW_NODE)} GPU {SLOW_GPU}" in page["annotations"]["summary"]
    assert {(a["labels"]["alertname"], a["labels"].get("node"), a["labels"].get("gpu")) for a in fired} == {
        ("FlopWatchStraggler", node_name(SLOW_NODE), str(SLOW_GPU))}
    print(f"vmalert straggler alert {latency:.0f}s after the injection")

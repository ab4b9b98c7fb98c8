"""End to end: a simulated fleet with an injected thermal straggler, a real Prometheus evaluating
alerts/*.yml at a 5 s scrape and evaluation interval, a real Alertmanager routed by
alerts/alertmanager.yml (receivers pointed at a local webhook) and the webhook as the pager.

Only the GPUs are simulated (flopwatch.sim serves the same series real agents do, one target per
node); Prometheus and Alertmanager are real, all on 127.0.0.1, in both releases FlopWatch supports
(`server_release`: Debian's Prometheus 2.42 and Alertmanager 0.25, and the current upstream ones),
so the shipped rules and routing page the same way on each.
"""

from __future__ import annotations

import json
import re
import time
import urllib.request
from pathlib import Path

import pytest
from helpers import wait_for

from flopwatch.commands.demo import alertmanager_config, rule_files
from flopwatch.mixin.config import MixinConfig
from flopwatch.promql import PromClient
from flopwatch.sim.fleet import Fleet, node_name
from flopwatch.stack import Alertmanager, Prometheus
from flopwatch.stack.webhook import WebhookReceiver
from integration.fleets import llm_8b_32_ranks, serving

pytestmark = pytest.mark.integration

SCRAPE_S = 5
HEALTHY_S = 30           # watched before the fault, for pages that must not come
PAGE_TIMEOUT_S = 75      # from the injection
SLOW_NODE, SLOW_GPU = 2, 5


def is_page(alert: dict) -> bool:
    return alert.get("status") == "firing" and alert["labels"].get("severity") == "page"


def test_thermal_straggler_pages_naming_node_gpu_rank_and_cause(tmp_path: Path, server_release: str) -> None:
    fleet = Fleet(llm_8b_32_ranks("e2e-thermal", seed=11, nodes=5, scrape_s=SCRAPE_S))
    for _ in range(24):                       # two minutes of history in the counters
        fleet.advance(SCRAPE_S)
    fleet.start_unix = time.time() - fleet.t  # step timestamps on the wall clock
    with WebhookReceiver() as webhook, Alertmanager(alertmanager_config(webhook.url)) as alertmanager, \
            serving(fleet) as server:
        targets = server.write_file_sd(tmp_path / "targets.json")
        with Prometheus([{"job_name": "flopwatch", "file_sd_configs": [{"files": [str(targets)]}]}],
                        rule_files=rule_files(), alertmanagers=[alertmanager.url],
                        scrape_interval=f"{SCRAPE_S}s", evaluation_interval=f"{SCRAPE_S}s") as prom:
            client = PromClient(prom.url)
            time.sleep(HEALTHY_S)
            # every rank in the peer group (each target's first scrapes land at its own offset in the
            # interval: on a busy machine some need longer than the healthy watch)
            wait_for(lambda: [s.value for s in client.query("job_id:flopwatch_straggler_ranks:count")] == [32],
                     60, "all 32 ranks in the straggler peer group")
            assert [a for a in webhook.alerts if is_page(a)] == [], "a page before any fault"

            with server.lock:
                fleet.inject("thermal_throttle", SLOW_NODE, gpu=SLOW_GPU, duration=3600, slowdown=0.08)
            injected = time.monotonic()
            page = webhook.wait_for(lambda a: is_page(a) and a["labels"]["alertname"] == "FlopWatchStraggler",
                                    PAGE_TIMEOUT_S)
            latency = time.monotonic() - injected
            rule_errors = [(g["name"], r["name"], r.get("lastError")) for g in prom_rules(prom.url)
                           for r in g["rules"] if r.get("health") == "err"]

    assert rule_errors == []
    assert page is not None, f"no straggler page within {PAGE_TIMEOUT_S}s; got {webhook.alerts}"
    labels = page["labels"]
    assert (labels["node"], labels["gpu"], labels["cause"]) == (node_name(SLOW_NODE), str(SLOW_GPU), "thermal")
    assert labels["rank"] == str(SLOW_NODE * 8 + SLOW_GPU) and labels["job_id"] == "llm-8b"
    summary = page["annotations"]["summary"]
    assert f"{node_name(SLOW_NODE)} GPU {SLOW_GPU}" in summary
    slowdown = re.search(r"\(rank \d+\) ([0-9.]+)% slower", summary)
    assert slowdown is not None and len(slowdown.group(1).replace(".", "").lstrip("0")) <= 3, summary
    assert page["annotations"]["runbook_url"] == f"{MixinConfig().urls.runbooks}#flopwatchstraggler"
    others = [a["labels"] for a in webhook.alerts if is_page(a)
              and (a["labels"].get("node"), a["labels"].get("gpu")) != (node_name(SLOW_NODE), str(SLOW_GPU))]
    assert others == [], "pages for healthy GPUs"
    print(f"{server_release}: straggler page {latency:.0f}s after the injection")


def prom_rules(url: str) -> list[dict]:
    with urllib.request.urlopen(url + "/api/v1/rules", timeout=10) as answer:
        return json.load(answer)["data"]["groups"]

"""Every panel query of every dashboard runs against a real Prometheus holding a simulated fleet.

No Grafana server can run here, so the test does what Grafana would: substitute the template
variables (a single job and node, a multi-value GPU selection written as Grafana writes it, All as
`.*`, $__rate_interval and $__range) and send each query to Prometheus the way its panel does
(range queries for graphs, instant queries for stats and tables). Prometheus (Debian package) scrapes
the fleet simulator and evaluates alerts/*.yml, so panels on recording rules and ALERTS are covered.
Faked, because they cannot run here: the GPUs, NICs and training ranks (flopwatch.sim, which serves
the same series as real agents), with a thermal straggler and XID, lost-GPU, NVLink, PCIe and NIC faults.

Checks: each target returns series; every series carries the labels its legend names; the label
columns of each table appear in its results; and every query (substituted) passes promtool's parser.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from flopwatch import dashboards
from flopwatch.promql import PromClient, Sample
from flopwatch.sim.fleet import Fleet
from flopwatch.sim.scenario import parse
from flopwatch.stack import Prometheus
from integration import dashboard_checks as checks
from integration.fleets import serving

pytestmark = pytest.mark.integration

RULE_FILES = checks.RULE_FILES
MODEL = {"params": 8e9, "layers": 32, "heads": 32, "head_dim": 128, "seq_len": 8192}
SCENARIO = {
    "name": "dashboards", "seed": 5, "duration": "1h", "scrape_interval": "1s",
    "fleet": {"nodes": 6, "gpus_per_node": 8, "gpu_model": "H100-SXM", "nics_per_node": 8},
    # Leaves of three nodes per rail, two spines: the fabric dashboard's panels read its topology info.
    "fabric": {"rail_optimised": True, "nodes_per_leaf": 3, "spines": 2},
    "jobs": [
        {"id": "llm-a", "nodes": "0-3", "model": MODEL, "tokens_per_step": 262144, "target_mfu": 0.45,
         "checkpoint_every": "15s", "checkpoint_seconds": "1s", "user": "alice"},
        {"id": "llm-b", "nodes": "4", "model": MODEL, "tokens_per_step": 65536, "target_mfu": 0.38},
    ],
    "faults": [
        {"kind": "thermal_throttle", "node": 2, "gpu": 5, "start": "0s", "slowdown": 0.1},
        {"kind": "xid", "node": 2, "gpu": 3, "xid": 13, "start": "3s", "duration": "10m"},
        {"kind": "gpu_lost", "node": 4, "gpu": 6, "start": "0s"},
        {"kind": "nvlink_errors", "node": 3, "gpu": 1, "start": "0s"},
        {"kind": "pcie_downgrade", "node": 4, "gpu": 2, "start": "0s"},
        {"kind": "slow_nic", "node": 4, "nic": 3, "start": "0s"},
    ],
}
ALL = ".*"
#: What a user picks on each dashboard: single-value variables get one value, multi-value ones All
#: (Grafana sends `.*`, the variables' allValue), except the node dashboard's GPUs: two of them,
#: which Grafana writes as a regex alternation.
VARIABLES = {
    "flopwatch-fleet": {"job_id": ALL},
    "flopwatch-job": {"job_id": "llm-a", "node": ALL, "gpu": ALL},
    "flopwatch-node": {"node": "node0002", "gpu": "(3|5)"},
    "flopwatch-network": {"node": ALL},
    "flopwatch-fabric": {"level": ALL, "switch": ALL},
    "flopwatch-reliability": {"job_id": ALL, "node": ALL},
}
BUILTINS = checks.BUILTINS
#: Table columns the scenario cannot fill while the test runs, and why.
UNFILLED_COLUMNS = {
    ("flopwatch-fleet", "FlopWatch alerts", "device"):
        "only the InfiniBand alerts carry device; they need a link down or a minute of errors",
}
#: MFU's first value waits for the peaks' minute-long group, which Prometheus first runs anywhere in
#: its minute, then for the 15 s groups above it: about 100 s on a slow start.
DEADLINE_S = 150


TARGETS = checks.all_targets(VARIABLES)


def test_every_query_passes_promtool_parsing(tmp_path: Path) -> None:
    checks.promtool_parses(TARGETS, tmp_path)


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory):
    assert RULE_FILES, "alerts/*.yml not found: the panels on recording rules need them"
    start = time.time()
    with serving(Fleet(parse(SCENARIO), start_unix=start)) as server:
        targets = server.write_file_sd(tmp_path_factory.mktemp("sim") / "targets.json")
        with Prometheus([{"job_name": "sim", "file_sd_configs": [{"files": [str(targets)]}]}],
                        rule_files=RULE_FILES) as prom:
            yield PromClient(prom.url), start


def test_every_panel_query_returns_series_with_its_labels(prometheus) -> None:
    client, start = prometheus
    problems = checks.until_clean(client, start, TARGETS, UNFILLED_COLUMNS, DEADLINE_S)
    assert not problems, f"{len(problems)} of {len(TARGETS)} queries fail:\n" + "\n".join(problems)


def test_variables_cover_what_the_dashboards_use() -> None:
    """The test substitutes every variable each dashboard defines (and nothing else)."""
    for uid, dashboard in dashboards.build_all().items():
        defined = {v["name"] for v in dashboard["templating"]["list"]} - {"datasource"}
        assert defined == set(VARIABLES[uid]), uid
        for panel in dashboards.panels(dashboard):
            for target in panel.get("targets", []):
                for name in re.findall(r"\$\{?([A-Za-z_]\w*)", target["expr"]):
                    assert name in defined or name in BUILTINS, f"{uid} / {panel['title']}: ${name} undefined"


def expr_of(uid: str, title: str, ref: str = "A") -> tuple[dict, str]:
    for t in TARGETS:
        if (t.uid, t.panel["title"], t.target["refId"]) == (uid, title, ref):
            return t.target, t.expr
    raise AssertionError(f"{uid} has no panel {title!r} with query {ref}")


def test_panels_point_at_the_injected_faults(prometheus) -> None:
    """What a user should see at a glance: the straggler, its throttling, the XID, the lost GPU."""
    client, _ = prometheus
    straggler_rank = 2 * 8 + 5   # node 2, GPU 5 of llm-a

    def current(uid: str, title: str, ref: str = "A") -> list[Sample]:
        """What the panel shows now: instant results, or the last point of each graphed series."""
        target, expr = expr_of(uid, title, ref)
        if target.get("instant"):
            return client.query(expr)
        return [Sample(s["metric"], float(s["values"][-1][1]))
                for s in client.query_range(expr, time.time() - 20, time.time(), 2)]

    def ready() -> bool:
        worst = current("flopwatch-fleet", "Worst ranks by straggler score")
        alerts = current("flopwatch-fleet", "FlopWatch alerts")
        return bool(worst) and any(a.labels.get("alertname") == "FlopWatchStraggler" for a in alerts)

    deadline = time.monotonic() + DEADLINE_S
    while not ready() and time.monotonic() < deadline:
        time.sleep(2)
    worst = max(current("flopwatch-fleet", "Worst ranks by straggler score"), key=lambda s: s.value)
    assert (worst.labels["job_id"], worst.labels["node"], worst.labels["gpu"], worst.labels["rank"]) == (
        "llm-a", "node0002", "5", str(straggler_rank))
    hottest = max(current("flopwatch-job", "Compute seconds per step by rank"), key=lambda s: s.value)
    assert hottest.labels == {"rank": f"{straggler_rank:05d}"}
    throttled = {(s.labels["node"], s.labels["gpu"], s.labels["reason"])
                 for s in current("flopwatch-job", "Throttle reasons")}
    assert ("node0002", "5", "sw_thermal") in throttled
    assert {(node, gpu) for node, gpu, _ in throttled} == {("node0002", "5")}
    alerts = current("flopwatch-fleet", "FlopWatch alerts")
    straggler = [a.labels for a in alerts if a.labels["alertname"] == "FlopWatchStraggler"]
    assert straggler and straggler[0]["runbook"] == "flopwatchstraggler"
    assert (straggler[0]["node"], straggler[0]["gpu"], straggler[0]["cause"]) == ("node0002", "5", "thermal")
    assert all(a.labels["runbook"] == a.labels["alertname"].lower() for a in alerts)
    xids = {(s.labels["node"], s.labels["gpu"], s.labels["xid"]): s.value
            for s in current("flopwatch-reliability", "XIDs in range by GPU")}
    assert xids == {("node0002", "3", "13"): 1.0, ("node0004", "6", "79"): 1.0}  # gpu_lost is XID 79
    lost = [s.labels for s in current("flopwatch-reliability", "Lost GPUs", "B")]
    assert [(s["node"], s["gpu"], s["job_id"]) for s in lost] == [("node0004", "6", "llm-b")]
    slowest = min(current("flopwatch-network", "Slowest negotiated port rates"), key=lambda s: s.value)
    assert (slowest.labels["node"], slowest.labels["device"]) == ("node0004", "mlx5_3")

"""`flopwatch remediate` against a real Slurm 22.05 (munged, slurmctld, one slurmd per node from
Debian's packages, flopwatch.stack.slurm) and a real Alertmanager, all on loopback.

Alerts enter Alertmanager through its API, labelled as FlopWatch's rules label them (Prometheus
posts them the same way); Alertmanager notifies the remediator's webhook and the test's pager.
What Slurm shows (`sinfo`, `squeue`) is the judge of every action. Twelve nodes: node01-08 under
leaf switch leaf1, node09-12 under leaf2, as the cluster's topology.conf says.
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import yaml
from helpers import wait_for

from flopwatch.stack import Alertmanager, free_port
from flopwatch.stack.remediator import RemediateProcess
from flopwatch.stack.slurm import SlurmCluster
from flopwatch.stack.webhook import WebhookReceiver

pytestmark = pytest.mark.integration

NODES = [f"node{i:02d}" for i in range(1, 13)]
TOPOLOGY = ("SwitchName=leaf1 Nodes=node[01-08]\nSwitchName=leaf2 Nodes=node[09-12]\n"
            "SwitchName=spine Switches=leaf[1-2]\n")
XID_REASON = "flopwatch: FlopWatchGpuXidCritical GPU 3 XID 79"


@pytest.fixture(scope="module")
def slurm() -> Iterator[SlurmCluster]:
    with SlurmCluster(NODES, topology=TOPOLOGY) as cluster:
        yield cluster


@pytest.fixture
def cluster(slurm: SlurmCluster) -> Iterator[SlurmCluster]:
    """The module's cluster, every node idle and no job left when the test ends."""
    yield slurm
    slurm.client("scancel", "--full", f"--partition={slurm.partition}", check=False)
    for node, (state, _) in slurm.node_states().items():
        if "drain" in state:
            slurm.client("scontrol", "update", f"NodeName={node}", "State=RESUME")
    slurm.wait_for(lambda: not slurm.jobs() and all(s == "idle" for s, _ in slurm.node_states().values()), 20,
                   "every node idle again")


@pytest.fixture
def pager() -> Iterator[WebhookReceiver]:
    with WebhookReceiver() as receiver:
        yield receiver


def am_config(pager_url: str, remediate_url: str, http_config: dict | None = None) -> dict:
    remediate = {"url": remediate_url, **({"http_config": http_config} if http_config else {})}
    return {"route": {"receiver": "pager", "group_by": ["alertname", "node", "key"], "group_wait": "1s",
                      "group_interval": "1s", "repeat_interval": "1h",
                      "routes": [{"receiver": "remediate", "continue": True}, {"receiver": "pager"}]},
            "receivers": [{"name": "pager", "webhook_configs": [{"url": pager_url}]},
                          {"name": "remediate", "webhook_configs": [remediate]}]}


def alert(name: str, node: str, gpu: str = "3", **labels: str) -> dict:
    return {"labels": {"alertname": name, "node": node, "gpu": gpu, "severity": "page", **labels}}


def fire(alertmanager: Alertmanager, *alerts: dict, ends_in: float = 600) -> None:
    """Post alerts as Prometheus does, starting now (ends_in 0: resolve them)."""
    alertmanager.post_alerts(alerts, ends_in)


def settings(tmp_path: Path, cluster: SlurmCluster, alertmanager: Alertmanager, **section: object) -> Path:
    values = {"dry_run": False, "alertmanager": alertmanager.url, "state_dir": str(tmp_path / "state"),
              "topology": str(cluster.topology_path), "reconcile_interval": "5s", "backoff": "1s",
              "breaker": {"max_nodes": 4, "partition_share": 0.5, "switch_share": 0.5, "window": "1h"},
              "return": {"hold_down": "2s", "health_check": "true"}}
    for key, value in section.items():
        values[key] = {**values[key], **value} if isinstance(value, dict) and key in values else value
    path = tmp_path / "flopwatch.yml"
    path.write_text(yaml.safe_dump({"remediation": values}))
    return path


def start(tmp_path: Path, cluster: SlurmCluster, pager: WebhookReceiver, http_config: dict | None = None,
          **section: object) -> tuple[Alertmanager, RemediateProcess]:
    """Alertmanager and the remediator (as a process) wired to each other and the pager."""
    port = free_port()
    alertmanager = Alertmanager(am_config(pager.url, f"http://127.0.0.1:{port}/alerts", http_config)).start()
    remediator = RemediateProcess(settings(tmp_path, cluster, alertmanager, **section), env={
        "SLURM_CONF": str(cluster.conf_path)}, port=port)
    try:
        remediator.start()
    except BaseException:
        alertmanager.stop()
        raise
    return alertmanager, remediator


def journal(tmp_path: Path) -> list[dict]:
    path = tmp_path / "state" / "journal.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def metric(remediator: RemediateProcess, name: str, auth: str = "", **labels: str) -> float:
    headers = {"Authorization": auth} if auth else {}
    with urllib.request.urlopen(urllib.request.Request(remediator.url + "/metrics", headers=headers),
                                timeout=5) as answer:
        text = answer.read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def pages(pager: WebhookReceiver, name: str) -> list[dict]:
    return [a for a in pager.firing() if a["labels"]["alertname"] == name]


def test_an_xid_79_page_drains_its_node_once_and_the_job_runs_on(
        tmp_path: Path, cluster: SlurmCluster, pager: WebhookReceiver, server_release: str) -> None:
    """On both Alertmanager releases (webhook payload and API v2 as each sends them)."""
    job = cluster.submit("node03")
    cluster.wait_for(lambda: cluster.jobs()[job][0] == "RUNNING", 30, "the job running on node03")
    alertmanager, remediator = start(tmp_path, cluster, pager)
    try:
        fire(alertmanager, alert("FlopWatchGpuXidCritical", "node03", xid="79"))
        notified = pager.wait_for(lambda a: a["labels"]["alertname"] == "FlopWatchGpuXidCritical", 30)
        assert notified is not None, "Alertmanager never notified"
        wait_for(lambda: cluster.node_states()["node03"] == ("draining", XID_REASON), 30, "node03 draining")
        assert time.time() - notified["received_at"] < 30
        fire(alertmanager, alert("FlopWatchGpuLost", "node03"))      # a second alert for the same node
        pager.wait_for(lambda a: a["labels"]["alertname"] == "FlopWatchGpuLost", 30)
        wait_for(lambda: metric(remediator, "flopwatch_remediation_node_drained", node="node03") == 1, 10,
                 "the drain in the remediator's metrics")
        time.sleep(1.5)   # let the webhook's second notification be decided on
        drains = [e for e in journal(tmp_path) if e["event"] == "drain"]
        done = metric(remediator, "flopwatch_remediation_actions_total", node="node03", action="drain", outcome="done")
    finally:
        remediator.stop()
        alertmanager.stop()
    assert [(e["node"], e["reason"]) for e in drains] == [("node03", XID_REASON)]
    assert done == 1
    assert cluster.jobs()[job] == ("RUNNING", "node03"), "FlopWatch must never end a job"
    assert cluster.node_states()["node03"] == ("draining", XID_REASON)
    others = {n: s for n, (s, _) in cluster.node_states().items() if n != "node03"}
    assert set(others.values()) == {"idle"}


def test_eight_nodes_failing_under_one_leaf_page_the_switch_and_drain_nothing(
        tmp_path: Path, cluster: SlurmCluster, pager: WebhookReceiver) -> None:
    alertmanager, remediator = start(tmp_path, cluster, pager)
    try:
        fire(alertmanager, *(alert("FlopWatchGpuLost", node, gpu="0") for node in NODES[:8]))
        page = pager.wait_for(lambda a: a["labels"]["alertname"] == "FlopWatchRemediationSwitchSuspected", 30)
        wait_for(lambda: metric(remediator, "flopwatch_remediation_node_held", why="switch") == 8, 10,
                 "eight nodes held for their switch")
        time.sleep(2)   # a second page, had there been one, would have come by now (group_interval 1s)
        switch_pages = pages(pager, "FlopWatchRemediationSwitchSuspected")
    finally:
        remediator.stop()
        alertmanager.stop()
    assert page is not None and page["labels"]["key"] == "leaf1"
    assert page["annotations"]["nodes"] == ",".join(NODES[:8])
    assert len(switch_pages) == 1
    assert {s for s, _ in cluster.node_states().values()} == {"idle"}
    assert [e for e in journal(tmp_path) if e["event"] == "drain"] == []


def test_past_the_breaker_nothing_is_drained_and_one_halted_page_lists_the_nodes(
        tmp_path: Path, cluster: SlurmCluster, pager: WebhookReceiver) -> None:
    alertmanager, remediator = start(tmp_path, cluster, pager, breaker={"max_nodes": 2})
    failing = ["node01", "node05", "node09"]          # two leaves, too few under either to blame a switch
    try:
        fire(alertmanager, *(alert("FlopWatchGpuXidCritical", node, xid="79") for node in failing))
        page = pager.wait_for(lambda a: a["labels"]["alertname"] == "FlopWatchRemediationHalted", 30)
        wait_for(lambda: metric(remediator, "flopwatch_remediation_halted") == 1, 10, "the halted gauge")
        time.sleep(2)
        halted_pages = pages(pager, "FlopWatchRemediationHalted")
    finally:
        remediator.stop()
        alertmanager.stop()
    assert page is not None and page["annotations"]["nodes"] == ",".join(failing)
    assert len(halted_pages) == 1
    assert {s for s, _ in cluster.node_states().values()} == {"idle"}


def test_a_cleared_node_returns_after_hold_down_and_health_check_and_a_lemon_stays(
        tmp_path: Path, cluster: SlurmCluster, pager: WebhookReceiver) -> None:
    state = tmp_path / "state"
    state.mkdir()
    two_days_ago = time.time() - 2 * 86400      # node10 was drained before: a second occasion makes it a lemon
    (state / "journal.jsonl").write_text(json.dumps({"t": two_days_ago, "event": "drain", "node": "node10",
                                                     "reason": "flopwatch: FlopWatchGpuLost GPU 1"}) + "\n")
    alertmanager, remediator = start(tmp_path, cluster, pager)
    faults = [alert("FlopWatchGpuXidCritical", node, xid="79") for node in ("node02", "node10")]
    try:
        fire(alertmanager, *faults)
        wait_for(lambda: {n: s for n, (s, _) in cluster.node_states().items() if "drain" in s} ==
                 {"node02": "drained", "node10": "drained"}, 30, "both nodes drained")
        fire(alertmanager, *faults, ends_in=0)          # the condition clears
        wait_for(lambda: cluster.node_states()["node02"][0] == "idle", 30, "node02 returned")
        wait_for(lambda: metric(remediator, "flopwatch_remediation_node_held", node="node10", why="lemon") == 1, 15,
                 "node10 held as a lemon")
        events = [(e["event"], e["node"]) for e in journal(tmp_path)]
    finally:
        remediator.stop()
        alertmanager.stop()
    assert cluster.node_states()["node10"] == ("drained", XID_REASON)
    order = [kind for kind, node in events if node == "node02"]
    assert order.index("cleared") < order.index("health_passed") < order.index("resume")
    assert ("resume", "node10") not in events


def test_dry_run_writes_the_plan_and_touches_nothing(
        tmp_path: Path, cluster: SlurmCluster, pager: WebhookReceiver) -> None:
    alertmanager, remediator = start(tmp_path, cluster, pager, dry_run=True)
    plan_path = tmp_path / "state" / "plan.json"
    try:
        fire(alertmanager, alert("FlopWatchGpuXidCritical", "node04", xid="79"))
        plan = wait_for(lambda: plan_path.exists() and json.loads(plan_path.read_text())["drains"] and
                        json.loads(plan_path.read_text()), 30, "a plan with a drain")
        dry = metric(remediator, "flopwatch_remediation_actions_total", node="node04", outcome="dry_run")
    finally:
        remediator.stop()
        alertmanager.stop()
    assert plan["dry_run"] is True
    assert plan["commands"] == [f'scontrol update NodeName=node04 State=DRAIN Reason="{XID_REASON}"']
    assert dry >= 1
    assert {s for s, _ in cluster.node_states().values()} == {"idle"}
    assert [e for e in journal(tmp_path) if e["event"] in ("intent", "drain")] == []


def wrapper(tmp_path: Path, cluster: SlurmCluster, body: str) -> Path:
    """A bin directory whose scontrol runs `body` (sh; $REAL is Slurm's scontrol, $LOG a call log)
    before Slurm's own; sinfo is Slurm's."""
    import shutil

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sinfo").symlink_to(shutil.which("sinfo"))
    script = bin_dir / "scontrol"
    script.write_text(f'#!/bin/sh\nREAL={shutil.which("scontrol")}\nLOG={tmp_path}/calls\nMARK={tmp_path}/mark\n'
                      f'echo "$*" >> $LOG\n{body}\nexec $REAL "$@"\n')
    script.chmod(0o755)
    return bin_dir


def real_drains(tmp_path: Path) -> int:
    path = tmp_path / "calls"
    return sum(line.startswith("REAL ") and "State=DRAIN" in line for line in path.read_text().splitlines()
               ) if path.exists() else 0


#: Where the first drain stops: before Slurm is told (the drain never happened), or after (it did,
#: but the journal never heard).
STOPS = {
    "before the scheduler": 'case "$*" in *State=DRAIN*) [ -e $MARK ] || { touch $MARK; sleep 60; }; esac\n'
                            'case "$*" in *State=DRAIN*) echo "REAL $*" >> $LOG; esac',
    "after the scheduler": 'case "$*" in *State=DRAIN*) echo "REAL $*" >> $LOG; [ -e $MARK ] || '
                           '{ $REAL "$@"; touch $MARK; sleep 60; }; esac',
}


@pytest.mark.parametrize("stop", sorted(STOPS))
def test_sigkill_mid_drain_and_restart_drains_once_and_agrees_with_slurm(
        tmp_path: Path, cluster: SlurmCluster, pager: WebhookReceiver, stop: str) -> None:
    bin_dir = wrapper(tmp_path, cluster, STOPS[stop])
    alertmanager, remediator = start(tmp_path, cluster, pager, slurm={"bin_dir": str(bin_dir)},
                                     command_timeout="2m")
    try:
        fire(alertmanager, alert("FlopWatchGpuXidCritical", "node07", xid="79"))
        wait_for((tmp_path / "mark").exists, 30, "the drain under way")
        remediator.kill()                                    # SIGKILL, its process group with it
        assert not [p for p in psutil.process_iter(["cmdline"]) if str(bin_dir) in " ".join(p.info["cmdline"] or [])], \
            "the cut-short scontrol must not outlive the service and finish behind the restart's back"
        remediator.restart()
        wait_for(lambda: cluster.node_states()["node07"] == ("drained", XID_REASON), 30, "node07 drained")
        wait_for(lambda: metric(remediator, "flopwatch_remediation_node_drained", node="node07") == 1, 10,
                 "the restarted remediator sees the drain")
        time.sleep(1)
        events = [e for e in journal(tmp_path) if e["node"] == "node07"]
    finally:
        remediator.stop()
        alertmanager.stop()
    assert real_drains(tmp_path) == 1, "Slurm must be told to drain exactly once"
    drains = [e for e in events if e["event"] == "drain"]
    assert len(drains) == 1 and drains[0].get("recovered", False) == (stop == "after the scheduler")
    assert [e["event"] for e in events].count("intent") == (2 if stop == "before the scheduler" else 1)


def test_webhook_refuses_strangers_and_bad_payloads_and_acts_on_nothing(
        tmp_path: Path, cluster: SlurmCluster, pager: WebhookReceiver) -> None:
    import base64
    import hashlib

    import bcrypt

    # Alertmanager sends a bearer token (its http_config.authorization); people and scripts basic auth.
    token = "tok-" + "7f" * 16
    web = tmp_path / "web.yml"
    web.write_text(yaml.safe_dump({"basic_auth_users": {"ops": bcrypt.hashpw(b"s3cret", bcrypt.gensalt(4)).decode()},
                                   "bearer_tokens": {"alertmanager": hashlib.sha256(token.encode()).hexdigest()}}))
    auth = "Basic " + base64.b64encode(b"ops:s3cret").decode()
    alertmanager, remediator = start(tmp_path, cluster, pager, http_config={
        "authorization": {"type": "Bearer", "credentials": token}}, web_config=str(web), max_body=4096)

    def post(body: bytes, authorization: str = auth) -> int:
        request = urllib.request.Request(remediator.url + "/alerts", body, method="POST",
                                         headers={"Authorization": authorization} if authorization else {})
        try:
            with urllib.request.urlopen(request, timeout=5) as answer:
                return answer.status
        except urllib.error.HTTPError as error:
            return error.code

    xid = json.dumps({"alerts": [{**alert("FlopWatchGpuXidCritical", "node08", xid="79"), "status": "firing"}]})
    try:
        before = metric(remediator, "flopwatch_remediation_webhook_requests_total", auth, code="401")  # readiness
        answers = {
            "no credentials": post(xid.encode(), ""),
            "wrong password": post(xid.encode(), "Basic " + base64.b64encode(b"ops:guess").decode()),
            "wrong token": post(xid.encode(), "Bearer " + token[:-1] + "0"),
            "not JSON": post(b"{not json"),
            "not a notification": post(b'{"alerts": "none"}'),
            "a bad alert": post(b'{"alerts": [{"status": "firing", "labels": {"node": "node08"}}]}'),
            "too large": post(b'{"alerts": []' + b" " * 8192 + b"}"),
        }
        time.sleep(1)
        refused = metric(remediator, "flopwatch_remediation_webhook_requests_total", auth, code="401") - before
        malformed = metric(remediator, "flopwatch_remediation_webhook_requests_total", auth, code="400")
        states = cluster.node_states()
        # Alertmanager, with its token, gets through
        fire(alertmanager, alert("FlopWatchGpuXidCritical", "node08", xid="79"))
        wait_for(lambda: cluster.node_states()["node08"][1] == XID_REASON, 30, "node08 drained")
    finally:
        remediator.stop()
        alertmanager.stop()
    assert answers == {"no credentials": 401, "wrong password": 401, "wrong token": 401, "not JSON": 400,
                       "not a notification": 400, "a bad alert": 400, "too large": 413}
    assert (refused, malformed) == (3, 3)
    assert {s for s, _ in states.values()} == {"idle"}, "a refused request must not act"


def test_unknown_nodes_and_failing_or_hanging_commands_are_counted_retried_and_paged(
        tmp_path: Path, cluster: SlurmCluster, pager: WebhookReceiver) -> None:
    bin_dir = wrapper(tmp_path, cluster, 'case "$*" in *node05*State=DRAIN*) echo broken >&2; exit 1; esac\n'
                                         'case "$*" in *node06*State=DRAIN*) exec sleep 30; esac')
    alertmanager, remediator = start(tmp_path, cluster, pager, slurm={"bin_dir": str(bin_dir)},
                                     command_timeout="1s", retries=2, backoff="1s")
    try:
        fire(alertmanager, *(alert("FlopWatchGpuXidCritical", n, xid="79") for n in ("node99", "node05", "node06")))
        failing = wait_for(lambda: len(pages(pager, "FlopWatchRemediationFailing")) == 3 and
                           pages(pager, "FlopWatchRemediationFailing"), 60, "three failing pages")
        counts = {outcome: metric(remediator, "flopwatch_remediation_actions_total", outcome=outcome)
                  for outcome in ("unknown_node", "failed", "timeout", "done")}
        attempts = [line for line in (tmp_path / "calls").read_text().splitlines() if "node06" in line]
    finally:
        remediator.stop()
        alertmanager.stop()
    assert sorted(a["labels"]["key"] for a in failing) == ["node05", "node06", "node99"]
    assert counts["unknown_node"] >= 2 and counts["failed"] >= 2 and counts["timeout"] >= 2
    assert counts["done"] == 0
    assert len(attempts) >= 2, "a timed-out command is retried"
    assert {s for s, _ in cluster.node_states().values()} == {"idle"}


def test_one_command_undoes_a_drain_and_the_same_alert_does_not_drain_again(
        tmp_path: Path, cluster: SlurmCluster, pager: WebhookReceiver) -> None:
    import subprocess
    import sys

    alertmanager, remediator = start(tmp_path, cluster, pager)
    config = tmp_path / "flopwatch.yml"

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "flopwatch", "remediate", *args, "--config", str(config)],
                              env=cluster.env, capture_output=True, text=True, timeout=60, check=False)

    try:
        fire(alertmanager, alert("FlopWatchGpuXidCritical", "node11", xid="79"))
        wait_for(lambda: cluster.node_states()["node11"] == ("drained", XID_REASON), 30, "node11 drained")
        status = cli("status")
        undo = cli("undo", "node11")
        refused = cli("undo", "node12")                 # not drained by FlopWatch: left alone, exit 1
        wait_for(lambda: metric(remediator, "flopwatch_remediation_node_held", node="node11") == 1, 15,
                 "the remediator holding node11 after the undo")
        after = cluster.node_states()["node11"]
    finally:
        remediator.stop()
        alertmanager.stop()
    assert status.returncode == 0 and status.stdout.strip() == f"node11\t{XID_REASON}"
    assert undo.returncode == 0, undo.stderr
    assert refused.returncode == 1 and "not drained by FlopWatch" in refused.stdout
    assert after == ("idle", "")
    assert [e["event"] for e in journal(tmp_path) if e["node"] == "node11"][-3:] == ["intent", "undo", "resume"]

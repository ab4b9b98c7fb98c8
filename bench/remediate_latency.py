"""Fault to drain: how long from a hardware fault on a GPU to its node showing drained in Slurm,
for the detection suite's faults that FlopWatch's shipped remediation policy drains for (faults
whose cause a `drain` alert of flopwatch/remediate/settings.py names: `xid` and `gpu_lost` in
flopwatch/detect/scenarios), as two measured parts and their sum:

1. Fault -> draining alert firing, in simulated time: the detection engine (flopwatch/detect, the
   engine of `flopwatch bench detect`) runs the suite's scenarios that hold such a fault through
   the real rules in a real Prometheus, cut 10 minutes after the last of those faults. The part is
   the fault's start to the first firing evaluation of an alert the policy drains for, on the
   fault's node (not merely its first alert). The engine evaluates each rule group at its own
   interval and applies `for:`, so this part already counts the wait for the group's evaluation
   (reported beside it, with `for:`); the suite's faults start on that evaluation grid, where a
   live Prometheus evaluates at a phase of its own: the same fault can fire up to one scrape
   interval later or up to one group interval earlier.
2. Alert firing -> drained, in wall time, all real on loopback: the alert, labelled as the rule
   labelled it, is posted to Alertmanager's `/api/v2/alerts` as Prometheus posts it (`startsAt` the
   firing evaluation, now), Alertmanager (flopwatch.stack) routes it with alerts/alertmanager.yml as
   shipped (waits included) to `flopwatch remediate run --execute` (its own process, reading
   Alertmanager back after each webhook as configured in docs/remediation.md), which drains the
   node in Slurm 22.05 (munged, slurmctld, one slurmd per node: flopwatch.stack.slurm). The clock
   stops when `sinfo` first shows the node draining with FlopWatch's reason for that alert.

Two wirings of the remediator into Alertmanager, each measured in its own round:
`documented`: the route docs/remediation.md shows (a first child route to the remediator,
`continue: true`, `group_wait` 10 s and `group_interval` 1m; the pager receivers point at a local
sink); `page`: every receiver's integrations
replaced by the remediator's webhook, as `flopwatch demo` does, so a page reaches it through the
page route (`group_wait` 10 s). Alerts of the fault's node still firing when its draining alert
fires are replayed before it at their offsets (they share its Alertmanager group); the suite's
faults have none.

Each round is a fresh Slurm cluster (three nodes per fault), Alertmanager and remediator (the
breaker opened wide; `reconcile_interval` 1h so that only the webhook path drains: with the
default 2m a reconcile that falls inside `group_wait` drains sooner). Every fault's alert is posted
together (one node each), so `group_wait` is paid once per round; `sinfo` is polled every
`--poll` seconds (the resolution, reported). Then, per fault, serially: the webhook alone (an
Alertmanager notification posted straight to the remediator, timed to the drain by back-to-back
sinfo), and the reference, the scheduler's own floor: `scontrol update ... State=DRAIN` run
directly, timed the same way.

Not measured: the scrape and Prometheus's send to Alertmanager (its notifier posts right after
the evaluation, as here), the remediator's periodic reconcile, a scheduler larger than 12 nodes.

    .venv/bin/python -m bench.remediate_latency --trials 3 --json /tmp/remediate_latency.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from flopwatch import resources, yamlfile
from flopwatch.commands import demo
from flopwatch.detect import detect
from flopwatch.detect import rules as rule_files
from flopwatch.detect.pages import AlertmanagerConfig
from flopwatch.detect.scoring import CAUSE_OF_ALERT
from flopwatch.remediate.alerts import Alert
from flopwatch.remediate.decide import reason
from flopwatch.remediate.settings import DEFAULT_ACTIONS
from flopwatch.sim.scenario import Scenario
from flopwatch.stack import Alertmanager, free_port, releases
from flopwatch.stack.remediator import RemediateProcess
from flopwatch.stack.servers import rfc3339
from flopwatch.stack.slurm import SlurmCluster
from flopwatch.stack.webhook import WebhookReceiver

#: The alerts the shipped policy drains a node for, and the fault causes they name.
DRAIN_ALERTS = tuple(sorted(alert for alert, action in DEFAULT_ACTIONS.items() if action == "drain"))
DRAIN_CAUSES = frozenset(CAUSE_OF_ALERT[alert] for alert in DRAIN_ALERTS)
#: Scenarios run on this long after the last such fault's start (its alerts fire within a minute).
CUT_AFTER_S = 600.0
WIRINGS = ("documented", "page")
#: The receiver docs/remediation.md names, and the route it puts first.
REMEDIATE_RECEIVER = "flopwatch-remediate"
#: The remediator's route as docs/remediation.md shows it (tests/test_bench_remediate_latency.py
#: checks that the two agree).
DOCUMENTED_ROUTE = {"receiver": REMEDIATE_RECEIVER, "continue": True, "group_wait": "10s", "group_interval": "1m"}
#: Prometheus's alert lifetime in a notification: 4 x max(resend delay 1m, evaluation interval).
ENDS_IN_S = 240.0
#: The longest replay of a node's earlier alerts before its draining alert.
MAX_REPLAY_S = 600.0
DRAIN_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class DrainFault:
    """One of the suite's faults that the shipped policy drains for, as the rules saw it."""

    scenario: str
    index: int
    kind: str
    node: str                      # the scenario's node
    target: str                    # "gpu 3", ...
    alert: str | None              # the first draining alert on the fault's node; None: none fired
    labels: dict[str, str] = field(default_factory=dict)   # its labels, as the rule produced them
    detection_s: float | None = None   # fault start -> that alert's first firing evaluation (simulated)
    first_alert_s: float | None = None  # fault start -> the first alert naming it (the suite's latency)
    interval_s: float | None = None    # the alert's rule group evaluation interval
    hold_s: float | None = None        # its `for:`
    before: tuple[tuple[float, dict[str, str]], ...] = ()  # the node's alerts firing then: (s before, labels)

    @property
    def name(self) -> str:
        xid = f" {self.labels['xid']}" if self.labels.get("xid") and self.kind == "xid" else ""
        return f"{self.scenario} {self.kind}{xid} ({self.node} {self.target})"


# -- part 1: detection -------------------------------------------------------------------------
def drain_scenario(scenario: Scenario) -> Scenario | None:
    """The scenario cut CUT_AFTER_S after its last fault the policy drains for; None without one."""
    starts = [f.start for f in scenario.faults if f.cause in DRAIN_CAUSES]
    if not starts:
        return None
    end = min(scenario.duration, max(starts) + CUT_AFTER_S)
    faults = [dataclasses.replace(f, end=min(f.end, end)) for f in scenario.faults if f.start < end]
    return dataclasses.replace(scenario, duration=end, faults=faults,
                               jobs=[j for j in scenario.jobs if j.start < end])


def detect_report(scenarios: Sequence[Scenario], rules: Path) -> dict[str, Any]:
    """The detection engine over the scenarios holding drain faults (cut): `bench detect`'s JSON."""
    cut = [s for s in map(drain_scenario, scenarios) if s is not None]
    if not cut:
        raise ValueError("no scenario holds a fault of a cause the policy drains for "
                         f"({', '.join(sorted(DRAIN_CAUSES))})")

    def progress(fraction: float, name: str) -> None:
        print(f"\rdetection: {name} {fraction:4.0%}", end="", file=sys.stderr, flush=True)

    report = detect.run_suite(cut, rules, progress=progress).as_dict()
    print(file=sys.stderr)
    return report


def drain_faults(report: Mapping[str, Any], rules: Sequence[rule_files.Rule]) -> list[DrainFault]:
    """Every fault of a drain cause in a detection report, with its first draining alert (the
    earliest true episode of a DRAIN_ALERTS alert on its node) and what else of that node fired."""
    alert_rules = {rule.name: rule for rule in rules if rule.kind == "alert"}
    found = []
    for scenario in report["scenarios"]:
        for fault in scenario["faults"]:
            if fault["cause"] not in DRAIN_CAUSES:
                continue
            base = DrainFault(scenario["scenario"], fault["index"], fault["kind"], fault["node"], fault["target"],
                              None, first_alert_s=fault.get("latency"))
            draining = sorted((e for e in scenario["episodes"] if e["fault"] == fault["index"] and e["true"]
                               and e["alertname"] in DRAIN_ALERTS and e["labels"].get("node") == fault["node"]),
                              key=lambda e: (e["fired_at"], e["alertname"]))
            if not draining:
                found.append(base)
                continue
            first = draining[0]
            at = first["fired_at"]
            before = tuple(sorted(
                ((at - e["fired_at"], e["labels"]) for e in scenario["episodes"]
                 if e is not first and e["labels"].get("node") == fault["node"] and e["fired_at"] <= at
                 and (e["resolved_at"] is None or e["resolved_at"] > at)),
                key=lambda item: -item[0]))
            rule = alert_rules.get(first["alertname"])
            found.append(dataclasses.replace(
                base, alert=first["alertname"], labels=dict(first["labels"]), detection_s=at - fault["start"],
                interval_s=rule.interval if rule else None, hold_s=rule.hold if rule else None, before=before))
    return found


# -- part 2: Alertmanager, the remediator and Slurm ----------------------------------------------
def _shipped_waits(route: dict[str, Any], shipped: Mapping[str, Any]) -> None:
    """Put back the waits alerts/alertmanager.yml gives each route (the demo cuts them to seconds)."""
    for key in ("group_wait", "group_interval", "repeat_interval"):
        if key in shipped:
            route[key] = shipped[key]
        else:
            route.pop(key, None)
    for child, shipped_child in zip(route.get("routes", []), shipped.get("routes", []), strict=True):
        _shipped_waits(child, shipped_child)


def alertmanager_config(wiring: str, remediate_url: str, pager_url: str) -> dict[str, Any]:
    """alerts/alertmanager.yml as shipped (routes, waits, inhibitions), its receivers' integrations
    replaced by local webhooks as `flopwatch demo` does: all by the remediator's (`page`), or all by
    a pager sink with the remediator's route of docs/remediation.md put first (`documented`)."""
    if wiring not in WIRINGS:
        raise ValueError(f"unknown wiring {wiring!r} (known: {', '.join(WIRINGS)})")
    config = demo.alertmanager_config(remediate_url if wiring == "page" else pager_url)
    shipped = yamlfile.load(resources.file("alerts", "alertmanager.yml"), "Alertmanager config")
    _shipped_waits(config["route"], shipped["route"])
    if wiring == "documented":
        config["route"].setdefault("routes", []).insert(0, dict(DOCUMENTED_ROUTE))
        config["receivers"].append({"name": REMEDIATE_RECEIVER, "webhook_configs": [{"url": remediate_url}]})
    return config


def remediator_wait(config: Mapping[str, Any], labels: Mapping[str, str], wiring: str) -> float:
    """Seconds of group_wait before Alertmanager notifies the remediator of an alert with these
    labels: its route's, inherited as Alertmanager does (flopwatch/detect/pages.py's routing)."""
    routes = AlertmanagerConfig.from_dict(dict(config)).route.match(labels)
    return min(r.group_wait for r in routes if wiring == "page" or r.receiver == REMEDIATE_RECEIVER)


def notification(labels: Mapping[str, str]) -> bytes:
    """One firing alert as Alertmanager's webhook (version 4) posts it."""
    alert = {"status": "firing", "labels": dict(labels), "annotations": {}, "startsAt": rfc3339(time.time()),
             "endsAt": "0001-01-01T00:00:00Z", "generatorURL": "",
             "fingerprint": f"{abs(hash(tuple(sorted(labels.items())))):016x}"}
    return json.dumps({"version": "4", "status": "firing", "receiver": "remediate", "groupKey": labels["node"],
                       "truncatedAlerts": 0, "groupLabels": {}, "commonLabels": alert["labels"],
                       "commonAnnotations": {}, "externalURL": "", "alerts": [alert]}).encode()


def until_drained(cluster: SlurmCluster, node: str, timeout: float = 30.0) -> tuple[float, int]:
    """(perf_counter when sinfo first shows the node draining or drained, sinfo calls made)."""
    deadline, calls = time.perf_counter() + timeout, 0
    while time.perf_counter() < deadline:
        state = cluster.client("sinfo", "--noheader", f"--nodes={node}", "--format=%T").strip()
        calls += 1
        if "drain" in state:
            return time.perf_counter(), calls
    raise RuntimeError(f"{node} not drained after {timeout:g}s")


def watch_drains(cluster: SlurmCluster, nodes: Sequence[str], poll: float,
                 timeout: float = DRAIN_TIMEOUT_S) -> tuple[dict[str, tuple[float, str]], list[float]]:
    """node -> (perf_counter when sinfo first showed it draining or drained, its reason), polling
    every node at once every `poll` seconds; and the time between polls."""
    seen: dict[str, tuple[float, str]] = {}
    gaps: list[float] = []
    deadline = last = time.perf_counter()
    deadline += timeout
    while len(seen) < len(nodes):
        states = cluster.node_states()
        now = time.perf_counter()
        gaps.append(now - last)
        last = now
        for node in nodes:
            if node not in seen and "drain" in states[node][0]:
                seen[node] = (now, states[node][1])
        if now > deadline:
            raise RuntimeError(f"not drained after {timeout:g}s: {', '.join(n for n in nodes if n not in seen)}")
        time.sleep(max(0.0, poll - (time.perf_counter() - now)))
    return seen, gaps[1:]


def expected_reason(labels: Mapping[str, str]) -> str:
    """The reason FlopWatch gives Slurm for a drain on this alert."""
    return reason(Alert(labels["alertname"], labels, True, 0.0))


def one_round(faults: Sequence[DrainFault], wiring: str, trial: int, poll: float) -> dict[str, Any]:
    """A fresh cluster (three nodes per fault), Alertmanager and remediator: every fault's alert
    through Alertmanager at once, then each through the webhook alone, then each reference."""
    nodes = [f"node{i:02d}" for i in range(1, 3 * len(faults) + 1)]
    routed, direct, reference = nodes[0::3], nodes[1::3], nodes[2::3]
    out: dict[str, Any] = {"alertmanager_s": {}, "webhook_s": {}, "scontrol_s": {}, "poll_gaps_s": [],
                           "sinfo_calls": [], "reasons": {}}
    with tempfile.TemporaryDirectory(prefix="remediate-bench-") as work, SlurmCluster(nodes) as cluster, \
            WebhookReceiver() as pager:
        port = free_port()
        config = alertmanager_config(wiring, f"http://127.0.0.1:{port}/alerts", pager.url)
        with Alertmanager(config) as alertmanager:
            settings = Path(work) / "flopwatch.yml"
            settings.write_text(yaml.safe_dump({"remediation": {
                "dry_run": False, "alertmanager": alertmanager.url, "state_dir": f"{work}/state",
                "reconcile_interval": "1h",
                "breaker": {"max_nodes": len(nodes), "partition_share": 1, "switch_share": 1}}}))
            remediator = RemediateProcess(settings, env={"SLURM_CONF": str(cluster.conf_path)}, port=port)
            remediator.start()   # ready once its first pass has read Alertmanager (/-/ready is 503 until then)
            try:
                starts = _fire(alertmanager, faults, routed)
                drained, gaps = watch_drains(cluster, routed, poll)
                out["poll_gaps_s"] = gaps
                for fault, node in zip(faults, routed, strict=True):
                    at, why = drained[node]
                    want = expected_reason({**fault.labels, "node": node})
                    if why != want:
                        raise RuntimeError(f"{node} drained, but not by FlopWatch for {fault.name}: {why!r}, "
                                           f"expected {want!r}")
                    out["alertmanager_s"][fault.name] = at - starts[node]
                    out["reasons"][fault.name] = why
                for fault, node in zip(faults, direct, strict=True):
                    request = urllib.request.Request(remediator.url + "/alerts",
                                                     notification({**fault.labels, "node": node}),
                                                     {"Content-Type": "application/json"})
                    start = time.perf_counter()
                    with urllib.request.urlopen(request, timeout=10):
                        pass
                    at, calls = until_drained(cluster, node)
                    out["webhook_s"][fault.name] = at - start
                    out["sinfo_calls"].append(calls)
            finally:
                remediator.stop()
        for fault, node in zip(faults, reference, strict=True):
            start = time.perf_counter()
            cluster.client("scontrol", "update", f"NodeName={node}", "State=DRAIN",
                           f"Reason=bench reference trial {trial}")
            at, _ = until_drained(cluster, node)
            out["scontrol_s"][fault.name] = at - start
    return out


def _fire(alertmanager: Alertmanager, faults: Sequence[DrainFault], nodes: Sequence[str]) -> dict[str, float]:
    """Replay each node's earlier alerts at their offsets, then post every draining alert (one
    request per fault, as separate evaluations send them); node -> perf_counter before its POST."""
    lead = max((offset for fault in faults for offset, _ in fault.before), default=0.0)
    if lead > MAX_REPLAY_S:
        raise ValueError(f"an alert fired {lead:g}s before its node's draining alert: longer than the "
                         f"{MAX_REPLAY_S:g}s this benchmark replays")
    schedule = sorted((lead - offset, node, labels) for fault, node in zip(faults, nodes, strict=True)
                      for offset, labels in fault.before)
    began = time.perf_counter()
    for at, node, labels in schedule:
        time.sleep(max(0.0, began + at - time.perf_counter()))
        alertmanager.post_alerts([{"labels": {**labels, "node": node}}], ENDS_IN_S)
    time.sleep(max(0.0, began + lead - time.perf_counter()))
    starts = {}
    for fault, node in zip(faults, nodes, strict=True):
        starts[node] = time.perf_counter()
        alertmanager.post_alerts([{"labels": {**fault.labels, "node": node}}], ENDS_IN_S)
    return starts


# -- the figure ------------------------------------------------------------------------------------
def summary(values: Sequence[float], scale: float = 1.0, digits: int = 2) -> dict[str, float]:
    return {"median": round(statistics.median(values) * scale, digits), "max": round(max(values) * scale, digits),
            "min": round(min(values) * scale, digits), "n": len(values)}


def compose(faults: Sequence[DrainFault], rounds: Mapping[str, Sequence[Mapping[str, Any]]]) -> dict[str, Any]:
    """Per fault: detection (simulated s) + Alertmanager to drained (wall s, per wiring) = fault to
    drain, each trial's sum summarised; the webhook alone and the scontrol reference in ms."""
    figures: dict[str, Any] = {"faults": [], "missed": [f.name for f in faults if f.alert is None], "all": {}}
    for fault in faults:
        if fault.alert is None:
            continue
        entry: dict[str, Any] = {
            "fault": fault.name, "alert": fault.alert, "labels": fault.labels, "detection_s": fault.detection_s,
            "first_alert_s": fault.first_alert_s, "eval_interval_s": fault.interval_s, "for_s": fault.hold_s,
            "replayed_before": len(fault.before), "wirings": {}}
        webhook, scontrol = [], []
        for wiring, trials in rounds.items():
            wall = [trial["alertmanager_s"][fault.name] for trial in trials]
            wait = remediator_wait(alertmanager_config(wiring, "http://remediate/", "http://pager/"),
                                   fault.labels, wiring)
            entry["wirings"][wiring] = {"group_wait_s": wait, "alertmanager_to_drained_s": summary(wall),
                                        "beyond_group_wait_s": summary([w - wait for w in wall], digits=3),
                                        "fault_to_drain_s": summary([fault.detection_s + w for w in wall])}
            webhook += [trial["webhook_s"][fault.name] for trial in trials]
            scontrol += [trial["scontrol_s"][fault.name] for trial in trials]
        entry["webhook_to_drained_ms"] = summary(webhook, 1000, 1)
        entry["scontrol_ms"] = summary(scontrol, 1000, 1)
        figures["faults"].append(entry)
    caught = [f for f in faults if f.alert is not None]
    for wiring, trials in rounds.items():
        waits = {f.name: entry["wirings"][wiring]["group_wait_s"] for f, entry in zip(caught, figures["faults"],
                                                                                         strict=True)}
        figures["all"][wiring] = {
            "fault_to_drain_s": summary([f.detection_s + t["alertmanager_s"][f.name] for f in caught for t in trials]),
            "alertmanager_to_drained_s": summary([t["alertmanager_s"][f.name] for f in caught for t in trials]),
            "beyond_group_wait_s": summary([t["alertmanager_s"][f.name] - waits[f.name] for f in caught
                                            for t in trials], digits=3)}
    every = [t for trials in rounds.values() for t in trials]
    figures["all"]["webhook_to_drained_ms"] = summary([v for t in every for v in t["webhook_s"].values()], 1000, 1)
    figures["all"]["scontrol_ms"] = summary([v for t in every for v in t["scontrol_s"].values()], 1000, 1)
    gaps = [g for t in every for g in t["poll_gaps_s"]]
    calls = [c for t in every for c in t["sinfo_calls"]]
    figures["sinfo_poll_ms"] = summary(gaps, 1000, 1) if gaps else None
    figures["sinfo_calls_to_see_a_direct_drain"] = (
        {"median": statistics.median(calls), "max": max(calls)} if calls else None)
    return figures


def table(figures: Mapping[str, Any], wirings: Sequence[str]) -> str:
    """The figures as the Markdown table of bench/RESULTS.md."""
    head = ["fault (scenario, node)", "draining alert", "detection (sim s)"]
    for wiring in wirings:
        head += [f"{wiring}: Alertmanager → drained, median (max) s", f"{wiring}: fault → drain, median (max) s"]
    head += ["webhook → drained, median (max) ms", "`scontrol` alone, median (max) ms"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * 2 + "---:|" * (len(head) - 2)]

    def pair(s: Mapping[str, float], unit: str = "") -> str:
        return f"{s['median']:g} ({s['max']:g}){unit}"

    for entry in figures["faults"]:
        row = [entry["fault"], f"`{entry['alert']}`", f"{entry['detection_s']:g}"]
        for wiring in wirings:
            w = entry["wirings"][wiring]
            row += [pair(w["alertmanager_to_drained_s"]), pair(w["fault_to_drain_s"])]
        row += [pair(entry["webhook_to_drained_ms"]), pair(entry["scontrol_ms"])]
        lines.append("| " + " | ".join(row) + " |")
    every = figures["all"]
    row = ["**all**", "", ""]
    for wiring in wirings:
        row += [pair(every[wiring]["alertmanager_to_drained_s"]), f"**{pair(every[wiring]['fault_to_drain_s'])}**"]
    row += [pair(every["webhook_to_drained_ms"]), pair(every["scontrol_ms"])]
    lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def server_version(program: str) -> str:
    """The first line of `program --version` in the release in force."""
    done = subprocess.run([releases.binary(program), "--version"], capture_output=True, text=True, timeout=30,
                          check=False)
    return (done.stdout or done.stderr).strip().splitlines()[0]


def run(trials: int, wirings: Sequence[str], poll: float, report: Mapping[str, Any],
        rules: Sequence[rule_files.Rule]) -> dict[str, Any]:
    faults = drain_faults(report, rules)
    caught = [f for f in faults if f.alert is not None]
    if not caught:
        raise RuntimeError("no fault of the report fired a draining alert: nothing to drain")
    load_start, started = os.getloadavg(), time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    rounds: dict[str, list[dict[str, Any]]] = {wiring: [] for wiring in wirings}
    for trial in range(trials):
        for wiring in wirings:
            rounds[wiring].append(one_round(caught, wiring, trial, poll))
    result = {"started": started, "finished": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
              "load_start": load_start, "load_end": os.getloadavg(), "trials": trials,
              "servers": releases.current(), "alertmanager": server_version("alertmanager"),
              "poll_s": poll, "detection_seconds": report.get("seconds"),
              "rules_sha256": report.get("rules_sha256"),
              **compose(faults, rounds)}
    return result


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    parser.add_argument("--trials", type=int, default=3, help="rounds per wiring (default 3)")
    parser.add_argument("--wiring", action="append", choices=WIRINGS,
                        help="the remediator's route in Alertmanager; repeatable (default: both)")
    parser.add_argument("--poll", type=float, default=0.05, help="seconds between sinfo polls (default 0.05)")
    parser.add_argument("--detect-json", type=Path,
                        help="take part 1 from this `flopwatch bench detect --json` output instead of running it")
    parser.add_argument("--scenarios", type=Path, help="scenario file or directory (default: the shipped suite)")
    parser.add_argument("--rules", type=Path, help="rule files (default: the shipped alerts/)")
    parser.add_argument("--servers", choices=releases.RELEASES, help="server release (default: FLOPWATCH_SERVERS)")
    parser.add_argument("--json", type=Path, help="write every figure here")
    args = parser.parse_args(argv)
    if args.trials < 1:
        parser.error("--trials: at least 1")
    if not 0 < args.poll <= 5:
        parser.error("--poll: between 0 and 5 seconds")
    if args.detect_json is not None and not args.detect_json.is_file():
        parser.error(f"--detect-json: {args.detect_json} is not a file")
    args.wiring = list(dict.fromkeys(args.wiring or WIRINGS))
    return args


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    load_before, began = os.getloadavg(), time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    with releases.use(args.servers or releases.current()):
        rules_path = args.rules or resources.folder("alerts")
        if args.detect_json is not None:
            report = json.loads(args.detect_json.read_text())
        else:
            report = detect_report(detect.load_suite(args.scenarios or resources.folder("scenarios")), rules_path)
        rules = rule_files.load(rules_path, 5.0).rules
        result = {"began": began, "load_before_detection": load_before,
                  **run(args.trials, args.wiring, args.poll, report, rules)}
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    print(table(result, args.wiring))
    print(f"load {result['load_before_detection'][0]:.2f} (detection), {result['load_start'][0]:.2f} (rounds) -> "
          f"{result['load_end'][0]:.2f}; {result['began']}, rounds {result['started']} - "
          f"{result['finished']}, Alertmanager {result['alertmanager']} ({result['servers']}), "
          f"sinfo poll {result['sinfo_poll_ms']} ms")


if __name__ == "__main__":
    main()

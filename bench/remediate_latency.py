"""Fault to drain: how long `flopwatch remediate run --execute` takes from an Alertmanager
notification posted to its webhook to the node showing drained in a real Slurm (22.05 on loopback,
flopwatch.stack.slurm), for the detection suite's hardware faults that page. The reference, in
the same run and on the same cluster, is the scheduler's own floor: `scontrol update ... State=DRAIN`
run directly, timed the same way to the same sinfo answer.

    .venv/bin/python -m bench.remediate_latency --trials 5 --json /tmp/remediate_latency.json

Each trial is a round on a fresh cluster of eight idle nodes and a fresh remediator (a node
FlopWatch drained is not drained again; the breaker is opened wide so that it never holds one
back): for each fault, the clock starts just before the POST and stops when
`sinfo --nodes=<node>` first shows a drain state; then the reference drains another node. sinfo
is polled back to back, so the resolution is one sinfo call (reported), the same for both.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
import urllib.request
from pathlib import Path

import yaml

from flopwatch.stack import free_port
from flopwatch.stack.remediator import RemediateProcess
from flopwatch.stack.slurm import SlurmCluster

#: The detection suite's paging hardware faults (flopwatch/detect/scenarios: xid 48, xid 94,
#: gpu_lost, whose XID 79 also pages as FlopWatchGpuXidCritical), as the alerts that drain.
FAULTS: dict[str, dict[str, str]] = {
    "XID 79 (GPU fallen off the bus)": {"alertname": "FlopWatchGpuXidCritical", "gpu": "3", "xid": "79"},
    "XID 48 (double-bit ECC)": {"alertname": "FlopWatchGpuXidCritical", "gpu": "1", "xid": "48"},
    "XID 94 (contained ECC)": {"alertname": "FlopWatchGpuXidCritical", "gpu": "2", "xid": "94"},
    "GPU lost": {"alertname": "FlopWatchGpuLost", "gpu": "4"},
}


def notification(labels: dict[str, str], node: str) -> bytes:
    """One firing alert as Alertmanager's webhook (version 4) posts it."""
    now = time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime())
    alert = {"status": "firing", "labels": {**labels, "node": node, "severity": "page"}, "annotations": {},
             "startsAt": now, "endsAt": "0001-01-01T00:00:00Z", "generatorURL": "",
             "fingerprint": f"{abs(hash((node, labels['alertname']))):016x}"}
    return json.dumps({"version": "4", "status": "firing", "receiver": "remediate", "groupKey": node,
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


def one_round(trial: int, results: dict[str, dict[str, list[float]]], polls: list[float],
              poll_counts: list[int]) -> None:
    """A fresh cluster of two nodes per fault and a fresh remediator; one trial of every fault."""
    nodes = [f"node{i:02d}" for i in range(1, 2 * len(FAULTS) + 1)]
    free = iter(nodes)
    with tempfile.TemporaryDirectory(prefix="remediate-bench-") as work, SlurmCluster(nodes) as cluster:
        config = Path(work) / "flopwatch.yml"
        config.write_text(yaml.safe_dump({"remediation": {
            "dry_run": False, "state_dir": f"{work}/state", "reconcile_interval": "1h",
            "breaker": {"max_nodes": len(nodes), "partition_share": 1, "switch_share": 1}}}))
        remediator = RemediateProcess(config, env={"SLURM_CONF": str(cluster.conf_path)}, port=free_port())
        remediator.start()
        try:
            for name, labels in FAULTS.items():
                node = next(free)
                body = notification(labels, node)
                start = time.perf_counter()
                request = urllib.request.Request(remediator.url + "/alerts", body, {"Content-Type": "application/json"})
                with urllib.request.urlopen(request, timeout=10):
                    answered = time.perf_counter()
                drained, calls = until_drained(cluster, node)
                reason = cluster.node_states()[node][1]
                if not reason.startswith(f"flopwatch: {labels['alertname']}"):
                    raise RuntimeError(f"{node} drained, but not by FlopWatch for {name}: {reason!r}")
                entry = results.setdefault(name, {"flopwatch_s": [], "webhook_answer_s": [], "scontrol_s": []})
                entry["flopwatch_s"].append(drained - start)
                entry["webhook_answer_s"].append(answered - start)
                polls.append((drained - answered) / calls)
                poll_counts.append(calls)
                node = next(free)          # the reference, interleaved: the scheduler alone
                start = time.perf_counter()
                cluster.client("scontrol", "update", f"NodeName={node}", "State=DRAIN",
                               f"Reason=bench reference trial {trial}")
                drained, _ = until_drained(cluster, node)
                entry["scontrol_s"].append(drained - start)
        finally:
            remediator.stop()


def run(trials: int) -> dict[str, object]:
    load_start = os.getloadavg()
    results: dict[str, dict[str, list[float]]] = {}
    polls: list[float] = []
    poll_counts: list[int] = []
    for trial in range(trials):
        one_round(trial, results, polls, poll_counts)
    load_end = os.getloadavg()

    def summary(values: list[float]) -> dict[str, float]:
        return {"median_ms": round(statistics.median(values) * 1000, 1), "max_ms": round(max(values) * 1000, 1),
                "min_ms": round(min(values) * 1000, 1)}

    return {"trials": trials, "nodes_per_cluster": 2 * len(FAULTS), "load_start": load_start, "load_end": load_end,
            "sinfo_poll_ms": round(statistics.median(polls) * 1000, 1),
            "sinfo_calls_to_see_the_drain": {"median": statistics.median(poll_counts), "max": max(poll_counts)},
            "faults": {name: {key: summary(values) for key, values in entry.items()}
                       for name, entry in results.items()},
            "all": {key: summary([v for entry in results.values() for v in entry[key]])
                    for key in ("flopwatch_s", "webhook_answer_s", "scontrol_s")}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=5, help="trials per fault (two nodes each)")
    parser.add_argument("--json", type=Path, help="write the results here too")
    args = parser.parse_args()
    result = run(args.trials)
    text = json.dumps(result, indent=1)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()

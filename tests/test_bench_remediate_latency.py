"""bench/remediate_latency.py without servers: which faults and alerts it takes from a detection
report, the Alertmanager wirings it builds from the shipped config, and how the figure is
composed from its parts (injected, no timing)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from helpers import usage_error

from bench import remediate_latency as bench
from flopwatch.detect.rules import Rule
from flopwatch.remediate.alerts import from_webhook
from flopwatch.sim.scenario import load

SUITE = bench.resources.folder("scenarios")
RULES = [Rule("alert", "FlopWatchGpuXidCritical", "x", 15.0), Rule("alert", "FlopWatchGpuLost", "x", 15.0, 30.0),
         Rule("record", "node_gpu:flopwatch_gpu_up:max", "x", 15.0)]


def episode(name: str, node: str, fired: float, fault: int | None, *, true: bool = True,
            resolved: float | None = None, **labels: str) -> dict:
    return {"alertname": name, "labels": {"alertname": name, "node": node, **labels}, "fired_at": fired,
            "resolved_at": resolved, "located": True, "true": true, "fault": fault, "names_culprit": true}


def fault(index: int, kind: str, cause: str, node: str, start: float, latency: float | None) -> dict:
    return {"index": index, "kind": kind, "cause": cause, "node": node, "target": "gpu 3", "start": start,
            "end": start + 120, "latency": latency}


REPORT = {"scenarios": [{
    "scenario": "s",
    "faults": [fault(0, "xid", "xid", "node0003", 100.0, 5.0),
               fault(1, "gpu_lost", "gpu_lost", "node0004", 200.0, 15.0),
               fault(2, "thermal_throttle", "thermal", "node0001", 300.0, 10.0),
               fault(3, "xid", "xid", "node0006", 400.0, None)],
    "episodes": [
        episode("FlopWatchGpuEccUncorrected", "node0003", 105.0, 0, gpu="3", severity="ticket"),
        episode("FlopWatchGpuXidCritical", "node0003", 115.0, 0, gpu="3", xid="48", severity="page"),
        episode("FlopWatchStraggler", "node0003", 90.0, None, true=False, resolved=100.0),   # over before it fired
        episode("FlopWatchGpuLost", "node0004", 245.0, 1, gpu="6", severity="page"),
        episode("FlopWatchGpuXidCritical", "node0004", 215.0, 1, gpu="6", xid="79", severity="page"),
        episode("FlopWatchGpuThrottled", "node0001", 310.0, 2, gpu="3", severity="ticket"),
        episode("FlopWatchGpuXidCritical", "node0006", 405.0, None, true=False, gpu="1", xid="48"),
    ]}]}


def test_the_drain_causes_are_the_shipped_policys() -> None:
    assert bench.DRAIN_ALERTS == ("FlopWatchGpuLost", "FlopWatchGpuRowRemapFailure", "FlopWatchGpuXidCritical")
    assert sorted(bench.DRAIN_CAUSES) == ["gpu_lost", "xid"]


def test_each_drain_fault_takes_its_first_draining_alert_and_what_its_node_fired_before() -> None:
    xid, lost, missed = bench.drain_faults(REPORT, RULES)
    assert (xid.alert, xid.detection_s, xid.first_alert_s, xid.interval_s, xid.hold_s) == (
        "FlopWatchGpuXidCritical", 15.0, 5.0, 15.0, 0.0)
    assert xid.labels == {"alertname": "FlopWatchGpuXidCritical", "node": "node0003", "gpu": "3", "xid": "48",
                          "severity": "page"}
    assert [(offset, labels["alertname"]) for offset, labels in xid.before] == [(10.0, "FlopWatchGpuEccUncorrected")]
    # XID 79 fires before FlopWatchGpuLost's `for:` is over: it is the one that drains, nothing before it
    assert (lost.alert, lost.labels["xid"], lost.detection_s, lost.before) == (
        "FlopWatchGpuXidCritical", "79", 15.0, ())
    assert lost.name == "s gpu_lost (node0004 gpu 3)" and xid.name == "s xid 48 (node0003 gpu 3)"
    # a false episode on the node does not count; a fault nothing drained is kept, as missed
    assert (missed.index, missed.alert, missed.detection_s) == (3, None, None)


def test_fault_to_drain_is_detection_plus_each_trials_alertmanager_to_drained() -> None:
    faults = bench.drain_faults(REPORT, RULES)
    xid, lost = faults[0].name, faults[1].name

    def trial(routed: float, webhook: float, scontrol: float) -> dict:
        return {"alertmanager_s": {xid: routed, lost: routed + 1}, "webhook_s": {xid: webhook, lost: webhook},
                "scontrol_s": {xid: scontrol, lost: scontrol}, "poll_gaps_s": [0.05, 0.07], "sinfo_calls": [3, 4]}

    rounds = {"documented": [trial(10.3, 0.02, 0.01), trial(10.5, 0.03, 0.01), trial(10.4, 0.04, 0.02)],
              "page": [trial(10.1, 0.02, 0.01), trial(10.4, 0.02, 0.01), trial(10.2, 0.02, 0.01)]}
    figures = bench.compose(faults, rounds)
    assert figures["missed"] == [faults[2].name]
    first = figures["faults"][0]
    assert first["fault"] == xid and first["detection_s"] == 15.0 and first["replayed_before"] == 1
    documented, page = first["wirings"]["documented"], first["wirings"]["page"]
    # the documented route has the page route's group_wait
    assert documented["group_wait_s"] == 10.0 and page["group_wait_s"] == 10.0
    assert documented["alertmanager_to_drained_s"] == {"median": 10.4, "max": 10.5, "min": 10.3, "n": 3}
    assert documented["fault_to_drain_s"] == {"median": 25.4, "max": 25.5, "min": 25.3, "n": 3}
    assert page["fault_to_drain_s"] == {"median": 25.2, "max": 25.4, "min": 25.1, "n": 3}
    assert page["beyond_group_wait_s"]["median"] == pytest.approx(0.2)
    assert first["webhook_to_drained_ms"] == {"median": 20.0, "max": 40.0, "min": 20.0, "n": 6}
    assert first["scontrol_ms"]["max"] == 20.0
    every = figures["all"]
    assert every["page"]["fault_to_drain_s"] == {"median": 25.75, "max": 26.4, "min": 25.1, "n": 6}
    assert every["documented"]["alertmanager_to_drained_s"]["max"] == 11.5
    assert every["documented"]["beyond_group_wait_s"]["max"] == pytest.approx(1.5)
    assert figures["sinfo_poll_ms"]["median"] == 60.0 and figures["sinfo_calls_to_see_a_direct_drain"]["max"] == 4
    table = bench.table(figures, ["documented", "page"])
    row = f"| {xid} | `FlopWatchGpuXidCritical` | 15 | 10.4 (10.5) | 25.4 (25.5) | 10.2 (10.4) | 25.2 (25.4) |"
    assert row in table


def test_the_wirings_keep_the_shipped_routes_and_waits_and_send_nothing_off_the_machine() -> None:
    documented = bench.alertmanager_config("documented", "http://127.0.0.1:1/alerts", "http://127.0.0.1:2/")
    first = documented["route"]["routes"][0]
    assert first == {**bench.DOCUMENTED_ROUTE, "group_wait": "10s", "group_interval": "1m", "continue": True}
    # the route docs/remediation.md tells users to add, key for key
    docs = (Path(__file__).resolve().parents[1] / "docs" / "remediation.md").read_text()
    snippet = yaml.safe_load(docs.split("```yaml\n", 1)[1].split("```", 1)[0])
    assert snippet["route"]["routes"][0] == first
    assert (documented["route"]["group_wait"], documented["route"]["routes"][1]["group_wait"]) == ("30s", "10s")
    assert "group_wait" not in documented["route"]["routes"][2]   # the ticket route inherits, as shipped
    page = bench.alertmanager_config("page", "http://127.0.0.1:1/alerts", "http://127.0.0.1:2/")
    for config, urls in ((documented, {"http://127.0.0.1:1/alerts", "http://127.0.0.1:2/"}),
                         (page, {"http://127.0.0.1:1/alerts"})):
        integrations = {key for receiver in config["receivers"] for key in receiver if key.endswith("_configs")}
        assert integrations == {"webhook_configs"}
        assert {c["url"] for r in config["receivers"] for c in r["webhook_configs"]} == urls
    ticket = {"alertname": "FlopWatchGpuRowRemapFailure", "node": "n", "severity": "ticket"}
    assert bench.remediator_wait(page, ticket, "page") == 30.0
    assert bench.remediator_wait(documented, ticket, "documented") == 10.0
    with pytest.raises(ValueError, match="unknown wiring"):
        bench.alertmanager_config("pager", "http://127.0.0.1:1/", "http://127.0.0.1:2/")


def test_scenarios_are_cut_after_their_last_drain_fault() -> None:
    scenario = load(SUITE / "faults-64gpu-a.yml")
    cut = bench.drain_scenario(scenario)
    last = max(f.start for f in scenario.faults if f.cause in bench.DRAIN_CAUSES)
    assert cut is not None and cut.duration == last + bench.CUT_AFTER_S < scenario.duration
    assert [f.kind for f in cut.faults] == [f.kind for f in scenario.faults]
    assert all(f.end <= cut.duration for f in cut.faults)
    assert bench.drain_scenario(load(SUITE / "healthy-noise.yml")) is None


def test_the_webhook_notification_is_one_the_remediator_reads() -> None:
    labels = {"alertname": "FlopWatchGpuXidCritical", "node": "node02", "gpu": "3", "xid": "79", "severity": "page"}
    (alert,) = from_webhook(bench.notification(labels))
    assert alert.firing and dict(alert.labels) == labels
    assert bench.expected_reason(labels) == "flopwatch: FlopWatchGpuXidCritical GPU 3 XID 79"


@pytest.mark.parametrize(("argv", "says"), [
    (["--trials", "0"], "--trials: at least 1"),
    (["--poll", "0"], "--poll: between 0 and 5 seconds"),
    (["--detect-json", "/nonexistent.json"], "--detect-json: /nonexistent.json is not a file"),
    (["--wiring", "pager"], "invalid choice: 'pager'"),
])
def test_bad_input_is_one_line_and_exit_2(argv: list[str], says: str, monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    assert says in usage_error(bench.main, argv, monkeypatch, capsys)


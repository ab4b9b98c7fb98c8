"""The pure decision (flopwatch/remediate/decide.py): policy, idempotence, switch escalation, the
breaker, undo, hold-down, health check and lemon holds, from alerts and node states alone."""

from __future__ import annotations

from flopwatch.remediate.alerts import Alert
from flopwatch.remediate.decide import HALTED, SWITCH, decide, reason
from flopwatch.remediate.journal import History, history
from flopwatch.remediate.scheduler import NodeState
from flopwatch.remediate.settings import load
from flopwatch.topology.model import Fabric

NOW = 1_800_000_000.0
NODES = [f"n{i:02d}" for i in range(1, 13)]
FABRIC = Fabric.from_tree({"leaf1": NODES[:8], "leaf2": NODES[8:]}, {"spine": ["leaf1", "leaf2"]})
SETTINGS = load(None, {}, {"breaker.max_nodes": 4, "breaker.partition_share": 1, "breaker.switch_share": 1,
                          "return.hold_down": "1m", "return.health_check": "true"})


def xid(node: str, starts: float = NOW - 10, name: str = "FlopWatchGpuXidCritical") -> Alert:
    return Alert(name, {"alertname": name, "node": node, "gpu": "3", "xid": "79"}, True, starts)


def idle(**drained: str) -> dict[str, NodeState]:
    return {n: NodeState(n, n in drained, drained.get(n, ""), ("gpu",)) for n in NODES}


def test_a_policy_alert_drains_its_node_with_the_reason_text() -> None:
    plan = decide([xid("n03")], idle(), History(), SETTINGS, NOW, FABRIC)
    assert [(d.node, d.reason) for d in plan.drains] == [("n03", "flopwatch: FlopWatchGpuXidCritical GPU 3 XID 79")]


def test_alerts_outside_the_policy_and_the_silent_agent_never_act() -> None:
    ticket = Alert("FlopWatchGpuThrottled", {"alertname": "FlopWatchGpuThrottled", "node": "n01"}, True, NOW)
    silent = Alert("FlopWatchAgentDown", {"alertname": "FlopWatchAgentDown", "node": "n02"}, True, NOW)
    assert decide([ticket, silent], idle(), History(), SETTINGS, NOW, FABRIC).drains == []


def test_a_node_drained_already_by_flopwatch_or_a_person_gets_nothing() -> None:
    nodes = idle(n03="flopwatch: FlopWatchGpuLost GPU 1", n04="bad DIMM")
    plan = decide([xid("n03"), xid("n04")], nodes, History(), SETTINGS, NOW, FABRIC)
    assert plan.drains == [] and "someone else" in plan.holds["n04"]


def test_an_unknown_node_is_reported_not_drained() -> None:
    plan = decide([xid("nope")], idle(), History(), SETTINGS, NOW, FABRIC)
    assert plan.drains == [] and plan.unknown == ["nope"]


def test_most_of_a_leaf_failing_together_pages_the_switch_only() -> None:
    plan = decide([xid(n) for n in NODES[:5]] + [xid("n09")], idle(), History(), SETTINGS, NOW, FABRIC)
    assert [(p.name, p.key, p.nodes) for p in plan.pages] == [(SWITCH, "leaf1", tuple(NODES[:5]))]
    assert [d.node for d in plan.drains] == ["n09"]


def test_a_few_nodes_of_a_leaf_are_no_switch_fault() -> None:
    plan = decide([xid(n) for n in NODES[:3]], idle(), History(), SETTINGS, NOW, FABRIC)
    assert plan.pages == [] and len(plan.drains) == 3


def test_past_the_breaker_none_is_drained_and_the_page_lists_them() -> None:
    past = history([{"t": NOW - 600, "event": "drain", "node": "n10"},
                    {"t": NOW - 300, "event": "resume", "node": "n10"}])
    plan = decide([xid("n01"), xid("n02"), xid("n09"), xid("n11")], idle(), past, SETTINGS, NOW, FABRIC)
    assert plan.drains == [] and plan.halted
    assert [(p.name, p.nodes) for p in plan.pages] == [(HALTED, ("n01", "n02", "n09", "n11"))]


def test_drains_older_than_the_window_do_not_count() -> None:
    old = history([{"t": NOW - 7200, "event": "drain", "node": "n10"}])
    plan = decide([xid("n01"), xid("n02"), xid("n09"), xid("n11")], idle(), old, SETTINGS, NOW, FABRIC)
    assert len(plan.drains) == 4 and not plan.halted


def test_a_share_of_one_leaf_trips_the_breaker() -> None:
    strict = load(None, {}, {"breaker.switch_share": 0.5, "breaker.partition_share": 1, "escalation.min_nodes": 10})
    plan = decide([xid(n) for n in ("n09", "n10", "n11")], idle(), History(), strict, NOW, FABRIC)
    assert plan.halted and "leaf switch leaf2" in plan.pages[0].summary


def test_a_share_of_one_partition_trips_the_breaker() -> None:
    strict = load(None, {}, {"breaker.partition_share": 0.1})          # 10% of 12 nodes: one
    plan = decide([xid("n01"), xid("n09")], idle(), History(), strict, NOW, FABRIC)
    assert plan.halted and "partition gpu" in plan.pages[0].summary


def test_an_undo_holds_the_node_until_a_newer_alert() -> None:
    undone = history([{"t": NOW - 5, "event": "undo", "node": "n03"}])
    assert decide([xid("n03", starts=NOW - 10)], idle(), undone, SETTINGS, NOW, FABRIC).drains == []
    newer = decide([xid("n03", starts=NOW - 1)], idle(), undone, SETTINGS, NOW, FABRIC)
    assert [d.node for d in newer.drains] == ["n03"]


def test_return_waits_for_clearing_hold_down_and_a_passed_check() -> None:
    drained = idle(n03="flopwatch: FlopWatchGpuXidCritical GPU 3 XID 79")
    events = [{"t": NOW - 600, "event": "drain", "node": "n03"}]
    assert decide([], drained, history(events), SETTINGS, NOW, FABRIC).cleared == ["n03"]
    events.append({"t": NOW - 30, "event": "cleared", "node": "n03"})
    assert "hold-down" in decide([], drained, history(events), SETTINGS, NOW, FABRIC).holds["n03"]
    later = NOW + 60
    assert decide([], drained, history(events), SETTINGS, later, FABRIC).checks == ["n03"]
    events.append({"t": later, "event": "health_failed", "node": "n03"})
    assert decide([], drained, history(events), SETTINGS, later + 1, FABRIC).resumes == []
    events.append({"t": later + 5, "event": "health_passed", "node": "n03"})
    assert decide([], drained, history(events), SETTINGS, later + 6, FABRIC).resumes == ["n03"]


def test_a_firing_alert_again_resets_the_hold_down() -> None:
    drained = idle(n03="flopwatch: FlopWatchGpuXidCritical GPU 3 XID 79")
    events = [{"t": NOW - 600, "event": "drain", "node": "n03"}, {"t": NOW - 300, "event": "cleared", "node": "n03"}]
    plan = decide([xid("n03")], drained, history(events), SETTINGS, NOW, FABRIC)
    assert plan.recurred == ["n03"] and plan.drains == []


def test_a_lemon_stays_drained_by_the_reports_occasions_rule() -> None:
    drained = idle(n03="flopwatch: FlopWatchGpuXidCritical GPU 3 XID 79")
    twice = [{"t": NOW - 86400, "event": "drain", "node": "n03"}, {"t": NOW - 600, "event": "drain", "node": "n03"},
             {"t": NOW - 300, "event": "cleared", "node": "n03"}]
    assert "lemon" in decide([], drained, history(twice), SETTINGS, NOW, FABRIC).holds["n03"]
    # two drains within the report's one-hour gap are one occasion: no lemon
    close = [{"t": NOW - 1200, "event": "drain", "node": "n03"}, *twice[1:]]
    assert decide([], drained, history(close), SETTINGS, NOW, FABRIC).checks == ["n03"]


def test_reason_text_is_one_printable_line() -> None:
    evil = Alert("FlopWatchGpuLost", {"alertname": "FlopWatchGpuLost", "node": "n1", "gpu": '1"\nState=RESUME'},
                 True, NOW)
    text = reason(evil)
    assert text.startswith("flopwatch: FlopWatchGpuLost GPU 1") and "\n" not in text and '"' not in text

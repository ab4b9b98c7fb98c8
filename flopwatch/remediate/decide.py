"""The decision, pure: firing alerts + each node's scheduler state + the journal's history -> what
to do. No scheduler, clock or network here, so every rule is tested on its own
(tests/test_remediate_decide.py). In order:

1. Alerts the policy maps to `drain` name their node (`node` label); FlopWatch's silent-agent
   alerts never act. A node the scheduler does not know is reported (`unknown`), never acted on.
2. A node already drained by FlopWatch gets nothing more (idempotent); one drained by someone
   else is left alone; an undo holds a node until an alert that started after it.
3. Escalation: when at least `escalation.min_nodes` nodes and `escalation.switch_share` of one
   leaf switch's nodes fail together, the switch is paged and none of its nodes is drained.
4. The breaker: if the drains left would take the drains of the last `breaker.window` past
   `breaker.max_nodes`, or past `breaker.partition_share` of a partition or `breaker.switch_share`
   of a leaf, none is done and "remediation halted" is paged with the nodes it would have drained.
5. Return: a node FlopWatch drained whose alerts have all cleared waits `return.hold_down`, then
   needs a passed health check, then is resumed; a lemon (drained on `return.lemon_occasions`
   separate occasions in `return.lemon_window`, the report's rule) stays drained.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from flopwatch.remediate.alerts import Alert, Page
from flopwatch.remediate.journal import History
from flopwatch.remediate.scheduler import REASON_PREFIX, NodeState
from flopwatch.remediate.settings import SILENT_AGENT_ALERTS, Settings
from flopwatch.report.incidents import Incident, occasions
from flopwatch.topology.model import Fabric

HALTED = "FlopWatchRemediationHalted"
SWITCH = "FlopWatchRemediationSwitchSuspected"
FAILING = "FlopWatchRemediationFailing"
MAX_REASON = 120


@dataclass(frozen=True)
class Drain:
    node: str
    reason: str


@dataclass
class Plan:
    drains: list[Drain] = field(default_factory=list)
    resumes: list[str] = field(default_factory=list)
    checks: list[str] = field(default_factory=list)        # health checks to run now
    cleared: list[str] = field(default_factory=list)       # drained nodes whose alerts just cleared
    recurred: list[str] = field(default_factory=list)      # cleared nodes whose alerts fire again
    pages: list[Page] = field(default_factory=list)
    holds: dict[str, str] = field(default_factory=dict)    # node -> why nothing is done now
    unknown: list[str] = field(default_factory=list)       # nodes in alerts the scheduler does not know
    halted: bool = False

    def as_dict(self) -> dict[str, object]:
        return {"drains": [{"node": d.node, "reason": d.reason} for d in self.drains], "resumes": self.resumes,
                "checks": self.checks, "holds": self.holds, "unknown": self.unknown, "halted": self.halted,
                "pages": [{"alertname": p.name, "key": p.key, "summary": p.summary, "nodes": list(p.nodes)}
                          for p in self.pages]}


def reason(alert: Alert) -> str:
    """`flopwatch: <alert> GPU <n> <what>`, the text the scheduler shows beside the node."""
    labels = alert.labels
    what = f"XID {labels['xid']}" if labels.get("xid") else labels.get("reason", "")
    parts = [REASON_PREFIX, alert.name]
    if labels.get("gpu"):
        parts += ["GPU", labels["gpu"]]
    if what:
        parts.append(what)
    text = " ".join(parts)
    return "".join(ch if ch.isprintable() and ch not in "\"'" else " " for ch in text)[:MAX_REASON]


def failing_nodes(alerts: Iterable[Alert], settings: Settings) -> dict[str, Alert]:
    """node -> its earliest firing alert that the policy drains for."""
    found: dict[str, Alert] = {}
    for alert in sorted(alerts, key=lambda a: (a.starts_at, a.name, a.key)):
        if (alert.firing and alert.node and alert.name not in SILENT_AGENT_ALERTS
                and settings.action(alert.name) == "drain"):
            found.setdefault(alert.node, alert)
    return found


def decide(alerts: Sequence[Alert], nodes: Mapping[str, NodeState], history: History, settings: Settings,
           now: float, fabric: Fabric | None = None) -> Plan:
    plan = Plan()
    failing = failing_nodes(alerts, settings)
    candidates: dict[str, Drain] = {}
    for node, alert in failing.items():
        state = nodes.get(node)
        if state is None:
            plan.unknown.append(node)
        elif state.ours:
            if node in history.cleared_at:
                plan.recurred.append(node)
        elif state.drained:
            plan.holds[node] = f"drained by someone else ({state.reason or 'no reason'}): left alone"
        elif history.undone_at.get(node, -1.0) >= alert.starts_at:
            plan.holds[node] = "undone by an operator after this alert started: acting again only on a newer alert"
        else:
            candidates[node] = Drain(node, reason(alert))
    _escalate(plan, candidates, set(failing), fabric, settings)
    _breaker(plan, candidates, nodes, history, settings, now, fabric)
    _returns(plan, nodes, set(failing), history, settings, now)
    return plan


def _escalate(plan: Plan, candidates: dict[str, Drain], failing: set[str], fabric: Fabric | None,
              settings: Settings) -> None:
    """Page each leaf switch under which most nodes fail together; drain none of them."""
    if fabric is None:
        return
    for switch in sorted(s for s, info in fabric.switches.items() if info.level == "leaf"):
        under = fabric.nodes_under(switch)
        down = sorted(under & failing)
        if len(down) < settings["escalation.min_nodes"] or len(down) < settings["escalation.switch_share"] * len(under):
            continue
        for node in down:
            if candidates.pop(node, None) is not None:
                plan.holds[node] = f"its leaf switch {switch} is suspected: the switch is paged instead"
        plan.pages.append(Page(
            SWITCH, switch, f"{len(down)} of the {len(under)} nodes under leaf switch {switch} fail together",
            f"Suspect the switch {switch}, not its nodes: FlopWatch drained none of {', '.join(down)}.",
            tuple(down)))


def _share_exceeded(group: set[str], drained: set[str], share: float) -> bool:
    return bool(group) and len(group & drained) > share * len(group)


def _breaker(plan: Plan, candidates: dict[str, Drain], nodes: Mapping[str, NodeState], history: History,
             settings: Settings, now: float, fabric: Fabric | None) -> None:
    if not candidates:
        return
    since = now - settings["breaker.window"]
    recent = {node for node, t in history.drains if t >= since} | {n for n, s in nodes.items() if s.ours}
    after = recent | set(candidates)
    why = ""
    if len(after) > settings["breaker.max_nodes"]:
        why = (f"{len(after)} nodes drained within {settings['breaker.window']:g}s "
               f"(at most {settings['breaker.max_nodes']})")
    partitions = {p for n in after if n in nodes for p in nodes[n].partitions}
    for partition in sorted(partitions):
        group = {n for n, s in nodes.items() if partition in s.partitions}
        if not why and _share_exceeded(group, after, settings["breaker.partition_share"]):
            why = f"over {settings['breaker.partition_share']:.0%} of partition {partition} drained"
    for switch in sorted({leaf for n in after for leaf in (fabric.leaves_of(n) if fabric else ())}):
        if not why and _share_exceeded(fabric.nodes_under(switch) if fabric else set(), after,
                                       settings["breaker.switch_share"]):
            why = f"over {settings['breaker.switch_share']:.0%} of leaf switch {switch}'s nodes drained"
    if not why:
        plan.drains = [candidates[node] for node in sorted(candidates)]
        return
    plan.halted = True
    would = tuple(sorted(candidates))
    for node in would:
        plan.holds[node] = f"remediation halted: {why}"
    plan.pages.append(Page(HALTED, "breaker", f"Remediation halted: {why}",
                           f"FlopWatch drained none of the {len(would)} node(s) it would have drained: "
                           f"{', '.join(would)}. Drain them by hand if the faults are real.", would))


def lemon(node: str, history: History, settings: Settings, now: float) -> int:
    """The node's drain occasions in the lemon window when it is a lemon, else 0."""
    since = now - settings["return.lemon_window"]
    drains = [Incident("drain", "", node, t, t) for t in history.drain_times(node) if t >= since]
    count = len(occasions(drains))
    return count if count >= settings["return.lemon_occasions"] else 0


def _returns(plan: Plan, nodes: Mapping[str, NodeState], failing: set[str], history: History, settings: Settings,
             now: float) -> None:
    for node, state in sorted(nodes.items()):
        if not state.ours or node in failing:
            continue
        cleared = history.cleared_at.get(node)
        if cleared is None:
            plan.cleared.append(node)
            plan.holds[node] = "condition cleared: hold-down starts"
            continue
        if now - cleared < settings["return.hold_down"]:
            plan.holds[node] = f"hold-down: {settings['return.hold_down'] - (now - cleared):.0f}s left"
            continue
        count = lemon(node, history, settings, now)
        if count:
            plan.holds[node] = f"lemon: drained on {count} separate occasions; return it by hand"
            continue
        if not settings["return.health_check"] and not settings["return.agent"]:
            plan.holds[node] = "no health check configured: return it by hand"
            continue
        checked = history.health.get(node)
        if checked is None or (not checked[1] and now - checked[0] >= settings["return.hold_down"]):
            plan.checks.append(node)
        elif checked[1]:
            plan.resumes.append(node)
        else:
            plan.holds[node] = "health check failed: tried again after the hold-down"

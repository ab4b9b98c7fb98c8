"""Scoring of fabric faults (switch_degrade, uplink_slow, spine_degrade, cable_flap) and pages per fault: the
parts of scoring.py (whose docstring gives the definitions) that know switches and Alertmanager.
"""

from __future__ import annotations

from typing import Any

from flopwatch.detect.pages import Alert, AlertmanagerConfig, incidents
from flopwatch.detect.score_records import ScenarioScore

#: Faults of a switch, an uplink or a spine (named by a `switch` label), and of one cable.
SWITCH_KINDS = {"switch_degrade", "uplink_slow", "spine_degrade"}
FABRIC_KINDS = SWITCH_KINDS | {"cable_flap"}
#: Switch, uplink and cable faults must be named within this.
FABRIC_LATENCY_TARGET_S = 60.0


def switch_match(fault: dict[str, Any], labels: dict[str, str]) -> tuple[bool, bool]:
    """(consistent, names) of an episode located at a switch, for a switch or uplink fault: the
    switch must be the fault's, and an `uplink` label the fault's uplink. Without one it names an
    uplink fault by its leaf: where a leaf has several uplinks, host-side counters cannot tell
    which one is slow (the alert lists them instead). Under a spine fault, an alert on one of its
    leaves (their uplinks, which the spine slows) is a true symptom that names nothing."""
    if fault["kind"] == "spine_degrade" and labels["switch"] in (fault.get("leaves") or ()):
        return True, False
    if fault["kind"] not in SWITCH_KINDS or fault.get("switch") != labels["switch"]:
        return False, False
    if "uplink" in labels and labels["uplink"] != (fault.get("uplink") or ""):
        return False, False
    return True, True


def port_match(fault: dict[str, Any], labels: dict[str, str]) -> tuple[bool, bool]:
    """A node or port episode under a faulted switch: a symptom, consistent when on its ports."""
    ports = fault.get("ports") or []
    node = labels["node"]
    if "device" in labels:
        return [node, labels["device"]] in ports, False
    return any(p[0] == node for p in ports), False


def job_hit(fault: dict[str, Any], job: str | None) -> bool:
    return job is None or fault["job_id"] == job or job in (fault.get("jobs") or ())


def count_pages(score: ScenarioScore, config: AlertmanagerConfig, until: float) -> None:
    """Pages per fault and false pages: the episodes through Alertmanager's routing, grouping and
    inhibitions (pages.py), each incident charged to the faults of the episodes it carried."""
    alerts = [Alert(e.labels, e.fired_at, e.resolved_at, i) for i, e in enumerate(score.episodes)]
    found = incidents(alerts, config, until=until)
    per_fault = dict.fromkeys((f.index for f in score.faults), 0)
    false = 0
    for incident in found:
        charged = {score.episodes[i].fault for i in incident.alerts if score.episodes[i].true}
        charged.discard(None)
        false += not charged
        for index in charged:
            per_fault[index] = per_fault.get(index, 0) + 1
    for fault in score.faults:
        fault.pages = per_fault.get(fault.index, 0)
    score.max_pages_per_fault = max((f.pages or 0 for f in score.faults), default=0)
    score.false_pages = false


def page_figures(scores: list[ScenarioScore]) -> dict[str, Any]:
    """Pages per fault over the run (None where no Alertmanager config was given)."""
    counted = [f.pages for s in scores for f in s.faults if f.pages is not None]
    false = [s.false_pages for s in scores if s.false_pages is not None]
    return {"max_pages_per_fault": max(counted) if counted else None, "pages": sum(counted) if counted else None,
            "false_pages": sum(false) if false else None}


def fabric_targets(scores: list[ScenarioScore]) -> list[tuple[str, str, bool | None]]:
    """Switch, uplink and cable faults named in time, one page per switch fault, and no switch
    alert outside a switch fault on fabric scenarios."""
    fabric = [f for s in scores for f in s.faults if f.kind in FABRIC_KINDS]
    switch_pages = [f.pages for f in fabric if f.kind in SWITCH_KINDS and f.pages is not None]
    fabric_scores = [s for s in scores if s.fabric]
    healthy = sum(s.healthy_gpu_hours for s in fabric_scores)
    false_switch = sum(1 for s in fabric_scores for e in s.episodes
                       if not e.true and "switch" in e.labels and "node" not in e.labels)
    return [
        (f"switch, uplink and cable faults named by the right switch or link within "
               f"{FABRIC_LATENCY_TARGET_S:.0f} s", f"{sum(bool(f.within_target) for f in fabric)}/{len(fabric)}",
               all(f.within_target for f in fabric) if fabric else None),
        ("at most one page per switch or uplink fault (after the shipped inhibitions)",
               f"{max(switch_pages)} worst" if switch_pages else "not counted",
               max(switch_pages) <= 1 if switch_pages else None),
        (f"zero false switch alerts over >= 10,000 healthy GPU-hours of fabric scenarios ({healthy:,.0f} run)",
               str(false_switch), false_switch == 0 and healthy >= 10_000 if fabric_scores else None),
    ]


def fabric_target(fault: dict[str, Any]) -> str:
    """What a fabric fault names, for tables: its switch, uplink or cable."""
    if fault["kind"] == "cable_flap":
        return f"link {fault['device']} -> {fault['switch']}"
    if fault.get("uplink"):
        return f"uplink {fault['switch']} -> {fault['uplink']}"
    return f"{'spine' if fault['kind'] == 'spine_degrade' else 'switch'} {fault['switch']}"

"""The fabric rules' shape: the promtool cases are what their generator writes, per-port IB alerts
keep firing without topology and carry the switch with it, and Alertmanager holds a switch's port
alerts back on `equal: [switch]` (the cases themselves run in tests/test_rules.py with promtool)."""

from __future__ import annotations

import re
import runpy
from pathlib import Path

import yaml

ALERTS = Path(__file__).resolve().parents[1] / "alerts"
PORT_ALERTS = ("FlopWatchIbSymbolErrors", "FlopWatchIbLinkDowned", "FlopWatchIbLinkFlapping")


def _rules(name: str) -> dict[str, dict]:
    doc = yaml.safe_load((ALERTS / name).read_text())
    return {rule.get("alert") or rule["record"]: rule for group in doc["groups"] for rule in group["rules"]}


def test_promtool_cases_are_committed_as_generated() -> None:
    cases = runpy.run_path(str(ALERTS / "tests" / "fabric_cases.py"), run_name="fabric_cases")
    for out, ports in ((cases["OUT"], False), (cases["PORTS_OUT"], True)):
        assert out.read_text() == cases["render"](ports), "run python alerts/tests/fabric_cases.py"


def test_port_alerts_take_the_switch_where_known_and_fire_without_it() -> None:
    rules = _rules("flopwatch-network.yml")
    for name in PORT_ALERTS:
        expr = " ".join(rules[name]["expr"].split())
        assert "group_left (switch, level)" in expr and "flopwatch_fabric_link_info" in expr, name
        joined, _, fallback = expr.partition(" or on (node, device, port) ")
        assert fallback and fallback in joined, f"{name}: the port without topology must still alert"
        assert "{{ with $labels.switch }}" in rules[name]["annotations"]["summary"], name


def test_switch_alerts_inhibit_the_port_alerts_of_their_switch_only() -> None:
    config = yaml.safe_load((ALERTS / "alertmanager.yml").read_text())
    [rule] = [r for r in config["inhibit_rules"] if r.get("equal", [])[-1:] == ["switch"]
              and "FlopWatchIb" in r["target_matchers"][0]]
    source = re.fullmatch(r'alertname=~"(.+)"', rule["source_matchers"][0]).group(1)
    target = re.fullmatch(r'alertname=~"(.+)"', rule["target_matchers"][0]).group(1)
    fabric = _rules("flopwatch-fabric.yml")
    assert {a for a in fabric if a.startswith("FlopWatch") and re.fullmatch(source, a)} == {
        "FlopWatchSwitchDegraded", "FlopWatchUplinkDegraded"}
    assert all(re.fullmatch(target, name) for name in PORT_ALERTS)
    assert not re.fullmatch(target, "FlopWatchSwitchDegraded")  # never inhibits itself
    for name in ("FlopWatchSwitchDegraded", "FlopWatchUplinkDegraded"):
        assert "switch" in fabric[name]["annotations"]["summary"] and fabric[name]["labels"]["severity"] == "page"

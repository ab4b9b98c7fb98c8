"""Alertmanager's routing, grouping, inhibition and dedup as flopwatch.detect.pages replays them,
on hand-made alerts. tests/integration/test_fabric_pages.py holds the same counts to a real
Alertmanager."""

from __future__ import annotations

from pathlib import Path

import pytest

from flopwatch.detect.pages import (
    Alert,
    AlertmanagerConfig,
    AlertmanagerConfigError,
    incidents,
    pages_per_key,
    parse_duration,
    parse_matcher,
)

ROOT = Path(__file__).resolve().parents[1]
CONFIG = {
    "route": {"receiver": "ticket", "group_by": ["job_id", "node"], "group_wait": "30s", "group_interval": "5m",
              "routes": [{"receiver": "page", "matchers": ['severity="page"'], "group_wait": "10s",
                          "group_interval": "1m"},
                         {"receiver": "ticket", "matchers": ['severity="ticket"']}]},
    "receivers": [{"name": "page", "webhook_configs": [{"url": "http://127.0.0.1:1/", "send_resolved": True}]},
                  {"name": "ticket"}],
    "inhibit_rules": [{"source_matchers": ['alertname="SwitchDown"'], "target_matchers": ['alertname=~"Ib.*"'],
                       "equal": ["switch"]}],
}


def port_alert(node: int, at: float, end: float | None = None, switch: str = "leaf1", key=None) -> Alert:
    labels = {"alertname": "IbLinkFlapping", "severity": "page", "node": f"n{node:02d}", "device": "mlx5_0",
              "port": "1", "switch": switch}
    return Alert(labels, at, end, key if key is not None else f"port{node}")


def switch_alert(at: float, end: float | None = None, switch: str = "leaf1") -> Alert:
    return Alert({"alertname": "SwitchDown", "severity": "page", "switch": switch}, at, end, f"switch-{switch}")


def config(**changes) -> AlertmanagerConfig:
    return AlertmanagerConfig.from_dict({**CONFIG, **changes})


def test_a_switch_alert_firing_with_its_ports_pages_once_and_many_times_without_the_inhibition():
    alerts = [switch_alert(100)] + [port_alert(n, 100) for n in range(16)]
    found = incidents(alerts, config(), until=3600)
    assert [(i.opened_at, i.alerts) for i in found] == [(110, ["switch-leaf1"])]
    storm = incidents(alerts, config(inhibit_rules=[]), until=3600)
    assert len(storm) == 17 and {i.opened_at for i in storm} == {110}


def test_inhibition_needs_the_source_firing_at_the_flush_and_equal_labels():
    late_source = [port_alert(0, 100), switch_alert(120)]           # the port's group flushes at 110
    assert [i.alerts for i in incidents(late_source, config(), until=600)] == [["port0"], ["switch-leaf1"]]
    in_wait = [port_alert(0, 100), switch_alert(105)]               # the source fires inside group_wait
    assert [i.alerts for i in incidents(in_wait, config(), until=600)] == [["switch-leaf1"]]
    other_switch = [port_alert(0, 100, switch="leaf2"), switch_alert(100)]
    assert len(incidents(other_switch, config(), until=600)) == 2
    resolved_source = [switch_alert(100, 300), port_alert(0, 100)]  # muted until 300, then it pages
    found = incidents(resolved_source, config(), until=900)
    assert [(i.opened_at, i.alerts) for i in found] == [(110, ["switch-leaf1"]), (350, ["port0"])]


def test_alerts_of_one_group_share_a_page_and_a_group_that_resolved_pages_again():
    same_node = [Alert({"alertname": a, "severity": "page", "node": "n01"}, t, None, a)
                 for a, t in (("A", 100), ("B", 130))]
    [only] = incidents(same_node, config(), until=600)
    assert only.opened_at == 110 and only.alerts == ["A", "B"]   # B joins at the next group_interval flush
    again = [port_alert(0, 100, 200, key="first"), port_alert(0, 400, key="second")]
    assert [(i.opened_at, i.alerts) for i in incidents(again, config(), until=900)] == \
        [(110, ["first"]), (410, ["second"])]
    assert pages_per_key(incidents(again + same_node, config(), until=900)) == {"first": 1, "second": 1, "A": 1,
                                                                                 "B": 1}


def test_tickets_are_no_pages_but_still_inhibit():
    ticket_source = Alert({"alertname": "SwitchDown", "severity": "ticket", "switch": "leaf1"}, 100, None, "s")
    assert incidents([ticket_source, port_alert(0, 100)], config(), until=600) == []
    assert config().pager_receivers() == {"page"}


def test_an_alert_matching_both_sides_is_not_inhibited_by_one_that_does_too():
    rules = [{"source_matchers": ['severity="page"'], "target_matchers": ['severity="page"'], "equal": ["node"]}]
    twins = [Alert({"alertname": a, "severity": "page", "node": "n01", "x": a}, 100, None, a) for a in "AB"]
    cfg = config(inhibit_rules=rules, route={**CONFIG["route"], "group_by": ["x"]})
    assert len(incidents(twins, cfg, until=600)) == 2


def test_routes_continue_inherit_and_group_by_everything():
    route = {"receiver": "ticket", "group_by": ["..."], "group_wait": "0s", "routes": [
        {"receiver": "page", "matchers": ["severity=page"], "continue": True},
        {"receiver": "pager2", "match_re": {"severity": "pa.e"}}]}
    cfg = config(route=route)
    assert cfg.pager_receivers() == {"page", "pager2"}
    assert cfg.route.routes[0].group_wait == 0 and cfg.route.routes[0].group_by is None
    alerts = [Alert({"alertname": "X", "severity": "page", "i": str(i)}, 10, None, i) for i in range(3)]
    assert len(incidents(alerts, cfg, until=100)) == 6    # every label set its own group, at both receivers


def test_matchers_and_durations_parse_as_alertmanager_reads_them():
    assert parse_matcher('alertname=~"FlopWatch(Ib.*)"', "m").matches({"alertname": "FlopWatchIbLinkDowned"})
    assert not parse_matcher('alertname=~"Ib"', "m").matches({"alertname": "IbX"})   # anchored
    assert parse_matcher('switch=""', "m").matches({})                                # absent reads as empty
    assert parse_matcher("severity!=page", "m").matches({"severity": "ticket"})
    assert parse_duration("1h30m", "d") == 5400 and parse_duration("500ms", "d") == 0.5
    with pytest.raises(AlertmanagerConfigError, match="expected a matcher"):
        parse_matcher("no operator", "inhibit_rules[0].source_matchers")
    with pytest.raises(AlertmanagerConfigError, match=r"route\.group_wait: expected a duration"):
        config(route={**CONFIG["route"], "group_wait": "soon"})


def test_the_shipped_config_loads_with_its_inhibitions():
    shipped = AlertmanagerConfig.load(ROOT / "alerts" / "alertmanager.yml")
    assert shipped.pager_receivers() == {"page"} and shipped.inhibit_rules
    agent_down = Alert({"alertname": "FlopWatchAgentDown", "severity": "page", "node": "n01"}, 100, None, "down")
    straggler = Alert({"alertname": "FlopWatchStraggler", "severity": "page", "node": "n01", "job_id": "j"},
                      100, None, "straggler")
    assert [i.alerts for i in incidents([agent_down, straggler], shipped, until=600)] == [["down"]]

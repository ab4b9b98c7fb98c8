"""The lemon-switch table reads each shared fault's cause from the rules' `cause` label; the
recorded value only ranks causes that show together (flopwatch-fabric.yml)."""

from __future__ import annotations

from flopwatch.report.fabric import QUERY_NAMES, lemons
from flopwatch.report.fetch import Outcome, Results
from flopwatch.report.queries import Query
from flopwatch.report.window import Grid

GRID = Grid(end=3600.0, step=600.0, n=6)


def _range(switch: str, cause: str, rank: int, points: list[int]) -> dict:
    labels = {"cluster": "c1", "switch": switch, "level": "leaf", "cause": cause}
    return {"metric": labels, "values": [[GRID.first + i * GRID.step, str(rank)] for i in points]}


def _results(series: list[dict]) -> Results:
    results = Results()
    for name in QUERY_NAMES:
        results.outcomes[name] = Outcome(Query(name, name, "unused", "range" if name == "fabric_switch_faults"
                                               else "instant"), data=[])
    results.outcomes["fabric_switch_faults"].data = series
    return results


def test_the_strongest_cause_named_and_the_causes_stretches_joined() -> None:
    series = [_range("leaf1", "errors", 2, [1, 2, 3]), _range("leaf1", "flap", 3, [2]),
              _range("leaf2", "congestion", 1, [4])]
    found = {s.switch: s for s in lemons(_results(series), GRID, "cluster").switches}
    assert (found["leaf1"].cause, found["leaf1"].occasions, found["leaf1"].seconds) == ("flap", 1, 1800.0)
    assert (found["leaf2"].cause, found["leaf2"].occasions, found["leaf2"].seconds) == ("congestion", 1, 600.0)


def test_a_cause_the_report_never_heard_of_is_shown_as_the_rules_spell_it() -> None:
    found = lemons(_results([_range("spine3", "fec_margin", 5, [0, 5])]), GRID, "cluster").switches
    assert [(s.switch, s.cause, s.occasions) for s in found] == [("spine3", "fec_margin", 2)]

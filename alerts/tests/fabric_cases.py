"""Writes the templates of alerts/tests/fabric.yml and fabric-ports.yml: promtool cases for the
switch and uplink rules.

Run `python alerts/tests/fabric_cases.py`, then `flopwatch rules build --out alerts`, after changing
a case; tests/test_fabric_rules.py fails when a committed template differs from what this writes.
A fleet of 24 nodes, one NIC each, under three leaves of 8 (leaf1: n01-n08, leaf2: n09-n16, leaf3:
n17-n24) and one spine (or two: every leaf to both for the ECMP cases, leaf1 and leaf2 to spine1 and
leaf3 to spine2 for the spine case). The cases that check the per-port alerts of
flopwatch-network.yml beside them are in fabric-ports.yml, which loads that file too; fabric.yml
loads flopwatch-fabric.yml alone (promtool evaluates every loaded rule at every step). Every port
carries the simulator's healthy background (a symbol error every ~17 minutes, busy ports waiting 1%
of the time) unless a case says otherwise, and faults start at 6m: late enough for the hour-long
baselines (each port's usual waits, each job's step time), whose window ends 5 minutes back and
which exist from 5m15s, to stand on 2 minutes of healthy history a minute after the fault, and no
later, as promtool evaluates every rule at every 15 s step. The flapping cases, which read no
baseline (no waits, no jobs), put theirs at 2m. Checks are placed relative to the fault (`_at`);
those before it at the last evaluation before it, when the baselines are in place.
The expected texts are what the rules render; each case says in its name what it proves. Runbook
URLs, severities and the symbol-error threshold are the mixin's settings (`[[ runbooks ]]`, ...).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

import yaml

#: The templates of alerts/tests/fabric.yml and fabric-ports.yml in the rules mixin (`flopwatch rules
#: build --out alerts` renders them): runbook URL, severities and the symbol-error threshold are the
#: mixin's settings.
OUT = Path(__file__).resolve().parents[2] / "flopwatch" / "mixin" / "templates" / "tests" / "fabric.yml"
PORTS_OUT = OUT.with_name("fabric-ports.yml")
INTERVAL_S = 15
FAULT = 24                   # sample index of 6m
FLAP_FAULT = 8               # 2m: the flapping cases read no baseline (no waits, no jobs)
SAMPLES = FAULT + 57         # 0 .. 20m: the last check is 13 minutes after the fault
NODES = [f"n{i:02d}" for i in range(1, 25)]
LEAF = {node: f"leaf{i // 8 + 1}" for i, node in enumerate(NODES)}
RATE = 5e10                  # 400 Gb/s in bytes per second
BACKGROUND = {"symbol_error": 0.001, "xmit_wait": 2e5, "data": 1e10}
RUNBOOKS = "[[ runbooks ]]"
SYMBOLS = "[[ c.network.symbol_errors_per_hour | num ]]"
HOLD = "[[ c.fabric.cause_hold | words ]]"
FLAP_WINDOW = "[[ c.fabric.flap_window | words ]]"
WAIT_MULTIPLE = "[[ c.fabric.wait_fleet_multiple | num ]]"


@dataclass
class Port:
    """One port's rates (per second) before and after the fault."""

    symbol_error: tuple[float, float] = (BACKGROUND["symbol_error"],) * 2
    xmit_wait: tuple[float, float] = (BACKGROUND["xmit_wait"],) * 2
    rate: tuple[float, float] = (RATE, RATE)
    downs: tuple[int, ...] = ()      # sample indices at which the link went down
    end: int = SAMPLES               # sample index from which the port is healthy again


@dataclass
class Case:
    name: str
    ports: dict[str, Port] = field(default_factory=dict)
    jobs: dict[str, tuple[list[str], float]] = field(default_factory=dict)  # id -> nodes, slowdown
    spines: tuple[str, ...] = ("spine1",)
    parents: dict[str, tuple[str, ...]] = field(default_factory=dict)   # leaf -> its spines, else `spines`
    checks: list[dict] = field(default_factory=list)
    fault: int = FAULT               # sample index at which the fault starts


def _counter(before: float, after: float, steps: tuple[int, ...] = (), end: int = SAMPLES, fault: int = FAULT) -> str:
    values, total = [], 0.0
    for i in range(SAMPLES):
        values.append(total)
        total += (after if fault <= i < end else before) * INTERVAL_S + (1 if i + 1 in steps else 0)
    return " ".join(f"{v:.6g}" for v in values)


def _gauge(before: float, after: float, end: int = SAMPLES, fault: int = FAULT) -> str:
    text = f"{before:g}x{fault - 1} {after:g}x{end - fault - 1}"
    return text + (f" {before:g}x{SAMPLES - end - 1}" if end < SAMPLES else "")


def _series(case: Case) -> list[dict[str, str]]:
    out = []
    for node in NODES:
        at = f'node="{node}",device="mlx5_0",port="1",instance="{node}:9847",job="flopwatch"'
        p = case.ports.get(node, Port())
        out += [
            {"series": f'flopwatch_fabric_link_info{{{at},switch="{LEAF[node]}",level="leaf",rail="0"}}',
             "values": f"1x{SAMPLES - 1}"},
            {"series": f'flopwatch_nic_port_errors_total{{{at},counter="symbol_error"}}',
             "values": _counter(*p.symbol_error, end=p.end, fault=case.fault)},
            {"series": f'flopwatch_nic_xmit_wait_total{{{at}}}',
             "values": _counter(*p.xmit_wait, end=p.end, fault=case.fault)},
            {"series": f'flopwatch_nic_data_bytes_total{{{at},direction="tx"}}',
             "values": _counter(BACKGROUND["data"], BACKGROUND["data"])},
            {"series": f'flopwatch_nic_port_rate_bytes_per_second{{{at}}}',
             "values": _gauge(*p.rate, end=p.end, fault=case.fault)},
            {"series": f'flopwatch_nic_link_downed_total{{{at}}}', "values": _counter(0, 0, p.downs)},
        ]
    for leaf in sorted(set(LEAF.values())):
        for spine in case.parents.get(leaf, case.spines):
            out.append({"series": f'flopwatch_fabric_switch_info{{switch="{leaf}",level="leaf",parent="{spine}"}}',
                        "values": f"1x{SAMPLES - 1}"})
    for job_id, (nodes, slowdown) in case.jobs.items():
        for node in nodes:
            out.append({"series": f'job_id_gpu:flopwatch_gpu_job_info:max{{job_id="{job_id}",node="{node}",gpu="0"}}',
                        "values": f"1x{SAMPLES - 1}"})
        out.append({"series": f'job_id:flopwatch_step_seconds:mean1m{{job_id="{job_id}"}}',
                    "values": _gauge(1.0, 1.0 + slowdown, fault=case.fault)})
    return out


def _expect(name: str, labels: dict[str, str], summary: str, description: str) -> dict:
    return {"exp_labels": {"severity": "[[ sev.page ]]", **labels},
            "exp_annotations": {"summary": summary, "description": description,
                                "runbook_url": f"{RUNBOOKS}#{name.lower()}"}}


def _switch_text(leaf: str, shares: tuple[int, int, int, int], jobs: int | None) -> str:
    errors, rate, flap, wait = shares
    text = (f"{errors}% of the ports under {leaf} count symbol errors above {SYMBOLS}/hour, {rate}% run below "
            f"their usual rate, {flap}% went down in the last {FLAP_WINDOW} and {wait}% wait to transmit. "
            "A fault shared by this many ports at once is the switch (or its power, cooling, firmware), "
            "not the cables: every job with ranks below it communicates slower. Its ports' own alerts "
            "are held back while this fires; the fabric dashboard lists them.")
    return text + (f" Jobs slowed below it: {jobs}." if jobs else "")


def _at(offset_s: int, fault: int = FAULT) -> str:
    """The eval time `offset_s` seconds after the fault (before it when negative), as promtool reads it."""
    minutes, seconds = divmod(fault * INTERVAL_S + offset_s, 60)
    return f"{minutes}m" + (f"{seconds}s" if seconds else "")


def _check(at: str, alert: str, expected: list[dict]) -> dict:
    return {"eval_time": at, "alertname": alert, "exp_alerts": expected}


def _nodes(*numbers: int) -> list[str]:
    return [f"n{i:02d}" for i in numbers]


def cases() -> list[Case]:
    bad = (BACKGROUND["symbol_error"], 0.3)       # 1,080/hour from the fault on
    waiting = (BACKGROUND["xmit_wait"], 1e7)      # half the time waiting for credit
    uplink_jobs = {"inside": (_nodes(1, 2, 3, 4), 0.0), "across": (_nodes(5, 6, 7, 8, 9, 10, 11, 12), 0.2)}
    uplink_ports = {n: Port(xmit_wait=waiting) for n in _nodes(5, 6, 7, 8)}
    return [
        Case("a leaf degrading with errors under 4 of its 8 nodes pages once, within a minute, naming "
             "leaf1; one bad cable under leaf2 and the healthy background elsewhere do not",
             ports={**{n: Port(symbol_error=bad) for n in _nodes(1, 2, 3, 4)},
                    "n10": Port(symbol_error=(0.2, 0.2))},
             jobs={"a": (_nodes(1, 2, 3, 4, 5, 6, 7, 8), 0.2)},
             checks=[_check(_at(-15), "FlopWatchSwitchDegraded", []),
                     _check(_at(60), "FlopWatchSwitchDegraded", [_expect(
                         "FlopWatchSwitchDegraded", {"switch": "leaf1", "level": "leaf", "cause": "errors"},
                         "leaf switch leaf1 degraded (errors): 4 of its 8 ports, on n01, n02, n03, n04",
                         _switch_text("leaf1", (50, 0, 0, 0), 1))]),
                     _check(_at(60), "FlopWatchUplinkDegraded", []),
                     _check(_at(-15), "FlopWatchIbSymbolErrors", [_cable_n10()])]),
        Case("a leaf whose ports train at half rate (and wait for credit) pages as rate, not congestion",
             ports={n: Port(rate=(RATE, RATE / 2), xmit_wait=waiting) for n in _nodes(9, 10, 11, 12, 13)},
             checks=[_check(_at(60), "FlopWatchSwitchDegraded", [_expect(
                 "FlopWatchSwitchDegraded", {"switch": "leaf2", "level": "leaf", "cause": "rate"},
                 "leaf switch leaf2 degraded (rate): 5 of its 8 ports, on n09, n10, n11, n12, n13",
                 _switch_text("leaf2", (0, 62, 0, 62), None))])]),
        Case("links flapping on 3 nodes of a leaf page as one switch flap",
             ports={n: Port(downs=(FLAP_FAULT + 1, FLAP_FAULT + 5)) for n in _nodes(17, 18, 19)},
             fault=FLAP_FAULT,
             checks=[_check(_at(-15, FLAP_FAULT), "FlopWatchSwitchDegraded", []),
                     _check(_at(60, FLAP_FAULT), "FlopWatchSwitchDegraded", [_expect(
                         "FlopWatchSwitchDegraded", {"switch": "leaf3", "level": "leaf", "cause": "flap"},
                         "leaf switch leaf3 degraded (flap): 3 of its 8 ports, on n17, n18, n19",
                         _switch_text("leaf3", (0, 0, 38, 0), None))])]),
        Case("a leaf flapping every port (symbol errors first, flaps from the next minute) reads errors "
             "until its first flap, then flap (the errors alert ends: one alert at a time), and outlasts "
             "its ports' flapping alerts, which it holds back",
             ports={n: Port(symbol_error=(BACKGROUND["symbol_error"], 0.5), end=FLAP_FAULT + 24,
                            downs=tuple(range(FLAP_FAULT + 4, FLAP_FAULT + 25, 4))) for n in _nodes(17, 18, 19, 20)},
             fault=FLAP_FAULT,
             checks=[_check(_at(30, FLAP_FAULT), "FlopWatchSwitchDegraded", [_flap_alert("errors", 4, (50, 0))]),
                     _check(_at(90, FLAP_FAULT), "FlopWatchSwitchDegraded", [_flap_alert("flap", 4, (50, 50))]),
                     _check(_at(300, FLAP_FAULT), "FlopWatchSwitchDegraded", [_flap_alert("flap", 4, (50, 50))]),
                     _check(_at(780, FLAP_FAULT), "FlopWatchSwitchDegraded", [_flap_alert("flap", 0, (0, 0))]),
                     _check(_at(780, FLAP_FAULT), "FlopWatchIbLinkFlapping",
                            [_flapping_port(n, 3) for n in (17, 18, 19, 20)])]),
        Case("congestion that slows a job inside the leaf too is the switch, not its uplinks",
             ports={n: Port(xmit_wait=waiting) for n in _nodes(1, 2, 3, 4, 5, 6, 7, 8)},
             jobs={"inside": (_nodes(1, 2, 3, 4), 0.15), "across": (_nodes(5, 6, 7, 8, 9, 10, 11, 12), 0.2)},
             checks=[_check(_at(60), "FlopWatchSwitchDegraded", [_expect(
                 "FlopWatchSwitchDegraded", {"switch": "leaf1", "level": "leaf", "cause": "congestion"},
                 "leaf switch leaf1 degraded (congestion): 8 of its 8 ports, on n01, n02, n03, n04, n05, "
                 "n06, n07, n08", _switch_text("leaf1", (0, 0, 0, 100), 2))]),
                     _check(_at(60), "FlopWatchUplinkDegraded", [])]),
        Case("ports of leaf1 wait while the job crossing it slows and the job inside it does not: its "
             "one uplink, named, and no switch page",
             ports=uplink_ports, jobs=uplink_jobs,
             checks=[_check(_at(-15), "FlopWatchUplinkDegraded", []),
                     _check(_at(60), "FlopWatchUplinkDegraded", [_expect(
                         "FlopWatchUplinkDegraded", {"switch": "leaf1", "level": "leaf", "uplink": "spine1"},
                         "uplink of leaf leaf1 to spine1 degraded: 1 job(s) crossing it slowed, 4 of its 8 "
                         "ports waiting", _uplink_text())]),
                     _check(_at(60), "FlopWatchSwitchDegraded", []),
                     _check(_at(60), "FlopWatchSpineDegraded", [])]),
        Case("the same on a leaf with two uplinks (ECMP): the leaf is named, the summary lists both",
             ports=uplink_ports, jobs=uplink_jobs, spines=("spine1", "spine2"),
             checks=[_check(_at(60), "FlopWatchUplinkDegraded", [_expect(
                 "FlopWatchUplinkDegraded", {"switch": "leaf1", "level": "leaf"},
                 "uplink of leaf leaf1 to one of spine1, spine2 degraded: 1 job(s) crossing it slowed, 4 of "
                 "its 8 ports waiting", _uplink_text())])]),
        Case("most leaves of spine1 (leaf1 and leaf2, its only leaves) with congested uplinks at once "
             "page once, naming spine1, and their uplink alerts are held back",
             ports={n: Port(xmit_wait=waiting) for n in _nodes(5, 6, 7, 8, 9, 10, 11, 12)},
             jobs={"inside": (_nodes(1, 2, 3, 4), 0.0), "across": (_nodes(5, 6, 7, 8, 9, 10, 11, 12), 0.2)},
             spines=("spine1", "spine2"), parents={"leaf1": ("spine1",), "leaf2": ("spine1",), "leaf3": ("spine2",)},
             checks=[_check(_at(-15), "FlopWatchSpineDegraded", []),
                     _check(_at(60), "FlopWatchSpineDegraded", [_expect(
                         "FlopWatchSpineDegraded", {"switch": "spine1", "level": "spine", "spine": "spine1"},
                         "spine switch spine1 degraded: uplinks of 2 of its 2 leaves congested (leaf1, leaf2)",
                         _spine_text("spine1"))]),
                     _check(_at(60), "FlopWatchUplinkDegraded", []),
                     _check(_at(60), "FlopWatchSwitchDegraded", [])]),
        Case("the same where both leaves uplink to both spines (ECMP): the spines tie, none is named, "
             "each leaf's uplink alert lists both",
             ports={n: Port(xmit_wait=waiting) for n in _nodes(5, 6, 7, 8, 9, 10, 11, 12)},
             jobs={"inside": (_nodes(1, 2, 3, 4), 0.0), "across": (_nodes(5, 6, 7, 8, 9, 10, 11, 12), 0.2)},
             spines=("spine1", "spine2"),
             checks=[_check(_at(60), "FlopWatchSpineDegraded", []),
                     _check(_at(60), "FlopWatchUplinkDegraded", [_expect(
                         "FlopWatchUplinkDegraded", {"switch": leaf, "level": "leaf"},
                         f"uplink of leaf {leaf} to one of spine1, spine2 degraded: 1 job(s) crossing it slowed, "
                         "4 of its 8 ports waiting", _uplink_text(leaf)) for leaf in ("leaf1", "leaf2")])]),
        Case("ports of a heavy job waiting 6x the fleet's typical port all along, with a job slowing, are "
             "no congestion: each port against its own usual waits",
             ports={n: Port(xmit_wait=(1.2e6, 1.2e6)) for n in _nodes(1, 2, 3, 4, 5, 6, 7, 8)},
             jobs={"heavy": (_nodes(1, 2, 3, 4, 5, 6, 7, 8), 0.2)},
             checks=[_check(at, alert, []) for at in (_at(-15), _at(60))
                     for alert in ("FlopWatchSwitchDegraded", "FlopWatchUplinkDegraded")]),
        Case("the healthy background, two bad cables on one leaf and a job slowed for its own reasons "
             "give no switch or uplink alert",
             ports={n: Port(symbol_error=bad) for n in _nodes(3, 4)},
             jobs={"a": (_nodes(1, 2, 3, 4, 5, 6, 7, 8), 0.3)},
             checks=[_check(at, alert, []) for at in (_at(60), _at(240))
                     for alert in ("FlopWatchSwitchDegraded", "FlopWatchUplinkDegraded")]),
    ]


def _flap_alert(cause: str, shown: int, shares: tuple[int, int]) -> dict:
    """leaf3's one switch alert under `cause`: the ports its summary counts with that symptom
    (none once recovering) and the shares of ports erroring and flapping its description gives."""
    summary = (f"leaf switch leaf3 degraded ({cause}): {shown} of its 8 ports, on n17, n18, n19, n20"
               if shown else f"leaf switch leaf3 degraded ({cause}): no port shows it now (recovering; it did "
               f"in the last {HOLD})")
    return _expect("FlopWatchSwitchDegraded", {"switch": "leaf3", "level": "leaf", "cause": cause}, summary,
                   _switch_text("leaf3", (shares[0], 0, shares[1], 0), None))


def _flapping_port(number: int, downs: int) -> dict:
    """A port's own flapping page, with its switch so that the switch alert holds it back."""
    node = f"n{number:02d}"
    return {"exp_labels": {"severity": "[[ sev.page ]]", "node": node, "device": "mlx5_0", "port": "1",
                           "switch": "leaf3", "level": "leaf"},
            "exp_annotations": {
                "summary": f"{node} mlx5_0 port 1 (cable to leaf switch leaf3) is flapping ({downs} downs in 10m)",
                "description": f"InfiniBand port mlx5_0/1 on {node} went down {downs} times in the last 10 "
                               "minutes. Each flap stalls every collective crossing the link; take the port (or "
                               "node) out of service.",
                "runbook_url": f"{RUNBOOKS}#flopwatchiblinkflapping"}}


def _cable_n10() -> dict:
    """The one bad cable: a per-port ticket naming both ends (the node's port and its leaf)."""
    return {"exp_labels": {"severity": "[[ sev.ticket ]]", "node": "n10", "device": "mlx5_0", "port": "1",
                           "switch": "leaf2", "level": "leaf"},
            "exp_annotations": {
                "summary": f"n10 mlx5_0 port 1 (cable to leaf switch leaf2): 720 symbol errors/hour (limit {SYMBOLS})",
                "description": "InfiniBand port mlx5_0/1 on n10 counts 720 symbol errors per hour over the last "
                               f"2 minutes (for 1 minute), above the {SYMBOLS}/hour threshold (the IBTA specification "
                               "allows 120). A marginal cable or transceiver: retransmissions slow the job's "
                               "collectives and the link may go down.",
                "runbook_url": f"{RUNBOOKS}#flopwatchibsymbolerrors"}}


def _spine_text(spine: str) -> str:
    return (f"Ports under these leaves wait to transmit (over {WAIT_MULTIPLE}x the fleet's typical port) while jobs "
            "whose traffic leaves them run slower than their own baseline and jobs inside the leaves do not, on "
            f"most of the leaves below {spine} at once and on no other spine's as many: the spine (its ports, "
            "optics, power or routing), not one uplink. The leaves' own uplink alerts are held back while this "
            "fires; the fabric dashboard lists them.")


def _uplink_text(leaf: str = "leaf1") -> str:
    return (f"50% of the ports under leaf {leaf} wait to transmit (over {WAIT_MULTIPLE}x the fleet's typical port), "
            "jobs whose traffic leaves the leaf run slower than their own baseline (across +20%) and jobs "
            "inside the leaf do not: the leaf's links to the switches above it (an optic, a cable, a congested "
            "or misrouted spine port), not the leaf. The ports show no errors or rate drops.")


def _checks_ports(case: Case) -> bool:
    return any(check["alertname"].startswith("FlopWatchIb") for check in case.checks)


def render(ports: bool = False) -> str:
    """fabric.yml's template: the cases that check the switch and uplink alerts only, on
    flopwatch-fabric.yml alone; with `ports`, fabric-ports.yml's: the cases that check per-port alerts
    of flopwatch-network.yml too, on both files."""
    rule_files = ["../flopwatch-fabric.yml"] + (["../flopwatch-network.yml"] if ports else [])
    doc = {
        "rule_files": rule_files,
        "evaluation_interval": f"{INTERVAL_S}s",
        "tests": [{"name": c.name, "interval": f"{INTERVAL_S}s", "input_series": _series(c),
                   "alert_rule_test": c.checks} for c in cases() if _checks_ports(c) == ports],
    }
    header = "# Generated by alerts/tests/fabric_cases.py: edit the cases there and run it.\n"
    return header + yaml.safe_dump(doc, sort_keys=False, width=200)


if __name__ == "__main__":
    for out, ports in ((OUT, False), (PORTS_OUT, True)):
        out.write_text(render(ports))
        sys.stdout.write(f"wrote {out}\n")

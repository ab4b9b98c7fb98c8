"""The exact cross-check: a small scenario through `promtool test rules` (DESIGN.md).

Every sample the engine would write becomes a promtool input series (time 0 = scenario start,
one value per scrape, `_` where a series is absent, `stale` where it ends); every alert is asked
for at every evaluation step with `exp_alerts: []`, so promtool's failure output lists exactly what
was firing, with labels and templated annotations. promtool evaluates the rules itself (its own
`for:` handling included), so agreement with the engine checks the engine end to end.

promtool evaluates every group at the test file's one interval, and the groups in an order of its
own (map order: a different one each run) unless the file names one. So the rules go to promtool
as one group in the rule set's order (each recording rule after those it reads, as the engine
evaluates them) at the set's smallest interval, and the engine is compared running the same
schedule (`same_schedule`): the two must then agree exactly, step for step. promtool caps a query
at 10,000 samples: only small scenarios fit.
"""

from __future__ import annotations

import dataclasses
import math
import re
import struct
import subprocess
import tempfile
from collections import defaultdict
from pathlib import Path

import yaml

from flopwatch.detect.alerts import Episode
from flopwatch.detect.engine import PrometheusEngine, exact_nodes_for
from flopwatch.detect.remote_write import STALE_NAN_BITS
from flopwatch.detect.rules import Rule, RuleSet
from flopwatch.detect.sampler import FleetSampler, Recorder, keep_by
from flopwatch.durations import parse_duration
from flopwatch.sim.fleet import Fleet
from flopwatch.sim.scenario import Scenario
from flopwatch.stack import releases

_BLOCK = re.compile(r"alertname: (\S+), time: (\S+),\s*\n\s*exp:\[\s*\],\s*\n\s*got:\[(.*?)\n\s*\]", re.S)
_LABELS = re.compile(r"Labels:\{(.*?)\}\n")
_PAIR = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')
_ERROR = re.compile(r"\berror\b\s*[:=]|could not|failed to", re.I)


class PromtoolError(RuntimeError):
    """promtool could not run the test (bad rules, evaluation errors); carries its output."""


def _series_name(labels: tuple[tuple[str, str], ...]) -> str:
    pairs = dict(labels)
    name = pairs.pop("__name__")
    inner = ",".join(f'{k}="{v}"' for k, v in sorted(pairs.items()))
    return f"{name}{{{inner}}}"


def _value(value: float) -> str:
    if _is_stale(value):
        return "stale"
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Inf" if value > 0 else "-Inf"
    return repr(value)


def _is_stale(value: float) -> bool:
    return struct.unpack("<Q", struct.pack("<d", value))[0] == STALE_NAN_BITS


def same_schedule(rules: RuleSet) -> RuleSet:
    """`rules` as promtool evaluates them: every rule at the set's smallest interval."""
    fastest = min(rules.intervals())
    return RuleSet([dataclasses.replace(rule, interval=fastest) for rule in rules.rules], rules.files)


def comparable_engine(rules: RuleSet) -> PrometheusEngine:
    """The engine run that `run(scenario, engine.rules)` must agree with exactly: the same schedule,
    and samples stamped on the evaluation steps as promtool's input series are."""
    return PrometheusEngine(same_schedule(rules), scrape_lead_ms=0)


def _rule_item(rule: Rule) -> dict[str, object]:
    item: dict[str, object] = {rule.kind: rule.name, "expr": rule.expr}
    if rule.hold:
        item["for"] = f"{rule.hold:g}s"
    if rule.keep_firing:
        item["keep_firing_for"] = f"{rule.keep_firing:g}s"
    if rule.labels:
        item["labels"] = dict(rule.labels)
    if rule.annotations:
        item["annotations"] = dict(rule.annotations)
    return item


def rule_file(rules: RuleSet, interval: float, path: Path) -> Path:
    """`rules` as one group evaluated every `interval`, in their order (see the module docstring)."""
    group = {"name": "flopwatch-cross-check", "interval": f"{interval:g}s",
             "rules": [_rule_item(rule) for rule in rules.rules]}
    path.write_text(yaml.safe_dump({"groups": [group]}, sort_keys=False, width=1 << 30))
    return path


def test_file(scenario: Scenario, rules: RuleSet, workdir: Path, exact: bool = False) -> tuple[Path, list[float]]:
    """Write the promtool test for `scenario`; returns it and the evaluation times (seconds)."""
    engine = PrometheusEngine(rules, exact=exact)
    fleet = Fleet(scenario, 0.0)
    sampler = FleetSampler(fleet, engine.wanted, exact_nodes_for(scenario), exact)
    recorder = Recorder(keep_by(engine.selectors.wants))
    dt = scenario.scrape_interval
    for _ in range(round(scenario.duration / dt)):
        fleet.advance(dt)
        recorder.add(round(fleet.now_unix * 1000), sampler.sample())
    block = recorder.flush()
    intervals = rules.intervals()
    interval = min(intervals) if intervals else dt
    series = []
    if block is not None:
        for labels, values, present in zip(block.labels, block.values, block.present, strict=True):
            text = ["_"]  # time 0: nothing scraped yet
            for value, here in zip(values.tolist(), present.tolist(), strict=True):
                text.append(_value(value) if here else "_")
            series.append({"series": _series_name(labels), "values": " ".join(text)})
    steps = [interval * k for k in range(1, int(scenario.duration / interval + 1e-9) + 1)]
    names = sorted({rule.name for rule in rules.alerting})
    tests = [{"eval_time": f"{t:g}s", "alertname": name, "exp_alerts": []} for t in steps for name in names]
    document = {
        "rule_files": [str(rule_file(rules, interval, workdir / "bench-rules.yml").resolve())],
        "evaluation_interval": f"{interval:g}s",
        "tests": [{"interval": f"{dt:g}s", "input_series": series, "alert_rule_test": tests}],
    }
    path = workdir / "bench-test.yml"
    path.write_text(yaml.safe_dump(document, sort_keys=False, width=1 << 30))
    return path, steps


def firing(output: str) -> dict[float, list[dict[str, str]]]:
    """promtool's failure output -> eval time -> label sets of the alerts firing then."""
    out: dict[float, list[dict[str, str]]] = defaultdict(list)
    for name, when, got in _BLOCK.findall(output):
        for labels in _LABELS.findall(got + "\n"):
            pairs = {k: v.replace('\\"', '"') for k, v in _PAIR.findall(labels)}
            pairs.setdefault("alertname", name)
            out[parse_duration(when, "promtool's eval time", bare_seconds=False)].append(pairs)
    return out


def episodes_from(firing_at: dict[float, list[dict[str, str]]], steps: list[float], start_unix: float = 0.0,
                  annotation_keys: tuple[str, ...] = ()) -> list[Episode]:
    """Consecutive firing steps of one label set -> one episode (times shifted by start_unix)."""
    open_: dict[tuple[tuple[str, str], ...], Episode] = {}
    done: list[Episode] = []
    for t in steps:
        now = {tuple(sorted(labels.items())) for labels in firing_at.get(t, [])}
        for key in list(open_):
            if key not in now:
                open_[key].resolved_at = start_unix + t
                done.append(open_.pop(key))
        for key in now - set(open_):
            labels = dict(key)
            open_[key] = Episode(labels["alertname"], labels, start_unix + t, start_unix + t)
    done += open_.values()
    return sorted(done, key=lambda e: (e.fired_at, e.alertname, sorted(e.labels.items())))


def run(scenario: Scenario, rules: RuleSet, exact: bool = False, timeout: float = 600) -> list[Episode]:
    """Episodes as promtool sees them (times in seconds since the scenario's start)."""
    binary = releases.binary("promtool")
    with tempfile.TemporaryDirectory(prefix="flopwatch-promtool-") as tmp:
        path, steps = test_file(scenario, rules, Path(tmp), exact)
        answer = subprocess.run([binary, "test", "rules", str(path)], capture_output=True, text=True,
                                timeout=timeout, check=False)
    output = answer.stdout + answer.stderr
    problems = [line for line in output.splitlines()
                if _ERROR.search(line) and not line.strip().startswith(("Labels:", "Annotations:"))]
    if answer.returncode not in (0, 1) or problems:
        raise PromtoolError("promtool test rules: " + ("; ".join(problems[:3]) or output[-2000:]))
    return episodes_from(firing(output), steps)



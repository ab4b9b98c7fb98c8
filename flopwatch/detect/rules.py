"""Prometheus rule files as the benchmark needs them: every rule with its group's interval, in an
order where each recording rule comes after the rules it reads, and the series selectors the rules
read (so a benchmark loads only those series).

The PromQL itself is never interpreted here beyond finding vector selectors: Prometheus evaluates
it. Selector finding errs on the side of loading more (an unparsable matcher keeps every series of
that name).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flopwatch import yamlfile
from flopwatch.durations import DurationError, parse_duration


class RuleFileError(ValueError):
    """A rule file cannot be used; the message names the file and the problem."""


@dataclass(frozen=True)
class Rule:
    kind: str                 # "record" or "alert"
    name: str                 # the record name or the alert name
    expr: str
    interval: float           # seconds, the group's evaluation interval
    hold: float = 0.0         # `for:` in seconds
    keep_firing: float = 0.0  # `keep_firing_for:` in seconds
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    source: str = ""          # file:group, for messages


@dataclass
class RuleSet:
    rules: list[Rule]
    files: list[Path]

    @property
    def recording(self) -> list[Rule]:
        return [rule for rule in self.rules if rule.kind == "record"]

    @property
    def alerting(self) -> list[Rule]:
        return [rule for rule in self.rules if rule.kind == "alert"]

    def intervals(self) -> set[float]:
        return {rule.interval for rule in self.rules}

    def needed(self, keep: tuple[str, ...] = ()) -> RuleSet:
        """Only the rules that alerts (and the recording rules named in `keep`) read, directly or
        through other rules: a recording rule nothing reads cannot change what fires."""
        producers: dict[str, list[Rule]] = {}
        for rule in self.recording:
            producers.setdefault(rule.name, []).append(rule)
        wanted: set[int] = set()
        todo = [*self.alerting, *(r for name in keep for r in producers.get(name, []))]
        while todo:
            rule = todo.pop()
            if id(rule) in wanted:
                continue
            wanted.add(id(rule))
            todo += [r for name in names_in(rule.expr) for r in producers.get(name, [])]
        return RuleSet([rule for rule in self.rules if id(rule) in wanted], self.files)

    def levels(self) -> list[list[Rule]]:
        """Rules in waves: each wave reads only recording rules of earlier waves, so the rules of
        one wave can be evaluated at the same time."""
        produced = {rule.name for rule in self.recording}
        level: dict[str, int] = {}
        waves: list[list[Rule]] = []
        for rule in self.rules:  # already in dependency order
            depth = 1 + max((level[name] for name in names_in(rule.expr) & produced if name in level), default=-1)
            if rule.kind == "record":
                level[rule.name] = max(level.get(rule.name, 0), depth)
            while len(waves) <= depth:
                waves.append([])
            waves[depth].append(rule)
        return waves


def rule_files(path: str | Path) -> list[Path]:
    """A rule file, or every *.yml/*.yaml of a directory except alertmanager.yml (sorted)."""
    try:
        return yamlfile.files(path, "rule files", skip=("alertmanager.yml", "alertmanager.yaml"))
    except yamlfile.YamlFileError as error:
        raise RuleFileError(str(error)) from None


def _seconds(value: Any, where: str) -> float:
    try:
        return parse_duration(value, where, bare_seconds=False)
    except DurationError as error:
        raise RuleFileError(str(error)) from None


def load(path: str | Path, default_interval: float) -> RuleSet:
    """Read rule files; groups without `interval` evaluate every `default_interval` seconds."""
    files = rule_files(path)
    rules: list[Rule] = []
    for file in files:
        try:
            data = yamlfile.load(file, "rule file") or {}
        except yamlfile.YamlFileError as error:
            raise RuleFileError(str(error)) from None
        if not isinstance(data, dict) or not isinstance(data.get("groups", []), list):
            raise RuleFileError(f"{file}: expected a mapping with a `groups` list")
        for group in data.get("groups") or []:
            where = f"{file.name}:{group.get('name', '?')}"
            interval = _seconds(group["interval"], f"{where} interval") if group.get("interval") \
                else default_interval
            for item in group.get("rules") or []:
                rules.append(_rule(item, interval, where))
    return RuleSet(order(rules), files)


def _rule(item: dict[str, Any], interval: float, where: str) -> Rule:
    if "record" in item:
        return Rule("record", str(item["record"]), str(item["expr"]), interval,
                    labels={k: str(v) for k, v in (item.get("labels") or {}).items()}, source=where)
    if "alert" in item:
        return Rule(
            "alert", str(item["alert"]), str(item["expr"]), interval,
            hold=_seconds(item.get("for", 0), f"{where} {item['alert']} for"),
            keep_firing=_seconds(item.get("keep_firing_for", 0), f"{where} {item['alert']} keep_firing_for"),
            labels={k: str(v) for k, v in (item.get("labels") or {}).items()},
            annotations={k: str(v) for k, v in (item.get("annotations") or {}).items()}, source=where,
        )
    raise RuleFileError(f"{where}: a rule needs `record` or `alert`: {item!r}")


_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_IDENT = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


def _strip_strings(expr: str) -> str:
    return _STRING.sub(lambda m: " " * len(m.group(0)), expr)


def names_in(expr: str) -> set[str]:
    """Identifiers of an expression (metric names among them; keywords and functions too)."""
    return set(_IDENT.findall(_strip_strings(expr)))


def order(rules: list[Rule]) -> list[Rule]:
    """Rules in file order, except that a rule moves after the recording rules it reads (as
    Prometheus's own evaluation of one group would see them at the same timestamp)."""
    produced: dict[str, list[int]] = {}
    for i, rule in enumerate(rules):
        if rule.kind == "record":
            produced.setdefault(rule.name, []).append(i)
    deps = {i: {j for name in names_in(rule.expr) for j in produced.get(name, []) if j != i}
            for i, rule in enumerate(rules)}
    done: list[int] = []
    placed: set[int] = set()
    visiting: set[int] = set()

    def visit(i: int) -> None:
        if i in placed:
            return
        if i in visiting:
            raise RuleFileError(f"{rules[i].source}: rule {rules[i].name} depends on itself through other rules")
        visiting.add(i)
        for j in sorted(deps[i]):
            visit(j)
        visiting.discard(i)
        placed.add(i)
        done.append(i)

    for i in range(len(rules)):
        visit(i)
    return [rules[i] for i in done]


# -- selectors ---------------------------------------------------------------------------------
_MATCHER = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*("(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\')\s*,?')
Matcher = tuple[str, str, str]


@dataclass
class Selectors:
    """Per metric name, the matcher lists it is selected with; an empty list among them means
    "every series of this name"."""

    by_name: dict[str, list[list[Matcher]]] = field(default_factory=dict)

    def add(self, name: str, matchers: list[Matcher]) -> None:
        self.by_name.setdefault(name, []).append(matchers)

    def wants_name(self, name: str) -> bool:
        return name in self.by_name

    def wants(self, name: str, labels: dict[str, str]) -> bool:
        options = self.by_name.get(name)
        if options is None:
            return False
        return any(all(_matches(labels.get(label, ""), op, value) for label, op, value in matchers)
                   for matchers in options)


def _matches(actual: str, op: str, value: str) -> bool:
    if op == "=":
        return actual == value
    if op == "!=":
        return actual != value
    hit = re.fullmatch(value, actual) is not None
    return hit if op == "=~" else not hit


def _unquote(text: str) -> str:
    body = text[1:-1]
    return body.encode().decode("unicode_escape") if "\\" in body else body


def selectors(exprs: list[str], names: set[str]) -> Selectors:
    """Vector selectors of `names` (the metric names worth loading) in `exprs`."""
    out = Selectors()
    for expr in exprs:
        masked = _strip_strings(expr)
        for match in _IDENT.finditer(masked):
            name = match.group(0)
            if name not in names:
                continue
            rest = match.end()
            while rest < len(expr) and expr[rest] == " ":
                rest += 1
            matchers: list[Matcher] = []
            if rest < len(expr) and expr[rest] == "{":
                close = _closing_brace(expr, rest)
                body = expr[rest + 1:close] if close is not None else None
                parsed = _parse_matchers(body) if body is not None else None
                matchers = [] if parsed is None else parsed  # unreadable: load every series of it
            out.add(name, matchers)
    return out


def _closing_brace(expr: str, start: int) -> int | None:
    masked = _strip_strings(expr)
    close = masked.find("}", start)
    return close if close >= 0 else None


def _parse_matchers(body: str) -> list[Matcher] | None:
    matchers: list[Matcher] = []
    position = 0
    body = body.strip()
    while position < len(body):
        match = _MATCHER.match(body, position)
        if not match:
            return None
        matchers.append((match.group(1), match.group(2), _unquote(match.group(3))))
        position = match.end()
    return matchers

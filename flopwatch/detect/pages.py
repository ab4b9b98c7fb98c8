"""Pages Alertmanager would send for a run's alerts: its routing, grouping, inhibition and
notification dedup, replayed from alertmanager.yml, so a page storm shows as a number.

    config = AlertmanagerConfig.load("alerts/alertmanager.yml")
    opened = incidents([Alert(labels, fired_at, resolved_at, key=i) for ...], config)

Semantics follow Alertmanager 0.25 (dispatch/route.go, dispatch/dispatch.go, inhibit/inhibit.go,
notify/notify.go), not a reading of its docs:

- Routing: an alert goes down the route tree; at each level the first child whose matchers match
  takes it (others too while `continue: true`); a node no child took is the match. Unset
  `group_by`, `group_wait`, `group_interval` and `repeat_interval` are inherited.
- Grouping: per route, alerts with equal values of the `group_by` labels (an absent label counts
  as absent, `...` means every label) form one group. A group flushes `group_wait` after its
  first alert arrived, then every `group_interval`; an emptied group goes away.
- Inhibition, checked at every flush: a target alert is muted while some alert that matches the
  rule's source matchers is firing with the same values of the `equal` labels (absent on both is
  equal), unless that source matches the target matchers too and so does the target itself.
  Sources inhibit whatever their own route, and whether or not they were themselves muted.
- Notification: the muted alerts are left out; nothing is sent when none is left. Otherwise a
  notification goes out when some firing alert was not in the last one sent, when everything
  resolved after a notification with firing alerts, or (send_resolved) when an alert resolved.

A page is an *incident*: a pager receiver's notification with firing alerts for a group whose
previous notification had none (or which had none before). Later notifications of the same group
while it still has firing alerts update that incident (PagerDuty dedups them by the group key).
"""

from __future__ import annotations

import heapq
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flopwatch import durations, yamlfile

#: Alertmanager's defaults (config/config.go).
DEFAULT_GROUP_WAIT_S = 30.0
DEFAULT_GROUP_INTERVAL_S = 300.0
DEFAULT_REPEAT_INTERVAL_S = 4 * 3600.0
ALL_LABELS = "..."
_MATCHER = re.compile(r'^\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*(.*?)\s*$')


class AlertmanagerConfigError(ValueError):
    """alertmanager.yml cannot be read as routing and inhibition; the message says where."""


def parse_duration(text: Any, where: str) -> float:
    """A Prometheus duration ('10s', '1h30m', '500ms') in seconds (flopwatch/durations.py)."""
    try:
        return durations.parse_duration(text, where, bare_seconds=False)
    except durations.DurationError as error:
        raise AlertmanagerConfigError(str(error)) from None


@dataclass(frozen=True)
class Matcher:
    name: str
    op: str           # =, !=, =~, !~
    value: str

    def matches(self, labels: Mapping[str, str]) -> bool:
        """Absent labels read as the empty string, as in Alertmanager; regexes are anchored."""
        have = labels.get(self.name, "")
        if self.op in ("=", "!="):
            return (have == self.value) == (self.op == "=")
        return (re.fullmatch(self.value, have) is not None) == (self.op == "=~")


def parse_matcher(text: str, where: str) -> Matcher:
    """`name="value"`, `name=~"regex"`, `name!=value` (quotes optional, as Alertmanager allows)."""
    match = _MATCHER.match(str(text))
    if not match:
        raise AlertmanagerConfigError(f"{where}: expected a matcher like severity=\"page\", got {text!r}")
    name, op, value = match.groups()
    if len(value) >= 2 and value[0] == value[-1] == '"':
        value = bytes(value[1:-1], "utf-8").decode("unicode_escape")
    if op in ("=~", "!~"):
        try:
            re.compile(value)
        except re.error as error:
            raise AlertmanagerConfigError(f"{where}: bad regular expression {value!r} ({error})") from None
    return Matcher(name, op, value)


def _matchers(data: Mapping[str, Any], prefix: str, where: str) -> tuple[Matcher, ...]:
    """`<prefix>matchers:` plus the deprecated `<prefix>match:` / `<prefix>match_re:` maps."""
    out = [parse_matcher(m, f"{where}.{prefix}matchers") for m in data.get(f"{prefix}matchers") or []]
    out += [Matcher(k, "=", str(v)) for k, v in (data.get(f"{prefix}match") or {}).items()]
    out += [Matcher(k, "=~", str(v)) for k, v in (data.get(f"{prefix}match_re") or {}).items()]
    return tuple(out)


def _all(matchers: Iterable[Matcher], labels: Mapping[str, str]) -> bool:
    return all(m.matches(labels) for m in matchers)


@dataclass
class Route:
    receiver: str
    matchers: tuple[Matcher, ...]
    group_by: tuple[str, ...] | None      # None: every label ('...')
    group_wait: float
    group_interval: float
    repeat_interval: float
    continue_matching: bool = False
    routes: list[Route] = field(default_factory=list)
    key: str = "{}"

    @classmethod
    def from_dict(cls, data: Any, parent: Route | None = None, where: str = "route") -> Route:
        if not isinstance(data, dict):
            raise AlertmanagerConfigError(f"{where}: expected a mapping")
        matchers = _matchers(data, "", where)
        group_by: tuple[str, ...] | None
        if "group_by" in data:
            names = [str(n) for n in data["group_by"] or []]
            group_by = None if ALL_LABELS in names else tuple(names)
        else:
            group_by = parent.group_by if parent else ()

        def timing(key: str, default: float) -> float:
            if key in data:
                return parse_duration(data[key], f"{where}.{key}")
            return getattr(parent, key) if parent else default

        route = cls(
            receiver=str(data.get("receiver") or (parent.receiver if parent else "")),
            matchers=matchers, group_by=group_by,
            group_wait=timing("group_wait", DEFAULT_GROUP_WAIT_S),
            group_interval=timing("group_interval", DEFAULT_GROUP_INTERVAL_S),
            repeat_interval=timing("repeat_interval", DEFAULT_REPEAT_INTERVAL_S),
            continue_matching=bool(data.get("continue", False)),
            key=(parent.key if parent else "") + ("/" if parent else "")
            + "{" + ",".join(f"{m.name}{m.op}{m.value!r}" for m in matchers) + "}",
        )
        if not route.receiver:
            raise AlertmanagerConfigError(f"{where}: the top route needs a receiver")
        route.routes = [cls.from_dict(child, route, f"{where}.routes[{i}]")
                        for i, child in enumerate(data.get("routes") or [])]
        return route

    def match(self, labels: Mapping[str, str]) -> list[Route]:
        """The routes that take an alert with these labels (dispatch/route.go's Match)."""
        if not _all(self.matchers, labels):
            return []
        found: list[Route] = []
        for child in self.routes:
            taken = child.match(labels)
            found += taken
            if taken and not child.continue_matching:
                break
        return found or [self]

    def group_labels(self, labels: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
        names = labels.keys() if self.group_by is None else [n for n in self.group_by if n in labels]
        return tuple(sorted((n, labels[n]) for n in names))


@dataclass(frozen=True)
class InhibitRule:
    source: tuple[Matcher, ...]
    target: tuple[Matcher, ...]
    equal: tuple[str, ...]

    def mutes(self, labels: Mapping[str, str], firing: Iterable[Mapping[str, str]]) -> bool:
        """Whether some firing alert inhibits one with these labels (inhibit/inhibit.go)."""
        if not _all(self.target, labels):
            return False
        two_sided = _all(self.source, labels)
        for source in firing:
            if not _all(self.source, source):
                continue
            if any(source.get(n, "") != labels.get(n, "") for n in self.equal):
                continue
            if two_sided and _all(self.target, source):
                continue
            return True
        return False


@dataclass
class AlertmanagerConfig:
    route: Route
    inhibit_rules: list[InhibitRule]
    send_resolved: dict[str, bool] = field(default_factory=dict)   # receiver -> any integration does

    @classmethod
    def from_dict(cls, data: Any) -> AlertmanagerConfig:
        if not isinstance(data, dict) or "route" not in data:
            raise AlertmanagerConfigError("alertmanager config: expected a mapping with a `route`")
        rules = []
        for i, rule in enumerate(data.get("inhibit_rules") or []):
            where = f"inhibit_rules[{i}]"
            if not isinstance(rule, dict):
                raise AlertmanagerConfigError(f"{where}: expected a mapping")
            rules.append(InhibitRule(_matchers(rule, "source_", where), _matchers(rule, "target_", where),
                                     tuple(str(n) for n in rule.get("equal") or [])))
        resolved = {}
        for receiver in data.get("receivers") or []:
            integrations = [c for key, configs in receiver.items() if key.endswith("_configs") for c in configs or []]
            resolved[str(receiver.get("name"))] = any(c.get("send_resolved", True) for c in integrations)
        return cls(Route.from_dict(data["route"]), rules, resolved)

    @classmethod
    def load(cls, path: str | Path) -> AlertmanagerConfig:
        try:
            data = yamlfile.load(path, "Alertmanager config")
        except yamlfile.YamlFileError as error:
            raise AlertmanagerConfigError(str(error)) from None
        try:
            return cls.from_dict(data)
        except AlertmanagerConfigError as error:
            raise AlertmanagerConfigError(f"{path}: {error}") from None

    def pager_receivers(self) -> set[str]:
        """Receivers an alert with severity="page" reaches: where pages go."""
        return {route.receiver for route in self.route.match({"severity": "page"})}


@dataclass(frozen=True)
class Alert:
    """One firing of one alert: labels (alertname included), when it fired and resolved."""

    labels: Mapping[str, str]
    fired_at: float
    resolved_at: float | None
    key: Any = None          # the caller's handle (an episode index), reported back in incidents

    def firing(self, t: float) -> bool:
        return self.fired_at <= t and (self.resolved_at is None or t < self.resolved_at)


@dataclass
class Incident:
    """A page: the first notification of a group with firing alerts, and what it carried while open."""

    receiver: str
    group_key: str
    opened_at: float
    alerts: list[Any] = field(default_factory=list)   # keys of the alerts it notified
    group_labels: dict[str, str] = field(default_factory=dict)   # as Alertmanager's groupLabels


@dataclass
class _Group:
    route: Route
    key: str
    labels: dict[str, str]
    members: dict[int, Alert] = field(default_factory=dict)
    last_firing: frozenset[int] | None = None       # the notification log entry
    last_resolved: frozenset[int] = frozenset()
    last_sent: float = float("-inf")
    incident: Incident | None = None
    live: bool = False        # flushing; an emptied group stops, its notification log stays


def notify_decision(group: _Group, firing: frozenset[int], resolved: frozenset[int], t: float,
                    send_resolved: bool) -> bool:
    """notify.DedupStage.needsUpdate."""
    if group.last_firing is None:
        return bool(firing)
    if not firing <= group.last_firing:
        return True
    if not firing:
        return bool(group.last_firing)
    if send_resolved and not resolved <= group.last_resolved:
        return True
    return group.last_sent < t - group.route.repeat_interval


def incidents(alerts: list[Alert], config: AlertmanagerConfig, receivers: set[str] | None = None,
              until: float | None = None) -> list[Incident]:
    """Every incident at `receivers` (default: the pager receivers), flushes up to `until`."""
    receivers = config.pager_receivers() if receivers is None else receivers
    order = sorted(range(len(alerts)), key=lambda i: alerts[i].fired_at)
    end = until if until is not None else max((a.resolved_at or a.fired_at for a in alerts), default=0.0) + 1.0
    groups: dict[tuple[str, tuple[tuple[str, str], ...]], _Group] = {}
    flushes: list[tuple[float, int, tuple[str, tuple[tuple[str, str], ...]]]] = []
    opened: list[Incident] = []
    sequence = 0
    pos = 0
    while True:
        next_alert = alerts[order[pos]].fired_at if pos < len(order) else float("inf")
        next_flush = flushes[0][0] if flushes else float("inf")
        if min(next_alert, next_flush) > end:
            break
        if next_alert <= next_flush:        # an alert arriving at a flush instant is in it
            index = order[pos]
            pos += 1
            labels = alerts[index].labels
            for route in config.route.match(labels):
                if route.receiver not in receivers:
                    continue
                gkey = (route.key, route.group_labels(labels))
                group = groups.get(gkey)
                if group is None:
                    group = groups[gkey] = _Group(route, f"{route.key}:{dict(gkey[1])}", dict(gkey[1]))
                if not group.live:
                    group.live = True
                    sequence += 1
                    heapq.heappush(flushes, (next_alert + route.group_wait, sequence, gkey))
                group.members[index] = alerts[index]
            continue
        t, _, gkey = heapq.heappop(flushes)
        group = groups[gkey]
        group.live = _flush(group, t, alerts, config, opened)
        if group.live:
            sequence += 1
            heapq.heappush(flushes, (t + group.route.group_interval, sequence, gkey))
    return opened


def _flush(group: _Group, t: float, alerts: list[Alert], config: AlertmanagerConfig,
           opened: list[Incident]) -> bool:
    """One flush of a group at `t`; False when the group is empty and goes away (Alertmanager
    drops it; a new alert starts a new one with group_wait, the notification log is kept)."""
    if not group.members:
        return False
    active = [a.labels for a in alerts if a.firing(t)]
    shown = {i: a for i, a in group.members.items()
             if not any(rule.mutes(a.labels, active) for rule in config.inhibit_rules)}
    firing = frozenset(i for i, a in shown.items() if a.firing(t))
    resolved = frozenset(i for i, a in shown.items() if not a.firing(t))
    if shown and notify_decision(group, firing, resolved, t, config.send_resolved.get(group.route.receiver, True)):
        if firing and not group.last_firing:
            group.incident = Incident(group.route.receiver, group.key, t, group_labels=group.labels)
            opened.append(group.incident)
        if firing and group.incident is not None:
            group.incident.alerts += [alerts[i].key for i in sorted(firing)
                                      if alerts[i].key not in group.incident.alerts]
        group.last_firing, group.last_resolved, group.last_sent = firing, resolved, t
    for i in [i for i, a in group.members.items() if not a.firing(t)]:
        del group.members[i]                # resolved alerts leave the group after a flush
    return True


def pages_per_key(found: list[Incident]) -> dict[Any, int]:
    """How many incidents carried each alert key."""
    counts: dict[Any, int] = {}
    for incident in found:
        for key in incident.alerts:
            counts[key] = counts.get(key, 0) + 1
    return counts

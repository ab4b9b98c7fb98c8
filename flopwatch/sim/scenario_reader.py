"""Reading a scenario's fields: typed access whose errors name the field's path, node index sets,
durations and fault windows. The scenario's shape (flopwatch/sim/scenario.py) is built on these."""

from __future__ import annotations

import re
from typing import Any

from flopwatch import durations


class ScenarioError(ValueError):
    """The scenario file is wrong; the message names the field and what is expected."""


def node_name(index: int) -> str:
    """The simulated node's name: what its agent labels `node` and what a `fabric:` names."""
    return f"node{index:04d}"


def parse_duration(value: Any, where: str) -> float:
    """'1m30s' -> 90.0 (Prometheus's grammar, flopwatch/durations.py); plain numbers are seconds."""
    try:
        return durations.parse_duration(value, where)
    except durations.DurationError as error:
        raise ScenarioError(str(error)) from None


def parse_index_set(value: Any, where: str, limit: int) -> list[int]:
    """'0-3,8,10-11' or [0, 1] or 5 -> sorted unique indices, each below `limit`."""
    items = value if isinstance(value, list) else str(value).split(",")
    out: set[int] = set()
    for item in items:
        text = str(item).strip()
        match = re.fullmatch(r"(\d+)(?:\s*-\s*(\d+))?", text)
        if not match:
            raise ScenarioError(f"{where}: expected node indices like \"0-127\" or \"0,4,8-11\", got {value!r}")
        low = int(match.group(1))
        high = int(match.group(2)) if match.group(2) else low
        if high < low:
            raise ScenarioError(f"{where}: range {text!r} runs backwards")
        if high >= limit:
            raise ScenarioError(f"{where}: node {high} is out of range (the fleet has nodes 0-{limit - 1})")
        out.update(range(low, high + 1))
    if not out:
        raise ScenarioError(f"{where}: names no node")
    return sorted(out)


class Reader:
    """Typed field access with errors that name the path of the field."""

    def __init__(self, data: Any, where: str) -> None:
        if not isinstance(data, dict):
            raise ScenarioError(f"{where}: expected a mapping, got {type(data).__name__}")
        self.data, self.where = data, where

    def path(self, key: str) -> str:
        return f"{self.where}.{key}" if self.where else key

    def has(self, key: str) -> bool:
        return key in self.data and self.data[key] is not None

    def raw(self, key: str, default: Any = ...) -> Any:
        if not self.has(key):
            if default is ...:
                raise ScenarioError(f"{self.path(key)}: required field is missing")
            return default
        return self.data[key]

    def number(self, key: str, low: float, high: float, default: Any = ...) -> float:
        value = self.raw(key, default)
        try:
            if isinstance(value, bool):
                raise ValueError
            number = float(value)
        except (TypeError, ValueError):
            raise ScenarioError(f"{self.path(key)}: expected a number, got {value!r}") from None
        if not low <= number <= high:
            raise ScenarioError(f"{self.path(key)}: expected a number from {low:g} to {high:g}, got {value!r}")
        return number

    def integer(self, key: str, low: int, high: int, default: Any = ...) -> int:
        number = self.number(key, low, high, default)
        if not float(number).is_integer():
            raise ScenarioError(f"{self.path(key)}: expected a whole number, got {self.raw(key)!r}")
        return int(number)

    def duration(self, key: str, default: Any = ...) -> float:
        value = self.raw(key, default)
        return value if isinstance(value, float) and not self.has(key) else parse_duration(value, self.path(key))

    def text(self, key: str, default: Any = ...) -> str:
        value = self.raw(key, default)
        if not isinstance(value, str | int) or isinstance(value, bool) or not str(value).strip():
            raise ScenarioError(f"{self.path(key)}: expected text, got {value!r}")
        return str(value).strip()

    def check_keys(self, allowed: set[str]) -> None:
        for key in self.data:
            if key not in allowed:
                raise ScenarioError(f"{self.path(str(key))}: unknown field (known: {', '.join(sorted(allowed))})")


def fault_window(r: Reader, duration: float) -> tuple[float, float]:
    """The fault's (start, end), the end clipped to the scenario."""
    start = r.duration("start")
    if start >= duration:
        raise ScenarioError(f"{r.where}.start: the fault would start after the scenario ends")
    return start, min(duration, start + r.duration("duration", duration - start))


def fault_nic(r: Reader, kind: str, nics_per_node: int) -> int:
    """The fault's `nic` index, checked against the fleet's NICs per node."""
    if nics_per_node == 0:
        raise ScenarioError(f"{r.where}: a {kind} fault needs NICs, but fleet.nics_per_node is 0")
    nic = r.integer("nic", 0, 10**9, 0)
    if nic >= nics_per_node:
        raise ScenarioError(f"{r.where}.nic: NIC {nic} is out of range (nodes have NICs 0-{nics_per_node - 1})")
    return nic

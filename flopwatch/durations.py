"""One duration grammar for every file and flag FlopWatch reads: Prometheus's.

A duration is whole numbers with units from the largest down, each unit at most once: `y`
(365 days), `w`, `d`, `h`, `m`, `s`, `ms`, e.g. `90s`, `1m30s`, `1h`, `500ms`, `2w`, or `0`
alone (Prometheus's `model.ParseDuration`). Where a value may also be a plain number of seconds
(a YAML number in a scenario, `--last 3600`), the caller says so with `bare_seconds`; the rule
templates, which write durations into PromQL, do not.
"""

from __future__ import annotations

import re

_PROMETHEUS = re.compile(r"^(?:(\d+)y)?(?:(\d+)w)?(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?(?:(\d+)ms)?$")
_UNIT_SECONDS = (365 * 86400, 7 * 86400, 86400, 3600, 60, 1, 0.001)
_BARE = re.compile(r"^\d+(?:\.\d+)?$")
EXAMPLES = "30s, 5m, 1m30s, 2h or 7d"


class DurationError(ValueError):
    """Not a duration; the message says where and what to write."""


def parse_duration(value: object, where: str, bare_seconds: bool = True) -> float:
    """Seconds of a Prometheus duration (`1m30s` -> 90.0); with `bare_seconds`, a number or a
    numeric string is seconds. Negative durations do not exist in the grammar."""
    if isinstance(value, bool):
        raise DurationError(f"{where}: expected a duration like {EXAMPLES}, got {value!r}")
    if isinstance(value, int | float) and bare_seconds:
        if value < 0:
            raise DurationError(f"{where}: a duration cannot be negative, got {value!r}")
        return float(value)
    text = str(value).strip()
    if bare_seconds and _BARE.match(text):
        return float(text)
    if text.startswith("-"):
        raise DurationError(f"{where}: a duration cannot be negative, got {value!r}")
    match = _PROMETHEUS.match(text)
    if text == "0":
        return 0.0
    if not text or match is None or not any(match.groups()):
        raise DurationError(f"{where}: expected a duration like {EXAMPLES}, got {value!r}")
    return float(sum(int(n) * unit for n, unit in zip(match.groups(), _UNIT_SECONDS, strict=True) if n))



def format_duration(seconds: float) -> str:
    """The shortest Prometheus duration of `seconds` in hours, minutes, seconds and milliseconds
    (240 -> `4m`, 90 -> `1m30s`, 7.5 -> `7s500ms`): the inverse of `parse_duration`, for durations
    computed into PromQL."""
    left = round(seconds * 1000)
    if left <= 0:
        return "0s"
    parts = []
    for unit, size in (("h", 3_600_000), ("m", 60_000), ("s", 1000), ("ms", 1)):
        count, left = divmod(left, size)
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts)

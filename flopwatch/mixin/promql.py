"""PromQL fragments that the rules and the dashboards both build, spelled once (a base module:
the dashboards, below the mixin, import it too)."""

from __future__ import annotations

from collections.abc import Iterable

from flopwatch.catalog.gpu import CLOCK_EVENT_BITS


def clock_events_from_mask(mask: str, reasons: Iterable[str] = tuple(CLOCK_EVENT_BITS), separator: str = " or ") -> str:
    """One series per reason (label `reason`, 1 active / 0 not) decoded from a selector of NVML
    clock-event bitmasks: one bitmask series per GPU is what is stored and read, seven times fewer
    than one series per reason, and the reasons are spelled out only where something shows them.
    `separator` joins the reasons' terms (a rule file's multi-line form: a newline, indent, "or ")."""
    return separator.join(f'label_replace(floor({mask} / {CLOCK_EVENT_BITS[reason]}) % 2, "reason", "{reason}", "", "")'
                       for reason in reasons)

"""Each rank's recent reports, kept by the intake for flopwatch_train_recent_*_seconds.

The agent sees every report a training client sends; the straggler rules, which see only scrapes,
would lag by their window. So the intake keeps a short history of each rank's running totals and
exports per-step means over its last ~10 s of steps (flopwatch/catalog/train.py, RECENT_*). The
history is bounded whatever a client sends: reports closer together than RESOLUTION_S coalesce.
"""

from __future__ import annotations

import math
from collections import deque

from flopwatch.catalog import train as m
from flopwatch.train import wire

#: Kept reports are at least this far apart (a report closer than this to the one before the latest
#: replaces the latest), so a client that reports every few milliseconds costs the memory of one
#: that reports every half second; clients report at most once a second by default (the training
#: monitor's min_interval).
RESOLUTION_S = 0.5
#: Every kept report is RESOLUTION_S after the one two places before it, so a window's reports and
#: its start always fit; a bound that dropped a start would leave none (absent, not wrong).
MAXLEN = 2 * math.ceil(m.RECENT_WINDOW_S / RESOLUTION_S) + 4

Reports = deque[tuple[float, tuple[int, ...]]]   # (monotonic time, the datagram's totals bits)

_STEPS = wire.I_STEPS - wire.I_TOTALS
_PHASES = wire.I_PHASES - wire.I_TOTALS
_RECENT_INDEX = tuple(wire.PHASE_INDEX[name] for name in m.RECENT_PHASES)


def reports() -> Reports:
    return deque(maxlen=MAXLEN)


def remember(history: Reports, now: float, bits: tuple[int, ...]) -> None:
    """Keep a report whose step count grew (the intake's hot path: no arithmetic on the totals)."""
    if len(history) >= 2 and now - history[-2][0] < RESOLUTION_S:
        history[-1] = (now, bits)
    else:
        history.append((now, bits))


def per_step(history: Reports, now: float) -> tuple[float, ...] | None:
    """Per step between a rank's latest report and its window start: (arrival, *RECENT_PHASES), or
    None while it has no window or its latest step is stale.

    The start is the newest earlier report at least RECENT_WINDOW_S and RECENT_MIN_STEPS before the
    latest. Every report older than one that qualifies qualifies too, so the qualifying ones lead the
    deque: dropping its oldest while the next would qualify leaves the start first, and nothing a
    later window could start at is lost.
    """
    if len(history) < 2:
        return None
    last_time, last_bits = history[-1]
    last_steps = last_bits[0]
    while len(history) > 2 and m.starts_recent_window(last_time - history[1][0], last_steps - history[1][1][0]):
        history.popleft()
    first_time, first_bits = history[0]
    if now - last_time > m.RECENT_STALE_S or not m.starts_recent_window(last_time - first_time,
                                                                        last_steps - first_bits[0]):
        return None
    first, last = wire.totals_of(history[0][1]), wire.totals_of(last_bits)
    steps = last[_STEPS] - first[_STEPS]
    arrival = sum(last[_PHASES + i] - first[_PHASES + i] for i in wire.ARRIVAL_INDEX)
    values = (arrival / steps, *((last[_PHASES + i] - first[_PHASES + i]) / steps for i in _RECENT_INDEX))
    return values if all(map(math.isfinite, values)) else None     # totals near the largest double


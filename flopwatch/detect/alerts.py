"""Alert state over evaluation steps: Prometheus's `for:` and `keep_firing_for:` bookkeeping.

The engine range-queries an alert's expression; which label sets it returned at each evaluation
step is all Prometheus's. This module only turns that presence into pending/firing/resolved the
way rules/alerting.go does: an alert is pending from the first step its labels appear, fires at
the first step at least `for` after that while it stayed present, and resolves at the first step
it is absent (after `keep_firing_for`, if set). A resolved alert that comes back starts over.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

Labels = tuple[tuple[str, str], ...]
_EPSILON = 1e-6  # steps are exact multiples of the interval; guard float sums


@dataclass
class Episode:
    """One firing of one alert (label set), from its first firing step to resolution."""

    alertname: str
    labels: dict[str, str]
    active_at: float            # first step pending (unix seconds)
    fired_at: float             # first step firing
    resolved_at: float | None = None  # first step not firing; None if still firing at the end
    value: float = float("nan")       # the expression's value at the first firing step

    def as_dict(self) -> dict[str, object]:
        return {"alertname": self.alertname, "labels": self.labels, "active_at": self.active_at,
                "fired_at": self.fired_at, "resolved_at": self.resolved_at, "value": self.value}


@dataclass
class _Active:
    active_at: float
    value: float
    fired_at: float | None = None
    keep_since: float | None = None
    episode: Episode | None = None


@dataclass
class AlertTracker:
    alertname: str
    hold: float = 0.0
    keep_firing: float = 0.0
    active: dict[Labels, _Active] = field(default_factory=dict)
    episodes: list[Episode] = field(default_factory=list)

    def step(self, ts: float, present: Iterable[tuple[Labels, float]]) -> None:
        """Evaluation at `ts`: `present` are the alert's label sets (alertname included) and values."""
        seen: set[Labels] = set()
        for labels, value in present:
            seen.add(labels)
            state = self.active.get(labels)
            if state is None:
                self.active[labels] = _Active(ts, value)
            else:
                state.keep_since = None
                state.value = value
        for labels in list(self.active):
            if labels in seen:
                continue
            state = self.active[labels]
            if state.fired_at is not None and self.keep_firing > 0:
                if state.keep_since is None:
                    state.keep_since = ts
                if ts - state.keep_since < self.keep_firing - _EPSILON:
                    continue
            if state.episode is not None:
                state.episode.resolved_at = ts
            del self.active[labels]
        for labels, state in self.active.items():
            if state.fired_at is None and ts - state.active_at >= self.hold - _EPSILON:
                state.fired_at = ts
                state.episode = Episode(self.alertname, dict(labels), state.active_at, ts, value=state.value)
                self.episodes.append(state.episode)

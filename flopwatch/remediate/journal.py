"""The remediator's history, one JSON object per line in `<state_dir>/journal.jsonl`: what it
intended and did, and when each node's condition cleared and its health check ran.

The scheduler holds the current truth (which node is drained by FlopWatch); the journal holds
what the scheduler forgets: drains per window (the breaker), drain occasions (lemons), when a
condition cleared (the hold-down), health checks and undos. Every line is flushed and fsynced
before the action it announces runs, so a SIGKILL in the middle of an action leaves an `intent`
without its outcome; on start the scheduler settles it (`settle`). Events:

    {"t": 1767000000.0, "event": "intent", "action": "drain", "node": "node02", "reason": "flopwatch: ..."}
    {"t": 1767000000.4, "event": "drain", "node": "node02", "reason": "flopwatch: ..."}
    {"t": 1767000900.0, "event": "cleared", "node": "node02"}
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flopwatch.remediate.scheduler import NodeState

log = logging.getLogger(__name__)
EVENTS = ("intent", "dropped", "drain", "resume", "cleared", "recurred", "health_passed", "health_failed", "undo")
#: History older than this is dropped when the journal is read (longer than any window it serves).
KEEP_S = 30 * 86400.0


@dataclass
class History:
    """What decisions need from the journal, per node."""

    drains: list[tuple[str, float]] = field(default_factory=list)       # (node, time), oldest first
    cleared_at: dict[str, float] = field(default_factory=dict)          # since the last drain/recurrence
    health: dict[str, tuple[float, bool]] = field(default_factory=dict)  # last check after clearing
    undone_at: dict[str, float] = field(default_factory=dict)

    def drain_times(self, node: str) -> list[float]:
        return [t for n, t in self.drains if n == node]


def history(events: Iterable[Mapping[str, Any]]) -> History:
    out = History()
    for event in events:
        kind, node, t = event.get("event"), str(event.get("node", "")), float(event.get("t", 0.0))
        if kind == "drain":
            out.drains.append((node, t))
            out.cleared_at.pop(node, None)
            out.health.pop(node, None)
        elif kind == "recurred":
            out.cleared_at.pop(node, None)
            out.health.pop(node, None)
        elif kind == "cleared":
            out.cleared_at[node] = t
            out.health.pop(node, None)
        elif kind in ("health_passed", "health_failed") and node in out.cleared_at:
            out.health[node] = (t, kind == "health_passed")
        elif kind in ("resume", "undo"):
            out.cleared_at.pop(node, None)
            out.health.pop(node, None)
            if kind == "undo":
                out.undone_at[node] = t
    return out


class Journal:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        path.parent.mkdir(parents=True, exist_ok=True)
        self._size = -1
        self.events: list[dict[str, Any]] = []
        self._refresh()

    def _refresh(self) -> None:
        """Read the file again when another process (`flopwatch remediate undo`) appended to it."""
        try:
            size = self.path.stat().st_size
        except FileNotFoundError:
            size = 0
        if size != self._size:
            self.events, self._size = self._read(), size

    def _read(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        events = []
        with open(self.path, encoding="utf-8") as file:
            for number, line in enumerate(file, 1):
                try:
                    event = json.loads(line)
                except ValueError:  # a line cut by a crash mid-write: its action never started
                    log.warning("%s:%d: unreadable journal line skipped", self.path, number)
                    continue
                if isinstance(event, dict) and event.get("event") in EVENTS:
                    events.append(event)
        newest = max((float(e.get("t", 0)) for e in events), default=0.0)
        return [e for e in events if float(e.get("t", 0)) >= newest - KEEP_S]

    def append(self, t: float, event: str, node: str, **fields: Any) -> None:
        record = {"t": round(t, 3), "event": event, "node": node, **fields}
        line = json.dumps(record, sort_keys=True) + "\n"
        with self._lock:
            self._refresh()
            with open(self.path, "a", encoding="utf-8") as file:
                file.write(line)
                file.flush()
                os.fsync(file.fileno())
            self.events.append(record)
            self._size += len(line.encode())

    def history(self) -> History:
        with self._lock:
            self._refresh()
            return history(list(self.events))

    def unsettled(self) -> list[dict[str, Any]]:
        """Intents with no outcome after them for their node (the process died mid-action)."""
        with self._lock:
            self._refresh()
            pending: dict[tuple[str, str], dict[str, Any]] = {}
            for event in self.events:
                kind, node = event["event"], event.get("node", "")
                if kind == "intent":
                    pending[(event.get("action", ""), node)] = event
                elif kind in ("drain", "resume"):
                    pending.pop((kind, node), None)
                elif kind == "dropped":
                    pending.pop((event.get("action", ""), node), None)
                elif kind == "undo":
                    pending = {key: value for key, value in pending.items() if key[1] != node}
            return list(pending.values())

    def settle(self, t: float, nodes: Mapping[str, NodeState]) -> list[str]:
        """Record the outcome of each unsettled intent as the scheduler shows it (a drain is done when
        the node carries FlopWatch's reason; a resume when it does not); the others were never done
        and are dropped (the next decision plans them again if still needed). Lines describing what
        was settled."""
        said = []
        for intent in self.unsettled():
            action, node = intent.get("action", ""), intent.get("node", "")
            state = nodes.get(node)
            done = state is not None and (state.ours if action == "drain" else not state.ours)
            if done:
                self.append(t, action, node, reason=intent.get("reason", ""), recovered=True)
                said.append(f"{action} of {node} was done before a restart: recorded")
            else:
                self.append(t, "dropped", node, action=action)
                said.append(f"{action} of {node} never reached the scheduler: planned again if still needed")
        return said

"""What remediation knows of a scheduler: each node's drain state and reason, read from the
scheduler itself, and the two writes it makes (drain with a reason, return). One adapter per
scheduler implements `Scheduler` (slurm.py, kubernetes.py).

The scheduler is the store: a node FlopWatch drained carries a reason that starts with
`flopwatch:`, so a restarted or second instance reads the truth there, and a node drained by a
person (any other reason) is never touched.
"""

from __future__ import annotations

import contextlib
import re
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

REASON_PREFIX = "flopwatch:"
#: Node names FlopWatch passes to a scheduler command (anything else is refused as unknown).
NODE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$")
FailureKind = Literal["unknown_node", "failed", "timeout"]


class SchedulerError(RuntimeError):
    """A scheduler command failed; `kind` is unknown_node, failed or timeout (a metric label)."""

    def __init__(self, kind: FailureKind, message: str) -> None:
        super().__init__(message)
        self.kind = kind


@dataclass(frozen=True)
class NodeState:
    name: str
    drained: bool                 # takes no new job (Slurm DRAIN flag; Kubernetes cordon)
    reason: str = ""              # the scheduler's reason text ("" when none)
    partitions: tuple[str, ...] = ()

    @property
    def ours(self) -> bool:
        """Drained by FlopWatch (its reason says so)."""
        return self.drained and self.reason.startswith(REASON_PREFIX)


class Scheduler(Protocol):
    name: str

    def nodes(self) -> dict[str, NodeState]: ...

    def drain(self, node: str, reason: str) -> None: ...

    def resume(self, node: str) -> None: ...

    def describe(self, action: str, node: str, reason: str = "") -> str:
        """The command (or API call) an action runs, for the dry-run plan and the audit log."""
        ...


def check_node_name(node: str) -> None:
    if not NODE_NAME.match(node):
        raise SchedulerError("unknown_node", f"{node[:80]!r} is not a node name a scheduler accepts")


def run(argv: Sequence[str], timeout: float, env: dict[str, str] | None = None) -> str:
    """stdout of a scheduler command; SchedulerError("timeout") when it runs past `timeout` (it is
    killed), ("failed") on a non-zero exit, with its stderr. The command stays in remediate's
    process group, so stopping the whole service (systemd's control-group kill) stops it too: a
    command cut short never completes behind a restarted service's back."""
    try:
        proc = subprocess.Popen(list(argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                stdin=subprocess.DEVNULL, env=env)
    except OSError as error:
        raise SchedulerError("failed", f"{argv[0]}: {error.strerror}") from None
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):  # a child of it may hold the pipes open
            proc.communicate(timeout=1.0)
        raise SchedulerError("timeout", f"{' '.join(argv[:3])} ... ran past {timeout:g}s and was killed") from None
    if proc.returncode != 0:
        raise SchedulerError("failed", f"{' '.join(argv[:3])} ... exited {proc.returncode}: "
                                       f"{err.strip()[:300]}")
    return out

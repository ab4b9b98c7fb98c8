"""Slurm through its own commands: `sinfo` reads every node's state and reason, `scontrol update`
drains (`State=DRAIN Reason="flopwatch: ..."`) and returns (`State=RESUME`) a node.

A drain lets running jobs finish (DRAINING, then DRAINED): FlopWatch never kills a job; a job
that fails on the bad GPU is requeued by Slurm's own policy. Every command has a timeout. Sample
`sinfo --noheader --Node --format=%N|%P|%T|%E` output (a node in two partitions prints twice):

    node01|gpu|idle|none
    node02|gpu|draining|flopwatch: FlopWatchGpuXidCritical GPU 3 XID 79
    node03|gpu|drained|bad DIMM, ticket 4411

`topology()` reads the fabric from the running slurmctld (`scontrol show topology`), for switch
escalation when no topology.conf is given.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from flopwatch.remediate.scheduler import NodeState, SchedulerError, check_node_name, run
from flopwatch.topology.model import Fabric
from flopwatch.topology.slurm import parse_show_topology

UNKNOWN_NODE_TEXT = "Invalid node name"


class Slurm:
    name = "slurm"

    def __init__(self, timeout: float, bin_dir: str = "", env: dict[str, str] | None = None) -> None:
        self.timeout = timeout
        self.bin_dir = bin_dir
        self.env = env

    def _program(self, name: str) -> str:
        if self.bin_dir:
            return str(Path(self.bin_dir) / name)
        return shutil.which(name) or name

    def nodes(self) -> dict[str, NodeState]:
        out = run([self._program("sinfo"), "--noheader", "--Node", "--format=%N|%P|%T|%E"], self.timeout, self.env)
        found: dict[str, NodeState] = {}
        for line in out.splitlines():
            parts = line.split("|", 3)
            if len(parts) != 4:
                continue
            node, partition, state, reason = parts
            before = found.get(node)
            partitions = (before.partitions if before else ()) + (partition.rstrip("*"),)
            found[node] = NodeState(node, "drain" in state.lower(), "" if reason == "none" else reason.strip(),
                                    partitions)
        return found

    def topology(self) -> Fabric | None:
        """The fabric slurmctld holds, or None when it runs no topology plugin (scontrol prints
        nothing then). SchedulerError when scontrol fails; TopologyError when its output is not
        Slurm's format."""
        out = run([self._program("scontrol"), "show", "topology"], self.timeout, self.env)
        return parse_show_topology(out) if out.strip() else None

    def _update(self, node: str, *fields: str) -> None:
        check_node_name(node)
        try:
            run([self._program("scontrol"), "update", f"NodeName={node}", *fields], self.timeout, self.env)
        except SchedulerError as error:
            if error.kind == "failed" and UNKNOWN_NODE_TEXT in str(error):
                raise SchedulerError("unknown_node", f"Slurm knows no node {node!r}") from None
            raise

    def drain(self, node: str, reason: str) -> None:
        self._update(node, "State=DRAIN", f"Reason={reason}")

    def resume(self, node: str) -> None:
        self._update(node, "State=RESUME")

    def describe(self, action: str, node: str, reason: str = "") -> str:
        if action == "drain":
            return f'scontrol update NodeName={node} State=DRAIN Reason="{reason}"'
        return f"scontrol update NodeName={node} State=RESUME"


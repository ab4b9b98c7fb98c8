"""The simulator's fabric faults: what switch_degrade, uplink_slow and spine_degrade do to a
fleet's ports and jobs, and what their truth names. The scenario's `fabric:` key and the faults are parsed in
scenario.py:

    fabric: {rail_optimised: true, nodes_per_leaf: 16, spines: 4}     # leaf<g>-r<rail>, spine<s>
    fabric: {topology: topology.conf, rails: rails.yml}               # a site's files
    faults:
      - {kind: switch_degrade, switch: leaf2-r3, mode: errors, start: 10m, duration: 10m}
      - {kind: uplink_slow, switch: leaf1-r0, uplink: spine1, start: 30m, duration: 10m, slowdown: 0.5}
      - {kind: spine_degrade, switch: spine2, start: 40m, duration: 10m, slowdown: 0.5}
      - {kind: cable_flap, node: 5, nic: 2, start: 50m, duration: 5m}

docs/simulator.md says what each does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from flopwatch.sim.scenario import FaultSpec, node_name
from flopwatch.topology.model import Fabric

if TYPE_CHECKING:
    from flopwatch.sim.nic import SimulatedNic
    from flopwatch.sim.state import JobState, SimNode


class FabricFaults:
    """Switch and uplink faults on a fleet's ports and jobs (cable_flap is the fleet's, as nic_link_flap).

    - switch_degrade: every port under the leaf gets the mode's symptom (flap: every link goes down
      as the fault starts, then once a minute); every job with ranks on more than one node that
      has a port there communicates `slowdown` slower (its step grows by slowdown x its exposed
      communication).
    - uplink_slow: jobs whose traffic crosses that leaf-to-upper link (Fabric.crosses) communicate
      `slowdown` slower; the ports under the leaf wait for credit in proportion to the share of
      their job's peers beyond the leaf. Jobs inside the leaf cross nothing and see nothing.
    - spine_degrade: the same for every link into or out of the spine (every uplink of its leaves
      to it, its own uplinks): jobs whose traffic crosses it slow down, and the ports they use
      under its leaves wait.
    """

    def __init__(self, nodes: list[SimNode], jobs: dict[str, JobState], fabric: Fabric) -> None:
        self.nodes, self.jobs, self.fabric = nodes, jobs, fabric
        self._ports: dict[str, list[tuple[SimNode, SimulatedNic]]] = {}
        self._crosses: dict[str, set[tuple[str, str]]] = {}
        self._started: set[int] = set()

    def ports(self, switch: str) -> list[tuple[SimNode, SimulatedNic]]:
        """The NIC ports below `switch`: a leaf's own, a spine's leaves' (in leaf order)."""
        if self.fabric.switches[switch].level == "leaf":
            return self._leaf_ports(switch)
        return [port for leaf in self.leaves(switch) for port in self._leaf_ports(leaf)]

    def leaves(self, switch: str) -> list[str]:
        """The leaves directly below `switch` (a spine), or [switch] for a leaf."""
        if self.fabric.switches[switch].level == "leaf":
            return [switch]
        return sorted(s for s, parents in self.fabric.parents.items() if switch in parents
                      and self.fabric.switches[s].level == "leaf")

    def _leaf_ports(self, leaf: str) -> list[tuple[SimNode, SimulatedNic]]:
        """The NIC ports plugged into `leaf`: the fabric's links, else every NIC of its nodes."""
        if leaf not in self._ports:
            by_name = {node.name: node for node in self.nodes}
            found = []
            if self.fabric.links:
                for link in self.fabric.links:
                    node = by_name.get(link.node)
                    if link.switch == leaf and node is not None:
                        found += [(node, nic) for nic in node.nics if nic.device == link.device]
            else:
                found = [(by_name[n], nic) for n in sorted(self.fabric.nodes_under(leaf)) if n in by_name
                         for nic in by_name[n].nics]
            self._ports[leaf] = found
        return self._ports[leaf]

    def crosses(self, state: JobState) -> set[tuple[str, str]]:
        job_id = state.runner.spec.id
        if job_id not in self._crosses:
            self._crosses[job_id] = self.fabric.crosses(node_name(i) for i in state.runner.spec.nodes)
        return self._crosses[job_id]

    def jobs_hit(self, fault: FaultSpec) -> list[JobState]:
        """Jobs running now that the fault slows."""
        jobs = [s for s in self.jobs.values() if len(s.runner.spec.nodes) > 1
                and any(node.job_id == s.runner.spec.id for node in (self.nodes[i] for i in s.runner.spec.nodes))]
        if fault.kind in ("uplink_slow", "spine_degrade"):
            return [s for s in jobs if self._crosses_fault(fault, s)]
        under = {node.index for node, _ in self.ports(fault.switch)}
        return [s for s in jobs if under.intersection(s.runner.spec.nodes)]

    def _crosses_fault(self, fault: FaultSpec, state: JobState) -> bool:
        """Whether the job's traffic takes the slow uplink, or any link of the degraded spine."""
        if fault.kind == "uplink_slow":
            return (fault.switch, fault.uplink) in self.crosses(state)
        return any(fault.switch in link for link in self.crosses(state))

    def apply(self, fault: FaultSpec) -> None:
        """The fault's effect for the coming tick (faults were reset before)."""
        hit = self.jobs_hit(fault)
        for state in hit:
            state.runner.slow.comm_extra += fault.slowdown * state.runner.comm_exposed
        if fault.kind == "switch_degrade":
            self._degrade_ports(fault)
            return
        crossing = {s.runner.spec.id: s for s in hit}
        for leaf in self.leaves(fault.switch):
            under = {node.name for node, _ in self._leaf_ports(leaf)}
            for node, nic in self._leaf_ports(leaf):
                state = crossing.get(node.job_id or "")
                if state is None:
                    continue
                peers = [node_name(i) for i in state.runner.spec.nodes]
                beyond = sum(1 for p in peers if p not in under) / max(1, len(peers) - 1)
                nic.faults.congestion += fault.slowdown * beyond

    def _degrade_ports(self, fault: FaultSpec) -> None:
        """A degrading leaf's symptom on every port below it; a flapping leaf's links all go down
        as the fault starts (the flaps that follow come once a minute, as nic_link_flap's)."""
        first = fault.index not in self._started
        self._started.add(fault.index)
        for _, nic in self.ports(fault.switch):
            if fault.mode == "errors":
                nic.faults.errors = True
            elif fault.mode == "rate":
                nic.faults.rate_loss = max(nic.faults.rate_loss, 0.5)
            else:
                nic.faults.flapping = True
                if first:
                    nic.link_downed += 1
                    nic.link_error_recovery += 2

    def truth(self, fault: FaultSpec) -> dict[str, object]:
        """The fault's culprit and reach: the switch (its level), the uplink, its ports and jobs."""
        ports = self.ports(fault.switch) if fault.switch else []
        record: dict[str, object] = {
            "switch": fault.switch, "level": self.fabric.switches[fault.switch].level if fault.switch else None,
            "uplink": fault.uplink, "mode": fault.mode,
        }
        if fault.kind == "spine_degrade":
            record["leaves"] = self.leaves(fault.switch)
        if fault.kind != "cable_flap":
            record["ports"] = [[node.name, nic.device] for node, nic in ports]
            record["jobs"] = sorted(self._jobs_of_window(fault))
        return record

    def _jobs_of_window(self, fault: FaultSpec) -> set[str]:
        """Multi-node jobs the fault can slow while it lasts (for scoring job-level alerts)."""
        out = set()
        under = {node.index for node, _ in self.ports(fault.switch)}
        for state in self.jobs.values():
            spec = state.runner.spec
            end = spec.end if spec.end is not None else float("inf")
            if len(spec.nodes) < 2 or not (spec.start < fault.end and fault.start < end):
                continue
            if fault.kind in ("uplink_slow", "spine_degrade"):
                if self._crosses_fault(fault, state):
                    out.add(spec.id)
            elif under.intersection(spec.nodes):
                out.add(spec.id)
        return out

"""The simulator's fabric: the scenario's `fabric:` key and its fault kinds (switch_degrade,
uplink_slow, cable_flap), parsed into the topology model's Fabric and FaultSpecs.

    fabric: {rail_optimised: true, nodes_per_leaf: 16, spines: 4}     # leaf<g>-r<rail>, spine<s>
    fabric: {topology: topology.conf, rails: rails.yml}               # a site's files
    faults:
      - {kind: switch_degrade, switch: leaf2-r3, mode: errors, start: 10m, duration: 10m}
      - {kind: uplink_slow, switch: leaf1-r0, uplink: spine1, start: 30m, duration: 10m, slowdown: 0.5}
      - {kind: cable_flap, node: 5, nic: 2, start: 50m, duration: 5m}

What the faults do to ports and jobs is the fleet's (fleet.py); docs/simulator.md says it.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from flopwatch.sim.scenario import (
    DEFAULT_SLOWDOWN,
    SWITCH_MODES,
    FaultSpec,
    FleetSpec,
    ScenarioError,
    _nic,
    _Reader,
    _window,
    node_name,
)
from flopwatch.topology.model import Fabric, TopologyError

if TYPE_CHECKING:
    from flopwatch.sim.fleet import Fleet, JobState, SimNode
    from flopwatch.sim.nic import SimulatedNic


def parse_fabric(top: _Reader, fleet: FleetSpec, base: Path) -> Fabric | None:
    """`fabric: {rail_optimised: true, nodes_per_leaf, spines}` or `{topology: FILE, rails: FILE}`
    (paths relative to the scenario file), over the fleet's node names."""
    if not top.has("fabric"):
        return None
    r = _Reader(top.raw("fabric"), "fabric")
    r.check_keys({"rail_optimised", "nodes_per_leaf", "spines", "topology", "rails"})
    names = [node_name(i) for i in range(fleet.nodes)]
    if r.raw("rail_optimised", False) is True:
        for key in ("topology", "rails"):
            if r.has(key):
                raise ScenarioError(f"fabric.{key}: a rail_optimised fabric is generated; drop this field or "
                                    "rail_optimised")
        if fleet.nics_per_node == 0:
            raise ScenarioError("fabric.rail_optimised: needs NICs, but fleet.nics_per_node is 0")
        return Fabric.rail_optimised(names, fleet.nics_per_node, r.integer("nodes_per_leaf", 1, 100_000, 16),
                                     r.integer("spines", 1, 1024, 4))
    if not (r.has("topology") or r.has("rails")):
        raise ScenarioError("fabric: expected `rail_optimised: true` or `topology:` and/or `rails:` files")
    from flopwatch.topology.rails import read_rails
    from flopwatch.topology.slurm import read_topology_conf

    def path(key: str) -> Path:
        given = Path(r.text(key))
        return given if given.is_absolute() else (base / given).resolve()

    try:
        fabric = read_topology_conf(path("topology"), known_nodes=names) if r.has("topology") else None
        if r.has("rails"):
            fabric = read_rails(path("rails"), fabric, known_nodes=names)
    except (TopologyError, OSError) as error:
        raise ScenarioError(f"fabric: {error}") from None
    return fabric


def parse_fabric_fault(r: _Reader, kind: str, index: int, fleet: FleetSpec, duration: float,
                  fabric: Fabric | None) -> FaultSpec:
    """switch_degrade {switch, mode}, uplink_slow {switch, uplink}, cable_flap {node, nic}: named
    in the scenario's fabric."""
    where = r.where
    if fabric is None:
        raise ScenarioError(f"{where}: a {kind} fault needs the scenario's `fabric:` (which switches there are)")
    allowed = {"kind", "start", "duration", "slowdown"} | (
        {"node", "nic"} if kind == "cable_flap" else {"switch", "mode" if kind == "switch_degrade" else "uplink"})
    r.check_keys(allowed)
    node = nic = uplink = mode = None
    if kind == "cable_flap":
        node = r.integer("node", 0, 10**9)
        if node >= fleet.nodes:
            raise ScenarioError(f"{where}.node: node {node} is out of range (the fleet has nodes 0-{fleet.nodes - 1})")
        nic = _nic(r, kind, fleet)
        switch = port_switch(fabric, node_name(node), nic)
        if switch is None:
            raise ScenarioError(f"{where}: the fabric does not say which leaf {node_name(node)} NIC {nic} plugs into")
    else:
        switch = r.text("switch")
        leaves = sorted(s.name for s in fabric.switches.values() if s.level == "leaf")
        if switch not in leaves:
            shown = ", ".join(leaves[:6]) + (", ..." if len(leaves) > 6 else "")
            raise ScenarioError(f"{where}.switch: {switch!r} is no leaf switch of the fabric (leaves: {shown})")
        if kind == "switch_degrade":
            mode = r.text("mode", "errors")
            if mode not in SWITCH_MODES:
                raise ScenarioError(f"{where}.mode: expected one of {', '.join(SWITCH_MODES)}, got {mode!r}")
        else:
            uplink = r.text("uplink")
            if uplink not in fabric.uplinks(switch):
                raise ScenarioError(f"{where}.uplink: {switch} has no uplink to {uplink!r} "
                                    f"(it has: {', '.join(fabric.uplinks(switch)) or 'none'})")
    start, end = _window(r, duration)
    return FaultSpec(kind=kind, node=node, gpu=None, nic=nic, start=start, end=end,
                     slowdown=r.number("slowdown", 0, 0.9, DEFAULT_SLOWDOWN[kind]), xid=None, index=index,
                     switch=switch, uplink=uplink, mode=mode)


def port_switch(fabric: Fabric, node: str, nic: int) -> str | None:
    """The leaf NIC `nic` (mlx5_<nic>) of `node` plugs into: its link, else the node's only leaf."""
    device = f"mlx5_{nic}"
    for link in fabric.links:
        if link.node == node and link.device == device:
            return link.switch
    leaves = fabric.leaves_of(node)
    return leaves[0] if len(leaves) == 1 else None


class FabricFaults:
    """Switch and uplink faults on a fleet's ports and jobs (cable_flap is the fleet's, as nic_link_flap).

    - switch_degrade: every port under the leaf gets the mode's symptom; every job with ranks on
      more than one node that has a port there communicates `slowdown` slower (its step grows by
      slowdown x its exposed communication).
    - uplink_slow: jobs whose traffic crosses that leaf-to-upper link (Fabric.crosses) communicate
      `slowdown` slower; the ports under the leaf wait for credit in proportion to the share of
      their job's peers beyond the leaf. Jobs inside the leaf cross nothing and see nothing.
    """

    def __init__(self, fleet: Fleet, fabric: Fabric) -> None:
        self.fleet, self.fabric = fleet, fabric
        self._ports: dict[str, list[tuple[SimNode, SimulatedNic]]] = {}
        self._crosses: dict[str, set[tuple[str, str]]] = {}

    def ports(self, leaf: str) -> list[tuple[SimNode, SimulatedNic]]:
        """The NIC ports plugged into `leaf`: the fabric's links, else every NIC of its nodes."""
        if leaf not in self._ports:
            by_name = {node.name: node for node in self.fleet.nodes}
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
        jobs = [s for s in self.fleet.jobs.values() if len(s.runner.spec.nodes) > 1
                and any(node.job_id == s.runner.spec.id for node in (self.fleet.nodes[i] for i in s.runner.spec.nodes))]
        if fault.kind == "uplink_slow":
            return [s for s in jobs if (fault.switch, fault.uplink) in self.crosses(s)]
        under = {node.index for node, _ in self.ports(fault.switch)}
        return [s for s in jobs if under.intersection(s.runner.spec.nodes)]

    def apply(self, fault: FaultSpec) -> None:
        """The fault's effect for the coming tick (faults were reset before)."""
        hit = self.jobs_hit(fault)
        for state in hit:
            state.runner.slow.comm_extra += fault.slowdown * state.runner.comm_exposed
        if fault.kind == "switch_degrade":
            for _, nic in self.ports(fault.switch):
                if fault.mode == "errors":
                    nic.faults.errors = True
                elif fault.mode == "rate":
                    nic.faults.rate_loss = max(nic.faults.rate_loss, 0.5)
                else:
                    nic.faults.flapping = True
            return
        under = {node.name for node, _ in self.ports(fault.switch)}
        crossing = {s.runner.spec.id: s for s in hit}
        for node, nic in self.ports(fault.switch):
            state = crossing.get(node.job_id or "")
            if state is None:
                continue
            peers = [node_name(i) for i in state.runner.spec.nodes]
            beyond = sum(1 for p in peers if p not in under) / max(1, len(peers) - 1)
            nic.faults.congestion += fault.slowdown * beyond

    def truth(self, fault: FaultSpec) -> dict[str, object]:
        """The fault's culprit and reach: the switch (its level), the uplink, its ports and jobs."""
        ports = self.ports(fault.switch) if fault.switch else []
        record: dict[str, object] = {
            "switch": fault.switch, "level": self.fabric.switches[fault.switch].level if fault.switch else None,
            "uplink": fault.uplink, "mode": fault.mode,
        }
        if fault.kind != "cable_flap":
            record["ports"] = [[node.name, nic.device] for node, nic in ports]
            record["jobs"] = sorted(self._jobs_of_window(fault))
        return record

    def _jobs_of_window(self, fault: FaultSpec) -> set[str]:
        """Multi-node jobs the fault can slow while it lasts (for scoring job-level alerts)."""
        out = set()
        under = {node.index for node, _ in self.ports(fault.switch)}
        for state in self.fleet.jobs.values():
            spec = state.runner.spec
            end = spec.end if spec.end is not None else float("inf")
            if len(spec.nodes) < 2 or not (spec.start < fault.end and fault.start < end):
                continue
            if fault.kind == "uplink_slow":
                if (fault.switch, fault.uplink) in self.crosses(state):
                    out.add(spec.id)
            elif under.intersection(spec.nodes):
                out.add(spec.id)
        return out

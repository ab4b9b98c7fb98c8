"""The fabric collector: this node's slice of the topology as info series.

Given a Fabric (from topology.conf and/or the rails YAML) and the node name, it serves one
`flopwatch_fabric_link_info` per NIC port of the node and one `flopwatch_fabric_switch_info` per
uplink of every switch above it. When the topology knows the node's leaf but not its NICs
(topology.conf alone), the node's RDMA ports come from `ports` (the NIC collector's last scan)
and all plug into that one leaf. The simulator passes each simulated node's slice to this same
collector.

Sample output:

    flopwatch_fabric_link_info{node="gpu001",device="mlx5_0",port="1",switch="leaf1-r0",level="leaf",rail="0"} 1.0
    flopwatch_fabric_switch_info{node="gpu001",switch="leaf1-r0",level="leaf",parent="spine1"} 1.0
    flopwatch_fabric_switch_info{node="gpu001",switch="spine1",level="spine",parent=""} 1.0
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING

from prometheus_client.core import Metric as Family

from flopwatch.catalog import fabric as m
from flopwatch.topology.model import Fabric

if TYPE_CHECKING:
    from flopwatch.config import AgentConfig

log = logging.getLogger(__name__)

Ports = Callable[[], Iterable[tuple[str, str]]]


class FabricCollector:
    """prometheus_client custom collector; the topology is read once, at start."""

    name = "fabric"

    def __init__(self, node: str, fabric: Fabric, ports: Ports | None = None) -> None:
        self.node = node
        self.fabric = fabric.slice_for(node)
        self.ports = ports
        self._links: list[tuple[str, str, str, str]]  # device, port, switch, rail
        self._warned = False
        self._links = self._read_links()
        if node not in self.fabric.node_switches:
            log.warning("fabric: node %s is in no switch of the topology; serving no fabric series", node)

    def update(self) -> int:
        self._links = self._read_links()
        return 0

    def _read_links(self) -> list[tuple[str, str, str, str]]:
        own = [(ln.device, str(ln.port), ln.switch, "" if ln.rail is None else str(ln.rail))
               for ln in self.fabric.links]
        if own:
            return own
        leaves = self.fabric.leaves_of(self.node)
        if len(leaves) != 1 or self.ports is None:
            if len(leaves) > 1 and not self._warned:
                self._warned = True
                log.warning("fabric: node %s plugs into %d leaves but the topology names no NIC per "
                            "leaf; give topology.rails to map each port", self.node, len(leaves))
            return []
        return [(device, port, leaves[0], "") for device, port in sorted(self.ports())]

    def close(self) -> None:
        pass

    def collect(self) -> Iterator[Family]:
        links, switches = m.LINK_INFO.family(), m.SWITCH_INFO.family()
        for device, port, switch, rail in self._links:
            links.add_metric([self.node, device, port, switch, self.fabric.switches[switch].level, rail], 1)
        for name, switch in self.fabric.switches.items():
            for parent in self.fabric.uplinks(name) or ("",):
                switches.add_metric([self.node, name, switch.level, parent], 1)
        yield links
        yield switches


def read_fabric(slurm: str | None, rails: str | None) -> Fabric:
    """The fabric from the agent's topology files (either or both); TopologyError when wrong."""
    from flopwatch.topology.rails import read_rails
    from flopwatch.topology.slurm import read_topology_conf

    fabric = read_topology_conf(slurm) if slurm else None
    if rails:
        fabric = read_rails(rails, fabric)
    if fabric is None:
        raise ValueError("read_fabric needs topology.slurm or topology.rails")
    return fabric


def fabric_collectors(config: AgentConfig, collectors: Sequence[object]) -> list[FabricCollector]:
    """The agent's fabric collector when topology.slurm or topology.rails is set (else none).

    Its ports come from the NIC collector among `collectors`, when there is one. A wrong
    topology file is a UsageError: one line naming the file, the line and what was expected."""
    if not (config.topology.slurm or config.topology.rails):
        return []
    from flopwatch.errors import UsageError
    from flopwatch.exporters.nic import NicCollector
    from flopwatch.topology.model import TopologyError

    try:
        fabric = read_fabric(config.topology.slurm, config.topology.rails)
    except TopologyError as error:
        raise UsageError(f"topology error: {error}") from None
    nic = next((c for c in collectors if isinstance(c, NicCollector)), None)
    ports = None if nic is None else (lambda: [(p.device, p.port) for p in nic.last_scan.ports])
    return [FabricCollector(config.node, fabric, ports)]

"""Fabric topology as info series: which switch each NIC port plugs into, and which switches sit
above it, so rules can join NIC counters to switches and name a shared fault once.

Served by each agent for its own node's slice of the topology (topology.slurm, topology.rails):
agents under the same leaf serve the same switch lines, and rules dedupe them with
`max by (switch, parent)`.
"""

from flopwatch.catalog.metric import Metric

LINK_INFO = Metric(
    "flopwatch_fabric_link_info", "gauge", "",
    "Always 1; one series per NIC port of this node naming the leaf switch it plugs into, that "
    "switch's level (leaf) and the NIC's rail (empty when the topology does not say).",
    ("device", "port", "switch", "level", "rail"),
    availability="agents given a topology (topology.slurm and/or topology.rails)",
)
SWITCH_INFO = Metric(
    "flopwatch_fabric_switch_info", "gauge", "",
    "Always 1; one series per uplink of each switch above this node (`parent` the upper switch, "
    "empty for a switch without uplinks), with the switch's level: leaf, spine or core.",
    ("switch", "level", "parent"),
    availability="agents given a topology (topology.slurm and/or topology.rails)",
)

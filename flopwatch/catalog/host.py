"""Host figures the straggler rules and reports need next to the GPUs: CPU busy and steal per
NUMA node (the cores that feed a GPU), memory, pressure stall (PSI) and processes on GPUs.

node_exporter remains the general host exporter; these few series exist so a rule can say "the
cores next to GPU 3 were saturated" without joining per-CPU series from another exporter.
"""

from flopwatch.catalog.metric import Metric

CPU_SECONDS = Metric(
    "flopwatch_host_cpu_seconds_total", "counter", "seconds",
    "CPU time summed over the online CPUs of a NUMA node, by mode: busy (user, nice, system, irq, "
    "softirq; guest time is inside user), steal (taken by the hypervisor), iowait, idle. "
    "Busy fraction = rate(busy) / flopwatch_host_cpus.", ("numa_node", "mode"),
)
CPUS = Metric(
    "flopwatch_host_cpus", "gauge", "",
    "Online CPUs of the NUMA node (numa_node=\"all\" where the kernel shows no NUMA topology).",
    ("numa_node",),
)
MEMORY_TOTAL = Metric(
    "flopwatch_host_memory_total_bytes", "gauge", "bytes", "Physical memory installed.",
)
MEMORY_AVAILABLE = Metric(
    "flopwatch_host_memory_available_bytes", "gauge", "bytes",
    "Memory available to start new work without swapping (MemAvailable).",
)
PRESSURE_STALLED = Metric(
    "flopwatch_host_pressure_stalled_seconds_total", "counter", "seconds",
    "Pressure stall time (PSI) by resource (cpu, memory, io) and kind: some (at least one task "
    "stalled), full (all non-idle tasks stalled).", ("resource", "kind"),
    availability="Linux 4.20 and newer with PSI enabled",
)
GPU_PROCESSES = Metric(
    "flopwatch_host_gpu_processes", "gauge", "",
    "Distinct processes running on any GPU of the node.",
)

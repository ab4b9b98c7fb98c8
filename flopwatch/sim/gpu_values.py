"""What GpuCollector exports for a SimulatedGpu that answers, read straight from the GPU's state:
one table for both fast readers of the fleet (the simulator's own node agents and the detection
benchmark's bulk sampler), so the values cannot be spelled twice. The tests hold both readers to the
real collector's exposition, series for series and value for value (tests/test_bench_sampler.py,
tests/test_sim_render.py).
"""

from __future__ import annotations

from collections.abc import Callable

from flopwatch.catalog import Metric
from flopwatch.catalog import gpu as g
from flopwatch.exporters.gpu.reading import CLOCK_EVENT_REASONS, clock_event_mask
from flopwatch.exporters.gpu.simulated import MHZ, SIM_DRIVER_VERSION, SimulatedGpu


def busy(gpu: SimulatedGpu) -> float:
    return 0.0 if gpu.idle else gpu.workload.busy


def nvlink_sum(gpu: SimulatedGpu, counters: str) -> float:
    return sum(getattr(gpu.c, counters))


GpuValue = Callable[[SimulatedGpu], float]
#: GPU metrics with one series per GPU (label `gpu` only): value as GpuCollector.blocks() emits it for
#: a GPU that answered (SimulatedGpu._reading, per-link NVLink off).
GPU_SCALARS: dict[Metric, GpuValue] = {
    g.UP: lambda gpu: 1.0,
    g.UTILIZATION: lambda gpu: min(1.0, busy(gpu)),
    g.MEMORY_UTILIZATION: lambda gpu: min(1.0, 0.4 * busy(gpu) + 0.2 * gpu.workload.tensor),
    g.SM_CLOCK: lambda gpu: gpu.sm_clock_hz,
    g.SM_CLOCK_MAX: lambda gpu: gpu.model.sm_clock_max_mhz * MHZ,
    g.MEMORY_CLOCK: lambda gpu: gpu.model.memory_clock_mhz * MHZ,
    g.POWER: lambda gpu: gpu.power_watts,
    g.POWER_LIMIT: lambda gpu: gpu.power_limit(),
    g.ENERGY: lambda gpu: gpu.c.energy_j,
    g.TEMPERATURE: lambda gpu: int(gpu.temperature_c),
    g.MEMORY_TEMPERATURE: lambda gpu: int(gpu.temperature_c) + 4,
    g.MEMORY_USED: lambda gpu: int(gpu.model.memory_bytes * gpu.workload.memory_fraction),
    g.MEMORY_TOTAL: lambda gpu: gpu.model.memory_bytes,
    g.PCIE_GENERATION: lambda gpu: gpu.model.pcie_generation,
    g.PCIE_WIDTH: lambda gpu: gpu.faults.pcie_width or gpu.model.pcie_width,
    g.PCIE_MAX_GENERATION: lambda gpu: gpu.model.pcie_generation,
    g.PCIE_MAX_WIDTH: lambda gpu: gpu.model.pcie_width,
    g.PCIE_REPLAYS: lambda gpu: gpu.c.pcie_replays,
    g.ECC_CORRECTED: lambda gpu: gpu.c.ecc_corrected,
    g.ECC_UNCORRECTED: lambda gpu: gpu.c.ecc_uncorrected,
    g.ROW_REMAP_PENDING: lambda gpu: 0.0,
    g.ROW_REMAP_FAILED: lambda gpu: 0.0,
    g.SM_ACTIVE: lambda gpu: busy(gpu) * 0.95,
    g.SM_OCCUPANCY: lambda gpu: busy(gpu) * 0.45,
    g.TENSOR_ACTIVE: lambda gpu: min(gpu.workload.tensor, busy(gpu)),
    g.DRAM_ACTIVE: lambda gpu: busy(gpu) * 0.35,
    g.CLOCK_EVENT_REASONS: lambda gpu: clock_event_mask(gpu.clock_events()),
    g.PROCESSES: lambda gpu: 0.0,
}
REASONS = tuple(sorted(CLOCK_EVENT_REASONS))
#: GPU metrics with a fixed set of series per GPU: (label values after `gpu`, per GPU) and values.
GPU_VARIANTS: dict[Metric, tuple[Callable[[SimulatedGpu], list[tuple[str, ...]]],
                                 Callable[[SimulatedGpu], list[float]]]] = {
    g.INFO: (lambda gpu: [(gpu.uuid, gpu.model.name, SIM_DRIVER_VERSION)], lambda gpu: [1.0]),
    g.PEAK_FLOPS: (lambda gpu: [(dtype,) for dtype in sorted(gpu.model.peak_dense_flops)],
                   lambda gpu: [float(v) for _, v in sorted(gpu.model.peak_dense_flops.items())]),
    g.CLOCK_EVENT_ACTIVE: (lambda gpu: [(reason,) for reason in REASONS],
                           lambda gpu: [float(v) for _, v in sorted(gpu.clock_events().items())]),
    g.PCIE_BYTES: (lambda gpu: [("tx",), ("rx",)],
                   lambda gpu: [float(int(gpu.c.pcie_tx)), float(int(gpu.c.pcie_rx))]),
    g.REMAPPED_ROWS: (lambda gpu: [("correctable",), ("uncorrectable",)],
                      lambda gpu: [0.0, float(gpu.remapped_uncorrectable)]),
    g.NVLINK_BYTES: (lambda gpu: [("all", "tx"), ("all", "rx")] if gpu.model.nvlink_links else [],
                     lambda gpu: [float(int(nvlink_sum(gpu, "nvlink_tx"))), float(int(nvlink_sum(gpu, "nvlink_rx")))]
                     if gpu.model.nvlink_links else []),
    g.NVLINK_ERRORS: (lambda gpu: [("all", "crc"), ("all", "recovery"), ("all", "replay")]
                      if gpu.model.nvlink_links else [],
                      lambda gpu: [float(nvlink_sum(gpu, "nvlink_crc")), float(nvlink_sum(gpu, "nvlink_recovery")),
                                   float(nvlink_sum(gpu, "nvlink_replay"))] if gpu.model.nvlink_links else []),
}
#: GPU metrics whose series come and go: [(label values after `gpu`, value)] per GPU.
GPU_DYNAMIC: dict[Metric, Callable[[SimulatedGpu], list[tuple[tuple[str, ...], float]]]] = {
    g.CLOCK_EVENT_VIOLATION: lambda gpu: [((reason,), float(seconds))
                                          for reason, seconds in sorted(gpu.c.violation.items())],
    g.XID_ERRORS: lambda gpu: [((str(xid),), float(count)) for xid, count in sorted(gpu.xids.items())],
}
GPU_METRICS = (*GPU_SCALARS, *GPU_VARIANTS, *GPU_DYNAMIC)

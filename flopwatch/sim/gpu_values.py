"""What GpuCollector exports for a SimulatedGpu that answers, read straight from the GPU's state:
one table for both fast readers of the fleet (the simulator's own node agents and the detection
benchmark's bulk sampler), so the values cannot be spelled twice. The tests hold both readers to the
real collector's exposition, series for series and value for value (tests/test_bench_sampler.py,
tests/test_sim_render.py).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from flopwatch.catalog import Metric
from flopwatch.catalog import gpu as g
from flopwatch.exporters.gpu.reading import CLOCK_EVENT_REASONS, clock_event_mask
from flopwatch.exporters.gpu.simulated import MHZ, SIM_DRIVER_VERSION, SimulatedGpu, clock_events_of


def busy(gpu: SimulatedGpu) -> float:
    return 0.0 if gpu.idle else gpu.workload.busy


#: GPU metrics with one series per GPU (label `gpu` only), in the order of scalar_row's values.
SCALAR_METRICS: tuple[Metric, ...] = (
    g.UP, g.UTILIZATION, g.MEMORY_UTILIZATION, g.SM_CLOCK, g.SM_CLOCK_MAX, g.MEMORY_CLOCK, g.POWER, g.POWER_LIMIT,
    g.ENERGY, g.TEMPERATURE, g.MEMORY_TEMPERATURE, g.MEMORY_USED, g.MEMORY_TOTAL, g.PCIE_GENERATION, g.PCIE_WIDTH,
    g.PCIE_MAX_GENERATION, g.PCIE_MAX_WIDTH, g.PCIE_REPLAYS, g.ECC_CORRECTED, g.ECC_UNCORRECTED,
    g.ROW_REMAP_PENDING, g.ROW_REMAP_FAILED, g.SM_ACTIVE, g.SM_OCCUPANCY, g.TENSOR_ACTIVE, g.DRAM_ACTIVE,
    g.CLOCK_EVENT_REASONS, g.PROCESSES,
)
#: Where each of SCALAR_METRICS sits in a row.
SCALAR_INDEX: dict[Metric, int] = {metric: i for i, metric in enumerate(SCALAR_METRICS)}


def scalar_row(gpu: SimulatedGpu) -> tuple[float, ...]:
    """Every SCALAR_METRICS value as GpuCollector.blocks() emits it for a GPU that answered
    (SimulatedGpu._reading): one call per GPU rather than one per metric and GPU, which is what a
    simulator serving 10,000 GPUs spends most of its GPU time on."""
    w, model, c = gpu.workload, gpu.model, gpu.c
    used = busy(gpu)
    temperature = float(int(gpu.temperature_c))
    generation = float(model.pcie_generation)
    return (
        1.0, min(1.0, used), min(1.0, 0.4 * used + 0.2 * w.tensor), float(gpu.sm_clock_hz),
        float(model.sm_clock_max_mhz * MHZ), float(model.memory_clock_mhz * MHZ), float(gpu.power_watts),
        float(gpu.power_limit()), float(c.energy_j), temperature, temperature + 4,
        float(int(model.memory_bytes * w.memory_fraction)), float(model.memory_bytes), generation,
        float(gpu.faults.pcie_width or model.pcie_width), generation, float(model.pcie_width),
        float(c.pcie_replays), float(c.ecc_corrected), float(c.ecc_uncorrected), 0.0, 0.0,
        used * 0.95, used * 0.45, min(w.tensor, used), used * 0.35, clock_event_values(gpu)[0], 0.0,
    )


def clock_event_values(gpu: SimulatedGpu) -> tuple[float, list[float]]:
    """The clock-event mask and each reason's 0/1 in REASONS order (one of 32 states, each built once)."""
    return _clock_event_values(gpu.clock_event_key())


@functools.cache
def _clock_event_values(key: tuple[bool, bool, bool, bool, bool]) -> tuple[float, list[float]]:
    active = clock_events_of(key)
    return float(clock_event_mask(active)), [float(active[reason]) for reason in REASONS]


REASONS = tuple(sorted(CLOCK_EVENT_REASONS))


def _active_reasons(gpus: list[SimulatedGpu]) -> list[float]:
    return [value for gpu in gpus for value in clock_event_values(gpu)[1]]


def _nvlink_bytes(gpus: list[SimulatedGpu]) -> list[float]:
    return [value for gpu in gpus if gpu.model.nvlink_links
            for value in (float(int(sum(gpu.c.nvlink_tx))), float(int(sum(gpu.c.nvlink_rx))))]


def _nvlink_errors(gpus: list[SimulatedGpu]) -> list[float]:
    return [float(sum(counts)) for gpu in gpus if gpu.model.nvlink_links
            for counts in (gpu.c.nvlink_crc, gpu.c.nvlink_recovery, gpu.c.nvlink_replay)]


#: GPU metrics with a fixed set of series per GPU: (label values after `gpu`, per GPU) and the
#: values of a list of GPUs, GPU after GPU in the same order (one call per node or fleet, not per
#: GPU: the simulator calls these for 10,000 GPUs every tick).
GPU_VARIANTS: dict[Metric, tuple[Callable[[SimulatedGpu], list[tuple[str, ...]]],
                                 Callable[[list[SimulatedGpu]], list[float]]]] = {
    g.INFO: (lambda gpu: [(gpu.uuid, gpu.model.name, SIM_DRIVER_VERSION)], lambda gpus: [1.0] * len(gpus)),
    g.PEAK_FLOPS: (lambda gpu: [(dtype,) for dtype in sorted(gpu.model.peak_dense_flops)],
                   lambda gpus: [float(v) for gpu in gpus for _, v in sorted(gpu.model.peak_dense_flops.items())]),
    g.CLOCK_EVENT_ACTIVE: (lambda gpu: [(reason,) for reason in REASONS], _active_reasons),
    g.PCIE_BYTES: (lambda gpu: [("tx",), ("rx",)],
                   lambda gpus: [float(int(value)) for gpu in gpus for value in (gpu.c.pcie_tx, gpu.c.pcie_rx)]),
    g.REMAPPED_ROWS: (lambda gpu: [("correctable",), ("uncorrectable",)],
                      lambda gpus: [value for gpu in gpus for value in (0.0, float(gpu.remapped_uncorrectable))]),
    g.NVLINK_BYTES: (lambda gpu: [("all", "tx"), ("all", "rx")] if gpu.model.nvlink_links else [], _nvlink_bytes),
    g.NVLINK_ERRORS: (lambda gpu: [("all", "crc"), ("all", "recovery"), ("all", "replay")]
                      if gpu.model.nvlink_links else [], _nvlink_errors),
}
#: GPU metrics whose series come and go: [(label values after `gpu`, value)] per GPU.
GPU_DYNAMIC: dict[Metric, Callable[[SimulatedGpu], list[tuple[tuple[str, ...], float]]]] = {
    g.CLOCK_EVENT_VIOLATION: lambda gpu: [((reason,), float(seconds))
                                          for reason, seconds in sorted(gpu.c.violation.items())],
    g.XID_ERRORS: lambda gpu: [((str(xid),), float(count)) for xid, count in sorted(gpu.xids.items())],
}
GPU_METRICS = (*SCALAR_METRICS, *GPU_VARIANTS, *GPU_DYNAMIC)

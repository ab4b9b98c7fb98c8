"""The agent's GPU collector for a simulated node, without building a GpuReading per GPU per tick.

A simulator serving 10,000 GPUs runs 1,250 of these every 5 s. The real GpuCollector reads each GPU
through a future, builds a GpuReading and a snapshot, then turns them into blocks: about 40 µs a
GPU, most of the simulator's CPU. While every GPU of the node answers (none lost, none being
retried, NVLink summed per GPU), this subclass skips the reads and fills the same blocks straight
from the SimulatedGpu objects with the values of flopwatch/sim/gpu_values.py, reusing each
metric's label tuples from tick to tick. Otherwise (a lost GPU, its backoff and read errors,
per-link NVLink) it is the real collector, so the state machine stays the agent's own.
tests/test_sim_render.py holds the two to the same bytes over faults, lost and recovered GPUs.
"""

from __future__ import annotations

from flopwatch.catalog import Metric
from flopwatch.catalog import gpu as m
from flopwatch.exporters.exposition import Blocks
from flopwatch.exporters.gpu.collector import SCALAR_READINGS, GpuCollector
from flopwatch.exporters.gpu.simulated import SimBackend, SimulatedGpu
from flopwatch.sim.gpu_values import GPU_DYNAMIC, GPU_VARIANTS, SCALAR_METRICS, scalar_row

#: After the per-GPU scalars, the metrics in the order GpuCollector.blocks() first adds them.
_FIXED_AFTER_SCALARS = (m.PROCESSES, m.CLOCK_EVENT_ACTIVE)
_VARIANTS_AFTER_VIOLATION = (m.PCIE_BYTES, m.REMAPPED_ROWS, m.NVLINK_BYTES, m.NVLINK_ERRORS)


class SimGpuCollector(GpuCollector):
    """GpuCollector over a SimBackend the fleet advances; fast while every GPU answers."""

    def __init__(self, backend: SimBackend, *args: object, **kwargs: object) -> None:
        super().__init__(backend, *args, **kwargs)  # type: ignore[arg-type]
        self.sim_backend = backend
        self.fast = False   # the last update skipped the reads (every GPU answered)
        self._series: dict[Metric, list[tuple[str, ...]]] = {}
        self._fixed_values: dict[Metric, list[float]] = {}
        self._shapes: dict[Metric, tuple[tuple[tuple[tuple[str, ...], ...], ...], list[tuple[str, ...]]]] = {}

    def _all_answer(self) -> bool:
        backend = self.sim_backend
        if backend.nvlink_per_link or backend.self_advancing:
            return False
        return all(state.up and not state.lost and state.pending is None and state.index in self.peaks
                   for state in self.states) and not any(gpu.lost for gpu in backend.gpus)

    def update(self) -> int:
        """A read of every GPU would succeed: nothing for the collector's state to learn. The first
        update, and any while a GPU is lost or being retried, is the real one."""
        self.fast = self._all_answer()
        return 0 if self.fast else super().update()

    def blocks(self) -> Blocks:
        if not self.fast:
            return super().blocks()
        gpus: list[SimulatedGpu] = self.sim_backend.gpus
        out = Blocks(self.node)
        rows = list(map(scalar_row, gpus))
        columns = dict(zip(SCALAR_METRICS, map(list, zip(*rows, strict=True)), strict=True)) if rows else {}
        if any(state.errors for state in self.states):
            self._per_state(out, gpus)
        else:   # up, info and peaks are fixed while every GPU answers
            self._scalar(out, m.UP, columns, gpus)
            self._variants(out, m.INFO, gpus, fixed=True)
            self._variants(out, m.PEAK_FLOPS, gpus, fixed=True)
        for metric, _ in SCALAR_READINGS:
            self._scalar(out, metric, columns, gpus)
        self._scalar(out, _FIXED_AFTER_SCALARS[0], columns, gpus)
        self._variants(out, _FIXED_AFTER_SCALARS[1], gpus)
        self._dynamic(out, m.CLOCK_EVENT_VIOLATION, gpus)
        for metric in _VARIANTS_AFTER_VIOLATION:
            self._variants(out, metric, gpus)
        self._dynamic(out, m.XID_ERRORS, gpus)
        return out

    def _per_state(self, out: Blocks, gpus: list[SimulatedGpu]) -> None:
        """Up, info, read errors and peaks GPU by GPU, as GpuCollector.blocks() adds them (the
        order of the metrics then depends on which GPU has errors)."""
        put = out.add
        info, _ = GPU_VARIANTS[m.INFO]
        for state, gpu in zip(self.states, gpus, strict=True):
            index = str(state.index)
            put(m.UP, (index,), True)
            put(m.INFO, (index, *info(gpu)[0]), 1)
            for cause, count in sorted(state.errors.items()):
                put(m.READ_ERRORS, (index, cause), count)
            for dtype, flops in sorted(self.peaks[state.index].items()):
                put(m.PEAK_FLOPS, (index, dtype), flops)

    def _scalar(self, out: Blocks, metric: Metric, columns: dict[Metric, list[float]],
                gpus: list[SimulatedGpu]) -> None:
        series = self._series.get(metric)
        if series is None:
            series = self._series[metric] = [(self.node, str(gpu.index)) for gpu in gpus]
        out.series[metric] = series
        out.values[metric] = columns.get(metric, [])

    def _variants(self, out: Blocks, metric: Metric, gpus: list[SimulatedGpu], fixed: bool = False) -> None:
        """A metric with a fixed set of series per GPU; `fixed`: its values too (built once)."""
        labels, values = GPU_VARIANTS[metric]
        series = self._series.get(metric)
        if series is None:
            series = self._series[metric] = [(self.node, str(gpu.index), *rest) for gpu in gpus for rest in labels(gpu)]
        if not series:
            return
        out.series[metric] = series
        if not fixed:
            out.values[metric] = values(gpus)
            return
        constant = self._fixed_values.get(metric)
        if constant is None:
            constant = self._fixed_values[metric] = values(gpus)
        out.values[metric] = constant

    def _dynamic(self, out: Blocks, metric: Metric, gpus: list[SimulatedGpu]) -> None:
        """Series that come and go, their label tuples reused while every GPU has the same ones
        (the violation reasons: the same three on every GPU from the first tick on)."""
        found = [GPU_DYNAMIC[metric](gpu) for gpu in gpus]
        if not any(found):   # no XID on any GPU: the common case
            return
        shape = tuple(tuple(rest for rest, _ in pairs) for pairs in found)
        cached = self._shapes.get(metric)
        if cached is None or cached[0] != shape:
            cached = self._shapes[metric] = (shape, [(self.node, str(gpu.index), *rest)
                                                     for gpu, rests in zip(gpus, shape, strict=True) for rest in rests])
        values = [value for pairs in found for _, value in pairs]
        if metric in out.series:
            out.series[metric] = out.series[metric] + cached[1]
            out.values[metric] += values
        else:   # the cached list itself: the renderer then knows the series are unchanged
            out.series[metric], out.values[metric] = cached[1], values

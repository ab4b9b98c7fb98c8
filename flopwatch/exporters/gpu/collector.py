"""The GPU collector: reads every GPU through a backend on the agent's clock, isolating faults.

Each GPU is read in its own worker so one hanging or lost GPU cannot hold up the others: a read
past `timeout` marks that GPU down (`flopwatch_gpu_up` 0, a `timeout` read error) and the GPU is
skipped until the stuck call returns; a lost GPU is retried with exponential backoff.

Sample output (one GPU, abridged):

    flopwatch_gpu_up{node="n1",gpu="0"} 1.0
    flopwatch_gpu_sm_clock_hertz{node="n1",gpu="0"} 1.98e+09
    flopwatch_gpu_clock_event_active{node="n1",gpu="0",reason="sw_thermal"} 0.0
    flopwatch_gpu_nvlink_bytes_total{node="n1",gpu="0",link="3",direction="tx"} 4.2e+12
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass, field

from prometheus_client.core import Metric as Family

from flopwatch.catalog import gpu as m
from flopwatch.config import GpuOptions
from flopwatch.exporters.exposition import Blocks
from flopwatch.exporters.gpu.backend import GpuBackend
from flopwatch.exporters.gpu.reading import GpuReadError, GpuReading
from flopwatch.hardware import match_device_name, model_by_name

log = logging.getLogger(__name__)

BACKOFF_START_S = 5.0
BACKOFF_MAX_S = 300.0


@dataclass
class _GpuState:
    index: int
    up: bool = False
    reading: GpuReading | None = None
    last_known: GpuReading | None = None     # for the info series while the GPU is down
    errors: dict[str, int] = field(default_factory=dict)
    pending: Future | None = None
    lost: bool = False
    backoff_s: float = BACKOFF_START_S
    retry_at: float = 0.0
    warned_unknown_model: bool = False


@dataclass(frozen=True)
class _Snapshot:
    states: tuple[tuple[int, bool, GpuReading | None, GpuReading | None, dict[str, int]], ...]
    xids: dict[tuple[int, int], int]
    peaks: dict[int, dict[str, float]]


#: Readings with one value per GPU (label `gpu` only): catalogue metric <- GpuReading attribute.
SCALAR_READINGS: tuple[tuple[m.Metric, str], ...] = (
    (m.UTILIZATION, "utilization"), (m.MEMORY_UTILIZATION, "memory_utilization"),
    (m.SM_CLOCK, "sm_clock_hz"), (m.SM_CLOCK_MAX, "sm_clock_max_hz"), (m.MEMORY_CLOCK, "memory_clock_hz"),
    (m.POWER, "power_watts"), (m.POWER_LIMIT, "power_limit_watts"), (m.ENERGY, "energy_joules"),
    (m.TEMPERATURE, "temperature_c"), (m.MEMORY_TEMPERATURE, "memory_temperature_c"),
    (m.MEMORY_USED, "memory_used_bytes"), (m.MEMORY_TOTAL, "memory_total_bytes"),
    (m.PCIE_GENERATION, "pcie_generation"), (m.PCIE_WIDTH, "pcie_width"),
    (m.PCIE_MAX_GENERATION, "pcie_max_generation"), (m.PCIE_MAX_WIDTH, "pcie_max_width"),
    (m.PCIE_REPLAYS, "pcie_replays"), (m.ECC_CORRECTED, "ecc_corrected"),
    (m.ECC_UNCORRECTED, "ecc_uncorrected"), (m.ROW_REMAP_PENDING, "row_remap_pending"),
    (m.ROW_REMAP_FAILED, "row_remap_failed"), (m.SM_ACTIVE, "sm_active"), (m.SM_OCCUPANCY, "sm_occupancy"),
    (m.TENSOR_ACTIVE, "tensor_active"), (m.DRAM_ACTIVE, "dram_active"),
    (m.CLOCK_EVENT_REASONS, "clock_event_mask"),
)


class _InlineExecutor:
    """Runs submitted reads at once in the caller's thread (Executor's submit/shutdown subset)."""

    def submit(self, fn: Callable[..., GpuReading], *args: object) -> Future:
        future: Future = Future()
        try:
            future.set_result(fn(*args))
        except BaseException as error:
            future.set_exception(error)
        return future

    def shutdown(self, wait: bool = True, cancel_futures: bool = False) -> None:
        pass


class GpuCollector:
    """prometheus_client custom collector: `update()` reads hardware, `collect()` only renders."""

    name = "gpu"

    def __init__(self, backend: GpuBackend, node: str, options: GpuOptions, count: int,
                 threaded: bool = True, clock: Callable[[], float] = time.monotonic) -> None:
        """`threaded=False` reads GPUs inline: only for backends that cannot hang (the simulator,
        which runs thousands of these collectors and cannot afford a thread pool each). `clock`
        drives the lost-GPU backoff (the simulator passes its simulated time)."""
        self.clock = clock
        self.backend = backend
        self.node = node
        self.options = options
        self.states = [_GpuState(i) for i in range(count)]
        self.peaks: dict[int, dict[str, float]] = {}
        self._pool = ThreadPoolExecutor(max_workers=max(1, count), thread_name_prefix="gpu-read") \
            if threaded else _InlineExecutor()
        self._snapshot = _Snapshot((), {}, {})

    # -- collection (agent clock) --------------------------------------------------------------
    def update(self) -> int:
        """Read all GPUs once; return how many errors were met."""
        now = self.clock()
        submitted: dict[int, Future] = {}
        for state in self.states:
            if state.pending is not None and not state.pending.done():
                continue  # still stuck in a previous call: already reported as timed out
            state.pending = None
            if state.lost and now < state.retry_at:
                continue
            submitted[state.index] = self._pool.submit(self._read_one, state.index, state.lost)
            state.pending = submitted[state.index]
        if submitted:
            wait_futures(list(submitted.values()), timeout=self.options.timeout)
        errors = 0
        for state in self.states:
            future = submitted.get(state.index)
            if future is None:
                if state.pending is not None or state.lost:
                    state.up = False
                continue
            try:
                reading = future.result(timeout=0)
            except FutureTimeout:
                errors += self._fail(state, "timeout", f"GPU {state.index}: read took longer than "
                                     f"{self.options.timeout:g}s; skipping it until the call returns")
                continue
            except GpuReadError as error:
                errors += self._fail(state, error.cause, str(error))
                continue
            except Exception as error:  # a backend bug must not take the other GPUs down
                errors += self._fail(state, "unknown", f"GPU {state.index}: {error!r}")
                continue
            state.pending = None
            if state.lost:
                log.info("GPU %d is back", state.index)
            state.up, state.lost, state.backoff_s = True, False, BACKOFF_START_S
            state.reading = state.last_known = reading
            self._remember_peak(state, reading)
        self._snapshot = _Snapshot(
            tuple((s.index, s.up, s.reading if s.up else None, s.last_known, dict(s.errors))
                  for s in self.states),
            self.backend.xid_counts(),
            dict(self.peaks),
        )
        return errors

    def _read_one(self, index: int, recovering: bool) -> GpuReading:
        if recovering:
            self.backend.recover(index)
        return self.backend.read(index)

    def _fail(self, state: _GpuState, cause: str, message: str) -> int:
        state.errors[cause] = state.errors.get(cause, 0) + 1
        if state.up or not state.lost:
            log.warning("%s", message)
        state.up = False
        state.reading = None
        if cause in {"gpu_lost", "driver"}:
            state.lost = True
            state.retry_at = self.clock() + state.backoff_s
            state.backoff_s = min(BACKOFF_MAX_S, state.backoff_s * 2)
        return 1

    def _remember_peak(self, state: _GpuState, reading: GpuReading) -> None:
        if state.index in self.peaks:
            return
        model = model_by_name(reading.model) or match_device_name(reading.model)
        if model is not None:
            self.peaks[state.index] = dict(model.peak_dense_flops)
            return
        if self.options.peak_flops is not None:
            self.peaks[state.index] = {self.options.dtype: self.options.peak_flops}
        if not state.warned_unknown_model:
            state.warned_unknown_model = True
            hint = ("using gpu.peak_flops from config" if self.options.peak_flops is not None
                    else "set gpu.peak_flops (dense FLOP/s) in the config to get MFU for it")
            log.warning("GPU %d: unknown model %r; %s", state.index, reading.model, hint)

    def close(self) -> None:
        """Stop the read workers and release the library (NVML shutdown, XID thread, DCGM groups)."""
        self._pool.shutdown(wait=False, cancel_futures=True)
        try:
            self.backend.stop()
        except Exception as error:  # closing must not fail the agent's shutdown
            log.debug("stopping the %s backend: %s", self.backend.name, error)

    # -- rendering (no hardware access) --------------------------------------------------------
    def collect(self) -> Iterator[Family]:
        return self.blocks().families()

    def blocks(self) -> Blocks:
        """The last snapshot as catalogue blocks (the agent renders these through a template).

        Built metric by metric over all GPUs (not GPU by GPU) so each metric's lists are looked up
        once: this loop runs for every node of a simulated fleet every tick."""
        snap = self._snapshot
        out = Blocks(self.node)
        put = out.add
        readings: list[tuple[str, GpuReading]] = []
        for index, up, reading, last_known, errors in snap.states:
            gpu = str(index)
            put(m.UP, (gpu,), up)
            if last_known is not None:
                put(m.INFO, (gpu, last_known.uuid, last_known.model, last_known.driver_version), 1)
            for cause, count in sorted(errors.items()):
                put(m.READ_ERRORS, (gpu, cause), count)
            for dtype, flops in sorted(snap.peaks.get(index, {}).items()):
                put(m.PEAK_FLOPS, (gpu, dtype), flops)
            if reading is not None:
                readings.append((gpu, reading))
        node = self.node
        for metric, attribute in SCALAR_READINGS:
            series, values = out.lists(metric)
            for gpu, reading in readings:
                value = getattr(reading, attribute)
                if value is not None:
                    series.append((node, gpu))
                    values.append(float(value))
        for gpu, r in readings:
            if r.pids is not None:
                put(m.PROCESSES, (gpu,), len(r.pids))
            for reason, active in sorted((r.clock_events or {}).items()):
                put(m.CLOCK_EVENT_ACTIVE, (gpu, reason), active)
            for reason, seconds in sorted((r.violation_seconds or {}).items()):
                put(m.CLOCK_EVENT_VIOLATION, (gpu, reason), seconds)
            put(m.PCIE_BYTES, (gpu, "tx"), r.pcie_tx_bytes)
            put(m.PCIE_BYTES, (gpu, "rx"), r.pcie_rx_bytes)
            put(m.REMAPPED_ROWS, (gpu, "correctable"), r.remapped_rows_correctable)
            put(m.REMAPPED_ROWS, (gpu, "uncorrectable"), r.remapped_rows_uncorrectable)
            for link in r.nvlinks:
                put(m.NVLINK_BYTES, (gpu, link.link, "tx"), link.tx_bytes)
                put(m.NVLINK_BYTES, (gpu, link.link, "rx"), link.rx_bytes)
                for error, count in sorted(link.errors.items()):
                    put(m.NVLINK_ERRORS, (gpu, link.link, error), count)
        for (index, xid), count in sorted(snap.xids.items()):
            put(m.XID_ERRORS, (str(index), str(xid)), count)
        return out

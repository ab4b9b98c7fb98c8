"""A simulated GPU whose telemetry stays physically consistent, and the `sim` backend over it.

This is the one GPU model FlopWatch has: `flopwatch agent --backend sim` runs it standalone, and
the fleet simulator (`flopwatch.sim`) drives the same objects with a training workload and faults,
so simulated and real nodes expose identical series through the same collector.

Consistency rules the model keeps: a busy GPU shows tensor activity, power and heat; a throttled
one a lower SM clock with the matching clock-event reasons (thermal -> sw_thermal/hw_thermal and a
hot die, power cap -> sw_power_cap at a lowered limit, hw_slowdown -> hw_slowdown); counters only
grow; an idle GPU drops to its idle clock with the `idle` reason.
"""

from __future__ import annotations

import functools
import math
import threading
import time
import uuid as uuid_module
from dataclasses import dataclass, field

import numpy as np

from flopwatch.exporters.gpu.backend import GpuBackend
from flopwatch.exporters.gpu.reading import (
    CLOCK_EVENT_REASONS,
    GpuReadError,
    GpuReading,
    NvLinkReading,
)
from flopwatch.hardware import GpuModel

MHZ = 1e6
AMBIENT_C = 30.0
THERMAL_TIME_CONSTANT_S = 30.0
SIM_DRIVER_VERSION = "sim-1.0"


@dataclass
class Workload:
    """What the GPU is asked to do; the fleet simulator sets this every tick."""

    busy: float = 0.0                  # fraction of time a kernel runs
    tensor: float = 0.0                # fraction of time the tensor pipes are active (<= busy)
    nvlink_bytes_per_s: float = 0.0    # per direction, summed over links
    pcie_bytes_per_s: float = 0.0      # per direction
    memory_fraction: float = 0.0       # of device memory in use
    processes: int = 0


@dataclass
class Impairments:
    """Active faults. Slowdowns are fractional reductions of the SM clock."""

    thermal: float = 0.0
    hw_slowdown: float = 0.0
    power_cap: float = 0.0
    pcie_width: int | None = None         # downgraded link width
    pcie_replays_per_s: float = 0.0
    nvlink_errors_per_s: float = 0.0      # on link 0
    ecc_corrected_per_s: float = 0.0

    def clock_factor(self) -> float:
        return (1 - self.thermal) * (1 - self.hw_slowdown) * (1 - self.power_cap)


@functools.cache
def _thermal_step(dt: float) -> float:
    """The share of the way to its target temperature a GPU moves in `dt` (one value per tick length)."""
    return 1 - math.exp(-dt / THERMAL_TIME_CONSTANT_S)


@dataclass
class _Counters:
    energy_j: float = 0.0
    pcie_tx: float = 0.0
    pcie_rx: float = 0.0
    pcie_replays: float = 0.0
    ecc_corrected: float = 0.0
    ecc_uncorrected: float = 0.0
    violation: dict[str, float] = field(default_factory=dict)
    nvlink_tx: list[float] = field(default_factory=list)
    nvlink_rx: list[float] = field(default_factory=list)
    nvlink_replay: list[float] = field(default_factory=list)
    nvlink_recovery: list[float] = field(default_factory=list)
    nvlink_crc: list[float] = field(default_factory=list)


@functools.cache
def clock_events_of(key: tuple[bool, bool, bool, bool, bool]) -> dict[str, bool]:
    """Every reason's state for a SimulatedGpu.clock_event_key(): 32 possible, each built once
    (read only; SimulatedGpu.clock_events() hands out copies)."""
    idle, sw_thermal, hw_thermal, hw_slowdown, power_cap = key
    active = dict.fromkeys(CLOCK_EVENT_REASONS, False)
    active.update(idle=idle, sw_thermal=sw_thermal, hw_thermal=hw_thermal, hw_slowdown=hw_slowdown,
                  sw_power_cap=power_cap)
    return active


class SimulatedGpu:
    """One GPU. Call `advance(dt)` to move time forward, `reading()` to observe it."""

    def __init__(self, index: int, model: GpuModel, seed: int, node: str = "sim") -> None:
        self.index = index
        self.model = model
        self.rng = np.random.default_rng([seed, index])
        self.uuid = "GPU-" + str(uuid_module.UUID(int=int(self.rng.integers(0, 2**63)) << 64 | index))
        self.node = node
        self.workload = Workload()
        self.faults = Impairments()
        self.lost = False
        self.xids: dict[int, int] = {}
        self.temperature_c = AMBIENT_C + 5
        self.sm_clock_hz = model.sm_clock_idle_mhz * MHZ
        self.power_watts = model.idle_power_watts
        self.remapped_uncorrectable = 0
        self.c = _Counters(
            nvlink_tx=[0.0] * model.nvlink_links, nvlink_rx=[0.0] * model.nvlink_links,
            nvlink_replay=[0.0] * model.nvlink_links, nvlink_recovery=[0.0] * model.nvlink_links,
            nvlink_crc=[0.0] * model.nvlink_links,
        )
        self._lock = threading.Lock()

    # -- physics -------------------------------------------------------------------------------
    @property
    def idle(self) -> bool:
        return self.workload.busy < 0.05

    def speed(self) -> float:
        """Compute speed relative to a healthy GPU of this model (1.0 = full clock)."""
        return self.faults.clock_factor()

    def power_limit(self) -> float:
        limit = self.model.power_limit_watts
        if self.faults.power_cap > 0:
            # A lowered limit that costs this much clock: power scales roughly with f^2 near peak.
            limit *= (1 - self.faults.power_cap) ** 2
        return limit

    def clock_event_key(self) -> tuple[bool, bool, bool, bool, bool]:
        """What the clock-event reasons depend on: idle, thermal (sw and hw), hw slowdown, power cap."""
        f = self.faults
        return self.idle, f.thermal > 0, f.thermal >= 0.15, f.hw_slowdown > 0, f.power_cap > 0

    def clock_events(self) -> dict[str, bool]:
        return dict(clock_events_of(self.clock_event_key()))

    def advance(self, dt: float) -> None:
        if dt <= 0:
            return
        with self._lock:
            self._advance(dt)

    def _advance(self, dt: float) -> None:
        w, f, m, c = self.workload, self.faults, self.model, self.c
        noise = self.rng.standard_normal(4).tolist()   # normal(0, 1): the same draws, as Python floats
        idle = self.idle
        if idle:
            self.sm_clock_hz = m.sm_clock_idle_mhz * MHZ
            dynamic = 0.0
        else:
            factor = f.clock_factor()
            self.sm_clock_hz = m.sm_clock_max_mhz * MHZ * factor
            dynamic = min(1.0, 0.3 * w.busy + 0.9 * w.tensor) * factor ** 2
        power = m.idle_power_watts + (m.power_limit_watts - m.idle_power_watts) * dynamic
        power *= 1 + 0.01 * noise[0]
        self.power_watts = max(m.idle_power_watts * 0.8, min(power, self.power_limit()))
        target_c = AMBIENT_C + 0.06 * self.power_watts
        if f.thermal > 0:
            target_c = 87 + 40 * f.thermal
        self.temperature_c += (target_c - self.temperature_c) * _thermal_step(dt)

        c.energy_j += self.power_watts * dt
        violation = c.violation
        violation["thermal"] = violation.get("thermal", 0.0) + (dt if f.thermal > 0 else 0.0)
        violation["power"] = violation.get("power", 0.0) + (dt if f.power_cap > 0 else 0.0)
        violation["low_utilization"] = violation.get("low_utilization", 0.0) + (dt if idle else 0.0)
        pcie = w.pcie_bytes_per_s * dt
        if f.pcie_width:
            pcie *= f.pcie_width / m.pcie_width
        c.pcie_tx += pcie * (1 + 0.02 * abs(noise[1]))
        c.pcie_rx += pcie * (1 + 0.02 * abs(noise[2]))
        if f.pcie_replays_per_s > 0:
            c.pcie_replays += self._events(f.pcie_replays_per_s * dt)
        if f.ecc_corrected_per_s > 0:
            c.ecc_corrected += self._events(f.ecc_corrected_per_s * dt)
        if m.nvlink_links:
            per_link = w.nvlink_bytes_per_s * dt / m.nvlink_links
            if per_link:
                c.nvlink_tx[:] = [total + per_link for total in c.nvlink_tx]
                c.nvlink_rx[:] = [total + per_link for total in c.nvlink_rx]
            if f.nvlink_errors_per_s > 0:
                c.nvlink_replay[0] += self._events(f.nvlink_errors_per_s * dt)
                c.nvlink_recovery[0] += self._events(f.nvlink_errors_per_s * dt / 20)
                c.nvlink_crc[0] += self._events(f.nvlink_errors_per_s * dt * 4)

    def _events(self, expected: float) -> int:
        return int(self.rng.poisson(expected)) if expected > 0 else 0

    # -- faults --------------------------------------------------------------------------------
    def inject_xid(self, xid: int) -> None:
        """Record an XID; 79 ('GPU has fallen off the bus') also loses the GPU."""
        with self._lock:
            self.xids[xid] = self.xids.get(xid, 0) + 1
            if xid == 48:
                self.c.ecc_uncorrected += 1
            if xid == 79:
                self.lost = True

    def restore(self) -> None:
        """The GPU is back (after a reset or reboot)."""
        with self._lock:
            self.lost = False

    # -- observation ---------------------------------------------------------------------------
    def reading(self, nvlink_per_link: bool = True) -> GpuReading:
        with self._lock:
            if self.lost:
                raise GpuReadError("gpu_lost", f"GPU {self.index} is lost (simulated XID 79)")
            return self._reading(nvlink_per_link)

    def _reading(self, nvlink_per_link: bool) -> GpuReading:
        w, f, m, c = self.workload, self.faults, self.model, self.c
        busy = 0.0 if self.idle else w.busy
        links = self._nvlinks(nvlink_per_link)
        temperature = int(self.temperature_c)
        return GpuReading(
            index=self.index, uuid=self.uuid, model=m.name, driver_version=SIM_DRIVER_VERSION,
            utilization=min(1.0, busy), memory_utilization=min(1.0, 0.4 * busy + 0.2 * w.tensor),
            sm_clock_hz=self.sm_clock_hz, sm_clock_max_hz=m.sm_clock_max_mhz * MHZ,
            memory_clock_hz=m.memory_clock_mhz * MHZ,
            power_watts=self.power_watts, power_limit_watts=self.power_limit(), energy_joules=c.energy_j,
            temperature_c=temperature, memory_temperature_c=temperature + 4,
            memory_used_bytes=float(int(m.memory_bytes * w.memory_fraction)),
            memory_total_bytes=float(m.memory_bytes),
            clock_events=self.clock_events(),
            violation_seconds=dict(c.violation),
            pcie_generation=m.pcie_generation, pcie_width=f.pcie_width or m.pcie_width,
            pcie_max_generation=m.pcie_generation, pcie_max_width=m.pcie_width,
            pcie_replays=c.pcie_replays, pcie_tx_bytes=float(int(c.pcie_tx)),
            pcie_rx_bytes=float(int(c.pcie_rx)),
            nvlinks=links,
            ecc_corrected=c.ecc_corrected, ecc_uncorrected=c.ecc_uncorrected,
            remapped_rows_correctable=0.0, remapped_rows_uncorrectable=float(self.remapped_uncorrectable),
            row_remap_pending=False, row_remap_failed=False,
            sm_active=busy * 0.95, sm_occupancy=busy * 0.45,
            tensor_active=min(w.tensor, busy), dram_active=busy * 0.35,
            pids=[],
        )

    def _nvlinks(self, per_link: bool) -> list[NvLinkReading]:
        c = self.c
        if not self.model.nvlink_links:
            return []
        if not per_link:
            return [NvLinkReading(
                "all", float(int(sum(c.nvlink_tx))), float(int(sum(c.nvlink_rx))),
                {"replay": sum(c.nvlink_replay), "recovery": sum(c.nvlink_recovery),
                 "crc": sum(c.nvlink_crc)},
            )]
        return [
            NvLinkReading(
                str(link), float(int(c.nvlink_tx[link])), float(int(c.nvlink_rx[link])),
                {"replay": c.nvlink_replay[link], "recovery": c.nvlink_recovery[link],
                 "crc": c.nvlink_crc[link]},
            )
            for link in range(self.model.nvlink_links)
        ]


def training_workload(model: GpuModel, mfu: float = 0.42) -> Workload:
    """A healthy data-parallel training load for a standalone simulated node."""
    nvlink = model.nvlink_links * model.nvlink_link_bytes_per_second * 0.3
    return Workload(busy=0.97, tensor=min(0.95, mfu * 1.2), nvlink_bytes_per_s=nvlink,
                    pcie_bytes_per_s=2e9, memory_fraction=0.85, processes=1)


class SimBackend(GpuBackend):
    """Serves SimulatedGpu objects. Standalone it advances them on the wall clock; the fleet
    simulator passes `self_advancing=False` and moves time itself."""

    name = "sim"

    def __init__(self, gpus: list[SimulatedGpu], self_advancing: bool = True,
                 nvlink_per_link: bool = True) -> None:
        self.gpus = gpus
        self.self_advancing = self_advancing
        self.nvlink_per_link = nvlink_per_link
        self._last = [time.monotonic()] * len(gpus)

    @classmethod
    def standalone(cls, count: int, model: GpuModel, seed: int, nvlink_per_link: bool = True) -> SimBackend:
        gpus = [SimulatedGpu(i, model, seed) for i in range(count)]
        for gpu in gpus:
            gpu.workload = training_workload(model)
            gpu.advance(1.0)
        return cls(gpus, nvlink_per_link=nvlink_per_link)

    def start(self) -> int:
        return len(self.gpus)

    def read(self, index: int) -> GpuReading:
        gpu = self.gpus[index]
        if self.self_advancing:
            now = time.monotonic()
            gpu.advance(now - self._last[index])
            self._last[index] = now
        return gpu.reading(self.nvlink_per_link)

    def xid_counts(self) -> dict[tuple[int, int], int]:
        return {(gpu.index, xid): n for gpu in self.gpus for xid, n in gpu.xids.items()}

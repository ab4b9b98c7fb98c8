"""What a backend reads from one GPU in one collection cycle.

`None` means "this GPU or driver does not provide it": the collector then leaves the series out
rather than exporting a misleading 0.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from flopwatch.catalog.gpu import CLOCK_EVENT_BITS

#: NVML clock-event (throttle) reasons FlopWatch exports, with their bits (the catalogue's table).
CLOCK_EVENT_REASONS = tuple(CLOCK_EVENT_BITS)


def clock_event_mask(active: dict[str, bool]) -> int:
    """The active reasons as NVML's bitmask (reasons outside the catalogue are not carried)."""
    return sum(CLOCK_EVENT_BITS[reason] for reason, on in active.items() if on)
#: NVML violation policies with their catalogue spelling.
VIOLATION_REASONS = ("power", "thermal", "sync_boost", "board_limit", "low_utilization", "reliability")


class BackendUnavailable(RuntimeError):
    """The backend cannot start on this machine (no driver, no library, no host engine).

    The message is one line a user can act on; the agent prints it and exits 2.
    """


class GpuReadError(RuntimeError):
    """One GPU could not be read this cycle; `cause` is gpu_lost, timeout, driver or unknown."""

    def __init__(self, cause: str, message: str) -> None:
        super().__init__(message)
        self.cause = cause


@dataclass
class NvLinkReading:
    link: str  # link index as text, or "all" when per-link detail is off
    tx_bytes: float | None = None
    rx_bytes: float | None = None
    errors: dict[str, float] = field(default_factory=dict)  # replay / recovery / crc -> count


@dataclass
class GpuReading:
    index: int
    uuid: str
    model: str
    driver_version: str = ""
    utilization: float | None = None          # 0..1
    memory_utilization: float | None = None   # 0..1
    sm_clock_hz: float | None = None
    sm_clock_max_hz: float | None = None
    memory_clock_hz: float | None = None
    power_watts: float | None = None
    power_limit_watts: float | None = None
    energy_joules: float | None = None
    temperature_c: float | None = None
    memory_temperature_c: float | None = None
    memory_used_bytes: float | None = None
    memory_total_bytes: float | None = None
    clock_events: dict[str, bool] | None = None          # reason -> active
    violation_seconds: dict[str, float] | None = None    # reason -> counter
    pcie_generation: int | None = None
    pcie_width: int | None = None
    pcie_max_generation: int | None = None
    pcie_max_width: int | None = None
    pcie_replays: float | None = None
    pcie_tx_bytes: float | None = None
    pcie_rx_bytes: float | None = None
    nvlinks: list[NvLinkReading] = field(default_factory=list)
    ecc_corrected: float | None = None
    ecc_uncorrected: float | None = None
    remapped_rows_correctable: float | None = None
    remapped_rows_uncorrectable: float | None = None
    row_remap_pending: bool | None = None
    row_remap_failed: bool | None = None
    sm_active: float | None = None       # 0..1
    sm_occupancy: float | None = None    # 0..1
    tensor_active: float | None = None   # 0..1
    dram_active: float | None = None     # 0..1
    pids: list[int] | None = None

    @property
    def clock_event_mask(self) -> int | None:
        """The clock-event reasons as one number: what the rules read every few seconds."""
        return None if self.clock_events is None else clock_event_mask(self.clock_events)

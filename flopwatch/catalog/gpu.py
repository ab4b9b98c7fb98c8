"""Per-GPU telemetry from NVML, DCGM or the simulated backend.

Every GPU series carries `gpu` (the NVML index); `flopwatch_gpu_info` maps that index to the
UUID and model, so rules join on (node, gpu) and dashboards show names.
"""

from flopwatch.catalog.metric import Metric

GPU = ("gpu",)
GPM = "GPM on Hopper and newer, or DCGM profiling fields; absent elsewhere"

UP = Metric(
    "flopwatch_gpu_up", "gauge", "",
    "1 when the GPU answered its last read, 0 when it is lost, timed out or erroring.", GPU,
)
INFO = Metric(
    "flopwatch_gpu_info", "gauge", "",
    "Always 1; maps the GPU index to its UUID, model and driver version.",
    ("gpu", "uuid", "model", "driver_version"),
)
READ_ERRORS = Metric(
    "flopwatch_gpu_read_errors_total", "counter", "",
    "Failed reads of this GPU by cause (gpu_lost, timeout, driver, unknown).", ("gpu", "error"),
)
PEAK_FLOPS = Metric(
    "flopwatch_gpu_peak_dense_flops", "gauge", "flops",
    "Dense (never sparse) peak FLOP/s of this GPU model for the dtype: the MFU denominator.",
    ("gpu", "dtype"),
)
UTILIZATION = Metric(
    "flopwatch_gpu_utilization_ratio", "gauge", "ratio",
    "Fraction of the sample period a kernel ran (NVML utilization.gpu). Not MFU: a GPU can be "
    "100% 'utilized' at 10% of its FLOPs.", GPU,
)
MEMORY_UTILIZATION = Metric(
    "flopwatch_gpu_memory_utilization_ratio", "gauge", "ratio",
    "Fraction of the sample period device memory was read or written.", GPU,
)
SM_CLOCK = Metric(
    "flopwatch_gpu_sm_clock_hertz", "gauge", "hertz", "Current SM clock.", GPU,
)
SM_CLOCK_MAX = Metric(
    "flopwatch_gpu_sm_clock_max_hertz", "gauge", "hertz", "Maximum SM clock of this GPU.", GPU,
)
MEMORY_CLOCK = Metric(
    "flopwatch_gpu_memory_clock_hertz", "gauge", "hertz", "Current memory clock.", GPU,
)
POWER = Metric("flopwatch_gpu_power_watts", "gauge", "watts", "Current board power draw.", GPU)
POWER_LIMIT = Metric(
    "flopwatch_gpu_power_limit_watts", "gauge", "watts", "Enforced power limit.", GPU,
)
ENERGY = Metric(
    "flopwatch_gpu_energy_joules_total", "counter", "joules",
    "Energy consumed since the driver loaded (NVML total energy, mJ converted to J).", GPU,
    availability="Volta and newer",
)
TEMPERATURE = Metric(
    "flopwatch_gpu_temperature_celsius", "gauge", "celsius", "GPU core temperature.", GPU,
)
MEMORY_TEMPERATURE = Metric(
    "flopwatch_gpu_memory_temperature_celsius", "gauge", "celsius", "HBM temperature.", GPU,
    availability="HBM GPUs",
)
MEMORY_USED = Metric(
    "flopwatch_gpu_memory_used_bytes", "gauge", "bytes", "Device memory in use.", GPU,
)
MEMORY_TOTAL = Metric(
    "flopwatch_gpu_memory_total_bytes", "gauge", "bytes", "Device memory installed.", GPU,
)
#: The clock-event (throttle) reasons FlopWatch exports, in the catalogue's spelling, with their bits
#: in NVML's mask (nvml.h nvmlClocksEventReason*), which dcgm-exporter's DCGM_FI_DEV_CLOCKS_EVENT_REASONS
#: carries too (internal/pkg/collector/clock_events_collector.go). The agent, the simulator, the rules
#: and the dashboards all read them from here.
CLOCK_EVENT_BITS: dict[str, int] = {
    "idle": 0x1, "sw_power_cap": 0x4, "hw_slowdown": 0x8, "sync_boost": 0x10, "sw_thermal": 0x20,
    "hw_thermal": 0x40, "hw_power_brake": 0x80,
}
CLOCK_EVENT_ACTIVE = Metric(
    "flopwatch_gpu_clock_event_active", "gauge", "",
    "1 while this clock-event (throttle) reason holds the SM clock down, else 0. Reasons: idle, "
    "sw_power_cap, hw_slowdown, sync_boost, sw_thermal, hw_thermal, hw_power_brake.",
    ("gpu", "reason"),
)
CLOCK_EVENT_REASONS = Metric(
    "flopwatch_gpu_clock_event_reasons", "gauge", "",
    "The clock-event reasons above as one bitmask, in NVML's bits (1 idle, 4 sw_power_cap, "
    "8 hw_slowdown, 16 sync_boost, 32 sw_thermal, 64 hw_thermal, 128 hw_power_brake), as "
    "dcgm-exporter's DCGM_FI_DEV_CLOCKS_EVENT_REASONS carries them: one series per GPU, which the "
    "straggler evidence reads every few seconds instead of one per reason.", ("gpu",),
)
CLOCK_EVENT_VIOLATION = Metric(
    "flopwatch_gpu_clock_event_violation_seconds_total", "counter", "seconds",
    "Time the clock was held below the requested clock by this policy (NVML violation status).",
    ("gpu", "reason"),
)
PCIE_GENERATION = Metric(
    "flopwatch_gpu_pcie_link_generation", "gauge", "", "Current PCIe link generation.", GPU,
)
PCIE_WIDTH = Metric(
    "flopwatch_gpu_pcie_link_width", "gauge", "", "Current PCIe link width (lanes).", GPU,
)
PCIE_MAX_GENERATION = Metric(
    "flopwatch_gpu_pcie_link_max_generation", "gauge", "",
    "Maximum PCIe generation of the GPU and the slot.", GPU,
)
PCIE_MAX_WIDTH = Metric(
    "flopwatch_gpu_pcie_link_max_width", "gauge", "", "Maximum PCIe link width.", GPU,
)
PCIE_REPLAYS = Metric(
    "flopwatch_gpu_pcie_replays_total", "counter", "", "PCIe replay counter (link retransmits).", GPU,
)
PCIE_BYTES = Metric(
    "flopwatch_gpu_pcie_bytes_total", "counter", "bytes",
    "PCIe bytes by direction, from NVML field values 197/198 (never the blocking throughput call).",
    ("gpu", "direction"),
)
NVLINK_BYTES = Metric(
    "flopwatch_gpu_nvlink_bytes_total", "counter", "bytes",
    "NVLink data bytes per link and direction (NVML field values; per link when enabled, else "
    "link=\"all\").", ("gpu", "link", "direction"), availability="GPUs with NVLink",
)
NVLINK_ERRORS = Metric(
    "flopwatch_gpu_nvlink_errors_total", "counter", "",
    "NVLink data-link errors per link: replay, recovery, crc.", ("gpu", "link", "error"),
    availability="GPUs with NVLink",
)
ECC_CORRECTED = Metric(
    "flopwatch_gpu_ecc_corrected_errors_total", "counter", "",
    "Corrected (single-bit) ECC errors since the driver loaded (volatile).", GPU,
)
ECC_UNCORRECTED = Metric(
    "flopwatch_gpu_ecc_uncorrected_errors_total", "counter", "",
    "Uncorrected (double-bit) ECC errors since the driver loaded (volatile).", GPU,
)
REMAPPED_ROWS = Metric(
    "flopwatch_gpu_remapped_rows", "gauge", "",
    "HBM rows remapped, by the error that caused it (correctable, uncorrectable).",
    ("gpu", "cause"), availability="Ampere and newer",
)
ROW_REMAP_PENDING = Metric(
    "flopwatch_gpu_row_remap_pending", "gauge", "",
    "1 when a row remap waits for a GPU reset.", GPU, availability="Ampere and newer",
)
ROW_REMAP_FAILED = Metric(
    "flopwatch_gpu_row_remap_failed", "gauge", "",
    "1 when a row remap failed: the GPU needs service.", GPU, availability="Ampere and newer",
)
XID_ERRORS = Metric(
    "flopwatch_gpu_xid_errors_total", "counter", "",
    "XID errors reported by the driver, by XID code (fed by NVML's event-wait loop).", ("gpu", "xid"),
)
SM_ACTIVE = Metric(
    "flopwatch_gpu_sm_active_ratio", "gauge", "ratio",
    "Fraction of time at least one warp was resident per SM, averaged over SMs.", GPU,
    availability=GPM,
)
SM_OCCUPANCY = Metric(
    "flopwatch_gpu_sm_occupancy_ratio", "gauge", "ratio",
    "Resident warps over the theoretical maximum, averaged over SMs.", GPU, availability=GPM,
)
TENSOR_ACTIVE = Metric(
    "flopwatch_gpu_tensor_active_ratio", "gauge", "ratio",
    "Fraction of time the tensor pipes were active: with the SM clock, the basis of telemetry-only "
    "MFU.", GPU, availability=GPM,
)
DRAM_ACTIVE = Metric(
    "flopwatch_gpu_dram_active_ratio", "gauge", "ratio",
    "Fraction of peak device-memory bandwidth in use.", GPU, availability=GPM,
)
PROCESSES = Metric(
    "flopwatch_gpu_processes", "gauge", "",
    "Compute processes running on the GPU (their PIDs feed job attribution).", GPU,
)

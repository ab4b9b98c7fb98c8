"""The NVML names FlopWatch reads by, as pynvml spells them (nvml.h): clock-event masks,
violation policies, GPM metrics, field ids, value-union members and the errors that mean a
GPU or the driver failed. Declarative tables only; nvml.py resolves them on the loaded library.
"""

from __future__ import annotations

from flopwatch.exporters.gpu.reading import CLOCK_EVENT_REASONS, VIOLATION_REASONS

MHZ = 1e6
KIB = 1024

#: catalogue reason -> pynvml bit-mask constant of nvmlDeviceGetCurrentClocksEventReasons
CLOCK_EVENT_MASKS = {
    "idle": "nvmlClocksEventReasonGpuIdle",
    "sw_power_cap": "nvmlClocksEventReasonSwPowerCap",
    "hw_slowdown": "nvmlClocksEventReasonHwSlowdown",
    "sync_boost": "nvmlClocksEventReasonSyncBoost",
    "sw_thermal": "nvmlClocksEventReasonSwThermalSlowdown",
    "hw_thermal": "nvmlClocksEventReasonHwThermalSlowdown",
    "hw_power_brake": "nvmlClocksEventReasonHwPowerBrakeSlowdown",
}
#: catalogue reason -> pynvml perf-policy constant of nvmlDeviceGetViolationStatus
VIOLATION_POLICIES = {
    "power": "NVML_PERF_POLICY_POWER",
    "thermal": "NVML_PERF_POLICY_THERMAL",
    "sync_boost": "NVML_PERF_POLICY_SYNC_BOOST",
    "board_limit": "NVML_PERF_POLICY_BOARD_LIMIT",
    "low_utilization": "NVML_PERF_POLICY_LOW_UTILIZATION",
    "reliability": "NVML_PERF_POLICY_RELIABILITY",
}
assert tuple(CLOCK_EVENT_MASKS) == CLOCK_EVENT_REASONS
assert tuple(VIOLATION_POLICIES) == VIOLATION_REASONS

#: GpuReading attribute -> GPM metric constant (values are percent)
GPM_METRICS = {
    "sm_active": "NVML_GPM_METRIC_SM_UTIL",
    "sm_occupancy": "NVML_GPM_METRIC_SM_OCCUPANCY",
    "tensor_active": "NVML_GPM_METRIC_ANY_TENSOR_UTIL",
    "dram_active": "NVML_GPM_METRIC_DRAM_BW_UTIL",
}
#: NVLink field ids read per link (scopeId = link): bytes in KiB, then the data-link error counters
NVLINK_FIELDS = {
    "tx": "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX",
    "rx": "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX",
    "replay": "NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY",
    "recovery": "NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY",
    "crc": "NVML_FI_DEV_NVLINK_ERROR_DL_CRC",
}
#: device-wide field ids (scopeId 0)
DEVICE_FIELDS = {
    "memory_temperature": "NVML_FI_DEV_MEMORY_TEMP",
    "pcie_replays": "NVML_FI_DEV_PCIE_REPLAY_COUNTER",
    "pcie_tx": "NVML_FI_DEV_PCIE_COUNT_TX_BYTES",
    "pcie_rx": "NVML_FI_DEV_PCIE_COUNT_RX_BYTES",
}
#: field value type -> member of the c_nvmlValue_t union
VALUE_MEMBERS = {
    "NVML_VALUE_TYPE_DOUBLE": "dVal",
    "NVML_VALUE_TYPE_UNSIGNED_INT": "uiVal",
    "NVML_VALUE_TYPE_UNSIGNED_LONG": "ulVal",
    "NVML_VALUE_TYPE_UNSIGNED_LONG_LONG": "ullVal",
    "NVML_VALUE_TYPE_SIGNED_LONG_LONG": "sllVal",
    "NVML_VALUE_TYPE_SIGNED_INT": "siVal",
    "NVML_VALUE_TYPE_UNSIGNED_SHORT": "usVal",
}
#: NVML errors that mean the whole GPU (or driver) failed, by the collector's cause
FATAL_ERRORS = {
    "NVML_ERROR_GPU_IS_LOST": "gpu_lost",
    "NVML_ERROR_RESET_REQUIRED": "gpu_lost",
    "NVML_ERROR_UNINITIALIZED": "driver",
    "NVML_ERROR_DRIVER_NOT_LOADED": "driver",
    "NVML_ERROR_LIB_RM_VERSION_MISMATCH": "driver",
    "NVML_ERROR_LIBRARY_NOT_FOUND": "driver",
    "NVML_ERROR_TIMEOUT": "timeout",
    "NVML_ERROR_UNKNOWN": "unknown",
}

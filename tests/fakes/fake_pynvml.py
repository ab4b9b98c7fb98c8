"""A fake `pynvml` module: simulated GPUs behind NVML's function names and return types.

There is no GPU, NVIDIA driver or libnvidia-ml.so on the machines that run these tests, so the
backend is given this object instead of the `pynvml` module. Everything that does not need the
driver comes from the REAL pynvml (nvidia-ml-py): the NVMLError subclasses a backend catches,
every NVML_* constant and bit mask, and the ctypes structures (field values, event data, GPM
metric requests), so decoding and error handling are exercised against the library's own types.

Fault injection: `init_error` (e.g. LIBRARY_NOT_FOUND from nvmlInit), `lose(i)` (GPU_IS_LOST on
every call for that GPU's handle; `restore(i)` brings it back under a NEW handle, so only a
re-acquired handle works), `restart_driver()` (every call UNINITIALIZED until NVML is shut down
and initialised again), `FakeGpu.not_supported` (NotSupported from chosen functions),
`FakeGpu.field_errors` (a per-field nvmlReturn in nvmlDeviceGetFieldValues), `inject_xid()`
(delivered through nvmlEventSetWait_v2) and `hang()` (a call that sleeps).
"""

# ruff: noqa: N802 - the fake must answer to pynvml's own camelCase function names
from __future__ import annotations

import ctypes
import queue
import threading
from collections import Counter
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pynvml as real

#: names served by the real pynvml: constants, error classes, bit masks, ctypes structures
DELEGATED_PREFIXES = ("NVML_", "NVMLError", "nvmlClocksEventReason", "nvmlClocksThrottleReason",
                      "nvmlEventType", "c_nvml", "nvmlFriendlyObject")

GPM_PERCENT_DEFAULT = {
    real.NVML_GPM_METRIC_SM_UTIL: 80.0,
    real.NVML_GPM_METRIC_SM_OCCUPANCY: 35.0,
    real.NVML_GPM_METRIC_ANY_TENSOR_UTIL: 50.0,
    real.NVML_GPM_METRIC_DRAM_BW_UTIL: 30.0,
}


def key(pointer: Any) -> int:
    return int(ctypes.cast(pointer, ctypes.c_void_p).value or 0)


@dataclass
class FakeGpu:
    """What one simulated GPU reports, in NVML's own units (mW, mJ, MHz, ns, percent, KiB)."""

    name: str
    uuid: str
    utilization_gpu: int = 97
    utilization_memory: int = 41
    sm_clock_mhz: int = 1980
    sm_clock_max_mhz: int = 1980
    memory_clock_mhz: int = 2619
    power_mw: int = 612_345
    power_limit_mw: int = 700_000
    energy_mj: int = 123_456_789
    temperature_c: int = 61
    memory_temperature_c: int | None = 70
    memory_total: int = 80 * 1024**3
    memory_used: int = 60 * 1024**3
    clock_reasons: int = 0
    supported_reasons: int = real.nvmlClocksEventReasonAll
    violations_ns: dict[int, int] = field(default_factory=lambda: {
        real.NVML_PERF_POLICY_POWER: 1_500_000_000, real.NVML_PERF_POLICY_THERMAL: 250_000_000,
        real.NVML_PERF_POLICY_SYNC_BOOST: 0, real.NVML_PERF_POLICY_BOARD_LIMIT: 0,
        real.NVML_PERF_POLICY_LOW_UTILIZATION: 9_000_000_000, real.NVML_PERF_POLICY_RELIABILITY: 0,
    })
    pcie_generation: int = 5
    pcie_width: int = 16
    pcie_max_generation: int = 5
    pcie_max_width: int = 16
    pcie_replays: int = 3
    pcie_tx_bytes: int = 7_000_000_123
    pcie_rx_bytes: int = 9_000_000_456
    nvlink_links: int = 18
    nvlink_tx_kib: list[int] = field(default_factory=list)
    nvlink_rx_kib: list[int] = field(default_factory=list)
    nvlink_errors: dict[int, list[int]] = field(default_factory=dict)  # field id -> per link
    ecc_corrected: int = 2
    ecc_uncorrected: int = 0
    remapped_rows: tuple[int, int, int, int] = (1, 0, 0, 0)  # corrected, uncorrected, pending, failure
    gpm_supported: bool = True
    gpm_percent: dict[int, float] = field(default_factory=lambda: dict(GPM_PERCENT_DEFAULT))
    pids: list[int] = field(default_factory=lambda: [4242])
    # fault injection
    not_supported: set[str] = field(default_factory=set)
    field_errors: dict[tuple[int, int], int] = field(default_factory=dict)
    hangs: dict[str, float] = field(default_factory=dict)
    # GPM accumulators (advance on every sample)
    gpm_ticks: int = 0
    gpm_accumulated: dict[int, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        n = self.nvlink_links
        self.nvlink_tx_kib = self.nvlink_tx_kib or [1000 * (link + 1) for link in range(n)]
        self.nvlink_rx_kib = self.nvlink_rx_kib or [2000 * (link + 1) for link in range(n)]
        for field_id, base in ((real.NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY, 10),
                               (real.NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY, 20),
                               (real.NVML_FI_DEV_NVLINK_ERROR_DL_CRC, 30)):
            self.nvlink_errors.setdefault(field_id, [base + link for link in range(n)])


def h100(index: int) -> FakeGpu:
    return FakeGpu("NVIDIA H100 80GB HBM3", f"GPU-00000000-0000-0000-0000-0000000000{index:02d}")


def a100(index: int) -> FakeGpu:
    """Ampere: 12 NVLinks, no GPM (SM/tensor activity must be absent, not 0)."""
    return FakeGpu("NVIDIA A100-SXM4-80GB", f"GPU-00000000-0000-0000-0000-0000000000{index:02d}",
                   sm_clock_mhz=1410, sm_clock_max_mhz=1410, memory_clock_mhz=1593, power_limit_mw=400_000,
                   pcie_generation=4, pcie_max_generation=4, nvlink_links=12, gpm_supported=False)


class FakeNvml:
    """Stands in for the `pynvml` module; attributes it does not define come from the real one."""

    def __init__(self, gpus: list[FakeGpu], driver_version: str = "550.54.15", init_error: int | None = None):
        self.gpus = gpus
        self.driver_version = driver_version
        self.init_error = init_error
        self.calls: Counter[str] = Counter()
        self.lost: set[int] = set()
        self.release = threading.Event()            # ends every injected hang
        self.hanging = 0                            # calls blocked in an injected hang right now
        self._lock = threading.Lock()
        self._initialized = 0
        self._driver_epoch = 0
        self._session_epoch = 0
        self._next_address = 0x10000
        self._live: dict[int, int] = {}             # handle address -> gpu index
        self._stale: dict[int, int] = {}            # old handle address -> error code it now raises
        self._handle: dict[int, Any] = {}           # gpu index -> current handle
        self._events: queue.Queue[tuple[int, int]] = queue.Queue()
        self._event_sets: dict[int, set[int]] = {}  # event-set address -> registered gpu indices
        self._registered_handle: dict[int, Any] = {}  # gpu index -> handle given at registration
        self._samples: dict[int, tuple[int, int, dict[int, float]] | None] = {}
        self._sample_epoch: dict[int, int] = {}     # GPM sample address -> NVML session it belongs to
        for index in range(len(gpus)):
            self._new_handle(index)

    def __getattr__(self, name: str) -> Any:
        if name.startswith(DELEGATED_PREFIXES):
            return getattr(real, name)
        raise AttributeError(f"the fake pynvml does not provide {name}")

    # -- fault injection -----------------------------------------------------------------------
    def lose(self, index: int) -> None:
        """The GPU fell off the bus: every call on its handle answers GPU_IS_LOST."""
        self.lost.add(index)

    def restore(self, index: int) -> None:
        """The GPU is back after a reset, under a new handle; the old handle stays lost."""
        self.lost.discard(index)
        self._stale[key(self._handle[index])] = real.NVML_ERROR_GPU_IS_LOST
        self._live.pop(key(self._handle[index]))
        self._new_handle(index)

    def restart_driver(self) -> None:
        """The driver was reloaded: this NVML session and every handle are invalid until re-init."""
        self._driver_epoch += 1
        for index in range(len(self.gpus)):
            self._stale[key(self._handle[index])] = real.NVML_ERROR_UNINITIALIZED
            self._live.pop(key(self._handle[index]))
            self._new_handle(index)

    def inject_xid(self, index: int, xid: int) -> None:
        self._events.put((index, xid))

    def hang(self, index: int, function: str, seconds: float) -> None:
        self.gpus[index].hangs[function] = seconds

    # -- plumbing ------------------------------------------------------------------------------
    def _new_handle(self, index: int) -> None:
        with self._lock:
            address = self._next_address
            self._next_address += 0x100
        handle = ctypes.cast(ctypes.c_void_p(address), real.c_nvmlDevice_t)
        self._handle[index] = handle
        self._live[address] = index

    def _count(self, function: str) -> None:
        with self._lock:
            self.calls[function] += 1

    def _session(self, function: str) -> None:
        self._count(function)
        if not self._initialized or self._session_epoch != self._driver_epoch:
            raise real.NVMLError(real.NVML_ERROR_UNINITIALIZED)

    def _gpu(self, handle: Any, function: str) -> FakeGpu:
        self._session(function)
        address = key(handle)
        if address in self._stale:
            raise real.NVMLError(self._stale[address])
        if address not in self._live:
            raise real.NVMLError(real.NVML_ERROR_INVALID_ARGUMENT)
        index = self._live[address]
        gpu = self.gpus[index]
        if index in self.lost:
            raise real.NVMLError(real.NVML_ERROR_GPU_IS_LOST)
        if function in gpu.not_supported:
            raise real.NVMLError(real.NVML_ERROR_NOT_SUPPORTED)
        if function in gpu.hangs:
            with self._lock:
                self.hanging += 1
            try:
                self.release.wait(gpu.hangs[function])
            finally:
                with self._lock:
                    self.hanging -= 1
        return gpu

    # -- library -------------------------------------------------------------------------------
    def nvmlInit(self) -> None:
        self._count("nvmlInit")
        if self.init_error is not None:
            raise real.NVMLError(self.init_error)
        self._initialized += 1
        self._session_epoch = self._driver_epoch

    def nvmlShutdown(self) -> None:
        self._count("nvmlShutdown")
        if not self._initialized:
            raise real.NVMLError(real.NVML_ERROR_UNINITIALIZED)
        self._initialized -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        self._session("nvmlSystemGetDriverVersion")
        return self.driver_version

    def nvmlDeviceGetCount(self) -> int:
        self._session("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        self._session("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < len(self.gpus):
            raise real.NVMLError(real.NVML_ERROR_INVALID_ARGUMENT)
        if index in self.lost:
            raise real.NVMLError(real.NVML_ERROR_GPU_IS_LOST)
        return self._handle[index]

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> Any:
        self._session("nvmlDeviceGetHandleByUUID")
        for index, gpu in enumerate(self.gpus):
            if gpu.uuid == uuid:
                if index in self.lost:
                    raise real.NVMLError(real.NVML_ERROR_GPU_IS_LOST)
                return self._handle[index]
        raise real.NVMLError(real.NVML_ERROR_NOT_FOUND)

    # -- identity and fixed facts --------------------------------------------------------------
    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        return self._gpu(handle, "nvmlDeviceGetUUID").uuid

    def nvmlDeviceGetName(self, handle: Any) -> str:
        return self._gpu(handle, "nvmlDeviceGetName").name

    def nvmlDeviceGetMaxClockInfo(self, handle: Any, clock_type: int) -> int:
        gpu = self._gpu(handle, "nvmlDeviceGetMaxClockInfo")
        return gpu.sm_clock_max_mhz if clock_type == real.NVML_CLOCK_SM else gpu.memory_clock_mhz

    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle: Any) -> int:
        return self._gpu(handle, "nvmlDeviceGetMaxPcieLinkGeneration").pcie_max_generation

    def nvmlDeviceGetMaxPcieLinkWidth(self, handle: Any) -> int:
        return self._gpu(handle, "nvmlDeviceGetMaxPcieLinkWidth").pcie_max_width

    def nvmlDeviceGetSupportedClocksEventReasons(self, handle: Any) -> int:
        return self._gpu(handle, "nvmlDeviceGetSupportedClocksEventReasons").supported_reasons

    def nvmlDeviceGetNvLinkState(self, handle: Any, link: int) -> int:
        gpu = self._gpu(handle, "nvmlDeviceGetNvLinkState")
        if link >= gpu.nvlink_links:
            raise real.NVMLError(real.NVML_ERROR_INVALID_ARGUMENT)
        return real.NVML_FEATURE_ENABLED

    # -- dynamic readings ----------------------------------------------------------------------
    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any:
        gpu = self._gpu(handle, "nvmlDeviceGetUtilizationRates")
        return real.c_nvmlUtilization_t(gpu=gpu.utilization_gpu, memory=gpu.utilization_memory)

    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> Any:
        gpu = self._gpu(handle, "nvmlDeviceGetMemoryInfo")
        return real.c_nvmlMemory_t(total=gpu.memory_total, free=gpu.memory_total - gpu.memory_used,
                                   used=gpu.memory_used)

    def nvmlDeviceGetClockInfo(self, handle: Any, clock_type: int) -> int:
        gpu = self._gpu(handle, "nvmlDeviceGetClockInfo")
        return gpu.sm_clock_mhz if clock_type == real.NVML_CLOCK_SM else gpu.memory_clock_mhz

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        return self._gpu(handle, "nvmlDeviceGetPowerUsage").power_mw

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: Any) -> int:
        return self._gpu(handle, "nvmlDeviceGetEnforcedPowerLimit").power_limit_mw

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: Any) -> int:
        return self._gpu(handle, "nvmlDeviceGetTotalEnergyConsumption").energy_mj

    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int:
        return self._gpu(handle, "nvmlDeviceGetTemperature").temperature_c

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any) -> int:
        return self._gpu(handle, "nvmlDeviceGetCurrentClocksEventReasons").clock_reasons

    def nvmlDeviceGetViolationStatus(self, handle: Any, policy: int) -> Any:
        gpu = self._gpu(handle, "nvmlDeviceGetViolationStatus")
        if policy not in gpu.violations_ns:
            raise real.NVMLError(real.NVML_ERROR_NOT_SUPPORTED)
        return real.c_nvmlViolationTime_t(referenceTime=1, violationTime=gpu.violations_ns[policy])

    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle: Any) -> int:
        return self._gpu(handle, "nvmlDeviceGetCurrPcieLinkGeneration").pcie_generation

    def nvmlDeviceGetCurrPcieLinkWidth(self, handle: Any) -> int:
        return self._gpu(handle, "nvmlDeviceGetCurrPcieLinkWidth").pcie_width

    def nvmlDeviceGetPcieThroughput(self, handle: Any, counter: int) -> int:
        """Present so a test can prove it is never called (the real one blocks ~20 ms)."""
        self._gpu(handle, "nvmlDeviceGetPcieThroughput")
        self.release.wait(0.02)
        return 0

    def nvmlDeviceGetTotalEccErrors(self, handle: Any, error_type: int, counter_type: int) -> int:
        gpu = self._gpu(handle, "nvmlDeviceGetTotalEccErrors")
        if error_type == real.NVML_MEMORY_ERROR_TYPE_CORRECTED:
            return gpu.ecc_corrected
        return gpu.ecc_uncorrected

    def nvmlDeviceGetRemappedRows(self, handle: Any) -> tuple[int, int, int, int]:
        return self._gpu(handle, "nvmlDeviceGetRemappedRows").remapped_rows

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[Any]:
        gpu = self._gpu(handle, "nvmlDeviceGetComputeRunningProcesses")
        return [SimpleNamespace(pid=pid, usedGpuMemory=1 << 30) for pid in gpu.pids]

    def nvmlDeviceGetFieldValues(self, handle: Any, field_ids: list[Any]) -> Any:
        gpu = self._gpu(handle, "nvmlDeviceGetFieldValues")
        values = (real.c_nvmlFieldValue_t * len(field_ids))()
        ull, uint = real.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG, real.NVML_VALUE_TYPE_UNSIGNED_INT
        device = {
            real.NVML_FI_DEV_MEMORY_TEMP: (uint, gpu.memory_temperature_c),
            real.NVML_FI_DEV_PCIE_REPLAY_COUNTER: (ull, gpu.pcie_replays),
            real.NVML_FI_DEV_PCIE_COUNT_TX_BYTES: (ull, gpu.pcie_tx_bytes),
            real.NVML_FI_DEV_PCIE_COUNT_RX_BYTES: (ull, gpu.pcie_rx_bytes),
        }
        for slot, requested in enumerate(field_ids):
            field_id, scope = requested if isinstance(requested, tuple) else (requested, 0)
            entry = values[slot]
            entry.fieldId, entry.scopeId = field_id, scope
            code, value_type, value = self._field(gpu, device, field_id, scope)
            entry.nvmlReturn = code
            if code == real.NVML_SUCCESS:
                entry.valueType = value_type
                if value_type == real.NVML_VALUE_TYPE_UNSIGNED_INT:
                    entry.value.uiVal = value
                else:
                    entry.value.ullVal = value
        return values

    @staticmethod
    def _field(gpu: FakeGpu, device: dict[int, tuple[int, int | None]], field_id: int,
               scope: int) -> tuple[int, int, int]:
        if (field_id, scope) in gpu.field_errors:
            return gpu.field_errors[(field_id, scope)], 0, 0
        ull = real.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
        if field_id in device:
            value_type, value = device[field_id]
            if value is None:
                return real.NVML_ERROR_NOT_SUPPORTED, 0, 0
            return real.NVML_SUCCESS, value_type, value
        if scope >= gpu.nvlink_links:
            return real.NVML_ERROR_INVALID_ARGUMENT, 0, 0
        if field_id == real.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX:
            return real.NVML_SUCCESS, ull, gpu.nvlink_tx_kib[scope]
        if field_id == real.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX:
            return real.NVML_SUCCESS, ull, gpu.nvlink_rx_kib[scope]
        if field_id in gpu.nvlink_errors:
            return real.NVML_SUCCESS, ull, gpu.nvlink_errors[field_id][scope]
        return real.NVML_ERROR_NOT_SUPPORTED, 0, 0

    # -- GPM -----------------------------------------------------------------------------------
    def nvmlGpmQueryDeviceSupport(self, handle: Any) -> Any:
        gpu = self._gpu(handle, "nvmlGpmQueryDeviceSupport")
        support = real.c_nvmlGpmSupport_t()
        support.version = real.NVML_GPM_SUPPORT_VERSION
        support.isSupportedDevice = int(gpu.gpm_supported)
        return support

    def nvmlGpmSampleAlloc(self) -> Any:
        self._session("nvmlGpmSampleAlloc")
        with self._lock:
            address = self._next_address
            self._next_address += 0x100
        self._samples[address] = None
        self._sample_epoch[address] = self._session_epoch
        return ctypes.cast(ctypes.c_void_p(address), real.c_nvmlGpmSample_t)

    def nvmlGpmSampleFree(self, sample: Any) -> None:
        self._session("nvmlGpmSampleFree")
        if self._samples.pop(key(sample), "missing") == "missing":
            raise real.NVMLError(real.NVML_ERROR_INVALID_ARGUMENT)

    def nvmlGpmSampleGet(self, handle: Any, sample: Any) -> Any:
        gpu = self._gpu(handle, "nvmlGpmSampleGet")
        if key(sample) not in self._samples or self._sample_epoch[key(sample)] != self._session_epoch:
            raise real.NVMLError(real.NVML_ERROR_INVALID_ARGUMENT)  # unknown, or from before a re-init
        gpu.gpm_ticks += 1
        for metric, percent in gpu.gpm_percent.items():
            gpu.gpm_accumulated[metric] = gpu.gpm_accumulated.get(metric, 0.0) + percent
        self._samples[key(sample)] = (self.gpus.index(gpu), gpu.gpm_ticks, dict(gpu.gpm_accumulated))
        return sample

    def nvmlGpmMetricsGet(self, request: Any) -> Any:
        """Average activity between sample1 (older) and sample2 (newer); refuses them swapped."""
        self._session("nvmlGpmMetricsGet")
        first, second = self._samples.get(key(request.sample1)), self._samples.get(key(request.sample2))
        if request.version != real.NVML_GPM_METRICS_GET_VERSION or first is None or second is None \
                or first[0] != second[0] or second[1] <= first[1]:
            raise real.NVMLError(real.NVML_ERROR_INVALID_ARGUMENT)
        ticks = second[1] - first[1]
        for slot in range(request.numMetrics):
            metric = request.metrics[slot]
            if metric.metricId in second[2]:
                metric.value = (second[2][metric.metricId] - first[2].get(metric.metricId, 0.0)) / ticks
                metric.nvmlReturn = real.NVML_SUCCESS
            else:
                metric.nvmlReturn = real.NVML_ERROR_NOT_SUPPORTED
        return request

    # -- events --------------------------------------------------------------------------------
    def nvmlEventSetCreate(self) -> Any:
        self._session("nvmlEventSetCreate")
        with self._lock:
            address = self._next_address
            self._next_address += 0x100
        self._event_sets[address] = set()
        return ctypes.cast(ctypes.c_void_p(address), real.c_nvmlEventSet_t)

    def nvmlDeviceRegisterEvents(self, handle: Any, event_types: int, event_set: Any) -> None:
        gpu = self._gpu(handle, "nvmlDeviceRegisterEvents")
        index = self.gpus.index(gpu)
        self._event_sets[key(event_set)].add(index)
        self._registered_handle[index] = handle

    def nvmlEventSetWait_v2(self, event_set: Any, timeout_ms: int) -> Any:
        self._session("nvmlEventSetWait_v2")
        registered = self._event_sets.get(key(event_set))
        if registered is None:
            raise real.NVMLError(real.NVML_ERROR_INVALID_ARGUMENT)
        try:
            index, xid = self._events.get(timeout=timeout_ms / 1000)
        except queue.Empty:
            raise real.NVMLError(real.NVML_ERROR_TIMEOUT) from None
        if index not in registered:  # the driver only reports devices registered on this set
            raise real.NVMLError(real.NVML_ERROR_TIMEOUT)
        data = real.c_nvmlEventData_t()
        data.device = self._registered_handle[index]
        data.eventType = real.nvmlEventTypeXidCriticalError
        data.eventData = xid
        return data

    def nvmlEventSetFree(self, event_set: Any) -> None:
        self._session("nvmlEventSetFree")
        if self._event_sets.pop(key(event_set), None) is None:
            raise real.NVMLError(real.NVML_ERROR_INVALID_ARGUMENT)

    @property
    def open_event_sets(self) -> int:
        return len(self._event_sets)

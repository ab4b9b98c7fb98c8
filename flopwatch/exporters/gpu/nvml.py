"""The NVML backend: reads every GPU through NVIDIA's own binding (`nvidia-ml-py`, import `pynvml`).

Units are converted here, once: mW -> W, mJ -> J, MHz -> Hz, ns -> s, percent -> 0..1, NVLink
KiB -> bytes. What a device does not support (`NVMLError_NotSupported` and friends) stays `None`
and its series is absent, never 0. Errors that mean the GPU as a whole is gone (GPU_IS_LOST,
driver unloaded, UNKNOWN) raise `GpuReadError`, and the collector marks only that GPU down.

Cost per GPU and cycle: 24 cheap NVML calls, ONE of them `nvmlDeviceGetFieldValues`, which
batches memory temperature, PCIe replay/tx/rx counters and every NVLink counter. The blocking
`nvmlDeviceGetPcieThroughput` (a 20 ms sample) is never called. GPM (Hopper and newer) keeps the
previous sample per GPU and reports SM/tensor/DRAM activity over the interval between cycles.

The `pynvml` module is a constructor argument (default: imported on `start()`), which is the seam
tests use to substitute a fake NVML that raises the library's own error classes.
"""

from __future__ import annotations

import ctypes
import importlib
import logging
import threading
from dataclasses import dataclass, field
from typing import Any

from flopwatch.config import GpuOptions
from flopwatch.exporters.gpu.backend import GpuBackend
from flopwatch.exporters.gpu.nvml_names import (
    CLOCK_EVENT_MASKS,
    DEVICE_FIELDS,
    FATAL_ERRORS,
    GPM_METRICS,
    KIB,
    MHZ,
    NVLINK_FIELDS,
    VALUE_MEMBERS,
    VIOLATION_POLICIES,
)
from flopwatch.exporters.gpu.reading import (
    BackendUnavailable,
    GpuReadError,
    GpuReading,
    NvLinkReading,
)
from flopwatch.exporters.gpu.xid_events import XidWatcher

log = logging.getLogger(__name__)

#: reads a ctypes field without pynvml's Python-level __getattribute__ (which only decodes bytes):
#: halves the cost of decoding the ~100 entries of a GPU's field-value batch
_struct_get = ctypes.Structure.__getattribute__



def import_pynvml() -> Any:
    try:
        return importlib.import_module("pynvml")
    except ImportError:
        raise BackendUnavailable(
            "the Python package nvidia-ml-py (module pynvml) is not installed: pip install nvidia-ml-py"
        ) from None


def init_failure(nvml: Any, error: Any) -> str:
    """The one line a user sees when nvmlInit() fails."""
    code = getattr(error, "value", None)
    if code == nvml.NVML_ERROR_LIBRARY_NOT_FOUND:
        return "NVIDIA driver library (libnvidia-ml.so.1) not found: no NVIDIA driver on this machine"
    if code == nvml.NVML_ERROR_DRIVER_NOT_LOADED:
        return "NVIDIA driver not loaded: the kernel module is missing or failed (see dmesg and nvidia-smi)"
    if code == nvml.NVML_ERROR_NO_PERMISSION:
        return ("no permission to open the NVIDIA devices (/dev/nvidia*): run the agent as root or as a user "
                "allowed to access them")
    if code == nvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH:
        return ("NVIDIA driver and libnvidia-ml.so versions differ (driver upgraded without reload): "
                "reload the driver or reboot")
    return f"NVML failed to initialise: {error}"


def text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


@dataclass
class _Device:
    """One GPU's handle and what is fixed for it until it is lost (read once, at open)."""

    index: int
    handle: Any
    uuid: str = ""
    name: str = ""
    sm_clock_max_hz: float | None = None
    pcie_max_generation: int | None = None
    pcie_max_width: int | None = None
    reasons: dict[str, int] = field(default_factory=dict)     # supported clock-event reason -> bit
    links: tuple[int, ...] = ()                                # NVLinks that exist on this GPU
    field_ids: list[tuple[int, int]] = field(default_factory=list)
    gpm_samples: list[Any] | None = None                       # two samples, used alternately
    gpm_next: int = 0
    gpm_primed: bool = False
    failure: GpuReadError | None = None                        # why it could not be opened


class NvmlBackend(GpuBackend):
    """Reads GPUs through NVML; `gpm=False` leaves SM/tensor/DRAM activity to another source (DCGM)."""

    name = "nvml"

    def __init__(self, options: GpuOptions, nvml: Any = None, *, gpm: bool = True) -> None:
        self.options = options
        self.nvml = nvml
        self.use_gpm = gpm
        self.driver_version = ""
        self.devices: list[_Device] = []
        self.xids: XidWatcher | None = None
        self._generation = 0                 # bumped on every NVML re-initialisation
        self._reinit_lock = threading.Lock()
        self._noted: set[tuple[int, str, int]] = set()
        self._fatal: dict[int, str] = {}
        self._field_id: dict[str, int] = {}      # DEVICE_FIELDS / NVLINK_FIELDS kind -> NVML field id
        self._members: dict[int, str] = {}       # field value type -> c_nvmlValue_t member
        self._started = False

    # -- lifecycle -----------------------------------------------------------------------------
    def start(self) -> int:
        if self.nvml is None:
            self.nvml = import_pynvml()
        nvml = self.nvml
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as error:
            raise BackendUnavailable(init_failure(nvml, error)) from None
        self._started = True
        self._fatal = {getattr(nvml, name): cause for name, cause in FATAL_ERRORS.items()}
        self._field_id = {kind: getattr(nvml, name) for kind, name in {**DEVICE_FIELDS, **NVLINK_FIELDS}.items()}
        self._members = {getattr(nvml, name): member for name, member in VALUE_MEMBERS.items()}
        try:
            count = int(nvml.nvmlDeviceGetCount())
        except nvml.NVMLError as error:
            self.stop()
            raise BackendUnavailable(f"NVML cannot count the GPUs: {error}") from None
        if count == 0:
            self.stop()
            raise BackendUnavailable("NVML found no NVIDIA GPU on this machine")
        try:
            self.driver_version = text(nvml.nvmlSystemGetDriverVersion())
        except nvml.NVMLError as error:
            log.info("driver version unavailable: %s", error)
        self.devices = [self._open_or_fail(index) for index in range(count)]
        self.xids = XidWatcher(nvml)
        self.xids.start({d.index: d.handle for d in self.devices if d.handle is not None})
        return count

    def stop(self) -> None:
        if self.xids is not None:
            self.xids.stop()
            self.xids = None
        for device in self.devices:
            self._free_gpm(device)
        if self._started:
            self._started = False
            try:
                self.nvml.nvmlShutdown()
            except self.nvml.NVMLError as error:
                log.debug("nvmlShutdown: %s", error)

    def xid_counts(self) -> dict[tuple[int, int], int]:
        return self.xids.counts() if self.xids is not None else {}

    def recover(self, index: int) -> None:
        """Get a fresh handle; if the driver restarted (NVML uninitialised), re-initialise NVML first."""
        old = self.devices[index]
        generation = self._generation
        try:
            device = self._open(index, old.uuid)
        except GpuReadError as error:
            if error.cause != "driver":
                raise
            self._reinit(generation)  # re-opens every GPU it can and rebuilds the XID event set
            if self.devices[index] is not old:
                log.info("GPU %d: back after NVML re-initialisation", index)
                return
            device = self._open(index, old.uuid)
        with self._reinit_lock:
            if self.devices[index] is not old:  # another GPU's re-initialisation reopened it meanwhile
                self._free_gpm(device)
                log.info("GPU %d: back after NVML re-initialisation", index)
                return
            self._free_gpm(old)
            self.devices[index] = device
            if self.xids is not None:
                if self.xids.running:
                    self.xids.register(index, device.handle)
                else:  # no GPU could take events before (e.g. the only one was lost at start)
                    self.xids.start({d.index: d.handle for d in self.devices if d.handle is not None})
        log.info("GPU %d: NVML handle re-acquired", index)

    def _reinit(self, seen_generation: int) -> None:
        """Shut NVML down and up again, once for all GPUs that noticed the same driver restart.

        Every GPU is opened afresh (handles and GPM samples of the old session are not reused);
        one that cannot be opened yet keeps its old state and recovers on its own turn.
        """
        nvml = self.nvml
        with self._reinit_lock:
            if self._generation != seen_generation:
                return  # another GPU's recovery already did it
            log.warning("NVML reports the driver uninitialised; re-initialising NVML")
            if self.xids is not None:
                self.xids.stop()
            for device in self.devices:  # GPM buffers belong to the old session: free them, or leak them
                self._free_gpm(device)
            try:
                nvml.nvmlShutdown()
            except nvml.NVMLError as error:
                log.debug("nvmlShutdown before re-init: %s", error)
            try:
                nvml.nvmlInit()
            except nvml.NVMLError as error:
                raise GpuReadError("driver", f"re-initialising NVML failed: {init_failure(nvml, error)}") from None
            self._generation += 1
            for index, old in enumerate(self.devices):
                try:
                    self.devices[index] = self._open(index, old.uuid)
                except GpuReadError as error:
                    log.info("GPU %d: not back yet after NVML re-initialisation: %s", index, error)
            if self.xids is not None:
                self.xids.start({d.index: d.handle for d in self.devices if d.handle is not None})

    # -- opening a device ----------------------------------------------------------------------
    def _open_or_fail(self, index: int) -> _Device:
        try:
            return self._open(index, "")
        except GpuReadError as error:
            log.warning("%s", error)
            return _Device(index, None, failure=error)

    def _open(self, index: int, uuid: str) -> _Device:
        """Get the handle and the fixed facts of one GPU; raise GpuReadError if it is unreachable."""
        nvml = self.nvml
        try:
            handle = nvml.nvmlDeviceGetHandleByUUID(uuid) if uuid else nvml.nvmlDeviceGetHandleByIndex(index)
        except nvml.NVMLError as error:
            cause = "driver" if self._fatal.get(error.value) == "driver" else "gpu_lost"
            raise GpuReadError(cause, f"GPU {index}: cannot get its NVML handle: {error}") from None
        device = _Device(index, handle)
        device.uuid = text(self._get(device, "nvmlDeviceGetUUID") or uuid)
        device.name = text(self._get(device, "nvmlDeviceGetName") or "")
        sm_max = self._get(device, "nvmlDeviceGetMaxClockInfo", nvml.NVML_CLOCK_SM)
        device.sm_clock_max_hz = None if sm_max is None else sm_max * MHZ
        device.pcie_max_generation = self._get(device, "nvmlDeviceGetMaxPcieLinkGeneration")
        device.pcie_max_width = self._get(device, "nvmlDeviceGetMaxPcieLinkWidth")
        supported = self._get(device, "nvmlDeviceGetSupportedClocksEventReasons")
        masks = {reason: getattr(nvml, name) for reason, name in CLOCK_EVENT_MASKS.items()}
        device.reasons = {r: bit for r, bit in masks.items() if supported is None or supported & bit}
        device.links = self._probe_links(device)
        device.field_ids = self._field_ids(device.links)
        if self.use_gpm:
            self._open_gpm(device)
        return device

    def _probe_links(self, device: _Device) -> tuple[int, ...]:
        """NVLinks that exist: those whose state NVML reports (active or not). Probed once per open."""
        nvml = self.nvml
        links = []
        for link in range(nvml.NVML_NVLINK_MAX_LINKS):
            try:
                nvml.nvmlDeviceGetNvLinkState(device.handle, link)
            except nvml.NVMLError as error:
                if error.value in self._fatal and self._fatal[error.value] in ("gpu_lost", "driver"):
                    raise GpuReadError(self._fatal[error.value], f"GPU {device.index}: NVLink probe: {error}") \
                        from None
                continue
            links.append(link)
        return tuple(links)

    def _field_ids(self, links: tuple[int, ...]) -> list[tuple[int, int]]:
        ids = [(self._field_id[kind], 0) for kind in DEVICE_FIELDS]
        for link in links:
            ids.extend((self._field_id[kind], link) for kind in NVLINK_FIELDS)
        return ids

    def _open_gpm(self, device: _Device) -> None:
        support = self._get(device, "nvmlGpmQueryDeviceSupport")
        if support is None or not support.isSupportedDevice:
            return
        samples = []
        for _ in range(2):
            sample = self._get(device, "nvmlGpmSampleAlloc", handle=False)
            if sample is None:
                for allocated in samples:
                    self._get(device, "nvmlGpmSampleFree", allocated, handle=False)
                return
            samples.append(sample)
        device.gpm_samples = samples

    def _free_gpm(self, device: _Device) -> None:
        samples, device.gpm_samples = device.gpm_samples, None
        for sample in samples or ():
            try:
                self.nvml.nvmlGpmSampleFree(sample)
            except self.nvml.NVMLError as error:
                log.debug("GPU %d: freeing a GPM sample: %s", device.index, error)

    # -- reading -------------------------------------------------------------------------------
    def read(self, index: int) -> GpuReading:
        device = self.devices[index]
        if device.handle is None:
            failure = device.failure or GpuReadError("gpu_lost", f"GPU {index}: no NVML handle")
            raise GpuReadError(failure.cause, str(failure))
        nvml = self.nvml

        def get(name: str, *args: Any) -> Any:
            return self._get(device, name, *args)

        def scaled(value: Any, factor: float) -> float | None:
            return None if value is None else value * factor

        utilization = get("nvmlDeviceGetUtilizationRates")
        memory = get("nvmlDeviceGetMemoryInfo")
        fields = self._field_values(device)
        reasons = get("nvmlDeviceGetCurrentClocksEventReasons")
        remapped = get("nvmlDeviceGetRemappedRows")
        processes = get("nvmlDeviceGetComputeRunningProcesses")
        reading = GpuReading(
            index=index, uuid=device.uuid, model=device.name, driver_version=self.driver_version,
            utilization=None if utilization is None else utilization.gpu / 100,
            memory_utilization=None if utilization is None else utilization.memory / 100,
            sm_clock_hz=scaled(get("nvmlDeviceGetClockInfo", nvml.NVML_CLOCK_SM), MHZ),
            sm_clock_max_hz=device.sm_clock_max_hz,
            memory_clock_hz=scaled(get("nvmlDeviceGetClockInfo", nvml.NVML_CLOCK_MEM), MHZ),
            power_watts=scaled(get("nvmlDeviceGetPowerUsage"), 1e-3),
            power_limit_watts=scaled(get("nvmlDeviceGetEnforcedPowerLimit"), 1e-3),
            energy_joules=scaled(get("nvmlDeviceGetTotalEnergyConsumption"), 1e-3),
            temperature_c=get("nvmlDeviceGetTemperature", nvml.NVML_TEMPERATURE_GPU),
            memory_temperature_c=fields.get((self._field_id["memory_temperature"], 0)),
            memory_used_bytes=None if memory is None else float(memory.used),
            memory_total_bytes=None if memory is None else float(memory.total),
            clock_events=None if reasons is None else {r: bool(reasons & bit) for r, bit in device.reasons.items()},
            violation_seconds=self._violations(device),
            pcie_generation=get("nvmlDeviceGetCurrPcieLinkGeneration"),
            pcie_width=get("nvmlDeviceGetCurrPcieLinkWidth"),
            pcie_max_generation=device.pcie_max_generation,
            pcie_max_width=device.pcie_max_width,
            pcie_replays=fields.get((self._field_id["pcie_replays"], 0)),
            pcie_tx_bytes=fields.get((self._field_id["pcie_tx"], 0)),
            pcie_rx_bytes=fields.get((self._field_id["pcie_rx"], 0)),
            nvlinks=self._nvlinks(device, fields),
            ecc_corrected=get("nvmlDeviceGetTotalEccErrors", nvml.NVML_MEMORY_ERROR_TYPE_CORRECTED,
                              nvml.NVML_VOLATILE_ECC),
            ecc_uncorrected=get("nvmlDeviceGetTotalEccErrors", nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                                nvml.NVML_VOLATILE_ECC),
            remapped_rows_correctable=None if remapped is None else float(remapped[0]),
            remapped_rows_uncorrectable=None if remapped is None else float(remapped[1]),
            row_remap_pending=None if remapped is None else bool(remapped[2]),
            row_remap_failed=None if remapped is None else bool(remapped[3]),
            pids=None if processes is None else [int(p.pid) for p in processes],
        )
        for attribute, value in self._gpm(device).items():
            setattr(reading, attribute, value)
        return reading

    def _get(self, device: _Device, name: str, *args: Any, handle: bool = True) -> Any:
        """Call one NVML function; None when unsupported, GpuReadError when the whole GPU failed."""
        nvml = self.nvml
        function = getattr(nvml, name, None)
        if function is None:  # an older pynvml without this function
            self._note(device, name, -1, "not in this pynvml")
            return None
        try:
            return function(device.handle, *args) if handle else function(*args)
        except nvml.NVMLError as error:
            cause = self._fatal.get(error.value)
            if cause is not None:
                raise GpuReadError(cause, f"GPU {device.index}: {name}: {error}") from None
            self._note(device, name, error.value, str(error))
            return None

    def _note(self, device: _Device, name: str, code: int, message: str) -> None:
        """Log once per GPU, call and error why a value is absent (NotSupported is normal: debug)."""
        key = (device.index, name, code)
        if key in self._noted:
            return
        self._noted.add(key)
        level = logging.DEBUG if code == self.nvml.NVML_ERROR_NOT_SUPPORTED else logging.INFO
        log.log(level, "GPU %d: %s unavailable (%s); its series stay absent", device.index, name, message)

    def _field_values(self, device: _Device) -> dict[tuple[int, int], float]:
        """All field ids of the GPU in ONE call; each entry's own nvmlReturn decides if it counts."""
        values = self._get(device, "nvmlDeviceGetFieldValues", device.field_ids)
        if values is None:
            return {}
        success, members = self.nvml.NVML_SUCCESS, self._members
        result: dict[tuple[int, int], float] = {}
        for key, value in zip(device.field_ids, values, strict=False):
            code = _struct_get(value, "nvmlReturn")
            if code != success:
                self._note(device, f"field {key[0]} scope {key[1]}", code, f"nvmlReturn {code}")
                continue
            member = members.get(_struct_get(value, "valueType"))
            if member is not None:
                result[key] = float(getattr(_struct_get(value, "value"), member))
        return result

    def _nvlinks(self, device: _Device, fields: dict[tuple[int, int], float]) -> list[NvLinkReading]:
        ids = self._field_id
        per_link = []
        for link in device.links:
            tx, rx = fields.get((ids["tx"], link)), fields.get((ids["rx"], link))
            errors = {kind: fields[(ids[kind], link)] for kind in ("replay", "recovery", "crc")
                      if (ids[kind], link) in fields}
            per_link.append(NvLinkReading(
                str(link), None if tx is None else tx * KIB, None if rx is None else rx * KIB, errors,
            ))
        if self.options.nvlink_per_link or not per_link:
            return per_link

        def total(values: list[float | None]) -> float | None:  # a partial sum would not be a counter
            return None if any(v is None for v in values) else float(sum(v for v in values if v is not None))

        errors = {}
        for kind in ("replay", "recovery", "crc"):
            summed = total([link.errors.get(kind) for link in per_link])
            if summed is not None:
                errors[kind] = summed
        return [NvLinkReading("all", total([link.tx_bytes for link in per_link]),
                              total([link.rx_bytes for link in per_link]), errors)]

    def _violations(self, device: _Device) -> dict[str, float] | None:
        nvml = self.nvml
        seconds = {}
        for reason, policy in VIOLATION_POLICIES.items():
            status = self._get(device, "nvmlDeviceGetViolationStatus", getattr(nvml, policy))
            if status is not None:
                seconds[reason] = status.violationTime * 1e-9
        return seconds or None

    def _gpm(self, device: _Device) -> dict[str, float]:
        """GPM activity between the previous cycle's sample and this one; empty on the first cycle."""
        if device.gpm_samples is None:
            return {}
        nvml = self.nvml
        current = device.gpm_samples[device.gpm_next]
        if self._get(device, "nvmlGpmSampleGet", current) is None:
            device.gpm_primed = False
            return {}
        previous = device.gpm_samples[1 - device.gpm_next]
        primed, device.gpm_primed = device.gpm_primed, True
        device.gpm_next = 1 - device.gpm_next
        if not primed:
            return {}
        request = nvml.c_nvmlGpmMetricsGet_t()
        request.version = nvml.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = len(GPM_METRICS)
        request.sample1 = previous
        request.sample2 = current
        for slot, name in enumerate(GPM_METRICS.values()):
            request.metrics[slot].metricId = getattr(nvml, name)
        if self._get(device, "nvmlGpmMetricsGet", request, handle=False) is None:
            return {}
        result = {}
        for slot, attribute in enumerate(GPM_METRICS):
            metric = request.metrics[slot]
            if metric.nvmlReturn == nvml.NVML_SUCCESS:
                result[attribute] = min(1.0, max(0.0, metric.value / 100))
        return result

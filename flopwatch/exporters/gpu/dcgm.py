"""The DCGM backend: NVML for device fields, DCGM's profiling fields for SM/tensor/DRAM activity.

DCGM's host engine (nv-hostengine) owns the profiling counters on every architecture it supports
(not only Hopper's GPM), so where it runs FlopWatch takes these from it:

    1002 SM active, 1003 SM occupancy, 1004 tensor pipe active, 1005 DRAM active   (ratios 0..1)
    1009/1010 PCIe tx/rx bytes per second, 1011/1012 NVLink tx/rx bytes per second

Fields are keyed by NUMERIC id because DCGM 4.6 renamed the constants. Everything else is read
exactly as the NVML backend reads it: this class composes an `NvmlBackend` (with GPM off, so the
two do not compete for the same counters) rather than copying it. The byte rates are used only
when NVML's byte counters are unavailable; they are integrated (rate x time since the previous
read) into counters, which is an estimate (docs/backends.md).

If the host engine goes away while running, the GPUs stay up with NVML's fields and the profiling
series go absent; a background thread reconnects every `reconnect_s`, so no GPU read ever waits on
a host engine that is slow to answer.

DCGM's Python bindings ship with DCGM (under /usr/local/dcgm/bindings/python3), not on PyPI.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from flopwatch.config import GpuOptions
from flopwatch.exporters.gpu.backend import GpuBackend
from flopwatch.exporters.gpu.nvml import NvmlBackend, text
from flopwatch.exporters.gpu.reading import BackendUnavailable, GpuReading, NvLinkReading

log = logging.getLogger(__name__)

DCGM_BINDINGS = Path("/usr/local/dcgm/bindings/python3")
BINDING_MODULES = ("dcgm_structs", "dcgm_fields", "dcgm_agent", "pydcgm")

#: GpuReading attribute -> DCGM profiling field id (a ratio 0..1)
RATIO_FIELDS = {"sm_active": 1002, "sm_occupancy": 1003, "tensor_active": 1004, "dram_active": 1005}
PCIE_TX, PCIE_RX, NVLINK_TX, NVLINK_RX = 1009, 1010, 1011, 1012
PROFILING_FIELDS = (*RATIO_FIELDS.values(), PCIE_TX, PCIE_RX, NVLINK_TX, NVLINK_RX)

UPDATE_US = 1_000_000     # the host engine samples the profiling fields once a second
KEEP_AGE_S = 60.0         # and keeps a minute of them
RECONNECT_S = 30.0


def load_bindings() -> dict[str, Any]:
    """Import DCGM's own Python modules, from the DCGM install directory when it exists."""
    if DCGM_BINDINGS.is_dir() and str(DCGM_BINDINGS) not in sys.path:
        sys.path.append(str(DCGM_BINDINGS))
    try:
        return {name: importlib.import_module(name) for name in BINDING_MODULES}
    except ImportError as error:
        raise BackendUnavailable(
            f"DCGM Python bindings not found (cannot import {error.name or 'pydcgm'}); they ship with DCGM "
            f"under {DCGM_BINDINGS}, not on PyPI"
        ) from None


class _RateCounter:
    """A counter built from a rate: adds rate x elapsed time on every read that has a rate."""

    def __init__(self) -> None:
        self.total = 0.0
        self.last: float | None = None

    def add(self, rate: float | None, now: float) -> float | None:
        previous, self.last = self.last, now
        if rate is None:
            return None
        if previous is not None:
            self.total += max(0.0, rate) * (now - previous)
        return float(int(self.total))


class DcgmBackend(GpuBackend):
    name = "dcgm"

    def __init__(self, options: GpuOptions, nvml: Any = None, bindings: dict[str, Any] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.options = options
        self.clock = clock          # integrates DCGM's byte rates into counters
        self.nvml_backend = NvmlBackend(options, nvml, gpm=False)
        self.bindings = bindings
        self.reconnect_s = RECONNECT_S
        self._handle: Any = None
        self._field_group: Any = None
        self._groups: dict[int, tuple[int, Any]] = {}   # NVML index -> (DCGM gpu id, one-GPU group)
        self._rates: dict[tuple[int, str], _RateCounter] = {}
        self._lock = threading.Lock()                    # connect / disconnect
        self._retry_at = 0.0
        self._reconnecting: threading.Thread | None = None
        self._warned: set[Any] = set()

    # -- lifecycle -----------------------------------------------------------------------------
    def start(self) -> int:
        if self.bindings is None:
            self.bindings = load_bindings()
        self._connect()
        try:
            count = self.nvml_backend.start()
        except BackendUnavailable:
            self._disconnect()
            raise
        try:
            self._watch()
        except BackendUnavailable:
            self.stop()
            raise
        return count

    def stop(self) -> None:
        with self._lock:
            self._disconnect()
        self.nvml_backend.stop()

    def recover(self, index: int) -> None:
        self.nvml_backend.recover(index)

    def xid_counts(self) -> dict[tuple[int, int], int]:
        return self.nvml_backend.xid_counts()

    def _connect(self) -> None:
        structs, pydcgm = self.bindings["dcgm_structs"], self.bindings["pydcgm"]
        host = self.options.dcgm_host
        try:
            self._handle = pydcgm.DcgmHandle(ipAddress=host, opMode=structs.DCGM_OPERATION_MODE_AUTO)
        except structs.DCGMError as error:
            if error.value == structs.DCGM_ST_LIBRARY_NOT_FOUND:
                raise BackendUnavailable("DCGM library (libdcgm.so.4) not found: DCGM is not installed") from None
            raise BackendUnavailable(f"DCGM host engine (nv-hostengine) does not answer at {host}: {error}") \
                from None

    def _watch(self) -> None:
        """One DCGM group per GPU (matched to NVML by UUID) watching the profiling fields."""
        structs, pydcgm = self.bindings["dcgm_structs"], self.bindings["pydcgm"]
        by_uuid = {d.uuid: d.index for d in self.nvml_backend.devices if d.uuid}
        tag = f"flopwatch-{os.getpid()}"
        try:
            system = self._handle.GetSystem()
            for gpu_id in system.discovery.GetAllSupportedGpuIds():
                uuid = text(system.discovery.GetGpuAttributes(gpu_id).identifiers.uuid)
                if uuid not in by_uuid:
                    log.info("DCGM GPU %d (%s) is not among NVML's GPUs; ignored", gpu_id, uuid)
                    continue
                group = system.GetGroupWithGpuIds(f"{tag}-gpu{gpu_id}", [gpu_id])
                self._groups[by_uuid[uuid]] = (gpu_id, group)
            if not self._groups:
                raise BackendUnavailable("DCGM host engine reports none of the GPUs NVML sees")
            self._field_group = pydcgm.DcgmFieldGroup(self._handle, tag, list(PROFILING_FIELDS))
            for _, group in self._groups.values():
                group.samples.WatchFields(self._field_group, UPDATE_US, KEEP_AGE_S, 0)
        except structs.DCGMError as error:
            raise BackendUnavailable(f"DCGM cannot watch the profiling fields: {error}") from None

    def _disconnect(self) -> None:
        """Drop groups, field group and connection; tolerate a host engine that is already gone."""
        groups, self._groups = self._groups, {}
        field_group, self._field_group = self._field_group, None
        handle, self._handle = self._handle, None
        releases = [group.Delete for _, group in groups.values()]
        if field_group is not None:
            releases.append(field_group.Delete)
        if handle is not None:
            releases.append(handle.Shutdown)
        for release in releases:
            try:
                release()
            except Exception as error:  # cleanup goes on whatever a half-gone host engine raises
                log.debug("DCGM cleanup: %r", error)

    def _schedule_reconnect(self) -> None:
        """Start one background reconnection attempt when the retry time has come."""
        with self._lock:
            if self._handle is not None or time.monotonic() < self._retry_at:
                return
            if self._reconnecting is not None and self._reconnecting.is_alive():
                return
            self._retry_at = time.monotonic() + self.reconnect_s
            self._reconnecting = threading.Thread(target=self._reconnect, name="dcgm-reconnect", daemon=True)
            self._reconnecting.start()

    def _reconnect(self) -> None:
        with self._lock:
            if self._handle is not None:
                return
            try:
                self._connect()
                self._watch()
            except BackendUnavailable as error:
                self._disconnect()
                self._warn_once("reconnect", "DCGM still unavailable (%s); retrying every %gs", error,
                                self.reconnect_s)
                return
            self._warned.discard("reconnect")
            log.info("DCGM host engine reconnected; profiling fields flow again")

    # -- reading -------------------------------------------------------------------------------
    def read(self, index: int) -> GpuReading:
        reading = self.nvml_backend.read(index)
        values = self._profiling(index)
        for attribute, field_id in RATIO_FIELDS.items():
            if values.get(field_id) is not None:
                setattr(reading, attribute, min(1.0, max(0.0, float(values[field_id]))))
        now = self.clock()
        if reading.pcie_tx_bytes is None:
            reading.pcie_tx_bytes = self._integrate(index, "pcie_tx", values.get(PCIE_TX), now)
        if reading.pcie_rx_bytes is None:
            reading.pcie_rx_bytes = self._integrate(index, "pcie_rx", values.get(PCIE_RX), now)
        if all(link.tx_bytes is None and link.rx_bytes is None for link in reading.nvlinks):
            tx = self._integrate(index, "nvlink_tx", values.get(NVLINK_TX), now)
            rx = self._integrate(index, "nvlink_rx", values.get(NVLINK_RX), now)
            if tx is not None or rx is not None:
                reading.nvlinks.append(NvLinkReading("all", tx, rx))
        return reading

    def _integrate(self, index: int, kind: str, rate: float | None, now: float) -> float | None:
        return self._rates.setdefault((index, kind), _RateCounter()).add(rate, now)

    def _profiling(self, index: int) -> dict[int, float]:
        """Latest non-blank profiling values of one GPU by field id; empty when DCGM cannot answer."""
        if self._handle is None:
            self._schedule_reconnect()
            return {}
        entry = self._groups.get(index)
        field_group = self._field_group
        if entry is None or field_group is None:
            return {}
        structs, fields = self.bindings["dcgm_structs"], self.bindings["dcgm_fields"]
        gpu_id, group = entry
        try:
            collection = group.samples.GetLatest_v2(field_group)
        except structs.DCGMError as error:
            if error.value == structs.DCGM_ST_CONNECTION_NOT_VALID:
                self._lost(error)
            else:
                self._warn_once(("read", index, error.value), "GPU %d: DCGM profiling fields unavailable: %s",
                                index, error)
            return {}
        series = collection.values.get(fields.DCGM_FE_GPU, {}).get(gpu_id, {})
        return {field_id: values[-1].value for field_id, values in series.items()
                if len(values) and not values[-1].isBlank}

    def _lost(self, error: Any) -> None:
        with self._lock:
            if self._handle is None:
                return
            log.warning("lost the DCGM host engine (%s): profiling series are absent until it is back", error)
            self._disconnect()
            self._retry_at = time.monotonic() + self.reconnect_s

    def _warn_once(self, key: Any, message: str, *args: Any) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning(message, *args)

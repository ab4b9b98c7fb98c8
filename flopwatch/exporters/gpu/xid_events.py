"""XID events: NVML delivers XIDs as events, not values, so a daemon thread waits on an event set
and counts them per GPU and code (the table of what each code means is flopwatch/xid.py).

XIDs are the driver's error reports (13 graphics exception, 48 double-bit ECC, 79 fallen off the
bus, ...). They cannot be polled: a device is registered for `nvmlEventTypeXidCriticalError` on an
event set and a loop waits on it. The wait is bounded (`WAIT_MS`) so `stop()` returns promptly; a
`Timeout` from the wait is the normal "nothing happened". The event set is freed only after the
thread has left the wait, never under it.
"""

from __future__ import annotations

import ctypes
import logging
import threading
from typing import Any

log = logging.getLogger(__name__)

WAIT_MS = 500
ERROR_PAUSE_S = 1.0  # after an unexpected wait error, so a broken driver does not spin a core


def handle_key(handle: Any) -> int:
    """A stable key for an NVML device handle (its address), to map an event back to a GPU.

    The address survives a lost GPU, whereas asking NVML for the index of a lost GPU fails.
    """
    try:
        return int(ctypes.cast(handle, ctypes.c_void_p).value or 0)
    except (TypeError, ctypes.ArgumentError):
        return id(handle)


class XidWatcher:
    """Counts (gpu index, xid) from NVML events on a daemon thread."""

    def __init__(self, nvml: Any, wait_ms: int | None = None) -> None:
        self.nvml = nvml
        self.wait_ms = WAIT_MS if wait_ms is None else wait_ms
        self._counts: dict[tuple[int, int], int] = {}
        self._lock = threading.Lock()
        self._index_by_key: dict[int, int] = {}
        self._event_set: Any = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._warned: set[tuple[Any, ...]] = set()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self, handles: dict[int, Any]) -> int:
        """Register every device; start the wait loop if at least one took. Returns how many took."""
        nvml = self.nvml
        try:
            self._event_set = nvml.nvmlEventSetCreate()
        except nvml.NVMLError as error:
            log.warning("XID events unavailable: cannot create an NVML event set (%s); "
                        "flopwatch_gpu_xid_errors_total will stay absent", error)
            return 0
        registered = sum(self.register(index, handle) for index, handle in sorted(handles.items()))
        if not registered:
            self._free()
            log.warning("XID events unavailable: no GPU accepted the XID event registration")
            return 0
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="nvml-xid", daemon=True)
        self._thread.start()
        return registered

    def register(self, index: int, handle: Any) -> bool:
        """Add one device (also after recovery gave it a new handle). NVML allows this while waiting."""
        nvml = self.nvml
        if self._event_set is None:
            return False
        try:
            nvml.nvmlDeviceRegisterEvents(handle, nvml.nvmlEventTypeXidCriticalError, self._event_set)
        except nvml.NVMLError as error:
            self._warn_once(("register", index, error.value),
                            "GPU %d: XID events not available (%s); its XIDs are not counted", index, error)
            return False
        self._index_by_key[handle_key(handle)] = index
        return True

    def counts(self) -> dict[tuple[int, int], int]:
        with self._lock:
            return dict(self._counts)

    def stop(self) -> None:
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout=self.wait_ms / 1000 + 2.0)
            if thread.is_alive():  # stuck inside NVML: leaking the set beats freeing it under the wait
                log.warning("XID thread did not stop; leaving its NVML event set allocated")
                self._event_set = None
                return
        self._free()

    def _free(self) -> None:
        event_set, self._event_set = self._event_set, None
        if event_set is None:
            return
        try:
            self.nvml.nvmlEventSetFree(event_set)
        except self.nvml.NVMLError as error:
            log.debug("freeing the XID event set: %s", error)

    def _run(self) -> None:
        nvml = self.nvml
        while not self._stop.is_set():
            try:
                data = nvml.nvmlEventSetWait_v2(self._event_set, self.wait_ms)
            except nvml.NVMLError as error:
                if error.value == nvml.NVML_ERROR_TIMEOUT:
                    continue
                self._warn_once(("wait", error.value), "waiting for XID events failed (%s); retrying", error)
                self._stop.wait(ERROR_PAUSE_S)
                continue
            if not data.eventType & nvml.nvmlEventTypeXidCriticalError:
                continue
            index = self._index_by_key.get(handle_key(data.device))
            xid = int(data.eventData)
            if index is None:
                log.warning("XID %d from a device FlopWatch does not know; not counted", xid)
                continue
            with self._lock:
                self._counts[(index, xid)] = self._counts.get((index, xid), 0) + 1
            log.warning("GPU %d: XID %d", index, xid)

    def _warn_once(self, key: tuple[Any, ...], message: str, *args: Any) -> None:
        if key in self._warned:
            return
        self._warned.add(key)
        log.warning(message, *args)

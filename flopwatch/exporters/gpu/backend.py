"""The contract every GPU backend (NVML, DCGM, simulated) fulfils for the GPU collector."""

from __future__ import annotations

from abc import ABC, abstractmethod

from flopwatch.exporters.gpu.reading import GpuReading


class GpuBackend(ABC):
    """Reads GPUs. `read()` may be called from worker threads, one call per GPU at a time."""

    name: str = "abstract"

    @abstractmethod
    def start(self) -> int:
        """Initialise the library and return the number of GPUs; raise BackendUnavailable."""

    @abstractmethod
    def read(self, index: int) -> GpuReading:
        """Read one GPU; raise GpuReadError when that GPU (not the whole backend) fails."""

    def recover(self, index: int) -> None:  # noqa: B027 - optional hook
        """Try to get a lost GPU back (new handle, re-initialised library); raise GpuReadError."""

    def xid_counts(self) -> dict[tuple[int, int], int]:
        """(gpu index, xid) -> count of XID events seen since start."""
        return {}

    def stop(self) -> None:  # noqa: B027 - optional hook
        """Release the library and stop helper threads."""

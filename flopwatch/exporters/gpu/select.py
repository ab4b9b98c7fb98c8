"""Pick the GPU backend: `auto` tries DCGM, then NVML; `sim` needs no hardware."""

from __future__ import annotations

import logging

from flopwatch.config import AgentConfig
from flopwatch.exporters.gpu.backend import GpuBackend
from flopwatch.exporters.gpu.reading import BackendUnavailable
from flopwatch.hardware import model_by_name

log = logging.getLogger(__name__)


def make_backend(config: AgentConfig) -> tuple[GpuBackend, int]:
    """A started backend and its GPU count; raises BackendUnavailable with a one-line reason."""
    choice = config.backend
    if choice == "sim":
        from flopwatch.exporters.gpu.simulated import SimBackend

        model = model_by_name(config.sim.model)
        assert model is not None  # validated by config
        backend: GpuBackend = SimBackend.standalone(
            config.sim.gpus, model, config.sim.seed, config.gpu.nvlink_per_link
        )
        return backend, backend.start()
    dcgm_skipped = ""
    if choice in ("dcgm", "auto"):
        from flopwatch.exporters.gpu.dcgm import DcgmBackend

        backend = DcgmBackend(config.gpu)
        try:
            return backend, backend.start()
        except BackendUnavailable as error:
            if choice == "dcgm":
                raise BackendUnavailable(f"{error}. Without DCGM, run with --backend nvml") from None
            dcgm_skipped = str(error)  # logged only if NVML works: a failure prints one line, not two
    from flopwatch.exporters.gpu.nvml import NvmlBackend

    backend = NvmlBackend(config.gpu)
    try:
        count = backend.start()
    except BackendUnavailable as error:
        raise BackendUnavailable(f"{error}. To try FlopWatch without GPUs, run with --backend sim") from None
    if dcgm_skipped:
        log.info("DCGM not used (%s); reading GPUs through NVML", dcgm_skipped)
    return backend, count

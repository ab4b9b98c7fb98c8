"""Collection cost per cycle of the NVML backend through the real nvidia-ml-py and a C libnvidia-ml.so.1.

The library is the test one (tests/nvml_driver, built with gcc against NVIDIA's nvml.h; 8 H100s):
every call crosses ctypes into C and back as on a GPU node, but the C side answers at once, so the
figures are FlopWatch's and pynvml's cost without the driver's own latency. Three contestants over
the same 8 GPUs, interleaved cycle by cycle in one process so machine noise hits them alike:

- `GpuCollector.update()` on the NVML backend (threads, timeouts, conversion: what the agent pays);
- the same collector on the simulated backend (`--backend sim`), the reference used elsewhere;
- a plain loop calling the same nvidia-ml-py functions with the same arguments, one GPU after
  another, keeping nothing (the floor any NVML-based exporter pays).

CPU per cycle is `time.process_time()` (all threads), wall per cycle `time.perf_counter()`. NVML
calls per GPU per cycle are counted by the library itself.

    .venv/bin/python -m bench.nvml_driver_cost [--cycles 300]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from flopwatch import config as cfg
from flopwatch.exporters.gpu import nvml as nvml_module
from flopwatch.exporters.gpu.collector import GpuCollector
from flopwatch.exporters.gpu.nvml import NvmlBackend
from flopwatch.exporters.gpu.simulated import SimBackend
from flopwatch.hardware import model_by_name

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from nvml_driver import STATE_VARIABLE, DriverState, InProcess  # the test library lives beside the tests

GPUS = 8


def plain_loop(nvml: Any, backend: NvmlBackend) -> Callable[[], None]:
    """The backend's per-cycle NVML calls, made directly: no collector, no conversion, no threads."""
    devices = backend.devices
    policies = [getattr(nvml, name) for name in nvml_module.VIOLATION_POLICIES.values()]
    metric_ids = [getattr(nvml, name) for name in nvml_module.GPM_METRICS.values()]
    pairs = {d.index: list(d.gpm_samples or []) for d in devices}
    for device in devices:   # a GPM interval needs an earlier sample
        nvml.nvmlGpmSampleGet(device.handle, pairs[device.index][0])

    def cycle() -> None:
        for device in devices:
            h = device.handle
            nvml.nvmlDeviceGetUtilizationRates(h)
            nvml.nvmlDeviceGetMemoryInfo(h)
            nvml.nvmlDeviceGetFieldValues(h, device.field_ids)
            nvml.nvmlDeviceGetCurrentClocksEventReasons(h)
            nvml.nvmlDeviceGetRemappedRows(h)
            nvml.nvmlDeviceGetComputeRunningProcesses(h)
            nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_SM)
            nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_MEM)
            nvml.nvmlDeviceGetPowerUsage(h)
            nvml.nvmlDeviceGetEnforcedPowerLimit(h)
            nvml.nvmlDeviceGetTotalEnergyConsumption(h)
            nvml.nvmlDeviceGetTemperature(h, nvml.NVML_TEMPERATURE_GPU)
            for policy in policies:
                nvml.nvmlDeviceGetViolationStatus(h, policy)
            nvml.nvmlDeviceGetCurrPcieLinkGeneration(h)
            nvml.nvmlDeviceGetCurrPcieLinkWidth(h)
            nvml.nvmlDeviceGetTotalEccErrors(h, nvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, nvml.NVML_VOLATILE_ECC)
            nvml.nvmlDeviceGetTotalEccErrors(h, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_VOLATILE_ECC)
            first, second = pairs[device.index]
            nvml.nvmlGpmSampleGet(h, second)
            request = nvml.c_nvmlGpmMetricsGet_t()
            request.version, request.numMetrics = nvml.NVML_GPM_METRICS_GET_VERSION, len(metric_ids)
            request.sample1, request.sample2 = first, second
            for slot, metric in enumerate(metric_ids):
                request.metrics[slot].metricId = metric
            nvml.nvmlGpmMetricsGet(request)
            pairs[device.index] = [second, first]

    return cycle


def measure(run: Callable[[], object], cpu: list[float], wall: list[float]) -> None:
    started_cpu, started_wall = time.process_time(), time.perf_counter()
    run()
    cpu.append(time.process_time() - started_cpu)
    wall.append(time.perf_counter() - started_wall)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=300)
    args = parser.parse_args()
    config = cfg.load(overrides={"node": "bench"}, environ={})
    workdir = Path(tempfile.mkdtemp(prefix="flopwatch-nvml-cost-"))
    state = DriverState(workdir, ["H100"] * GPUS)
    os.environ[STATE_VARIABLE] = str(state.path)
    driver = InProcess()
    backend = NvmlBackend(config.gpu, driver.pynvml)
    backend.start()
    loop_backend = NvmlBackend(config.gpu, driver.pynvml)   # its own handles and GPM samples
    loop_backend.start()
    contestants: dict[str, Callable[[], object]] = {
        "nvml backend (collector)": GpuCollector(backend, "bench", config.gpu, GPUS).update,
        "sim backend (collector)": GpuCollector(SimBackend.standalone(GPUS, model_by_name("H100-SXM"), seed=0),
                                                "bench", config.gpu, GPUS).update,
        "plain nvidia-ml-py loop": plain_loop(driver.pynvml, loop_backend),
    }
    for run in contestants.values():
        for _ in range(10):
            run()
    cpu: dict[str, list[float]] = {name: [] for name in contestants}
    wall: dict[str, list[float]] = {name: [] for name in contestants}
    for _ in range(args.cycles):
        for name, run in contestants.items():
            measure(run, cpu[name], wall[name])
    calls_before, fields_before = driver.calls("*"), driver.calls("nvmlDeviceGetFieldValues")
    for _ in range(10):   # the library counts C entry points: the backend's alone
        contestants["nvml backend (collector)"]()
    calls = (driver.calls("*") - calls_before) / (10 * GPUS)
    fields = (driver.calls("nvmlDeviceGetFieldValues") - fields_before) / (10 * GPUS)
    backend.stop()
    loop_backend.stop()
    print(f"cycles {args.cycles}, {GPUS} GPUs, load average {os.getloadavg()[0]:.2f}, {os.cpu_count()} CPUs")
    print("| | CPU per cycle (median) | wall per cycle (median) | CPU / sim | CPU / plain loop |")
    print("|---|---:|---:|---:|---:|")
    sim, plain = statistics.median(cpu["sim backend (collector)"]), statistics.median(cpu["plain nvidia-ml-py loop"])
    for name in contestants:
        median = statistics.median(cpu[name])
        print(f"| {name} | {median * 1e3:.3f} ms | {statistics.median(wall[name]) * 1e3:.3f} ms | "
              f"{median / sim:.2f} | {median / plain:.2f} |")
    print(f"NVML C calls per GPU per cycle (backend): {calls:.1f}; nvmlDeviceGetFieldValues per GPU per cycle: "
          f"{fields:.1f}; nvmlDeviceGetPcieThroughput calls: {driver.calls('nvmlDeviceGetPcieThroughput')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

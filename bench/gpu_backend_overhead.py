"""CPU cost of the NVML backend's own Python per collection cycle, against the simulated backend.

No GPU or driver exists where this runs, so the NVML backend reads the fake `pynvml` of
tests/fakes (whose functions return at once): what is measured is FlopWatch's side of a cycle
(the ~20 NVML calls per GPU, unit conversion, the field-value batch, GPM, the collector's threads),
an upper bound that includes the fake's own cost and excludes driver time. The reference is the
simulated backend (`--backend sim`, the same 8 GPUs through the same collector) in the same run,
interleaved cycle by cycle so machine noise hits both alike. NVML calls per GPU per cycle are
counted by the fake.

    .venv/bin/python -m bench.gpu_backend_overhead [--cycles 300]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from flopwatch import config as cfg
from flopwatch.exporters.gpu.collector import GpuCollector
from flopwatch.exporters.gpu.nvml import NvmlBackend
from flopwatch.exporters.gpu.simulated import SimBackend
from flopwatch.hardware import model_by_name

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from fakes.fake_pynvml import FakeNvml, h100  # test fakes live beside the tests

GPUS = 8


def cpu_per_cycle(collector: GpuCollector, cycles: list[float]) -> None:
    started = time.process_time()
    collector.update()
    cycles.append(time.process_time() - started)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=300)
    args = parser.parse_args()
    config = cfg.load(overrides={"node": "bench"}, environ={})

    nvml = FakeNvml([h100(i) for i in range(GPUS)])
    nvml_backend = NvmlBackend(config.gpu, nvml)
    nvml_backend.start()
    sim_backend = SimBackend.standalone(GPUS, model_by_name("H100-SXM"), seed=0)
    collectors = {"nvml (fake driver)": GpuCollector(nvml_backend, "bench", config.gpu, GPUS),
                  "sim": GpuCollector(sim_backend, "bench", config.gpu, GPUS)}
    for collector in collectors.values():
        for _ in range(10):
            collector.update()
    calls_before = sum(nvml.calls.values())
    field_batches_before = nvml.calls["nvmlDeviceGetFieldValues"]
    samples: dict[str, list[float]] = {name: [] for name in collectors}
    for _ in range(args.cycles):
        for name, collector in collectors.items():
            cpu_per_cycle(collector, samples[name])
    nvml_calls = sum(nvml.calls.values()) - calls_before - nvml.calls["nvmlEventSetWait_v2"]
    batches = nvml.calls["nvmlDeviceGetFieldValues"] - field_batches_before
    for collector in collectors.values():
        collector.close()
    nvml_backend.stop()

    medians = {name: statistics.median(values) * 1e3 for name, values in samples.items()}
    print(f"{GPUS} GPUs, {args.cycles} cycles each, interleaved; CPU time per GpuCollector.update()")
    for name, median in medians.items():
        print(f"  {name:20s} median {median:.3f} ms per cycle ({median / GPUS:.3f} ms per GPU)")
    print(f"  ratio nvml / sim: {medians['nvml (fake driver)'] / medians['sim']:.2f}")
    print(f"  NVML calls per GPU per cycle: {nvml_calls / args.cycles / GPUS:.1f} "
          f"(field-value batches per GPU per cycle: {batches / args.cycles / GPUS:.1f}, "
          f"nvmlDeviceGetPcieThroughput calls: {nvml.calls['nvmlDeviceGetPcieThroughput']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""GPU collector: per-GPU fault isolation, timeouts, backoff, absent-not-zero, peaks.

The backend here is the simulated one, with a thin subclass that makes one GPU hang or fail:
no GPU exists on this machine, and this is the narrowest seam above NVML.
"""

from __future__ import annotations

import threading
import time

from helpers import wait_for
from prometheus_client import CollectorRegistry

from flopwatch import config as cfg
from flopwatch.exporters.gpu import collector as collector_module
from flopwatch.exporters.gpu.collector import GpuCollector
from flopwatch.exporters.gpu.reading import GpuReadError, GpuReading
from flopwatch.exporters.gpu.simulated import SimBackend
from flopwatch.hardware import model_by_name

H100 = model_by_name("H100-SXM")


class FlakyBackend(SimBackend):
    def __init__(self, count: int) -> None:
        base = SimBackend.standalone(count, H100, seed=1)
        super().__init__(base.gpus)
        self.hang: dict[int, threading.Event] = {}
        self.stuck: set[int] = set()        # GPUs whose read is blocked in `hang` right now
        self.fail: dict[int, str] = {}
        self.recovered: list[int] = []

    def read(self, index: int) -> GpuReading:
        if index in self.hang:
            self.stuck.add(index)
            self.hang[index].wait(10)
            self.stuck.discard(index)
        if index in self.fail:
            raise GpuReadError(self.fail[index], f"GPU {index}: simulated {self.fail[index]}")
        return super().read(index)

    def recover(self, index: int) -> None:
        self.recovered.append(index)


def make(count: int = 4, **gpu_overrides):
    config = cfg.load(overrides={"backend": "sim", "node": "n1", **gpu_overrides}, environ={})
    backend = FlakyBackend(count)
    collector = GpuCollector(backend, "n1", config.gpu, count)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return backend, collector, registry


def value(registry, name, **labels):
    return registry.get_sample_value(name, {"node": "n1", **labels})


def test_all_gpus_up_with_consistent_values():
    _, collector, registry = make()
    assert collector.update() == 0
    for gpu in "0123":
        assert value(registry, "flopwatch_gpu_up", gpu=gpu) == 1
        assert value(registry, "flopwatch_gpu_sm_clock_hertz", gpu=gpu) == 1980e6
        assert value(registry, "flopwatch_gpu_peak_dense_flops", gpu=gpu, dtype="bf16") == 989.4e12
        assert value(registry, "flopwatch_gpu_clock_event_active", gpu=gpu, reason="idle") == 0
        assert value(registry, "flopwatch_gpu_nvlink_bytes_total", gpu=gpu, link="17", direction="tx") > 0


def test_lost_gpu_goes_down_others_keep_flowing_and_it_comes_back(monkeypatch):
    backend, collector, registry = make()
    collector.update()
    energy_before = value(registry, "flopwatch_gpu_energy_joules_total", gpu="0")
    backend.fail[2] = "gpu_lost"
    assert collector.update() == 1
    assert value(registry, "flopwatch_gpu_up", gpu="2") == 0
    assert value(registry, "flopwatch_gpu_read_errors_total", gpu="2", error="gpu_lost") == 1
    assert value(registry, "flopwatch_gpu_power_watts", gpu="2") is None  # no stale values
    assert value(registry, "flopwatch_gpu_info", gpu="2", uuid=backend.gpus[2].uuid, model="H100-SXM",
                 driver_version="sim-1.0") == 1
    for gpu in "013":
        assert value(registry, "flopwatch_gpu_up", gpu=gpu) == 1
    time.sleep(0.01)
    collector.update()
    assert value(registry, "flopwatch_gpu_energy_joules_total", gpu="0") > energy_before
    # in backoff: not retried on the next cycle
    assert value(registry, "flopwatch_gpu_read_errors_total", gpu="2", error="gpu_lost") == 1
    assert backend.recovered == []
    # once the backoff expires the GPU is retried through recover() and comes back
    del backend.fail[2]
    collector.states[2].retry_at = 0
    collector.update()
    assert backend.recovered == [2]
    assert value(registry, "flopwatch_gpu_up", gpu="2") == 1


def test_backoff_doubles_up_to_a_cap():
    backend, collector, _ = make(count=1)
    backend.fail[0] = "gpu_lost"
    delays = []
    for _ in range(12):
        collector.states[0].retry_at = 0
        collector.update()
        delays.append(collector.states[0].backoff_s)
    assert delays[0] == 2 * collector_module.BACKOFF_START_S
    assert delays[-1] == collector_module.BACKOFF_MAX_S


def test_hanging_gpu_is_bounded_by_timeout_and_does_not_delay_others():
    backend, collector, registry = make(**{"gpu.timeout": 0.2})
    release = threading.Event()
    backend.hang[1] = release
    errors = collector.update()
    assert errors == 1
    assert backend.stuck == {1}     # update() returned while GPU 1's read was still blocked
    assert value(registry, "flopwatch_gpu_up", gpu="1") == 0
    assert value(registry, "flopwatch_gpu_read_errors_total", gpu="1", error="timeout") == 1
    assert all(value(registry, "flopwatch_gpu_up", gpu=g) == 1 for g in "023")
    # while the call is stuck the GPU is skipped (not re-submitted, not re-counted)
    collector.update()
    assert value(registry, "flopwatch_gpu_read_errors_total", gpu="1", error="timeout") == 1
    release.set()
    del backend.hang[1]
    wait_for(lambda: not backend.stuck, 5, "GPU 1's blocked read to return")
    collector.update()
    assert value(registry, "flopwatch_gpu_up", gpu="1") == 1


def test_backend_bug_counts_as_unknown_error():
    backend, collector, registry = make(count=2)

    def broken(index):
        raise ZeroDivisionError("bug")

    backend.read = broken
    assert collector.update() == 2
    assert value(registry, "flopwatch_gpu_read_errors_total", gpu="0", error="unknown") == 1


def test_unsupported_fields_are_absent_not_zero():
    backend, collector, registry = make(count=1)

    original = backend.read

    def without_gpm(index):
        reading = original(index)
        reading.tensor_active = None
        reading.memory_temperature_c = None
        reading.nvlinks = []
        return reading

    backend.read = without_gpm
    collector.update()
    assert value(registry, "flopwatch_gpu_tensor_active_ratio", gpu="0") is None
    assert value(registry, "flopwatch_gpu_memory_temperature_celsius", gpu="0") is None
    names = {metric.name for metric in registry.collect()}
    assert "flopwatch_gpu_nvlink_bytes" not in names
    assert value(registry, "flopwatch_gpu_sm_clock_hertz", gpu="0") is not None


def test_unknown_model_takes_configured_peak(caplog):
    backend, collector, registry = make(count=1, **{"gpu.peak_flops": 5e14})
    original = backend.read

    def unknown(index):
        reading = original(index)
        reading.model = "NVIDIA Z9000"
        return reading

    backend.read = unknown
    collector.update()
    assert value(registry, "flopwatch_gpu_peak_dense_flops", gpu="0", dtype="bf16") == 5e14
    assert "unknown model 'NVIDIA Z9000'" in caplog.text


def test_unknown_model_without_peak_warns_and_exports_no_peak(caplog):
    backend, collector, registry = make(count=1)
    original = backend.read
    backend.read = lambda index: GpuReading(**{**vars(original(index)), "model": "Mystery GPU"})
    collector.update()
    collector.update()
    assert value(registry, "flopwatch_gpu_peak_dense_flops", gpu="0", dtype="bf16") is None
    assert caplog.text.count("unknown model") == 1
    assert "gpu.peak_flops" in caplog.text


def test_xids_are_counted_per_gpu_and_code():
    backend, collector, registry = make()
    backend.gpus[3].inject_xid(13)
    backend.gpus[3].inject_xid(13)
    backend.gpus[0].inject_xid(79)
    collector.update()
    assert value(registry, "flopwatch_gpu_xid_errors_total", gpu="3", xid="13") == 2
    assert value(registry, "flopwatch_gpu_xid_errors_total", gpu="0", xid="79") == 1
    assert value(registry, "flopwatch_gpu_up", gpu="0") == 0  # XID 79: fell off the bus

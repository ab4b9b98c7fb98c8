"""The NVML backend through NVIDIA's real binding (nvidia-ml-py) on a driver-shaped libnvidia-ml.so.1.

The library (tests/nvml_driver) is compiled against NVIDIA's nvml.h and checks what the driver
checks; nothing between the backend and the C ABI is replaced. Its GPUs and faults come from a
state file the tests rewrite while the agent runs.
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess
import time
from collections.abc import Iterator

import pytest
from backend_rig import BackendRig
from helpers import wait_for
from nvml_driver import DEVICE_NAMES, STATE_VARIABLE, DriverState, InProcess, header_dir
from prometheus_client.parser import text_string_to_metric_families

from flopwatch import config as cfg
from flopwatch.exporters.gpu import xid_events
from flopwatch.exporters.gpu.nvml import NvmlBackend
from flopwatch.exporters.gpu.reading import BackendUnavailable, GpuReadError


@pytest.fixture(scope="module")
def driver() -> Iterator[InProcess]:
    loaded = InProcess()
    yield loaded
    loaded.close()
    assert not loaded.loaded(), "the test NVML library is still mapped after unloading it"


@pytest.fixture
def state(tmp_path, monkeypatch) -> DriverState:
    monkeypatch.setenv(STATE_VARIABLE, str(tmp_path / "driver" / "state"))
    return DriverState(tmp_path / "driver", ["H100", "A100"])


class Rig(BackendRig):
    """A started NvmlBackend on the library, with the real GpuCollector and Agent over it."""

    def __init__(self, driver: InProcess, **overrides: object) -> None:
        super().__init__(lambda options: NvmlBackend(options, driver.pynvml), **overrides)


@pytest.fixture
def rig(driver, state, monkeypatch) -> Iterator[object]:
    monkeypatch.setattr(xid_events, "WAIT_MS", 50)
    made: list[Rig] = []

    def make(**overrides: object) -> Rig:
        made.append(Rig(driver, **overrides))
        return made[-1]

    yield make
    state.release()
    for one in made:
        one.close()


def test_values_arrive_in_base_units_from_the_driver_units(rig, state):
    state.set(0, power_mw=612_345, energy_base_mj=123_456_789)
    state.set_clock(1000.0)                  # the library's counters run on this clock, not the machine's
    r = rig()
    r.collect()
    assert r.value("flopwatch_gpu_up", gpu="0") == 1
    assert r.value("flopwatch_gpu_power_watts", gpu="0") == pytest.approx(612.345)           # mW -> W
    assert r.value("flopwatch_gpu_power_limit_watts", gpu="1") == 400.0
    energy = r.value("flopwatch_gpu_energy_joules_total", gpu="0")                           # mJ -> J
    assert energy is not None and energy >= 123_456.789
    assert r.value("flopwatch_gpu_sm_clock_hertz", gpu="0") == 1980e6                        # MHz -> Hz
    assert r.value("flopwatch_gpu_sm_clock_max_hertz", gpu="1") == 1410e6
    assert r.value("flopwatch_gpu_utilization_ratio", gpu="0") == pytest.approx(0.97)
    assert r.value("flopwatch_gpu_memory_temperature_celsius", gpu="0") == 70
    assert r.value("flopwatch_gpu_memory_total_bytes", gpu="0") == 85_520_809_984
    assert r.value("flopwatch_gpu_clock_event_violation_seconds_total", gpu="0", reason="power") == 1.5
    assert r.value("flopwatch_gpu_pcie_link_generation", gpu="1") == 4
    assert r.value("flopwatch_gpu_pcie_bytes_total", gpu="0", direction="tx") == 7_000_000_123
    assert r.value("flopwatch_gpu_nvlink_bytes_total", gpu="0", link="3", direction="tx") == 4000 * 1024  # KiB
    assert r.value("flopwatch_gpu_nvlink_bytes_total", gpu="0", link="3", direction="rx") == 8000 * 1024
    assert r.value("flopwatch_gpu_nvlink_errors_total", gpu="0", link="3", error="crc") == 33
    assert r.value("flopwatch_gpu_nvlink_bytes_total", gpu="0", link="17", direction="tx") is not None
    assert r.value("flopwatch_gpu_nvlink_bytes_total", gpu="1", link="12", direction="tx") is None   # A100: 12
    assert r.value("flopwatch_gpu_remapped_rows", gpu="0", cause="correctable") == 1
    assert r.value("flopwatch_gpu_processes", gpu="0") == 1   # the v3 two-call INSUFFICIENT_SIZE protocol
    assert r.value("flopwatch_gpu_peak_dense_flops", gpu="0", dtype="bf16") == 989.4e12
    assert r.value("flopwatch_gpu_peak_dense_flops", gpu="1", dtype="bf16") == 312e12
    # energy is the integral of power: between two reads it grows by power x elapsed time
    state.set_clock(1000.25)
    r.collect()
    grown = r.value("flopwatch_gpu_energy_joules_total", gpu="0") - energy
    assert grown == pytest.approx(612.345 * 0.25, abs=0.001)   # NVML counts whole millijoules


@pytest.mark.parametrize("model", ["H100", "H200", "A100", "B200"])
def test_every_model_is_named_as_nvml_names_it_and_gets_its_dense_peak(driver, state, model, monkeypatch):
    monkeypatch.setattr(xid_events, "WAIT_MS", 50)
    state.gpus = state.gpus[:1]
    state.gpus[0].model = model
    state.write()
    r = Rig(driver)
    try:
        r.collect()
        peak = {"H100": 989.4e12, "H200": 989.4e12, "A100": 312e12, "B200": 2250e12}[model]
        assert r.value("flopwatch_gpu_peak_dense_flops", gpu="0", dtype="bf16") == peak
        assert r.backend.devices[0].name == DEVICE_NAMES[model]
    finally:
        r.close()


def test_exposition_passes_promtool_check_metrics(rig):
    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing: install the Debian package prometheus"
    r = rig()
    r.collect()
    r.collect()
    result = subprocess.run([promtool, "check", "metrics"], input=r.agent.exposition(), capture_output=True,
                            timeout=30, check=False)
    assert (result.returncode, result.stdout + result.stderr) == (0, b"")
    assert list(text_string_to_metric_families(r.agent.exposition().decode()))


def test_one_field_values_call_per_gpu_and_never_the_blocking_throughput_call(rig, driver):
    r = rig()
    before = driver.calls("nvmlDeviceGetFieldValues")
    throughput = driver.calls("nvmlDeviceGetPcieThroughput")
    probes = driver.calls("nvmlDeviceGetNvLinkState")
    r.collect()
    r.collect()
    assert driver.calls("nvmlDeviceGetFieldValues") - before == 2 * 2
    assert driver.calls("nvmlDeviceGetPcieThroughput") == throughput
    assert driver.calls("nvmlDeviceGetNvLinkState") == probes  # links are probed at open, not per cycle


def test_gpm_is_measured_between_cycles_over_a_sample_pair_and_absent_before_hopper(rig, state, driver):
    state.set_clock(10.0)                    # the library's counters run on this clock, not the machine's
    r = rig()
    r.collect()
    assert r.value("flopwatch_gpu_tensor_active_ratio", gpu="0") is None   # one sample is no interval
    state.set_clock(10.15)
    r.collect()
    assert r.value("flopwatch_gpu_sm_active_ratio", gpu="0") == pytest.approx(0.80)
    assert r.value("flopwatch_gpu_sm_occupancy_ratio", gpu="0") == pytest.approx(0.35)
    assert r.value("flopwatch_gpu_tensor_active_ratio", gpu="0") == pytest.approx(0.50)
    assert r.value("flopwatch_gpu_dram_active_ratio", gpu="0") == pytest.approx(0.30)
    state.clock = 10.2
    state.set(0, tensor_active=70)           # 50% for 0.05 s of the next pair, then 70% for 0.1 s
    driver.pynvml.nvmlDeviceGetCount()       # the library reads its state at a call: this one, at 10.2
    state.set_clock(10.3)
    r.collect()  # the library averages over the time between the two samples it is given
    assert r.value("flopwatch_gpu_tensor_active_ratio", gpu="0") == pytest.approx((0.05 * 0.5 + 0.1 * 0.7) / 0.15)
    state.set_clock(10.45)
    r.collect()
    assert r.value("flopwatch_gpu_tensor_active_ratio", gpu="0") == pytest.approx(0.70)
    for name in ("sm_active", "sm_occupancy", "tensor_active", "dram_active"):
        assert r.value(f"flopwatch_gpu_{name}_ratio", gpu="1") is None       # A100: absent, not 0
    assert r.value("flopwatch_gpu_up", gpu="1") == 1


def test_calls_of_the_wrong_shape_are_refused_as_the_driver_refuses_them(driver, state):
    state.gpus.append(state.gpus[0].__class__("H200"))
    state.write()
    nvml = driver.pynvml
    nvml.nvmlInit()
    try:
        handle = nvml.nvmlDeviceGetHandleByIndex(0)
        first, second = nvml.nvmlGpmSampleAlloc(), nvml.nvmlGpmSampleAlloc()
        nvml.nvmlGpmSampleGet(handle, first)
        time.sleep(0.02)
        nvml.nvmlGpmSampleGet(handle, second)
        request = nvml.c_nvmlGpmMetricsGet_t()          # version left 0
        request.numMetrics, request.sample1, request.sample2 = 1, first, second
        request.metrics[0].metricId = nvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL
        with pytest.raises(nvml.NVMLError) as raised:
            nvml.nvmlGpmMetricsGet(request)
        assert raised.value.value == nvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH
        request.version = nvml.NVML_GPM_METRICS_GET_VERSION
        request.sample1, request.sample2 = second, first   # swapped: not an interval
        with pytest.raises(nvml.NVMLError_InvalidArgument):
            nvml.nvmlGpmMetricsGet(request)
        request.sample1, request.sample2 = first, second
        assert nvml.nvmlGpmMetricsGet(request).metrics[0].value == pytest.approx(50.0)
        nvml.nvmlGpmSampleGet(nvml.nvmlDeviceGetHandleByIndex(2), second)   # a pair from two GPUs
        with pytest.raises(nvml.NVMLError_InvalidArgument):
            nvml.nvmlGpmMetricsGet(request)
        state.restore(0)                                     # after a reset the old handle is lost
        with pytest.raises(nvml.NVMLError_GpuIsLost):
            nvml.nvmlDeviceGetPowerUsage(handle)
        handle = nvml.nvmlDeviceGetHandleByIndex(0)
        other = nvml.nvmlDeviceGetHandleByIndex(1)           # the A100 has no GPM
        with pytest.raises(nvml.NVMLError_NotSupported):
            nvml.nvmlGpmSampleGet(other, first)
        for sample in (first, second):
            nvml.nvmlGpmSampleFree(sample)
        # a name buffer one byte short, and a process list with no room: INSUFFICIENT_SIZE with the count
        name = ctypes.create_string_buffer(len(DEVICE_NAMES["H100"]))
        assert nvml.nvmlLib.nvmlDeviceGetName(handle, name, ctypes.c_uint(len(name))) == \
            nvml.NVML_ERROR_INSUFFICIENT_SIZE
        count = ctypes.c_uint(0)
        assert nvml.nvmlLib.nvmlDeviceGetComputeRunningProcesses_v3(handle, ctypes.byref(count), None) == \
            nvml.NVML_ERROR_INSUFFICIENT_SIZE
        assert count.value == 1
        bogus = ctypes.cast(ctypes.c_void_p(0x1000), nvml.c_nvmlDevice_t)   # not a handle NVML issued
        with pytest.raises(nvml.NVMLError_InvalidArgument):
            nvml.nvmlDeviceGetPowerUsage(bogus)
    finally:
        nvml.nvmlShutdown()
    with pytest.raises(nvml.NVMLError_Uninitialized):
        nvml.nvmlDeviceGetCount()


def test_not_supported_functions_leave_their_series_absent_not_zero(rig, state):
    for function in ("nvmlDeviceGetPowerUsage", "nvmlDeviceGetTotalEnergyConsumption", "nvmlDeviceGetRemappedRows"):
        state.fail(1, function, 3)  # NVML_ERROR_NOT_SUPPORTED
    state.set(1, ecc=0, mem_temp_c=-1)
    state.gpus[1].violations[5] = -1  # NVML_PERF_POLICY_RELIABILITY
    state.write()
    r = rig()
    r.collect()
    for name in ("flopwatch_gpu_power_watts", "flopwatch_gpu_energy_joules_total", "flopwatch_gpu_row_remap_pending",
                 "flopwatch_gpu_ecc_corrected_errors_total", "flopwatch_gpu_memory_temperature_celsius"):
        assert r.value(name, gpu="1") is None, name
    assert r.value("flopwatch_gpu_clock_event_violation_seconds_total", gpu="1", reason="reliability") is None
    assert r.value("flopwatch_gpu_clock_event_violation_seconds_total", gpu="1", reason="power") == 1.5
    assert r.value("flopwatch_gpu_up", gpu="1") == 1
    assert r.value("flopwatch_gpu_power_watts", gpu="0") is not None


def test_a_failed_field_is_absent_and_its_neighbours_in_the_batch_still_flow(rig, state):
    state.gpus[0].field_errors = {(197, 0): 3, (138, 5): 999}  # PCIe TX: NOT_SUPPORTED; link 5 TX: UNKNOWN
    state.write()
    r = rig()
    r.collect()
    assert r.value("flopwatch_gpu_pcie_bytes_total", gpu="0", direction="tx") is None
    assert r.value("flopwatch_gpu_pcie_bytes_total", gpu="0", direction="rx") == 9_000_000_456
    assert r.value("flopwatch_gpu_nvlink_bytes_total", gpu="0", link="5", direction="tx") is None
    assert r.value("flopwatch_gpu_nvlink_bytes_total", gpu="0", link="5", direction="rx") == 12000 * 1024
    assert r.value("flopwatch_gpu_up", gpu="0") == 1


def test_gpu_lost_with_xid_79_through_the_event_set_goes_down_alone_and_comes_back(rig, state, driver):
    state.gpus.append(state.gpus[0].__class__("H100"))
    state.write()
    r = rig()
    r.collect()
    state.lose(2)   # XID 79 delivered through nvmlEventSetWait_v2, then GPU_IS_LOST on every call
    assert wait_for(lambda: r.backend.xid_counts().get((2, 79)) == 1)
    r.collect()
    assert r.value("flopwatch_gpu_up", gpu="2") == 0
    assert r.value("flopwatch_gpu_read_errors_total", gpu="2", error="gpu_lost") == 1
    assert r.value("flopwatch_gpu_xid_errors_total", gpu="2", xid="79") == 1
    assert r.value("flopwatch_gpu_up", gpu="0") == r.value("flopwatch_gpu_up", gpu="1") == 1
    state.restore(2)                 # reset: a new handle; the old one stays lost
    r.collector.states[2].retry_at = 0
    by_uuid = driver.calls("nvmlDeviceGetHandleByUUID")
    r.collect()
    assert driver.calls("nvmlDeviceGetHandleByUUID") == by_uuid + 1
    assert r.value("flopwatch_gpu_up", gpu="2") == 1
    state.inject_xid(2, 13)          # its events arrive on the new handle's registration
    assert wait_for(lambda: r.backend.xid_counts().get((2, 13)) == 1)


def test_driver_restart_reinitialises_nvml_once_and_leaks_no_gpm_samples(rig, state, driver):
    r = rig()
    r.collect()
    live = driver.live("samples")
    inits = driver.calls("nvmlInitWithFlags")
    state.restart_driver()
    r.collect()
    for gpu in "01":
        assert r.value("flopwatch_gpu_up", gpu=gpu) == 0
        assert r.value("flopwatch_gpu_read_errors_total", gpu=gpu, error="driver") == 1
    for one in r.collector.states:
        one.retry_at = 0
    r.collect()
    assert driver.calls("nvmlInitWithFlags") == inits + 1
    assert all(r.value("flopwatch_gpu_up", gpu=gpu) == 1 for gpu in "01")
    assert driver.live("samples") == live  # the old session's GPM samples were freed, not leaked
    time.sleep(0.15)
    r.collect()
    assert r.value("flopwatch_gpu_tensor_active_ratio", gpu="0") == pytest.approx(0.5)
    state.inject_xid(1, 31)          # the XID event set was rebuilt on the new session
    assert wait_for(lambda: r.backend.xid_counts().get((1, 31)) == 1)


def test_a_gpu_reopened_while_another_reinitialised_nvml_leaks_no_gpm_samples(rig, state, driver, monkeypatch):
    """Two GPUs recover at once: GPU 1 re-initialises NVML (and reopens GPU 0) between GPU 0 noting
    its old state and opening it again. One of the two fresh GPU 0 states must be freed."""
    r = rig()
    r.collect()
    live = driver.live("samples")
    state.restart_driver()
    r.collect()
    backend = r.backend
    backend_open = backend._open
    interleaved = []

    def open_after_the_other_gpus_reinit(index: int, uuid: str):
        if index == 0 and not interleaved:
            interleaved.append(index)
            backend.recover(1)       # the other GPU's recovery re-initialises NVML here
        return backend_open(index, uuid)

    monkeypatch.setattr(backend, "_open", open_after_the_other_gpus_reinit)
    backend.recover(0)
    assert interleaved == [0]
    assert driver.live("samples") == live
    assert backend.devices[0].gpm_samples is not None   # the state kept is the one whose samples live


def test_the_clock_event_mask_carries_nvmls_bits_of_the_catalogue_reasons(rig, state, driver):
    nvml = driver.pynvml
    thermal = nvml.nvmlClocksEventReasonSwThermalSlowdown | nvml.nvmlClocksEventReasonHwPowerBrakeSlowdown
    state.set(0, clock_reasons=thermal | nvml.nvmlClocksEventReasonApplicationsClocksSetting)
    r = rig()
    r.collect()
    assert r.value("flopwatch_gpu_clock_event_reasons", gpu="0") == thermal   # the setting is no catalogue reason
    assert r.value("flopwatch_gpu_clock_event_active", gpu="0", reason="sw_thermal") == 1
    assert r.value("flopwatch_gpu_clock_event_active", gpu="0", reason="hw_power_brake") == 1
    assert r.value("flopwatch_gpu_clock_event_reasons", gpu="1") == 0


def test_xids_are_counted_per_gpu_and_code_and_not_for_unregistered_gpus(rig, state):
    state.fail(1, "nvmlDeviceRegisterEvents", 3)
    r = rig()
    for gpu, code in ((0, 13), (0, 13), (1, 79), (0, 48)):
        state.inject_xid(gpu, code)
    assert wait_for(lambda: sum(r.backend.xid_counts().values()) == 3)
    time.sleep(0.2)
    assert r.backend.xid_counts() == {(0, 13): 2, (0, 48): 1}


def test_a_hanging_call_is_bounded_by_the_timeout_and_does_not_hold_other_gpus(rig, state):
    state.hang(1, "nvmlDeviceGetPowerUsage", 30)
    r = rig(**{"gpu.timeout": 0.2})
    r.collect()
    assert r.value("flopwatch_gpu_up", gpu="1") == 0
    assert r.value("flopwatch_gpu_read_errors_total", gpu="1", error="timeout") == 1
    assert r.value("flopwatch_gpu_up", gpu="0") == 1
    state.release()
    assert wait_for(r.collector.states[1].pending.done)
    r.collect()
    assert r.value("flopwatch_gpu_up", gpu="1") == 1


@pytest.mark.parametrize(("code", "expected"), [
    (9, "NVIDIA driver not loaded"), (4, "no permission to open the NVIDIA devices"), (18, "versions differ"),
])
def test_init_failures_become_one_line_backend_unavailable(driver, state, code, expected):
    state.init_error = code
    state.write()
    with pytest.raises(BackendUnavailable) as raised:
        NvmlBackend(cfg.load(environ={}).gpu, driver.pynvml).start()
    assert expected in str(raised.value) and "\n" not in str(raised.value)


def test_a_gpu_lost_before_start_is_down_and_recovers(driver, state):
    state.lose(1, xid=None)
    backend = NvmlBackend(cfg.load(environ={}).gpu, driver.pynvml)
    try:
        assert backend.start() == 2
        with pytest.raises(GpuReadError) as raised:
            backend.read(1)
        assert raised.value.cause == "gpu_lost"
        state.restore(1)
        backend.recover(1)
        assert backend.read(1).model == DEVICE_NAMES["A100"]
    finally:
        backend.stop()


def test_stop_frees_the_event_set_and_gpm_samples_and_shuts_nvml_down(rig, driver):
    sets, samples = driver.live("event_sets"), driver.live("samples")
    shutdowns = driver.calls("nvmlShutdown")
    r = rig()
    assert driver.live("event_sets") == sets + 1
    assert driver.live("samples") == samples + 2    # the H100's pair; the A100 has no GPM
    r.collect()
    r.close()
    assert driver.live("event_sets") == sets and driver.live("samples") == samples
    assert driver.calls("nvmlShutdown") == shutdowns + 1


def test_a_definition_that_differs_from_nvml_h_does_not_compile(tmp_path):
    """Why the library is built against NVIDIA's header: a wrong width or argument is a build error."""
    source = tmp_path / "wrong.c"
    source.write_text('#include "nvml.h"\n'
                      "nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t device, unsigned long long *power)\n"
                      "{ (void)device; *power = 0; return NVML_SUCCESS; }\n")
    result = subprocess.run(["gcc", "-c", "-fPIC", f"-I{header_dir()}", "-o", str(tmp_path / "wrong.o"), str(source)],
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode != 0
    assert "conflicting types for 'nvmlDeviceGetPowerUsage'" in result.stderr.replace("‘", "'").replace("’", "'")

"""NVML backend, through the real GpuCollector, Agent, registry and rendered exposition.

There is no GPU, NVIDIA driver or libnvidia-ml.so on this machine: the backend is handed the fake
`pynvml` of tests/fakes/fake_pynvml.py (an H100 and A100s), which raises the REAL nvidia-ml-py
error classes and returns its real ctypes structures. Everything above that seam is the product.
"""

from __future__ import annotations

import logging
import shutil
import subprocess
import sys
import threading
import urllib.request

import pynvml as real
import pytest
from backend_rig import NODE, BackendRig
from fakes.fake_pynvml import FakeNvml, a100, h100
from helpers import wait_for
from prometheus_client.parser import text_string_to_metric_families

from flopwatch import __version__
from flopwatch import config as cfg
from flopwatch.exporters.gpu import xid_events
from flopwatch.exporters.gpu.nvml import NvmlBackend
from flopwatch.exporters.gpu.reading import BackendUnavailable, GpuReadError


class Rig(BackendRig):
    """A fake NVML under a started NvmlBackend, a GpuCollector and an Agent, torn down together."""

    def __init__(self, gpus, **overrides) -> None:
        self.nvml = FakeNvml(gpus)
        super().__init__(lambda options: NvmlBackend(options, self.nvml), **overrides)

    def served(self) -> dict[tuple[str, frozenset], float]:
        """Every sample of the bytes the agent serves on /metrics."""
        text = self.agent.exposition().decode()
        return {(s.name, frozenset(s.labels.items())): s.value
                for family in text_string_to_metric_families(text) for s in family.samples}

    def close(self) -> None:
        self.nvml.release.set()
        if self.agent.http is not None:
            self.agent.http.stop()
        super().close()


@pytest.fixture
def rigs(monkeypatch):
    monkeypatch.setattr(xid_events, "WAIT_MS", 50)  # faster teardown; the stop test below uses the real wait
    made: list[Rig] = []

    def make(gpus, **overrides) -> Rig:
        made.append(Rig(gpus, **overrides))
        return made[-1]

    yield make
    for rig in made:
        rig.close()



def test_values_arrive_in_base_units_in_the_served_exposition(rigs):
    rig = rigs([h100(0), a100(1)])
    rig.collect()
    served = rig.served()

    def get(name, **labels):
        return served.get((name, frozenset({"node": NODE, **labels}.items())))

    assert get("flopwatch_gpu_up", gpu="0") == 1
    assert get("flopwatch_gpu_power_watts", gpu="0") == pytest.approx(612.345)          # mW -> W
    assert get("flopwatch_gpu_power_limit_watts", gpu="1") == pytest.approx(400.0)
    assert get("flopwatch_gpu_energy_joules_total", gpu="0") == pytest.approx(123456.789)  # mJ -> J
    assert get("flopwatch_gpu_sm_clock_hertz", gpu="0") == 1980e6                        # MHz -> Hz
    assert get("flopwatch_gpu_sm_clock_max_hertz", gpu="1") == 1410e6
    assert get("flopwatch_gpu_memory_clock_hertz", gpu="1") == 1593e6
    assert get("flopwatch_gpu_utilization_ratio", gpu="0") == pytest.approx(0.97)        # % -> ratio
    assert get("flopwatch_gpu_memory_utilization_ratio", gpu="0") == pytest.approx(0.41)
    assert get("flopwatch_gpu_temperature_celsius", gpu="0") == 61
    assert get("flopwatch_gpu_memory_temperature_celsius", gpu="0") == 70
    assert get("flopwatch_gpu_memory_used_bytes", gpu="0") == 60 * 1024**3
    assert get("flopwatch_gpu_memory_total_bytes", gpu="0") == 80 * 1024**3
    assert get("flopwatch_gpu_clock_event_violation_seconds_total", gpu="0", reason="power") == 1.5  # ns -> s
    assert get("flopwatch_gpu_clock_event_violation_seconds_total", gpu="0", reason="low_utilization") == 9.0
    assert get("flopwatch_gpu_pcie_link_generation", gpu="1") == 4
    assert get("flopwatch_gpu_pcie_link_max_width", gpu="1") == 16
    assert get("flopwatch_gpu_pcie_replays_total", gpu="0") == 3
    assert get("flopwatch_gpu_pcie_bytes_total", gpu="0", direction="tx") == 7_000_000_123
    assert get("flopwatch_gpu_pcie_bytes_total", gpu="0", direction="rx") == 9_000_000_456
    # NVLink field values are KiB: link 3 of the fake sends 4000 KiB and receives 8000 KiB
    assert get("flopwatch_gpu_nvlink_bytes_total", gpu="0", link="3", direction="tx") == 4000 * 1024
    assert get("flopwatch_gpu_nvlink_bytes_total", gpu="0", link="3", direction="rx") == 8000 * 1024
    assert get("flopwatch_gpu_nvlink_errors_total", gpu="0", link="3", error="replay") == 13
    assert get("flopwatch_gpu_nvlink_errors_total", gpu="0", link="3", error="crc") == 33
    assert get("flopwatch_gpu_nvlink_bytes_total", gpu="0", link="17", direction="tx") is not None
    assert get("flopwatch_gpu_nvlink_bytes_total", gpu="1", link="11", direction="tx") is not None
    assert get("flopwatch_gpu_nvlink_bytes_total", gpu="1", link="12", direction="tx") is None  # A100: 12
    assert get("flopwatch_gpu_ecc_corrected_errors_total", gpu="0") == 2
    assert get("flopwatch_gpu_remapped_rows", gpu="0", cause="correctable") == 1
    assert get("flopwatch_gpu_row_remap_pending", gpu="0") == 0
    assert get("flopwatch_gpu_processes", gpu="0") == 1
    assert get("flopwatch_gpu_info", gpu="0", uuid=rig.nvml.gpus[0].uuid, model="NVIDIA H100 80GB HBM3",
               driver_version="550.54.15") == 1
    # NVML's device names map to the catalogue's dense peaks (the MFU denominator)
    assert get("flopwatch_gpu_peak_dense_flops", gpu="0", dtype="bf16") == 989.4e12
    assert get("flopwatch_gpu_peak_dense_flops", gpu="1", dtype="bf16") == 312e12
    assert get("flopwatch_build_info", version=__version__,
               backend="nvml", python=sys.version.split()[0]) == 1


def test_exposition_passes_promtool_check_metrics(rigs):
    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing: install the Debian package prometheus"
    rig = rigs([h100(0), a100(1)])
    rig.collect()
    rig.collect()
    result = subprocess.run([promtool, "check", "metrics"], input=rig.agent.exposition(),
                            capture_output=True, timeout=30, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == b"" and result.stderr.strip() == b""


def test_one_field_values_call_per_gpu_and_never_the_blocking_throughput_call(rigs):
    rig = rigs([h100(0), a100(1)])
    before = rig.nvml.calls["nvmlDeviceGetFieldValues"]
    rig.collect()
    rig.collect()
    assert rig.nvml.calls["nvmlDeviceGetFieldValues"] - before == 2 * 2
    assert rig.nvml.calls["nvmlDeviceGetPcieThroughput"] == 0


def test_nvlink_links_are_probed_once_at_start_not_every_cycle(rigs):
    rig = rigs([h100(0)])
    probes = rig.nvml.calls["nvmlDeviceGetNvLinkState"]
    assert probes == real.NVML_NVLINK_MAX_LINKS
    rig.collect()
    rig.collect()
    assert rig.nvml.calls["nvmlDeviceGetNvLinkState"] == probes


def test_gpm_activity_is_absent_first_then_measured_between_cycles_and_absent_before_hopper(rigs):
    rig = rigs([h100(0), a100(1)])
    rig.collect()
    assert rig.value("flopwatch_gpu_tensor_active_ratio", gpu="0") is None   # one sample is no interval
    assert rig.nvml.calls["nvmlGpmMetricsGet"] == 0
    rig.collect()
    assert rig.value("flopwatch_gpu_sm_active_ratio", gpu="0") == pytest.approx(0.80)
    assert rig.value("flopwatch_gpu_sm_occupancy_ratio", gpu="0") == pytest.approx(0.35)
    assert rig.value("flopwatch_gpu_tensor_active_ratio", gpu="0") == pytest.approx(0.50)
    assert rig.value("flopwatch_gpu_dram_active_ratio", gpu="0") == pytest.approx(0.30)
    rig.nvml.gpus[0].gpm_percent[real.NVML_GPM_METRIC_ANY_TENSOR_UTIL] = 70.0
    rig.collect()  # the fake averages over exactly the two samples it is given, in order
    assert rig.value("flopwatch_gpu_tensor_active_ratio", gpu="0") == pytest.approx(0.70)
    for name in ("sm_active", "sm_occupancy", "tensor_active", "dram_active"):
        assert rig.value(f"flopwatch_gpu_{name}_ratio", gpu="1") is None     # A100: no GPM, absent not 0
    assert rig.value("flopwatch_gpu_up", gpu="1") == 1


def test_not_supported_functions_leave_their_series_absent_not_zero(rigs):
    gpu = a100(0)
    gpu.not_supported = {"nvmlDeviceGetPowerUsage", "nvmlDeviceGetTotalEnergyConsumption",
                         "nvmlDeviceGetRemappedRows", "nvmlDeviceGetTotalEccErrors"}
    gpu.memory_temperature_c = None  # the field answers NOT_SUPPORTED
    gpu.violations_ns.pop(real.NVML_PERF_POLICY_RELIABILITY)
    rig = rigs([gpu])
    rig.collect()
    for name in ("flopwatch_gpu_power_watts", "flopwatch_gpu_energy_joules_total",
                 "flopwatch_gpu_row_remap_pending", "flopwatch_gpu_ecc_corrected_errors_total",
                 "flopwatch_gpu_memory_temperature_celsius"):
        assert rig.value(name, gpu="0") is None, name
    assert rig.value("flopwatch_gpu_remapped_rows", gpu="0", cause="correctable") is None
    assert rig.value("flopwatch_gpu_clock_event_violation_seconds_total", gpu="0", reason="reliability") is None
    assert rig.value("flopwatch_gpu_clock_event_violation_seconds_total", gpu="0", reason="power") == 1.5
    assert rig.value("flopwatch_gpu_up", gpu="0") == 1
    assert rig.value("flopwatch_gpu_power_limit_watts", gpu="0") == 400
    assert rig.value("flopwatch_collector_errors_total", collector="gpu") == 0


def test_a_failed_field_is_absent_and_its_neighbours_in_the_batch_still_flow(rigs):
    gpu = h100(0)
    gpu.field_errors = {(real.NVML_FI_DEV_PCIE_COUNT_TX_BYTES, 0): real.NVML_ERROR_NOT_SUPPORTED,
                        (real.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, 5): real.NVML_ERROR_UNKNOWN}
    rig = rigs([gpu])
    rig.collect()
    assert rig.value("flopwatch_gpu_pcie_bytes_total", gpu="0", direction="tx") is None
    assert rig.value("flopwatch_gpu_pcie_bytes_total", gpu="0", direction="rx") == 9_000_000_456
    assert rig.value("flopwatch_gpu_nvlink_bytes_total", gpu="0", link="5", direction="tx") is None
    assert rig.value("flopwatch_gpu_nvlink_bytes_total", gpu="0", link="5", direction="rx") == 12000 * 1024
    assert rig.value("flopwatch_gpu_up", gpu="0") == 1
    assert rig.value("flopwatch_gpu_read_errors_total", gpu="0", error="unknown") is None  # counted nowhere


def test_nvlink_summed_into_one_all_entry_when_per_link_is_off(rigs):
    rig = rigs([a100(0)], **{"gpu.nvlink_per_link": False})
    rig.collect()
    assert rig.value("flopwatch_gpu_nvlink_bytes_total", gpu="0", link="0", direction="tx") is None
    expected_tx = sum(1000 * (link + 1) for link in range(12)) * 1024
    assert rig.value("flopwatch_gpu_nvlink_bytes_total", gpu="0", link="all", direction="tx") == expected_tx
    assert rig.value("flopwatch_gpu_nvlink_errors_total", gpu="0", link="all", error="recovery") == \
        sum(20 + link for link in range(12))


def test_a_partial_nvlink_sum_is_absent_rather_than_a_counter_that_jumps(rigs):
    gpu = a100(0)
    gpu.field_errors = {(real.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, 4): real.NVML_ERROR_NOT_SUPPORTED}
    rig = rigs([gpu], **{"gpu.nvlink_per_link": False})
    rig.collect()
    assert rig.value("flopwatch_gpu_nvlink_bytes_total", gpu="0", link="all", direction="rx") is None
    assert rig.value("flopwatch_gpu_nvlink_bytes_total", gpu="0", link="all", direction="tx") is not None


def test_clock_event_reasons_from_the_bitmask_and_only_supported_ones(rigs):
    gpu = h100(0)
    gpu.clock_reasons = real.nvmlClocksEventReasonSwThermalSlowdown | real.nvmlClocksEventReasonHwSlowdown
    gpu.supported_reasons = real.nvmlClocksEventReasonAll & ~real.nvmlClocksEventReasonHwPowerBrakeSlowdown
    rig = rigs([gpu])
    rig.collect()
    active = {reason: rig.value("flopwatch_gpu_clock_event_active", gpu="0", reason=reason)
              for reason in ("idle", "sw_power_cap", "hw_slowdown", "sync_boost", "sw_thermal", "hw_thermal",
                             "hw_power_brake")}
    assert active == {"idle": 0, "sw_power_cap": 0, "hw_slowdown": 1, "sync_boost": 0, "sw_thermal": 1,
                      "hw_thermal": 0, "hw_power_brake": None}


def test_lost_gpu_goes_down_alone_the_agent_keeps_serving_and_it_comes_back(rigs):
    rig = rigs([h100(0), h100(1), h100(2)])
    host, port = rig.agent.serve("127.0.0.1", 0)
    rig.collect()
    rig.nvml.lose(1)
    rig.collect()
    assert rig.value("flopwatch_gpu_up", gpu="1") == 0
    assert rig.value("flopwatch_gpu_read_errors_total", gpu="1", error="gpu_lost") == 1
    assert rig.value("flopwatch_gpu_power_watts", gpu="1") is None
    assert rig.value("flopwatch_gpu_up", gpu="0") == rig.value("flopwatch_gpu_up", gpu="2") == 1
    with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=5) as response:
        body = response.read().decode()
    assert 'flopwatch_gpu_up{node="n1",gpu="1"} 0' in body
    assert 'flopwatch_gpu_power_watts{node="n1",gpu="2"}' in body
    # reset: the GPU is back under a new handle; the old one keeps answering GPU_IS_LOST
    rig.nvml.restore(1)
    rig.collector.states[1].retry_at = 0  # skip the collector's backoff
    by_uuid = rig.nvml.calls["nvmlDeviceGetHandleByUUID"]
    rig.collect()
    assert rig.nvml.calls["nvmlDeviceGetHandleByUUID"] == by_uuid + 1
    assert rig.value("flopwatch_gpu_up", gpu="1") == 1
    assert rig.value("flopwatch_gpu_power_watts", gpu="1") == pytest.approx(612.345)


def test_driver_restart_reinitialises_nvml_once_for_all_gpus(rigs):
    rig = rigs([h100(0), h100(1), a100(2)])
    rig.collect()
    rig.nvml.restart_driver()
    rig.collect()
    for gpu in "012":
        assert rig.value("flopwatch_gpu_up", gpu=gpu) == 0
        assert rig.value("flopwatch_gpu_read_errors_total", gpu=gpu, error="driver") == 1
    for state in rig.collector.states:
        state.retry_at = 0
    rig.collect()
    assert rig.nvml.calls["nvmlInit"] == 2  # start, and one re-initialisation shared by three GPUs
    assert all(rig.value("flopwatch_gpu_up", gpu=gpu) == 1 for gpu in "012")
    rig.collect()  # GPM restarts on the new session's samples (a new interval needs two of them)
    assert rig.value("flopwatch_gpu_tensor_active_ratio", gpu="0") == pytest.approx(0.5)
    assert rig.value("flopwatch_gpu_tensor_active_ratio", gpu="1") == pytest.approx(0.5)
    rig.nvml.inject_xid(2, 31)  # the XID event set was rebuilt on the new session
    assert wait_for(lambda: rig.backend.xid_counts().get((2, 31)) == 1)


def test_xids_are_counted_per_gpu_and_code(rigs):
    rig = rigs([h100(0), h100(1)])
    for gpu, xid in ((0, 13), (0, 13), (1, 79), (0, 48)):
        rig.nvml.inject_xid(gpu, xid)
    assert wait_for(lambda: sum(rig.backend.xid_counts().values()) == 4)
    rig.collect()
    assert rig.value("flopwatch_gpu_xid_errors_total", gpu="0", xid="13") == 2
    assert rig.value("flopwatch_gpu_xid_errors_total", gpu="0", xid="48") == 1
    assert rig.value("flopwatch_gpu_xid_errors_total", gpu="1", xid="79") == 1
    assert rig.value("flopwatch_gpu_xid_errors_total", gpu="1", xid="13") is None


def test_xid_registration_not_supported_on_one_gpu_is_logged_once_and_others_count(rigs, caplog):
    unsupported = a100(1)
    unsupported.not_supported = {"nvmlDeviceRegisterEvents"}
    with caplog.at_level(logging.WARNING):
        rig = rigs([h100(0), unsupported])
    assert caplog.text.count("GPU 1: XID events not available") == 1
    rig.nvml.inject_xid(1, 13)
    rig.nvml.inject_xid(0, 94)
    assert wait_for(lambda: rig.backend.xid_counts() == {(0, 94): 1})


def test_a_hanging_read_is_bounded_by_the_timeout_and_does_not_delay_other_gpus(rigs):
    rig = rigs([h100(0), h100(1), h100(2)], **{"gpu.timeout": 0.2})
    rig.nvml.hang(1, "nvmlDeviceGetPowerUsage", 10)
    rig.collect()
    assert rig.nvml.hanging == 1      # collect() returned while GPU 1's read was still blocked
    assert rig.value("flopwatch_gpu_up", gpu="1") == 0
    assert rig.value("flopwatch_gpu_read_errors_total", gpu="1", error="timeout") == 1
    assert rig.value("flopwatch_gpu_up", gpu="0") == rig.value("flopwatch_gpu_up", gpu="2") == 1
    del rig.nvml.gpus[1].hangs["nvmlDeviceGetPowerUsage"]
    rig.nvml.release.set()
    assert wait_for(rig.collector.states[1].pending.done)
    rig.collect()
    assert rig.value("flopwatch_gpu_up", gpu="1") == 1


@pytest.mark.parametrize(("code", "expected"), [
    (real.NVML_ERROR_LIBRARY_NOT_FOUND,
     "NVIDIA driver library (libnvidia-ml.so.1) not found: no NVIDIA driver on this machine"),
    (real.NVML_ERROR_DRIVER_NOT_LOADED, "NVIDIA driver not loaded"),
    (real.NVML_ERROR_NO_PERMISSION, "no permission to open the NVIDIA devices"),
    (real.NVML_ERROR_LIB_RM_VERSION_MISMATCH, "versions differ"),
])
def test_init_failures_become_one_line_backend_unavailable(code, expected):
    backend = NvmlBackend(cfg.load(environ={}).gpu, FakeNvml([h100(0)], init_error=code))
    with pytest.raises(BackendUnavailable) as raised:
        backend.start()
    assert expected in str(raised.value)
    assert "\n" not in str(raised.value)


def test_no_gpus_is_unavailable_and_nvml_is_shut_down_again():
    nvml = FakeNvml([])
    with pytest.raises(BackendUnavailable, match="found no NVIDIA GPU"):
        NvmlBackend(cfg.load(environ={}).gpu, nvml).start()
    assert nvml.calls["nvmlShutdown"] == 1


def test_missing_pynvml_names_the_pip_package(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml now raises ImportError
    with pytest.raises(BackendUnavailable, match="pip install nvidia-ml-py"):
        NvmlBackend(cfg.load(environ={}).gpu).start()


def test_default_module_is_the_real_nvidia_ml_py_which_finds_no_driver_here():
    with pytest.raises(BackendUnavailable, match=r"libnvidia-ml\.so\.1\) not found"):
        NvmlBackend(cfg.load(environ={}).gpu).start()


def test_a_gpu_lost_before_start_is_down_and_recovers_later():
    nvml_gpus = [h100(0), h100(1)]
    nvml = FakeNvml(nvml_gpus)
    nvml.lose(1)
    backend = NvmlBackend(cfg.load(environ={}).gpu, nvml)
    try:
        assert backend.start() == 2
        with pytest.raises(GpuReadError) as raised:
            backend.read(1)
        assert raised.value.cause == "gpu_lost"
        assert backend.read(0).uuid == nvml_gpus[0].uuid
        nvml.restore(1)
        backend.recover(1)
        assert backend.read(1).uuid == nvml_gpus[1].uuid
        nvml.inject_xid(1, 79)  # its XIDs are counted from now on
        assert wait_for(lambda: backend.xid_counts() == {(1, 79): 1})
    finally:
        backend.stop()


def test_stop_ends_the_xid_thread_promptly_and_releases_nvml(rigs, monkeypatch, caplog):
    monkeypatch.setattr(xid_events, "WAIT_MS", 500)
    rig = rigs([h100(0), a100(1)])
    assert rig.backend.xids.wait_ms == 500
    rig.collect()
    rig.collect()
    assert any(t.name == "nvml-xid" for t in threading.enumerate())
    rig.backend.stop()      # joins the thread for one bounded wait (plus a margin), no longer
    assert not any(t.name == "nvml-xid" and t.is_alive() for t in threading.enumerate())
    assert "did not stop" not in caplog.text    # it left its wait on the stop, not after join gave up
    assert rig.nvml.open_event_sets == 0
    assert rig.nvml.calls["nvmlGpmSampleFree"] == 2       # the H100's two GPM samples
    assert rig.nvml.calls["nvmlShutdown"] == 1
    rig.backend.stop()                                       # idempotent
    assert rig.nvml.calls["nvmlShutdown"] == 1

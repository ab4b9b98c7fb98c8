"""DCGM backend: profiling fields from DCGM by numeric id, device fields from NVML.

Neither DCGM, its nv-hostengine, a GPU nor an NVIDIA driver exists on this machine. The DCGM
Python bindings are replaced by tests/fakes/fake_dcgm.py (installed into sys.modules, the import
seam) and NVML by tests/fakes/fake_pynvml.py; the collector, agent and registry are real.
"""

from __future__ import annotations

import logging
import platform
import sys
import time

import pynvml as real
import pytest
from backend_rig import BackendRig
from fakes import fake_dcgm
from fakes.fake_dcgm import FakeHostEngine
from fakes.fake_pynvml import FakeNvml, a100, h100
from helpers import wait_for

from flopwatch import __version__
from flopwatch import config as cfg
from flopwatch.exporters.gpu import dcgm as dcgm_module
from flopwatch.exporters.gpu import xid_events
from flopwatch.exporters.gpu.dcgm import DcgmBackend
from flopwatch.exporters.gpu.reading import BackendUnavailable

SM_ACTIVE, SM_OCCUPANCY, TENSOR_ACTIVE, DRAM_ACTIVE = 1002, 1003, 1004, 1005
PCIE_TX, PCIE_RX, NVLINK_TX, NVLINK_RX = 1009, 1010, 1011, 1012


class Rig(BackendRig):
    def __init__(self, monkeypatch, gpus, engine: FakeHostEngine | None = None, **overrides) -> None:
        self.nvml = FakeNvml(gpus)
        # DCGM numbers its GPUs on its own: here in reverse NVML order, so a match by index would be wrong
        self.engine = engine or FakeHostEngine({len(gpus) - 1 - i: gpu.uuid for i, gpu in enumerate(gpus)})
        fake_dcgm.install(monkeypatch, self.engine)
        super().__init__(lambda options: DcgmBackend(options, self.nvml), **overrides)


@pytest.fixture
def rigs(monkeypatch):
    monkeypatch.setattr(xid_events, "WAIT_MS", 50)
    made: list[Rig] = []

    def make(gpus, engine=None, **overrides) -> Rig:
        made.append(Rig(monkeypatch, gpus, engine, **overrides))
        return made[-1]

    yield make
    for rig in made:
        rig.close()


def test_profiling_ratios_flow_from_dcgm_matched_to_nvml_by_uuid(rigs):
    engine = FakeHostEngine({1: h100(0).uuid, 0: a100(1).uuid}, values={
        1: {SM_ACTIVE: 0.62, SM_OCCUPANCY: 0.31, TENSOR_ACTIVE: 0.45, DRAM_ACTIVE: 0.27},
        0: {SM_ACTIVE: 0.11, SM_OCCUPANCY: 0.05, TENSOR_ACTIVE: 0.02, DRAM_ACTIVE: 0.09},
    })
    rig = rigs([h100(0), a100(1)], engine)
    rig.collect()
    assert rig.value("flopwatch_gpu_sm_active_ratio", gpu="0") == pytest.approx(0.62)
    assert rig.value("flopwatch_gpu_sm_occupancy_ratio", gpu="0") == pytest.approx(0.31)
    assert rig.value("flopwatch_gpu_tensor_active_ratio", gpu="0") == pytest.approx(0.45)
    assert rig.value("flopwatch_gpu_dram_active_ratio", gpu="0") == pytest.approx(0.27)
    # the A100 has no GPM, but DCGM profiles it: present from the first cycle
    assert rig.value("flopwatch_gpu_tensor_active_ratio", gpu="1") == pytest.approx(0.02)
    # device fields still come from NVML, in base units
    assert rig.value("flopwatch_gpu_power_watts", gpu="0") == pytest.approx(612.345)
    assert rig.value("flopwatch_gpu_nvlink_bytes_total", gpu="0", link="3", direction="tx") == 4000 * 1024
    assert rig.value("flopwatch_build_info", version=__version__, backend="dcgm",
                     python=platform.python_version()) == 1
    # GPM stays off under DCGM: the two would compete for the same profiling counters
    assert rig.nvml.calls["nvmlGpmSampleGet"] == 0
    assert rig.nvml.calls["nvmlGpmQueryDeviceSupport"] == 0


def test_values_follow_the_host_engine_between_cycles(rigs):
    engine = FakeHostEngine({0: h100(0).uuid}, values={0: {TENSOR_ACTIVE: 0.4}})
    rig = rigs([h100(0)], engine)
    rig.collect()
    engine.values[0][TENSOR_ACTIVE] = 0.7
    rig.collect()
    assert rig.value("flopwatch_gpu_tensor_active_ratio", gpu="0") == pytest.approx(0.7)


def test_blank_profiling_values_are_absent_not_zero(rigs):
    engine = FakeHostEngine({0: h100(0).uuid}, values={0: {SM_ACTIVE: 0.5, TENSOR_ACTIVE: None}})
    rig = rigs([h100(0)], engine)
    rig.collect()
    assert rig.value("flopwatch_gpu_sm_active_ratio", gpu="0") == pytest.approx(0.5)
    assert rig.value("flopwatch_gpu_tensor_active_ratio", gpu="0") is None
    assert rig.value("flopwatch_gpu_dram_active_ratio", gpu="0") is None
    assert rig.value("flopwatch_gpu_up", gpu="0") == 1


def test_nvml_byte_counters_win_over_dcgm_rates(rigs):
    engine = FakeHostEngine({0: h100(0).uuid}, values={0: {PCIE_TX: 5e9, NVLINK_TX: 9e10}})
    rig = rigs([h100(0)], engine)
    rig.collect()
    rig.backend.clock = lambda: time.monotonic() + 60    # a minute of DCGM rates that must not count
    rig.collect()
    assert rig.value("flopwatch_gpu_pcie_bytes_total", gpu="0", direction="tx") == 7_000_000_123
    assert rig.value("flopwatch_gpu_nvlink_bytes_total", gpu="0", link="all", direction="tx") is None


def test_dcgm_rates_are_integrated_into_counters_when_nvml_has_none(rigs):
    gpu = a100(0)
    gpu.field_errors = {(real.NVML_FI_DEV_PCIE_COUNT_TX_BYTES, 0): real.NVML_ERROR_NOT_SUPPORTED,
                        (real.NVML_FI_DEV_PCIE_COUNT_RX_BYTES, 0): real.NVML_ERROR_NOT_SUPPORTED}
    for link in range(gpu.nvlink_links):
        for field_id in (real.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, real.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX):
            gpu.field_errors[(field_id, link)] = real.NVML_ERROR_NOT_SUPPORTED
    rate = 1e9
    engine = FakeHostEngine({0: gpu.uuid}, values={0: {PCIE_TX: rate, NVLINK_TX: 2 * rate, NVLINK_RX: 3 * rate}})
    rig = rigs([gpu], engine)
    now = [1000.0]
    rig.backend.clock = lambda: now[0]
    rig.collect()
    assert rig.value("flopwatch_gpu_pcie_bytes_total", gpu="0", direction="tx") == 0  # a counter starts at 0
    now[0] += 0.25
    rig.collect()
    assert rig.value("flopwatch_gpu_pcie_bytes_total", gpu="0", direction="tx") == 0.25 * rate
    assert rig.value("flopwatch_gpu_pcie_bytes_total", gpu="0", direction="rx") is None  # DCGM has no rate
    nvlink_rx = rig.value("flopwatch_gpu_nvlink_bytes_total", gpu="0", link="all", direction="rx")
    assert nvlink_rx == 0.25 * 3 * rate
    # the per-link error counters from NVML are still there
    assert rig.value("flopwatch_gpu_nvlink_errors_total", gpu="0", link="2", error="replay") == 12


def test_host_engine_loss_keeps_gpus_up_and_reconnects(rigs, caplog):
    engine = FakeHostEngine({0: h100(0).uuid, 1: h100(1).uuid},
                            values={0: {TENSOR_ACTIVE: 0.4}, 1: {TENSOR_ACTIVE: 0.6}})
    rig = rigs([h100(0), h100(1)], engine)
    rig.collect()
    engine.crash()
    with caplog.at_level(logging.WARNING):
        rig.collect()
        rig.collect()
    assert rig.value("flopwatch_gpu_up", gpu="0") == rig.value("flopwatch_gpu_up", gpu="1") == 1
    assert rig.value("flopwatch_gpu_tensor_active_ratio", gpu="0") is None
    assert rig.value("flopwatch_gpu_power_watts", gpu="0") is not None
    assert caplog.text.count("lost the DCGM host engine") == 1
    engine.start()
    rig.backend._retry_at = 0  # skip the reconnect wait
    rig.collect()              # schedules the reconnection in the background, does not wait for it
    wait_for(lambda: engine.connections, 5, "the background reconnection")
    rig.collect()
    assert rig.value("flopwatch_gpu_tensor_active_ratio", gpu="0") == pytest.approx(0.4)
    assert rig.value("flopwatch_gpu_tensor_active_ratio", gpu="1") == pytest.approx(0.6)
    assert engine.connections == 1


def test_host_engine_not_answering_is_unavailable_in_one_line(monkeypatch):
    engine = FakeHostEngine({0: h100(0).uuid}, running=False)
    fake_dcgm.install(monkeypatch, engine)
    nvml = FakeNvml([h100(0)])
    with pytest.raises(BackendUnavailable) as raised:
        DcgmBackend(cfg.load(environ={}).gpu, nvml).start()
    assert "DCGM host engine (nv-hostengine) does not answer at 127.0.0.1" in str(raised.value)
    assert "\n" not in str(raised.value)
    assert nvml.calls["nvmlInit"] == 0  # nothing started, nothing to clean up


def test_missing_bindings_are_unavailable_naming_where_they_ship(monkeypatch, tmp_path):
    fake_dcgm.hide(monkeypatch)
    monkeypatch.setattr(dcgm_module, "DCGM_BINDINGS", tmp_path / "absent")
    with pytest.raises(BackendUnavailable, match=r"DCGM Python bindings not found .* not on PyPI"):
        DcgmBackend(cfg.load(environ={}).gpu, FakeNvml([h100(0)])).start()


def test_bindings_directory_is_added_to_the_import_path(monkeypatch, tmp_path):
    """DCGM installs its bindings outside site-packages; the backend finds them there."""
    bindings = tmp_path / "bindings" / "python3"
    bindings.mkdir(parents=True)
    engine = FakeHostEngine({0: h100(0).uuid}, values={0: {SM_ACTIVE: 0.3}})
    for name, module in fake_dcgm.make_modules(engine).items():
        (bindings / f"{name}.py").write_text(f"# placeholder for {name}\n")
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setattr(dcgm_module, "DCGM_BINDINGS", bindings)
    monkeypatch.setattr(sys, "path", list(sys.path))
    backend = DcgmBackend(cfg.load(environ={}).gpu, FakeNvml([h100(0)]))
    try:
        backend.start()
        assert str(bindings) in sys.path
        assert backend.read(0).sm_active == pytest.approx(0.3)
    finally:
        backend.stop()


def test_profiling_not_supported_is_unavailable_and_releases_nvml_and_dcgm(monkeypatch):
    engine = FakeHostEngine({0: h100(0).uuid}, watch_error=fake_dcgm.ST["DCGM_ST_PROFILING_NOT_SUPPORTED"])
    fake_dcgm.install(monkeypatch, engine)
    nvml = FakeNvml([h100(0)])
    with pytest.raises(BackendUnavailable, match="DCGM cannot watch the profiling fields"):
        DcgmBackend(cfg.load(environ={}).gpu, nvml).start()
    assert nvml.calls["nvmlShutdown"] == 1
    assert engine.connections == 0 and not engine.groups and not engine.field_groups


def test_stop_removes_groups_field_group_and_connection(rigs):
    rig = rigs([h100(0), a100(1)])
    assert len(rig.engine.groups) == 2 and len(rig.engine.field_groups) == 1
    assert all(set(fields) >= {SM_ACTIVE, TENSOR_ACTIVE, PCIE_TX, NVLINK_RX}
               for fields in rig.engine.watched.values())
    rig.backend.stop()
    assert not rig.engine.groups and not rig.engine.field_groups and rig.engine.connections == 0


def test_lost_gpu_and_xids_go_through_the_composed_nvml_backend(rigs):
    rig = rigs([h100(0), h100(1)])
    rig.nvml.lose(0)
    rig.nvml.inject_xid(0, 79)
    rig.collect()
    assert rig.value("flopwatch_gpu_up", gpu="0") == 0
    assert rig.value("flopwatch_gpu_up", gpu="1") == 1
    rig.nvml.restore(0)
    rig.collector.states[0].retry_at = 0
    wait_for(lambda: rig.backend.xid_counts() == {(0, 79): 1}, 5, "XID 79 of GPU 0 to be counted")
    rig.collect()
    assert rig.value("flopwatch_gpu_up", gpu="0") == 1
    assert rig.value("flopwatch_gpu_xid_errors_total", gpu="0", xid="79") == 1

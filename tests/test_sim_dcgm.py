"""The simulator's dcgm-exporter mode (flopwatch/sim/dcgm_exposition.py): what a node's dcgm-exporter
serves, in dcgm-exporter's names, labels and value formats (tests/fixtures/dcgm_exporter/README.md
names the source of each), read from the simulated GPUs. No DCGM runs: the GPUs are simulated."""

from __future__ import annotations

import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from flopwatch import hardware
from flopwatch.detect.sampler import FleetSampler
from flopwatch.sim import dcgm_exposition as dcgm
from flopwatch.sim.fleet import Fleet
from flopwatch.sim.scenario import ScenarioError, parse
from flopwatch.sim.serve import FleetServer

MODEL = {"params": 1e9, "layers": 8, "heads": 8, "head_dim": 64, "seq_len": 1024}


def scenario(exporter: str = "dcgm", faults: list | None = None, gpu_model: str = "H100-SXM"):
    return parse({"name": "d", "duration": "20m", "seed": 1,
                  "fleet": {"nodes": 1, "gpus_per_node": 4, "nics_per_node": 1, "exporter": exporter,
                            "gpu_model": gpu_model},
                  "jobs": [{"id": "4242", "nodes": "0", "tokens_per_step": 65536, "target_mfu": 0.4, "model": MODEL}],
                  "faults": faults or []})


def series(exporter: dcgm.DcgmNodeExporter) -> dict[tuple[str, str], tuple[tuple[tuple[str, str], ...], float]]:
    """(name, gpu) -> (labels, value) of the current series."""
    return {(name, dict(pairs)["gpu"]): (pairs, value) for name, pairs, value in exporter.series()}


def test_labels_come_in_dcgm_exporters_order_with_the_slurm_job_and_values_in_its_units():
    fleet = Fleet(scenario())
    node = dcgm.DcgmNodeExporter(fleet, fleet.nodes[0])
    fleet.advance(30.0)
    now = series(node)
    pairs, clock = now[("DCGM_FI_DEV_SM_CLOCK", "1")]
    assert [key for key, _ in pairs] == ["gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname",
                                         "DCGM_FI_DRIVER_VERSION", "hpc_job"]
    labels = dict(pairs)
    assert labels["hpc_job"] == "4242" and labels["Hostname"] == "node0000" and labels["device"] == "nvidia1"
    gpu = fleet.nodes[0].gpus[1]
    assert clock == round(gpu.sm_clock_hz / 1e6)                      # MHz, not Hz
    assert now[("DCGM_FI_DEV_GPU_UTIL", "1")][1] == round(100 * gpu.workload.busy)   # percent
    names = {name for name, _ in now}
    assert "DCGM_FI_DEV_MAX_SM_CLOCK" not in names                  # in no shipped counters file
    assert not any(name.startswith("flopwatch_") for name in names)


def test_the_xid_gauge_holds_the_last_code_and_a_lost_gpu_keeps_only_it():
    fleet = Fleet(scenario())
    node = dcgm.DcgmNodeExporter(fleet, fleet.nodes[0])
    gpu = fleet.nodes[0].gpus[2]
    fleet.advance(10.0)
    assert series(node)[("DCGM_FI_DEV_XID_ERRORS", "2")][1] == 0
    gpu.inject_xid(13)
    first = series(node)[("DCGM_FI_DEV_XID_ERRORS", "2")]
    gpu.inject_xid(31)
    second = series(node)[("DCGM_FI_DEV_XID_ERRORS", "2")]
    assert (first[1], dict(first[0])["err_code"]) == (13, "13")
    assert (second[1], dict(second[0])["err_code"], dict(second[0])["err_msg"]) == (
        31, "31", "GPU memory page fault")
    assert series(node)[("DCGM_FI_DEV_XID_ERRORS", "2")][1] == 31    # a gauge: it stays, it does not count
    gpu.inject_xid(79)
    lost = [name for name, g in series(node) if g == "2"]
    assert lost == ["DCGM_FI_DEV_XID_ERRORS"]
    assert series(node)[("DCGM_FI_DEV_XID_ERRORS", "2")][1] == 79
    assert ("DCGM_FI_DEV_SM_CLOCK", "1") in series(node)           # the other GPUs keep reporting


def test_nvlink_bandwidth_is_a_rate_in_dcgms_unit_not_a_count():
    fleet = Fleet(scenario())
    node = dcgm.DcgmNodeExporter(fleet, fleet.nodes[0])
    gpu = fleet.nodes[0].gpus[0]
    fleet.advance(5.0)
    series(node)
    before = sum(gpu.c.nvlink_tx) + sum(gpu.c.nvlink_rx)
    fleet.advance(10.0)
    after = sum(gpu.c.nvlink_tx) + sum(gpu.c.nvlink_rx)
    value = series(node)[("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "0")][1]
    assert after > before
    assert value == int((after - before) / 10.0 / 1_024_000)


def test_default_counters_leave_out_the_opt_in_rows():
    fleet = Fleet(scenario("dcgm-default", faults=[
        {"kind": "thermal_throttle", "node": 0, "gpu": 3, "start": "0s", "duration": "5m", "slowdown": 0.1}]))
    default = {name for name, _ in series(dcgm.DcgmNodeExporter(fleet, fleet.nodes[0], opt_in=False))}
    full = dcgm.DcgmNodeExporter(fleet, fleet.nodes[0], opt_in=True)
    fleet.advance(10.0)
    assert "DCGM_FI_DEV_CLOCKS_EVENT_REASONS" not in default and "DCGM_FI_DEV_SM_CLOCK" in default
    assert series(full)[("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "3")][1] == 32    # sw_thermal bit


def test_the_text_is_valid_exposition_with_one_help_and_type_per_field():
    fleet = Fleet(scenario())
    node = dcgm.DcgmNodeExporter(fleet, fleet.nodes[0])
    fleet.advance(10.0)
    text = node.render().decode()
    families = {family.name: family for family in text_string_to_metric_families(text)}
    assert families["DCGM_FI_DEV_PCIE_REPLAY_COUNTER"].type == "counter"
    assert families["DCGM_FI_DEV_XID_ERRORS"].type == "gauge"
    assert text.count("# TYPE DCGM_FI_DEV_POWER_USAGE gauge") == 1
    power = next(line for line in text.splitlines() if line.startswith("DCGM_FI_DEV_POWER_USAGE{"))
    assert power.rsplit(" ", 1)[1].count(".") == 1 and len(power.rsplit(".", 1)[1]) == 6   # %f


@pytest.mark.parametrize("model", sorted(dcgm.DEVICE_NAMES))
def test_device_names_map_back_to_their_model(model):
    assert hardware.match_device_name(dcgm.DEVICE_NAMES[model]).name == model


def test_an_amd_fleet_cannot_run_behind_dcgm_exporter_and_unknown_exporters_are_refused():
    with pytest.raises(dcgm.DcgmExporterError, match="NVIDIA GPUs only"):
        dcgm.check_fleet(Fleet(scenario(gpu_model="MI300X")))
    with pytest.raises(ScenarioError, match=r"fleet\.exporter"):
        scenario("nvidia-smi")


def test_the_benchmark_sampler_serves_dcgm_series_and_the_agent_only_steps():
    fleet = Fleet(scenario())
    wanted = {"up", "DCGM_FI_DEV_SM_CLOCK", "flopwatch_gpu_sm_clock_hertz", "flopwatch_gpu_job_info",
              "flopwatch_train_steps_total"}
    sampler = FleetSampler(fleet, wanted)
    fleet.advance(30.0)
    names: dict[str, set[str]] = {}
    for labels, _ in sampler.sample():
        for series_labels in labels:
            pairs = dict(series_labels)
            names.setdefault(pairs["__name__"], set()).add(pairs["job"])
    assert names["DCGM_FI_DEV_SM_CLOCK"] == {"dcgm-exporter"}
    assert names["flopwatch_train_steps_total"] == {"flopwatch"}
    assert names["up"] == {"dcgm-exporter", "flopwatch"}
    assert "flopwatch_gpu_sm_clock_hertz" not in names and "flopwatch_gpu_job_info" not in names


def test_the_fleet_server_serves_dcgm_exporter_and_the_agent_as_two_targets_per_node():
    fleet = Fleet(scenario())
    server = FleetServer(fleet)
    host, port = server.start()
    try:
        server.tick(5.0)
        paths = {target["labels"]["instance"]: target["labels"]["__metrics_path__"] for target in server.targets()}
        assert paths == {"node0000": "/node/0/metrics", "node0000:9400": "/node/0/dcgm/metrics"}
        read = {instance: urllib.request.urlopen(f"http://{host}:{port}{path}", timeout=10).read().decode()
                for instance, path in paths.items()}
    finally:
        server.stop()
    dcgm_names = {family.name for family in text_string_to_metric_families(read["node0000:9400"])}
    agent_names = {family.name for family in text_string_to_metric_families(read["node0000"])}
    assert "DCGM_FI_DEV_SM_CLOCK" in dcgm_names
    assert "flopwatch_train_steps" in agent_names or "flopwatch_train_steps_total" in agent_names
    assert not [name for name in agent_names if name.startswith("flopwatch_gpu_")]

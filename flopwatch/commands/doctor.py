"""`flopwatch doctor`: what FlopWatch can read on this node, in one table (or JSON), before a rollout.

It starts the GPU backend the agent would start (same config), reads every GPU twice (GPM needs
an interval) and reports which metric families each GPU provides and which stay absent, then the
driver and NVML versions, DCGM, the NIC and host collectors, the training-step socket and the
Slurm mapping directory. Absent families are facts about the hardware, not failures.

Exit codes: 0 every GPU was read; 1 at least one GPU could not be read (lost, hung, failing
calls); 2 no GPU backend could start (no driver, no DCGM for --backend dcgm) or bad usage.
"""

from __future__ import annotations

import argparse
import json
import os
import stat
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from flopwatch import config as cfg
from flopwatch.errors import EXIT_FAILURE, EXIT_OK, EXIT_USAGE, UsageError
from flopwatch.exporters.gpu.backend import GpuBackend
from flopwatch.exporters.gpu.reading import BackendUnavailable, GpuReading
from flopwatch.hardware import match_device_name

#: family -> whether a reading carries it (the series the agent would export for it)
FAMILIES: dict[str, Any] = {
    "GPM activity (SM, tensor, DRAM)": lambda r: r.tensor_active is not None,
    "NVLink counters": lambda r: any(link.tx_bytes is not None for link in r.nvlinks or ()),
    "PCIe byte counters": lambda r: r.pcie_tx_bytes is not None,
    "ECC error counters": lambda r: r.ecc_corrected is not None,
    "remapped rows": lambda r: r.remapped_rows_correctable is not None,
    "energy counter": lambda r: r.energy_joules is not None,
    "memory temperature": lambda r: r.memory_temperature_c is not None,
    "clock-event reasons": lambda r: r.clock_events is not None,
}
GPM_INTERVAL_S = 0.2   # NVML asks for more than 100 ms between two GPM samples


@dataclass
class Check:
    """One row: what was checked, the verdict (ok, partial, absent, off, fail) and the detail."""

    section: str
    check: str
    status: str
    detail: str = ""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="FILE", help="the agent's YAML config file (docs/agent.md)")
    parser.add_argument("--backend", choices=["auto", "nvml", "dcgm", "sim"],
                        help="GPU backend to check (default: the agent's, auto)")
    parser.add_argument("--sim-gpus", dest="sim_gpus", metavar="N", help="simulated GPUs (backend sim)")
    parser.add_argument("--sim-model", dest="sim_model", metavar="MODEL", help="simulated model (backend sim)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")


def run(args: argparse.Namespace) -> int:
    overrides = {key: getattr(args, flag) for flag, key in
                 (("backend", "backend"), ("sim_gpus", "sim.gpus"), ("sim_model", "sim.model"))
                 if getattr(args, flag) is not None}
    try:
        config = cfg.load(args.config, overrides)
    except cfg.ConfigError as error:
        raise UsageError(f"config error: {error}") from None
    checks, code = diagnose(config)
    if args.json:
        json.dump({"exit_code": code, "checks": [asdict(c) for c in checks]}, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print_table(checks, code)
    return code


def diagnose(config: cfg.AgentConfig) -> tuple[list[Check], int]:
    """Every check, and the exit code they add up to."""
    checks: list[Check] = []
    code = EXIT_OK
    if config.collectors.get("gpu", True):
        code = _gpu_checks(config, checks)
    else:
        checks.append(Check("gpu", "GPU collector", "off", "collectors.gpu is false"))
    if config.backend != "sim":
        checks.append(_dcgm_check(config))
    checks += _node_checks(config)
    return checks, code


def _gpu_checks(config: cfg.AgentConfig, checks: list[Check]) -> int:
    from flopwatch.exporters.gpu.select import make_backend

    try:
        backend, count = make_backend(config)
    except BackendUnavailable as error:
        checks.append(Check("gpu", "GPU backend", "fail", str(error)))
        return EXIT_USAGE
    try:
        checks.append(Check("gpu", "GPU backend", "ok", f"{backend.name}: {count} GPU(s)"))
        checks += _versions(backend)
        readings, failures = _read_twice(backend, count, config.gpu.timeout)
        checks += _gpu_rows(count, readings, failures, config)
        checks += _family_rows(readings)
        checks.append(_xid_check(backend, count))
    finally:
        backend.stop()
    return EXIT_FAILURE if failures else EXIT_OK


def _nvml_of(backend: GpuBackend) -> Any:
    """The pynvml module under an NVML or DCGM backend, or None (simulated GPUs)."""
    inner = getattr(backend, "nvml_backend", backend)
    return getattr(inner, "nvml", None)


def _versions(backend: GpuBackend) -> list[Check]:
    nvml = _nvml_of(backend)
    if nvml is None:
        return [Check("gpu", "driver", "ok", "simulated GPUs, no driver")]
    inner = getattr(backend, "nvml_backend", backend)
    rows = [Check("gpu", "driver", "ok" if inner.driver_version else "absent", inner.driver_version or "unknown")]
    queries = (("NVML", "nvmlSystemGetNVMLVersion"), ("CUDA driver API", "nvmlSystemGetCudaDriverVersion"))
    for label, function in queries:
        try:
            value = getattr(nvml, function)()
        except (nvml.NVMLError, AttributeError) as error:
            rows.append(Check("gpu", label, "absent", str(error)))
            continue
        if isinstance(value, int):
            value = f"{value // 1000}.{value % 1000 // 10}"
        rows.append(Check("gpu", label, "ok", value.decode() if isinstance(value, bytes) else str(value)))
    return rows


def _read_twice(backend: GpuBackend, count: int, timeout: float) -> tuple[dict[int, GpuReading], dict[int, str]]:
    """Two reads per GPU, GPM_INTERVAL_S apart; each GPU's read in its own daemon thread with
    the agent's timeout, so a hung GPU is reported, not waited for."""
    readings: dict[int, GpuReading] = {}
    failures: dict[int, str] = {}
    for attempt in range(2):
        if attempt:
            time.sleep(GPM_INTERVAL_S)
        results: dict[int, Any] = {}

        def read(index: int, out: dict[int, Any] = results) -> None:
            try:
                out[index] = backend.read(index)
            except Exception as error:  # reported per GPU, never raised
                out[index] = error

        threads = {i: threading.Thread(target=read, args=(i,), daemon=True) for i in range(count) if i not in failures}
        for thread in threads.values():
            thread.start()
        deadline = time.monotonic() + timeout
        for index, thread in threads.items():
            thread.join(max(0.0, deadline - time.monotonic()))
            result = results.get(index)
            if thread.is_alive():
                failures[index] = f"a read took longer than gpu.timeout ({timeout:g} s)"
            elif isinstance(result, BaseException):
                failures[index] = str(result)
            else:
                readings[index] = result
    for index in failures:
        readings.pop(index, None)
    return readings, failures


def _gpu_rows(count: int, readings: dict[int, GpuReading], failures: dict[int, str],
              config: cfg.AgentConfig) -> list[Check]:
    rows = []
    for index in range(count):
        if index in failures:
            rows.append(Check("gpu", f"GPU {index}", "fail", failures[index]))
            continue
        reading = readings[index]
        model = match_device_name(reading.model)
        peak = model.peak_dense_flops.get(config.gpu.dtype) if model else config.gpu.peak_flops
        if peak is None:
            detail, status = f"{reading.model}: unknown model, no peak (set gpu.peak_flops)", "partial"
        else:
            source = model.name if model else "gpu.peak_flops"
            detail, status = f"{reading.model} ({source}, {peak / 1e12:g} TFLOP/s {config.gpu.dtype} dense)", "ok"
        rows.append(Check("gpu", f"GPU {index}", status, f"{detail} {reading.uuid}".strip()))
    return rows


def _family_rows(readings: dict[int, GpuReading]) -> list[Check]:
    rows = []
    for family, present in FAMILIES.items():
        have = sorted(i for i, reading in readings.items() if present(reading))
        if not readings:
            status, detail = "fail", "no GPU could be read"
        elif len(have) == len(readings):
            status, detail = "ok", f"all {len(readings)} GPU(s)"
        elif have:
            status, detail = "partial", f"GPUs {', '.join(map(str, have))} of {len(readings)}"
        else:
            status, detail = "absent", "not provided by these GPUs or this driver; its series stay absent"
        rows.append(Check("families", family, status, detail))
    return rows


def _xid_check(backend: GpuBackend, count: int) -> Check:
    """Ask NVML itself whether each GPU takes the XID event registration the agent makes."""
    nvml = _nvml_of(backend)
    if nvml is None:
        return Check("families", "XID events", "ok", "simulated")
    inner = getattr(backend, "nvml_backend", backend)
    try:
        event_set = nvml.nvmlEventSetCreate()
    except nvml.NVMLError as error:
        return Check("families", "XID events", "absent", f"no NVML event set: {error}")
    taken, refused = [], []
    try:
        for device in inner.devices:
            if device.handle is None:
                continue
            try:
                nvml.nvmlDeviceRegisterEvents(device.handle, nvml.nvmlEventTypeXidCriticalError, event_set)
                taken.append(device.index)
            except nvml.NVMLError as error:
                refused.append(f"GPU {device.index}: {error}")
    finally:
        nvml.nvmlEventSetFree(event_set)
    if len(taken) == count:
        return Check("families", "XID events", "ok", f"all {count} GPU(s) accept the registration")
    return Check("families", "XID events", "partial" if taken else "absent", "; ".join(refused) or "no GPU open")


def _dcgm_check(config: cfg.AgentConfig) -> Check:
    from flopwatch.exporters.gpu.dcgm import DcgmBackend

    backend = DcgmBackend(config.gpu)
    try:
        count = backend.start()
    except BackendUnavailable as error:
        return Check("services", "DCGM host engine", "absent", f"{error} (NVML is used instead)")
    except Exception as error:  # a broken DCGM install is a finding, not a crash
        return Check("services", "DCGM host engine", "absent", f"{type(error).__name__}: {error}")
    backend.stop()
    return Check("services", "DCGM host engine", "ok", f"{config.gpu.dcgm_host}: {count} GPU(s)")


def _node_checks(config: cfg.AgentConfig) -> list[Check]:
    rows = [_nic_check(config), _host_check(config), _socket_check(config)]
    mapping = config.attribution.mapping_dir
    if not config.collectors.get("attribution", True) or not mapping:
        rows.append(Check("node", "Slurm mapping directory", "off", "attribution off or mapping_dir none"))
    elif Path(mapping).is_dir():
        jobs = len([p for p in Path(mapping).iterdir() if p.is_file()])
        rows.append(Check("node", "Slurm mapping directory", "ok", f"{mapping}: {jobs} file(s)"))
    else:
        rows.append(Check("node", "Slurm mapping directory", "absent",
                          f"{mapping} does not exist (the Slurm prolog in deploy/slurm/ writes it)"))
    return rows


def _nic_check(config: cfg.AgentConfig) -> Check:
    if not config.collectors.get("nic", True):
        return Check("node", "NIC collector", "off", "collectors.nic is false")
    from flopwatch.exporters.nic_sysfs import SysfsReader

    scan = SysfsReader(config.nic.sysfs_root, config.nic.net_exclude).scan()
    detail = f"{len(scan.ports)} InfiniBand/RoCE port(s), {len(scan.nets)} Ethernet interface(s)"
    if scan.problems:
        detail += f"; {scan.problems[0]}"
    return Check("node", "NIC collector", "ok" if scan.ports or scan.nets else "absent", detail)


def _host_check(config: cfg.AgentConfig) -> Check:
    if not config.collectors.get("host", True):
        return Check("node", "host collector", "off", "collectors.host is false")
    from flopwatch.exporters.host import HostCollector

    host = HostCollector(config.node, config.host.procfs_root, config.host.sysfs_root or config.nic.sysfs_root)
    errors = host.update()
    numa = len(set(host.numa_nodes().values()))
    status = "ok" if errors == 0 else "partial"
    return Check("node", "host collector", status, f"{numa} NUMA node(s), {errors} read error(s)")


def _socket_check(config: cfg.AgentConfig) -> Check:
    path = Path(config.train.socket)
    enabled = config.collectors.get("train", False)
    try:
        mode = path.stat().st_mode
    except OSError:
        if not enabled:
            return Check("node", "training-step socket", "off", f"collectors.train is false ({path})")
        parent_ok = path.parent.is_dir() and os.access(path.parent, os.W_OK)
        detail = f"{path}: not there yet; the agent {'can' if parent_ok else 'cannot'} create it"
        return Check("node", "training-step socket", "absent" if parent_ok else "fail", detail)
    if not stat.S_ISSOCK(mode):
        return Check("node", "training-step socket", "fail", f"{path} exists and is not a socket")
    return Check("node", "training-step socket", "ok", f"{path}; intake {'on' if enabled else 'off'}")


def print_table(checks: list[Check], code: int) -> None:
    from rich.console import Console
    from rich.table import Table

    colours = {"ok": "green", "partial": "yellow", "absent": "yellow", "off": "dim", "fail": "red"}
    table = Table(title="flopwatch doctor", show_lines=False)
    for column in ("section", "check", "status", "detail"):
        table.add_column(column, overflow="fold")
    for check in checks:
        colour = colours.get(check.status, "")
        table.add_row(check.section, check.check, f"[{colour}]{check.status}[/{colour}]", check.detail)
    console = Console(width=max(100, Console().width))
    console.print(table)
    verdict = {EXIT_OK: "every GPU readable", EXIT_FAILURE: "some GPUs could not be read",
               EXIT_USAGE: "no GPU backend"}[code]
    console.print(f"exit {code}: {verdict}")

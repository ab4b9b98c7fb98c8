"""Node and GPU drill-down: every GPU metric of one node, with units, for finding why a GPU is slow
or broken: activity, clocks and their clock-event reasons, power and heat, memory, XID/ECC/row-remap
events, PCIe and NVLink.
"""

from __future__ import annotations

from grafana_foundation_sdk.models import dashboard as dm

from flopwatch.dashboards import common as c

UID = "flopwatch-node"
TITLE = "FlopWatch / Node and GPU"
SEL = 'node=~"$node", gpu=~"$gpu"'
GPU = "GPU {{gpu}}"


def _gpu(metric: str, extra: str = "") -> str:
    return f"{metric}{{{SEL}{extra}}}"


def build(docs_url: str = c.DOCS_URL) -> dm.Dashboard:
    variables = [c.node_variable(multi=False), c.gpu_variable()]
    board = c.Board(UID, TITLE, "Every GPU metric of one node: activity, clocks, throttling, power, "
                    "memory, errors, PCIe and NVLink.", variables, docs_url=docs_url)
    _gpus_and_jobs(board)
    _activity(board)
    _clocks_and_throttling(board)
    _power_and_temperature(board)
    _errors_xid_ecc_row_remapping(board)
    _pcie_and_nvlink(board)
    return board.build()


def _gpus_and_jobs(board: c.Board) -> None:
    """The "GPUs and jobs" row."""
    board.row("GPUs and jobs")
    gpus = (
        c.table_panel(
            "GPUs on this node", "Each GPU with whether it can be read (up) and the job that holds it; model, "
            "UUID, driver and user where the agent reports them (dcgm-exporter: GPU, up and job only).", c.COUNT,
            columns=["gpu", "model", "job_id", "user", "uuid", "driver_version"], width=24, height=6,
            hide=["node", "Value #B"])
        .with_target(c.query(
            f"max by (node, gpu, model, uuid, driver_version) ({_gpu(c.UP)} * on (node, gpu) "
            f"group_left (model, uuid, driver_version) {_gpu('flopwatch_gpu_info')}) "
            f"or on (node, gpu) {_gpu(c.UP)}", ref="A", instant=True, table_format=True))
        .with_target(c.query(f"{_gpu('flopwatch_gpu_job_info')} or on (node, gpu, job_id) {_gpu(c.JOB_INFO)}",
                             ref="B", instant=True, table_format=True))
    )
    gpus = c.value_column(gpus, "A", "up", c.COUNT, (c.RED, ((1, c.GREEN),)))
    board.add(c.column_links(gpus, "job_id", [c.drill_link(
        "Training job ${__data.fields.job_id}", "flopwatch-job", job_id="${__data.fields.job_id}")]))


def _activity(board: c.Board) -> None:
    """The "Activity" row."""
    board.row("Activity")
    board.add(
        c.timeseries_panel(
            "GPU utilization", "Share of time a kernel ran (NVML utilization.gpu). Not MFU: Acme (NSDI'24) "
            "found median utilization of 97-99% with median SM activity near 40%. Compare with tensor "
            "activity.", c.PERCENT, width=8)
        .min(0).max(1).with_target(c.query(_gpu("node_gpu:flopwatch_gpu_utilization_ratio:max"), GPU)),
        c.timeseries_panel(
            "Tensor pipe activity", "Share of time the tensor cores were busy (GPM on Hopper and newer, or "
            "DCGM profiling): with the SM clock, the basis of the telemetry-only MFU estimate. Absent, not "
            "0, on GPUs that cannot report it.", c.PERCENT, width=8)
        .min(0).max(1).with_target(c.query(_gpu("node_gpu:flopwatch_gpu_tensor_active_ratio:max"), GPU)),
        c.timeseries_panel(
            "SM activity and occupancy", "SM active: share of time at least one warp was resident; "
            "occupancy: resident warps over the maximum. Low activity with high utilization means short "
            "or narrow kernels.", c.PERCENT, width=8)
        .min(0).max(1)
        .with_target(c.query(_gpu("flopwatch_gpu_sm_active_ratio"), "GPU {{gpu}} active", "A"))
        .with_target(c.query(_gpu("flopwatch_gpu_sm_occupancy_ratio"), "GPU {{gpu}} occupancy", "B")),
    )


def _clocks_and_throttling(board: c.Board) -> None:
    """The "Clocks and throttling" row."""
    board.row("Clocks and throttling")
    board.add(
        c.timeseries_panel(
            "SM clock", "Current SM clock of each GPU against the highest maximum clock among them. A GPU "
            "below its peers at the same load is held down: the clock-event reasons say why.", c.HERTZ)
        .with_target(c.query(_gpu("node_gpu:flopwatch_gpu_sm_clock_hertz:max"), GPU, "A"))
        .with_target(c.query(f"max({_gpu('node_gpu:flopwatch_gpu_sm_clock_max_hertz:max')})", "max clock", "B")),
        c.state_timeline_panel(
            "Clock-event reasons", "Which clock-event (throttle) reasons hold each GPU's SM clock down: idle "
            "(no work), sw_power_cap and hw_power_brake (power), sw_thermal and hw_thermal (heat), "
            "hw_slowdown (hardware protection, often a PSU or thermal event), sync_boost (held to match "
            "other GPUs); clock_below_max where dcgm-exporter exports no clock-event bitmask (a busy GPU "
            "under 90% of its model's maximum clock). Red = active.", c.COUNT,
            {"0": ("clear", "transparent"), "1": ("active", c.RED)})
        .links(board.runbooks("FlopWatchGpuThrottled"))
        .with_target(c.query(c.clock_event_reasons(SEL), "GPU {{gpu}} {{reason}}")),
        c.timeseries_panel(
            "Time held below the requested clock", "Share of time each policy held the clock below the "
            "requested clock (NVML violation counters). Sustained thermal or power shares on one GPU make "
            "it the straggler of its job.", c.PERCENT)
        .min(0)
        .with_target(c.query(
            f"rate({_gpu('flopwatch_gpu_clock_event_violation_seconds_total')}[$__rate_interval])",
            "GPU {{gpu}} {{reason}}")),
        c.timeseries_panel(
            "Memory clock", "Current memory clock; it drops with memory throttling or idle.", c.HERTZ)
        .with_target(c.query(f"{_gpu('flopwatch_gpu_memory_clock_hertz')} or on (node, gpu) "
                             f"{_gpu('node_gpu:flopwatch_gpu_memory_clock_hertz:dcgm')}", GPU)),
    )


def _power_and_temperature(board: c.Board) -> None:
    """The "Power and temperature" row."""
    board.row("Power and temperature")
    board.add(
        c.timeseries_panel(
            "Power and limit", "Board power draw and the enforced power limit per GPU (the limit from the "
            "agent only). Draw pinned at a lowered limit is a power cap.", c.WATTS)
        .with_target(c.query(_gpu("node_gpu:flopwatch_gpu_power_watts:max"), "GPU {{gpu}} power", "A"))
        .with_target(c.query(_gpu("flopwatch_gpu_power_limit_watts"), "GPU {{gpu}} limit", "B")),
        c.timeseries_panel(
            "Temperature", "GPU core and HBM temperature (HBM from the agent only). A GPU hotter than its "
            "neighbours throttles first (sw_thermal/hw_thermal).", c.CELSIUS)
        .with_target(c.query(_gpu("node_gpu:flopwatch_gpu_temperature_celsius:max"), "GPU {{gpu}} core", "A"))
        .with_target(c.query(_gpu("flopwatch_gpu_memory_temperature_celsius"), "GPU {{gpu}} HBM", "B")),
        c.bargauge_panel(
            "Energy in range", "Energy each GPU used over the dashboard's time range (NVML total energy).",
            c.WATT_HOURS, width=12)
        .thresholds(c.thresholds(c.BLUE))
        .with_target(c.query(f"increase({_gpu('flopwatch_gpu_energy_joules_total')}[$__range]) / 3600", GPU,
                             instant=True)),
        c.timeseries_panel(
            "Memory used", "Device memory in use per GPU against the memory installed (installed from the "
            "agent only).",
            c.BYTES)
        .with_target(c.query(f"{_gpu('flopwatch_gpu_memory_used_bytes')} or on (node, gpu) "
                             f"{_gpu('node_gpu:flopwatch_gpu_memory_used_bytes:dcgm')}", "GPU {{gpu}} used", "A"))
        .with_target(c.query(f"max({_gpu('flopwatch_gpu_memory_total_bytes')})", "installed", "B")),
    )


def _errors_xid_ecc_row_remapping(board: c.Board) -> None:
    """The "Errors: XID, ECC, row remapping" row."""
    board.row("Errors: XID, ECC, row remapping")
    board.add(
        c.state_timeline_panel(
            "GPU readable", "Whether each GPU could be read: lost means fallen off the bus (XID 79), hung or "
            "timing out (the agent reports it down; dcgm-exporter stops its series while its target is up); "
            "the other GPUs keep reporting.", c.COUNT,
            {"0": ("lost", c.RED), "1": ("up", c.GREEN)}, width=8)
        .links(board.runbooks("FlopWatchGpuLost"))
        .with_target(c.query(_gpu(c.UP), GPU)),
        c.timeseries_panel(
            "XID events", "XID errors the driver reported, by GPU and code (a first XID on a GPU counts "
            "too; dcgm-exporter's GPUs: 1 for 5 minutes after its last-XID gauge shows a new code). Critical "
            "codes (48, 62, 64, 74, 79, 94, 95, "
            "119, 120) mean the GPU or its job stopped.",
            c.COUNT, width=8, bars=True)
        .links(board.runbooks("FlopWatchGpuXidCritical", "FlopWatchGpuXid"))
        .with_target(c.query(
            f"sum by (gpu, xid) ({c.increase_with_new(_gpu('flopwatch_gpu_xid_errors_total'), '$__rate_interval')} "
            f"or {c.dcgm_xids(SEL)})",
            "GPU {{gpu}} XID {{xid}}")),
        c.timeseries_panel(
            "ECC errors", "Corrected (single-bit) ECC errors per interval (agent only) and uncorrected "
            "(double-bit) ECC errors in the last 10 minutes. Any uncorrected error killed the process that "
            "touched the memory.", c.COUNT, width=8, bars=True)
        .links(board.runbooks("FlopWatchGpuEccUncorrected"))
        .with_target(c.query(
            f"increase({_gpu('flopwatch_gpu_ecc_corrected_errors_total')}[$__rate_interval])",
            "GPU {{gpu}} corrected", "A"))
        .with_target(c.query(
            _gpu("node_gpu:flopwatch_gpu_ecc_uncorrected_errors:increase10m"), "GPU {{gpu}} uncorrected (10m)", "B")),
        c.timeseries_panel(
            "Row remapping", "HBM rows remapped by cause, and whether a remap waits for a reset (pending) or "
            "failed (no spare rows: the GPU needs service); cause and pending from the agent only.", c.COUNT)
        .links(board.runbooks("FlopWatchGpuRowRemapFailure"))
        .with_target(c.query(_gpu("flopwatch_gpu_remapped_rows"), "GPU {{gpu}} {{cause}}", "A"))
        .with_target(c.query(_gpu("flopwatch_gpu_row_remap_pending"), "GPU {{gpu}} pending", "B"))
        .with_target(c.query(_gpu("node_gpu:flopwatch_gpu_row_remap_failed:max"), "GPU {{gpu}} failed", "C")),
        c.timeseries_panel(
            "Compute processes", "Processes running on each GPU; 0 on an allocated GPU means the job is not "
            "using it.", c.COUNT)
        .with_target(c.query(_gpu("flopwatch_gpu_processes"), GPU)),
    )


def _pcie_and_nvlink(board: c.Board) -> None:
    """The "PCIe and NVLink" row."""
    board.row("PCIe and NVLink")
    board.add(
        c.timeseries_panel(
            "PCIe link: current over maximum", "Current PCIe width and generation over the maximum of the "
            "GPU and slot: below 100% is a downgraded link (FlopWatchPcieDegraded), which slows host-device "
            "copies and GPUDirect traffic.", c.PERCENT, show_thresholds=True)
        .thresholds(c.thresholds(c.RED, (1, c.GREEN))).min(0).max(1)
        .links(board.runbooks("FlopWatchPcieDegraded"))
        .with_target(c.query(
            f"{_gpu('node_gpu:flopwatch_gpu_pcie_link_width:max')} / "
            f"{_gpu('node_gpu:flopwatch_gpu_pcie_link_max_width:max')}",
            "GPU {{gpu}} width", "A"))
        .with_target(c.query(
            f"{_gpu('node_gpu:flopwatch_gpu_pcie_link_generation:max')} / "
            f"{_gpu('node_gpu:flopwatch_gpu_pcie_link_max_generation:max')}",
            "GPU {{gpu}} generation", "B")),
        c.timeseries_panel(
            "PCIe replays", "PCIe link retransmits per second over 5 minutes, as the alert reads them "
            "(more than 0.1/s).", c.PER_SECOND, show_thresholds=True)
        .thresholds(c.thresholds(c.GREEN, (0.1, c.RED)))
        .links(board.runbooks("FlopWatchPcieDegraded"))
        .with_target(c.query(_gpu("node_gpu:flopwatch_gpu_pcie_replays:rate5m"), GPU)),
        c.timeseries_panel(
            "PCIe throughput", "PCIe bytes per second by direction (NVML field-value counters).",
            c.BYTES_PER_SECOND)
        .with_target(c.query(f"rate({_gpu('flopwatch_gpu_pcie_bytes_total')}[$__rate_interval])",
                             "GPU {{gpu}} {{direction}}")),
        c.timeseries_panel(
            "NVLink throughput", "NVLink bytes per second by GPU and direction, summed over links "
            "(dcgm-exporter: both directions together, direction total).",
            c.BYTES_PER_SECOND)
        .with_target(c.query(
            f"sum by (gpu, direction) (rate({_gpu('flopwatch_gpu_nvlink_bytes_total')}[$__rate_interval])) "
            "or " + c.dcgm_total("node_gpu:flopwatch_gpu_nvlink_bytes:rate1m", SEL,
                                 "flopwatch_gpu_nvlink_bytes_total", "direction"),
            "GPU {{gpu}} {{direction}}")),
        c.timeseries_panel(
            "NVLink errors", "NVLink replay, recovery and CRC errors per second by GPU; FlopWatchNvlinkErrors "
            "pages above 1/s (summed over a GPU's links) for 30 s. They slow every collective of the job, "
            "equally on all ranks (dcgm-exporter: all kinds together, error total).", c.PER_SECOND, width=24,
            show_thresholds=True)
        .thresholds(c.thresholds(c.GREEN, (1, c.RED)))
        .links(board.runbooks("FlopWatchNvlinkErrors"))
        .with_target(c.query(
            f"sum by (gpu, error) (rate({_gpu('flopwatch_gpu_nvlink_errors_total')}[$__rate_interval])) "
            "or " + c.dcgm_total("node_gpu:flopwatch_gpu_nvlink_errors:sum_rate1m", SEL,
                                 "flopwatch_gpu_nvlink_errors_total", "error"),
            "GPU {{gpu}} {{error}}")),
    )

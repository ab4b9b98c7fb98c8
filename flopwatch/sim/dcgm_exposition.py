"""What NVIDIA's dcgm-exporter would serve for a simulated node, instead of the agent's GPU series.

The simulator's `dcgm` exporter modes put each node's GPUs behind dcgm-exporter's own series
(`DCGM_FI_*`), the way a cluster that already runs it looks to FlopWatch's rules, while the agent
beside it (GPU collector and attribution off) serves only the training-step intake, NICs and host.
Names, Prometheus types, label order and value formats follow dcgm-exporter's source, as the test
fixtures do (tests/fixtures/dcgm_exporter/README.md names the file for each): labels `gpu`, `UUID`,
`pci_bus_id`, `device`, `modelName`, the host label, `DCGM_FI_DRIVER_VERSION`, then the attributes
(`err_code`/`err_msg` on the XID gauge, `hpc_job` from the Slurm mapping directory); integers print
`%d`, doubles `%f`. The XID field is a gauge of the *last* XID; there is no max-clock series.

What DCGM itself does is modelled where the rules depend on it:
- a lost GPU (XID 79, or gone without one) reads blank in every field but the XID field, whose
  value DCGM got from the driver's event: dcgm-exporter skips blank values, so only the XID
  series stays (an assumption: dcgm-exporter's code skips blanks, the XID field keeps its cached value);
- `DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL` is a rate (DCGM's ReadAndCacheNvLinkBandwidth: RX + TX KiB
  over the interval since its previous read, / 1000), here over the time since the last render.
"""

from __future__ import annotations

from collections.abc import Iterator

from flopwatch import xid as xid_catalogue
from flopwatch.exporters.gpu.reading import clock_event_mask
from flopwatch.exporters.gpu.simulated import MHZ, SIM_DRIVER_VERSION, SimulatedGpu
from flopwatch.sim.fleet import Fleet
from flopwatch.sim.state import SimNode

#: dcgm-exporter's port: a node's dcgm-exporter target is `<node>:9400`.
PORT = 9400
SCRAPE_JOB = "dcgm-exporter"
HOST_LABEL = "Hostname"           # dcgm-exporter up to 4.5.3-4.8.2
NVLINK_UNIT_BYTES = 1024 * 1000   # one unit of DCGM's NVLink throughput field, bytes/s
MIB = 1 << 20
#: (field, Prometheus type, help, value kind): the rows of dcgm-exporter's etc/default-counters.csv
#: the rules read, then FlopWatch's counters-file rows (opt-in). int64 fields print %d, doubles %f.
DEFAULT_FIELDS = (
    ("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz).", "int"),
    ("DCGM_FI_DEV_MEM_CLOCK", "gauge", "Memory clock frequency (in MHz).", "int"),
    ("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C).", "int"),
    ("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W).", "double"),
    ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter", "Total number of PCIe retries.", "int"),
    ("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %).", "int"),
    ("DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error encountered.", "int"),
    ("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB).", "int"),
    ("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "counter", "Total number of NVLink bandwidth counters for all lanes.",
     "int"),
    ("DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge", "Whether remapping of rows has failed", "int"),
    ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "gauge", "Ratio of cycles the tensor (HMMA) pipe is active.", "double"),
)
OPT_IN_FIELDS = (
    ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "gauge", "Current clock event reasons (bitmask).", "int"),
    ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "counter", "Total number of double-bit volatile ECC errors.", "int"),
    ("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "counter", "Total number of NVLink flow-control CRC errors.",
     "int"),
    ("DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL", "counter", "Total number of NVLink data CRC errors.", "int"),
    ("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", "counter", "Total number of NVLink retries.", "int"),
    ("DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL", "counter", "Total number of NVLink recovery errors.", "int"),
    ("DCGM_FI_DEV_PCIE_LINK_WIDTH", "gauge", "PCIe current link width.", "int"),
    ("DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH", "gauge", "PCIe maximum link width.", "int"),
    ("DCGM_FI_DEV_PCIE_LINK_GEN", "gauge", "PCIe current link generation.", "int"),
    ("DCGM_FI_DEV_PCIE_MAX_LINK_GEN", "gauge", "PCIe maximum link generation.", "int"),
)
XID_FIELD = "DCGM_FI_DEV_XID_ERRORS"
#: NVML device names of FlopWatch's NVIDIA models, as DCGM reports them in `modelName`.
DEVICE_NAMES = {"A100-SXM": "NVIDIA A100-SXM4-80GB", "H100-SXM": "NVIDIA H100 80GB HBM3",
                "H100-PCIe": "NVIDIA H100 PCIe", "H200-SXM": "NVIDIA H200", "B200": "NVIDIA B200",
                "GB200": "NVIDIA GB200"}

Pairs = tuple[tuple[str, str], ...]


class DcgmExporterError(ValueError):
    """The fleet cannot be shown through dcgm-exporter (an AMD GPU); one line for the user."""


def uses_flopwatch_counters(exporter: str) -> bool:
    """Whether `exporter` (flopwatch.sim.scenario.EXPORTERS) runs with FlopWatch's counters file."""
    return exporter == "dcgm"


def field_names(opt_in: bool) -> set[str]:
    return {row[0] for row in DEFAULT_FIELDS + (OPT_IN_FIELDS if opt_in else ())}


def check_fleet(fleet: Fleet) -> None:
    unknown = sorted({gpu.model.name for node in fleet.nodes for gpu in node.gpus} - set(DEVICE_NAMES))
    if unknown:
        raise DcgmExporterError(f"dcgm-exporter runs on NVIDIA GPUs only; the fleet has {', '.join(unknown)}: "
                                "use the agent exporter for it")


def _busy(gpu: SimulatedGpu) -> float:
    return 0.0 if gpu.idle else gpu.workload.busy


class DcgmNodeExporter:
    """dcgm-exporter on one simulated node: what DCGM keeps between reads (each GPU's last XID and
    its NVLink counters at the previous read) and the series of the current state."""

    def __init__(self, fleet: Fleet, node: SimNode, opt_in: bool = True) -> None:
        check_fleet(fleet)
        self.fleet, self.node, self.opt_in = fleet, node, opt_in
        self.fields = DEFAULT_FIELDS + (OPT_IN_FIELDS if opt_in else ())
        self.instance = f"{node.name}:{PORT}"
        self._xid_counts: list[dict[int, int]] = [{} for _ in node.gpus]
        self._last_xid = [0] * len(node.gpus)
        self._nvlink: list[tuple[float, float] | None] = [None] * len(node.gpus)
        self._fixed = [self._fixed_labels(gpu) for gpu in node.gpus]

    def _fixed_labels(self, gpu: SimulatedGpu) -> Pairs:
        i = gpu.index
        return (("gpu", str(i)), ("UUID", gpu.uuid), ("pci_bus_id", f"00000000:{(0x18 + 0x10 * i) % 256:02X}:00.0"),
                ("device", f"nvidia{i}"), ("modelName", DEVICE_NAMES[gpu.model.name]), (HOST_LABEL, self.node.name),
                ("DCGM_FI_DRIVER_VERSION", SIM_DRIVER_VERSION))

    def _observe(self) -> None:
        """Move DCGM's own state on to now: a count that grew is a new last XID; NVLink rates."""
        now = self.fleet.t
        for position, gpu in enumerate(self.node.gpus):
            seen = self._xid_counts[position]
            grown = [code for code, count in gpu.xids.items() if count > seen.get(code, 0)]
            if grown:
                self._last_xid[position] = max(grown)
                self._xid_counts[position] = dict(gpu.xids)
        self._rates = []
        for position, gpu in enumerate(self.node.gpus):
            total = sum(gpu.c.nvlink_tx) + sum(gpu.c.nvlink_rx)
            before = self._nvlink[position]
            rate = (total - before[1]) / (now - before[0]) if before and now > before[0] else 0.0
            self._rates.append(rate)
            self._nvlink[position] = (now, total)

    def _values(self, position: int, gpu: SimulatedGpu) -> dict[str, float]:
        busy = _busy(gpu)
        events = gpu.clock_events()
        c = gpu.c
        return {
            "DCGM_FI_DEV_SM_CLOCK": round(gpu.sm_clock_hz / MHZ), "DCGM_FI_DEV_MEM_CLOCK": gpu.model.memory_clock_mhz,
            "DCGM_FI_DEV_GPU_TEMP": int(gpu.temperature_c), "DCGM_FI_DEV_POWER_USAGE": gpu.power_watts,
            "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": int(c.pcie_replays), "DCGM_FI_DEV_GPU_UTIL": round(100 * min(1.0, busy)),
            XID_FIELD: self._last_xid[position],
            "DCGM_FI_DEV_FB_USED": int(gpu.model.memory_bytes * gpu.workload.memory_fraction / MIB),
            "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": int(self._rates[position] / NVLINK_UNIT_BYTES),
            "DCGM_FI_DEV_ROW_REMAP_FAILURE": 0, "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": min(gpu.workload.tensor, busy),
            "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": clock_event_mask(events),
            "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": int(c.ecc_uncorrected),
            "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL": int(sum(c.nvlink_crc)),
            "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL": 0,
            "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL": int(sum(c.nvlink_replay)),
            "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL": int(sum(c.nvlink_recovery)),
            "DCGM_FI_DEV_PCIE_LINK_GEN": gpu.model.pcie_generation,
            "DCGM_FI_DEV_PCIE_LINK_WIDTH": gpu.faults.pcie_width or gpu.model.pcie_width,
            "DCGM_FI_DEV_PCIE_MAX_LINK_GEN": gpu.model.pcie_generation,
            "DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH": gpu.model.pcie_width,
        }

    def series(self, wanted: set[str] | None = None) -> Iterator[tuple[str, Pairs, float]]:
        """Every series now, field by field: (name, labels in dcgm-exporter's order, value)."""
        self._observe()
        state = self.fleet.active_job(self.node)
        job: Pairs = (("hpc_job", state.runner.spec.id),) if state is not None else ()
        values = [None if gpu.lost else self._values(p, gpu) for p, gpu in enumerate(self.node.gpus)]
        for name, _, _, _ in self.fields:
            if wanted is not None and name not in wanted:
                continue
            for position in range(len(self.node.gpus)):
                if name == XID_FIELD:
                    code = self._last_xid[position]
                    yield name, self._fixed[position] + (
                        ("err_code", str(code)), ("err_msg", xid_message(code))) + job, float(code)
                elif values[position] is not None:
                    yield name, self._fixed[position] + job, float(values[position][name])

    def render(self) -> bytes:
        """The /metrics body, as dcgm-exporter's text template writes it."""
        kinds = {name: (prom_type, help_text, kind) for name, prom_type, help_text, kind in self.fields}
        out: list[str] = []
        current = ""
        for name, pairs, value in self.series():
            prom_type, help_text, kind = kinds[name]
            if name != current:
                out.append(f"# HELP {name} {help_text}\n# TYPE {name} {prom_type}\n")
                current = name
            labels = ",".join(f'{key}="{text}"' for key, text in pairs)
            out.append(f"{name}{{{labels}}} {int(value) if kind == 'int' else f'{value:f}'}\n")
        return "".join(out).encode()


def xid_message(code: int) -> str:
    """dcgm-exporter's `err_msg` (internal/pkg/collector/xid_errors.go): 0 is "No Error"."""
    return "No Error" if code == 0 else xid_catalogue.lookup(code).meaning

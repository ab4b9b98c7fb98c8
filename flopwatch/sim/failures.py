"""Job interruptions drawn at a published failure rate and mix (the scenario's `failures:` key).

    failures:
      preset: llama3       # Llama 3's 419 unplanned interruptions in 54 days on 16,384 GPUs
      rate_scale: 1000     # x the preset's rate per GPU-hour (a short run sees a long run's failures)
      seed: 5              # default: the scenario's
      detect: 2m           # mean time from the failure to its detection (drawn 0.5-1.5x)
      restart: 8m          # mean time from detection to the first step again (drawn 0.5-1.5x)

Each job fails as a Poisson process at rate x its GPUs while it runs (the clock stops while it is
down). An interruption stops every step of the job for detection + restart, then the job resumes
from its last checkpoint, so the steps since it are done again (lost progress). Its cause is one
of Llama 3's root-cause categories (arXiv 2407.21783, Table 5), drawn by their counts, and each
leaves what telemetry would show: a faulty GPU falls off the bus (XID 79, lost until the
restart), HBM3, SRAM and GSP faults raise an XID (48, 94, 119), a switch, cable or NIC fault takes
an InfiniBand link down; software, host and the rest leave no trace in node telemetry ("none":
the simulated agent keeps reporting through a host failure).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

#: Llama 3's root causes of its 419 unplanned interruptions (Table 5): count and what node
#: telemetry shows (the rules' cause label). Faulty GPU 148 is the table's count (its 30.1% is as
#: printed there).
LLAMA3_CAUSES: tuple[tuple[str, int, str], ...] = (
    ("faulty_gpu", 148, "gpu_lost"), ("gpu_hbm3_memory", 72, "xid"), ("software_bug", 54, "none"),
    ("network_switch_cable", 35, "nic_down"), ("host_maintenance", 32, "none"), ("gpu_sram_memory", 19, "xid"),
    ("gpu_system_processor", 17, "xid"), ("nic", 7, "nic_down"), ("nccl_watchdog_timeout", 7, "none"),
    ("silent_data_corruption", 6, "none"), ("gpu_thermal_interface", 6, "none"), ("ssd", 3, "none"),
    ("power_supply", 3, "none"), ("server_chassis", 2, "none"), ("io_expansion_board", 2, "none"),
    ("dependency", 2, "none"), ("cpu", 2, "none"), ("system_memory", 2, "none"),
)
#: 419 interruptions over 54 days x 24 h x 16,384 GPUs.
LLAMA3_PER_GPU_HOUR = 419 / (54 * 24 * 16384)
PRESETS = {"llama3": (LLAMA3_PER_GPU_HOUR, LLAMA3_CAUSES)}
#: The XID each GPU-side cause raises (NVIDIA's Xid catalogue: 48 double-bit ECC, 94 contained
#: ECC, 119 GSP RPC timeout, 79 fallen off the bus).
XID_OF = {"faulty_gpu": 79, "gpu_hbm3_memory": 48, "gpu_sram_memory": 94, "gpu_system_processor": 119}

#: Truth fault records of drawn interruptions are numbered from here (the scenario's count up
#: from 0, a trace's blamed worker down from -1), with the fault kind and cause alerts are
#: scored against: a software crash or a host failure is a fault of the job's node no node alert
#: can name.
TRUTH_INDEX = 10_000
FAULT_KIND = {"gpu_lost": "gpu_lost", "xid": "xid", "nic_down": "nic_link_flap", "none": "job_interruption"}
FAULT_CAUSE = {"gpu_lost": "gpu_lost", "xid": "xid", "nic_down": "nic", "none": "unknown"}


@dataclass(frozen=True)
class FailureSpec:
    preset: str
    per_gpu_hour: float
    seed: int
    detect_s: float
    restart_s: float


@dataclass
class Interruption:
    """One drawn interruption of one job; `restarted` and `lost_steps` are filled as it plays out."""

    job_id: str
    start: float
    end: float               # the job steps again from here (start + detection + restart)
    detect_s: float
    cause: str               # Llama 3's category
    telemetry: str           # what the rules should name: gpu_lost, xid, nic_down or none
    node: int
    gpu: int
    nic: int | None
    xid: int | None
    restarted: bool = False
    fired: bool = False
    lost_steps: int = 0
    record: dict[str, Any] = field(default_factory=dict)   # its ground truth, completed at the restart

    def __post_init__(self) -> None:
        self.record.update(job_id=self.job_id, start=self.start, restart_at=None, cause=self.cause,
                           telemetry_cause=self.telemetry, detect_seconds=self.detect_s, restart_seconds=None,
                           node=self.node, gpu=self.gpu, nic=self.nic, xid=self.xid, lost_steps=None)


def parse(data: Any, where: str, seed: int, reader: Any, error: type[Exception]) -> FailureSpec:
    """The `failures:` mapping, read with the scenario's field reader (errors name the field)."""
    r = reader(data, where)
    r.check_keys({"preset", "rate_scale", "rate_per_1k_gpu_hours", "seed", "detect", "restart"})
    preset = r.text("preset", "llama3")
    if preset not in PRESETS:
        raise error(f"{where}.preset: unknown preset {preset!r} (known: {', '.join(PRESETS)})")
    if r.has("rate_per_1k_gpu_hours"):
        per_gpu_hour = r.number("rate_per_1k_gpu_hours", 0, 1e6) / 1000
    else:
        per_gpu_hour = PRESETS[preset][0] * r.number("rate_scale", 0, 1e6, 1.0)
    return FailureSpec(preset=preset, per_gpu_hour=per_gpu_hour, seed=r.integer("seed", 0, 2**32 - 1, seed),
                       detect_s=r.duration("detect", 120.0), restart_s=r.duration("restart", 480.0))


def draw(spec: FailureSpec, jobs: list[Any], gpus_per_node: int, nics_per_node: int,
         duration: float) -> list[Interruption]:
    """Every interruption of every job, in time order per job; the same seed draws the same ones."""
    causes = PRESETS[spec.preset][1]
    weights = np.array([count for _, count, _ in causes], dtype=float)
    weights /= weights.sum()
    out: list[Interruption] = []
    for index, job in enumerate(jobs):
        rng = np.random.default_rng([spec.seed, index, 16])
        gpus = len(job.nodes) * gpus_per_node
        rate = spec.per_gpu_hour * gpus / 3600.0          # per second of running
        if rate <= 0:
            continue
        t, end = job.start, job.end if job.end is not None else duration
        while True:
            t += rng.exponential(1 / rate)
            if t >= end:
                break
            cause, _, telemetry = causes[int(rng.choice(len(causes), p=weights))]
            if telemetry == "nic_down" and not nics_per_node:
                telemetry = "none"
            detect = spec.detect_s * rng.uniform(0.5, 1.5)
            down = detect + spec.restart_s * rng.uniform(0.5, 1.5)
            out.append(Interruption(
                job_id=job.id, start=t, end=t + down, detect_s=detect, cause=cause, telemetry=telemetry,
                node=int(job.nodes[int(rng.integers(len(job.nodes)))]), gpu=int(rng.integers(gpus_per_node)),
                nic=int(rng.integers(nics_per_node)) if telemetry == "nic_down" else None,
                xid=XID_OF.get(cause) if telemetry in ("xid", "gpu_lost") else None))
            t += down
    return out


def young_daly(save_seconds: float, mtbf_seconds: float) -> float:
    """First-order optimal checkpoint interval sqrt(2 x C x MTBF) (Young 1974, Daly 2006)."""
    return math.sqrt(2 * save_seconds * mtbf_seconds) if save_seconds > 0 and mtbf_seconds > 0 else math.inf

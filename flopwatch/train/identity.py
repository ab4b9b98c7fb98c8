"""Who a training rank is: its job, rank, local rank, GPU and pipeline coordinates, from the
arguments StepMonitor was given or else the launcher's environment (Slurm, torchrun,
FLOPWATCH_*). A bad argument is a ValueError; a bad environment value is logged and ignored.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

from flopwatch.train import wire

log = logging.getLogger("flopwatch.train")

JOB_ENV = ("FLOPWATCH_JOB_ID", "SLURM_JOB_ID", "TORCHELASTIC_RUN_ID")
RANK_ENV = ("RANK", "SLURM_PROCID")
LOCAL_RANK_ENV = ("LOCAL_RANK", "SLURM_LOCALID")
GPU_ENV = "FLOPWATCH_GPU"
PP_STAGE_ENV, DP_RANK_ENV, TP_RANK_ENV = ("FLOPWATCH_PP_STAGE",), ("FLOPWATCH_DP_RANK",), ("FLOPWATCH_TP_RANK",)
PP_SIZE_ENV, DP_SIZE_ENV, TP_SIZE_ENV = ("FLOPWATCH_PP_SIZE",), ("FLOPWATCH_DP_SIZE",), ("FLOPWATCH_TP_SIZE",)


def coordinates(env: Mapping[str, str], **given: int | None) -> tuple[int, int, int, int, int, int]:
    """(pp_stage, pp_size, tp_rank, tp_size, dp_rank, dp_size) from arguments, else the environment;
    -1 / 0 where unknown. A rank at or beyond its size is refused (ValueError)."""
    def one(name: str, env_names: tuple[str, ...], default: int, low: int, high: int) -> int:
        return env_int(given[name], env_names, env, default, low, high, name.replace("_", " "))

    stage = one("pp_stage", PP_STAGE_ENV, -1, -1, wire.MAX_STAGES - 1)
    stages = one("pp_size", PP_SIZE_ENV, 0, 0, wire.MAX_STAGES)
    tp_rank = one("tp_rank", TP_RANK_ENV, -1, -1, 32767)
    tp_size = one("tp_size", TP_SIZE_ENV, 0, 0, 32767)
    dp_rank = one("dp_rank", DP_RANK_ENV, -1, -1, wire.MAX_PARALLEL - 1)
    dp_size = one("dp_size", DP_SIZE_ENV, 0, 0, wire.MAX_PARALLEL)
    for what, index, count in (("pp_stage", stage, stages), ("tp_rank", tp_rank, tp_size),
                               ("dp_rank", dp_rank, dp_size)):
        if count and index >= count:
            raise ValueError(f"StepMonitor: {what} = {index} but the size is {count}; expected 0..{count - 1}")
    return stage, stages, tp_rank, tp_size, dp_rank, dp_size


def job_from_env(env: Mapping[str, str]) -> str:
    for name in JOB_ENV:
        if env.get(name, "").strip():
            return env[name].strip()
    if env.get("MASTER_PORT", "").strip():   # ranks of one local torch.distributed run share it
        return f"local-{env['MASTER_PORT'].strip()}"
    return f"local-{os.getpid()}"


def clean_job_id(job_id: Any) -> str:
    text = "".join(c if c.isascii() and c.isprintable() and c not in '"\\' else "_" for c in str(job_id))
    if text != str(job_id) or len(text) > wire.MAX_JOB_ID:
        log.warning("flopwatch: job_id %r sent as %r (printable ASCII, at most %d characters)",
                    job_id, text[:wire.MAX_JOB_ID], wire.MAX_JOB_ID)
    return text[:wire.MAX_JOB_ID] or "unknown"


def env_int(value: int | None, names: tuple[str, ...], env: Mapping[str, str], default: int,
             low: int, high: int, what: str) -> int:
    if value is not None:
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise ValueError(f"StepMonitor: {what} = {value!r}; expected an integer {low}..{high}")
        return value
    for name in names:
        text = env.get(name, "").strip()
        if not text:
            continue
        try:
            number = int(text)
        except ValueError:
            number = low - 1
        if low <= number <= high:
            return number
        log.warning("flopwatch: %s=%r is not a %s (%d..%d); using %d", name, text, what, low, high, default)
        return default
    return default


def resolve_gpu(device_index: int | None, local_rank: int, env: Mapping[str, str]) -> int:
    """This process's GPU index as the node (and NVML) numbers it, or -1 when it cannot be known.

    `device_index` is the CUDA device the process uses (None: assume cuda:local_rank, as torchrun
    does); CUDA_VISIBLE_DEVICES renumbers devices, so map through it when it lists indices.
    """
    if env.get(GPU_ENV, "").strip().isdigit():
        return min(int(env[GPU_ENV]), 32767)
    visible = env.get("CUDA_VISIBLE_DEVICES")
    entries = [item.strip() for item in visible.split(",")] if visible is not None else None
    if device_index is None:
        if entries is not None and len(entries) == 1:
            device_index = 0        # one GPU bound per task (Slurm): whatever the local rank
        elif local_rank >= 0:
            device_index = local_rank
        else:
            return -1
    if entries is None:
        return min(device_index, 32767)
    if device_index < len(entries) and entries[device_index].isdigit():
        return min(int(entries[device_index]), 32767)
    return -1

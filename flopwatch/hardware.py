"""GPU models FlopWatch knows: dense peak FLOP/s per dtype (the MFU denominator) and the figures
the simulator needs (clocks, power, memory, NVLink).

Peaks are dense Tensor Core figures from the vendors' datasheets (DESIGN.md, REFERENCES.md):
A100 312 TF, H100/H200 SXM 989.4 TF, B200 2,250 TF, GB200 2,500 TF, MI300X/MI325X 1,307.4 TF for
BF16. Sparse peaks are twice these and are never an MFU denominator.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

TERA = 1e12
GIB = 1024**3


@dataclass(frozen=True)
class GpuModel:
    name: str                      # FlopWatch's canonical name, used in scenarios and config
    patterns: tuple[str, ...]      # regexes matched against NVML's device name
    peak_dense_flops: dict[str, float]   # dtype -> dense FLOP/s
    sm_clock_max_mhz: float
    sm_clock_idle_mhz: float
    memory_clock_mhz: float
    power_limit_watts: float
    idle_power_watts: float
    memory_bytes: int
    nvlink_links: int
    nvlink_link_bytes_per_second: float   # per direction per link
    pcie_generation: int
    pcie_width: int = 16
    extra: dict[str, str] = field(default_factory=dict)


MODELS: tuple[GpuModel, ...] = (
    GpuModel(
        "A100-SXM", (r"A100.*SXM", r"A100-SXM", r"A100 80GB", r"A100-40GB", r"^NVIDIA A100$"),
        {"bf16": 312 * TERA, "fp16": 312 * TERA, "tf32": 156 * TERA, "fp32": 19.5 * TERA},
        1410, 210, 1593, 400, 55, 80 * GIB, 12, 25e9, 4,
    ),
    GpuModel(
        "H100-SXM", (r"H100.*(SXM|HBM3)", r"H100 80GB HBM3"),
        {"bf16": 989.4 * TERA, "fp16": 989.4 * TERA, "tf32": 494.7 * TERA, "fp8": 1978.9 * TERA,
         "fp32": 66.9 * TERA},
        1980, 345, 2619, 700, 70, 80 * GIB, 18, 25e9, 5,
    ),
    GpuModel(
        "H100-PCIe", (r"H100.*PCIe",),
        {"bf16": 756 * TERA, "fp16": 756 * TERA, "tf32": 378 * TERA, "fp8": 1513 * TERA,
         "fp32": 51.2 * TERA},
        1755, 345, 1593, 350, 50, 80 * GIB, 0, 0.0, 5,
    ),
    GpuModel(
        "H200-SXM", (r"H200",),
        {"bf16": 989.4 * TERA, "fp16": 989.4 * TERA, "tf32": 494.7 * TERA, "fp8": 1978.9 * TERA,
         "fp32": 66.9 * TERA},
        1980, 345, 3201, 700, 75, 141 * 10**9, 18, 25e9, 5,
    ),
    GpuModel(
        "B200", (r"(^|[^G])B200",),       # not GB200's name (no look-behind: Prometheus's RE2 reads these too)
        {"bf16": 2250 * TERA, "fp16": 2250 * TERA, "tf32": 1125 * TERA, "fp8": 4500 * TERA},
        1965, 345, 3996, 1000, 120, 180 * 10**9, 18, 50e9, 5,
    ),
    GpuModel(
        "GB200", (r"GB200",),
        {"bf16": 2500 * TERA, "fp16": 2500 * TERA, "tf32": 1250 * TERA, "fp8": 5000 * TERA},
        2062, 345, 3996, 1200, 140, 186 * 10**9, 18, 50e9, 6,
    ),
    GpuModel(
        "MI300X", (r"MI300X",),
        {"bf16": 1307.4 * TERA, "fp16": 1307.4 * TERA, "tf32": 653.7 * TERA, "fp8": 2614.9 * TERA},
        2100, 500, 1300, 750, 140, 192 * GIB, 7, 64e9, 5,
    ),
    GpuModel(
        "MI325X", (r"MI325X",),
        {"bf16": 1307.4 * TERA, "fp16": 1307.4 * TERA, "tf32": 653.7 * TERA, "fp8": 2614.9 * TERA},
        2100, 500, 1300, 1000, 160, 256 * GIB, 7, 64e9, 5,
    ),
)

DTYPES = ("bf16", "fp16", "tf32", "fp8", "fp32")

_BY_NAME = {model.name.lower(): model for model in MODELS}


def model_by_name(name: str) -> GpuModel | None:
    """A model by FlopWatch's canonical name (case-insensitive), e.g. 'H100-SXM'."""
    return _BY_NAME.get(name.lower())


def match_device_name(device_name: str) -> GpuModel | None:
    """The model for a name as NVML reports it ('NVIDIA H100 80GB HBM3'), or None if unknown."""
    for model in MODELS:
        if any(re.search(pattern, device_name, re.IGNORECASE) for pattern in model.patterns):
            return model
    return None


def known_names() -> list[str]:
    return [model.name for model in MODELS]

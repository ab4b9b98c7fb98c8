"""One prepared hardware check: FlopWatch's telemetry against a bf16 GEMM whose FLOPs are counted.

On a GPU node it runs `flopwatch doctor`, starts `flopwatch agent --backend nvml --interval 1`,
scrapes it every second, and runs a bf16 GEMM load with PyTorch on GPU 0 at two sizes (about a
minute in all). Per size it compares:

- the GEMM's measured MFU (2 n^3 FLOPs x GEMMs counted / elapsed / the GPU's dense bf16 peak) with
  FlopWatch's telemetry-only MFU (tensor activity x SM clock / max SM clock, as the recording rule
  in alerts/flopwatch-mfu.yml computes it); the goal is within 2 percentage points;
- the energy counter's increase with the integral of the power samples over the same scrapes.

Without a GPU it runs against the test NVML library (tests/nvml_driver) and says so: the GEMM
runs on the CPU, so its MFU is not comparable; instead the library is given a known tensor
activity and power per phase and the check verifies that FlopWatch hands them back (the pipeline,
not the hardware). No network is used. Writes device_check.json and device_check.md into --out.

    .venv/bin/python -m bench.device_check [--duration 60] [--sizes 8192,16384] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from flopwatch.stack import AgentProcess

ROOT = Path(__file__).resolve().parent.parent
FLOPWATCH = str(Path(sys.executable).parent / "flopwatch")
GOAL_PP = 2.0
WARMUP_SCRAPES = 2       # GPM averages over the previous interval: skip the first scrapes of a phase
#: what the test library is told per phase when there is no GPU: (tensor activity %, SM MHz, power mW)
LIBRARY_PHASES = ((62, 1980, 650_000), (41, 1755, 520_000))


class Agent(AgentProcess):
    """The agent on the NVML backend at a 1 s interval."""

    def args(self) -> list[str]:
        return ["agent", "--backend", "nvml", "--interval", "1", "--node", "device-check",
                "--listen", f"{self.host}:{self.port}"]


@dataclass
class Phase:
    size: int
    started: float = 0.0
    ended: float = 0.0
    gemms: int = 0
    measured_flops: float = 0.0
    measured_mfu: float = 0.0
    telemetry_mfu: float | None = None
    injected_mfu: float | None = None     # the test library only
    samples: int = 0


@dataclass
class Report:
    mode: str
    device: str
    peak_flops: float | None = None
    phases: list[Phase] = field(default_factory=list)
    energy_counter_j: float | None = None
    energy_integrated_j: float | None = None
    families: dict[str, str] = field(default_factory=dict)
    doctor_exit: int | None = None
    host: dict[str, Any] = field(default_factory=dict)


class Scraper(threading.Thread):
    """Scrapes the agent every second: (time, {metric: value}) for GPU 0."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True, name="device-check-scraper")
        self.url, self.samples = url, []
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(1.0):
            try:
                with urllib.request.urlopen(self.url + "/metrics", timeout=5) as answer:
                    text = answer.read().decode()
            except OSError:   # one missed scrape is one sample fewer, not a failed check
                continue
            values: dict[str, float] = {}
            for family in text_string_to_metric_families(text):
                for s in family.samples:
                    if s.labels.get("gpu") == "0" and s.labels.get("dtype", "bf16") == "bf16":
                        values[s.name] = s.value
            self.samples.append((time.monotonic(), values))


def gpu_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def library_environment(workdir: Path) -> tuple[dict[str, str], Any]:
    """The test NVML library with one H100, for a machine without a GPU."""
    sys.path.insert(0, str(ROOT / "tests"))
    from nvml_driver import DriverState, environment

    state = DriverState(workdir / "driver", ["H100"])
    return environment(state.path), state


def gemm_phase(size: int, seconds: float, device: str, peak: float) -> Phase:
    """Multiply two bf16 matrices back to back for `seconds`; count the GEMMs, synchronise, time."""
    import torch

    a = torch.randn(size, size, dtype=torch.bfloat16, device=device)
    b = torch.randn(size, size, dtype=torch.bfloat16, device=device)
    out = torch.empty(size, size, dtype=torch.bfloat16, device=device)
    torch.matmul(a, b, out=out)   # warm-up (kernel selection) outside the timed window
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    sync()
    phase = Phase(size, started=time.monotonic())
    deadline = phase.started + seconds
    batch = 1
    while time.monotonic() < deadline:
        for _ in range(batch):
            torch.matmul(a, b, out=out)
        phase.gemms += batch
        sync()
        batch = min(batch * 2, 64)
    phase.ended = time.monotonic()
    phase.measured_flops = 2.0 * size**3 * phase.gemms / (phase.ended - phase.started)
    phase.measured_mfu = phase.measured_flops / peak
    return phase


def telemetry_mfu(samples: list[tuple[float, dict[str, float]]], phase: Phase) -> tuple[float | None, int]:
    """Mean of tensor activity x SM clock / max SM clock over the phase's scrapes, after warm-up."""
    inside = [v for t, v in samples if phase.started <= t <= phase.ended][WARMUP_SCRAPES:]
    values = [v["flopwatch_gpu_tensor_active_ratio"] * v["flopwatch_gpu_sm_clock_hertz"]
              / v["flopwatch_gpu_sm_clock_max_hertz"]
              for v in inside if "flopwatch_gpu_tensor_active_ratio" in v]
    return (sum(values) / len(values) if values else None), len(values)


def energy(samples: list[tuple[float, dict[str, float]]], start: float, end: float) -> tuple[float, float] | None:
    """(energy counter increase, trapezoid integral of power) over the scrapes between start and end."""
    inside = [(t, v) for t, v in samples if start <= t <= end and "flopwatch_gpu_power_watts" in v
              and "flopwatch_gpu_energy_joules_total" in v]
    if len(inside) < 2:
        return None
    counter = inside[-1][1]["flopwatch_gpu_energy_joules_total"] - inside[0][1]["flopwatch_gpu_energy_joules_total"]
    integral = sum((t2 - t1) * (v1["flopwatch_gpu_power_watts"] + v2["flopwatch_gpu_power_watts"]) / 2
                   for (t1, v1), (t2, v2) in pairwise(inside))
    return counter, integral


def run_doctor(env: dict[str, str], report: Report) -> None:
    result = subprocess.run([FLOPWATCH, "doctor", "--backend", "nvml", "--json"], capture_output=True, text=True,
                            env=env, timeout=120, check=False)
    report.doctor_exit = result.returncode
    try:
        checks = json.loads(result.stdout)["checks"]
    except (ValueError, KeyError):
        report.families = {"doctor": f"no JSON (exit {result.returncode}): {result.stderr.strip()[:200]}"}
        return
    report.families = {c["check"]: c["status"] for c in checks if c["section"] in ("families", "gpu")}


def measure(args: argparse.Namespace, report: Report, env: dict[str, str], state: Any) -> None:
    """Doctor, the agent, the scraper and the GEMM phases; fills the report."""
    run_doctor(env, report)
    saved = dict(os.environ)
    os.environ.update(env)   # the agent subprocess inherits it
    try:
        agent = Agent().start()
    finally:
        os.environ.clear()
        os.environ.update(saved)
    scraper = Scraper(agent.url)
    try:
        scraper.start()
        time.sleep(2.5)   # two collections: GPM has its first interval
        peak = scraper.samples[-1][1].get("flopwatch_gpu_peak_dense_flops") if scraper.samples else None
        report.peak_flops = peak
        device = "cuda" if report.mode == "gpu" else "cpu"
        seconds = args.duration / len(args.sizes)
        for number, size in enumerate(args.sizes):
            injected = None
            if state is not None:   # tell the library what this phase "does"
                tensor, clock, power = LIBRARY_PHASES[number % len(LIBRARY_PHASES)]
                state.set(0, tensor_active=tensor, sm_mhz=clock, power_mw=power)
                injected = tensor / 100 * clock / 1980
            phase = gemm_phase(size, seconds, device, peak or 1.0)
            phase.injected_mfu = injected
            report.phases.append(phase)
        time.sleep(1.2)   # the last phase's final scrape
    finally:
        scraper.done.set()
        scraper.join(timeout=5)
        agent.stop()
    for phase in report.phases:
        phase.telemetry_mfu, phase.samples = telemetry_mfu(scraper.samples, phase)
    figures = energy(scraper.samples, report.phases[0].started, report.phases[-1].ended)
    if figures is not None:
        report.energy_counter_j, report.energy_integrated_j = figures


def markdown(report: Report) -> str:
    lines = [f"# FlopWatch device check ({report.mode})", "", f"Device: {report.device}", ""]
    if report.mode != "gpu":
        lines += ["No GPU: telemetry came from the test NVML library, told a known tensor activity per phase;",
                  "the GEMM ran on the CPU, so its MFU is not comparable. This checks the pipeline only.", ""]
    lines += ["| GEMM size | GEMMs | measured TFLOP/s | measured MFU | telemetry MFU | reference | difference |",
              "|---|---|---|---|---|---|---|"]
    for p in report.phases:
        reference = p.injected_mfu if p.injected_mfu is not None else p.measured_mfu
        label = "injected" if p.injected_mfu is not None else "measured"
        diff = "n/a" if p.telemetry_mfu is None else f"{(p.telemetry_mfu - reference) * 100:+.2f} pp"
        telemetry = "absent" if p.telemetry_mfu is None else f"{p.telemetry_mfu * 100:.2f}%"
        lines.append(f"| {p.size} | {p.gemms} | {p.measured_flops / 1e12:.3f} | {p.measured_mfu * 100:.2f}% | "
                     f"{telemetry} | {label} {reference * 100:.2f}% | {diff} |")
    if report.energy_counter_j is not None and report.energy_integrated_j:
        error = (report.energy_counter_j / report.energy_integrated_j - 1) * 100
        lines += ["", f"Energy: counter {report.energy_counter_j:.1f} J, integrated power "
                  f"{report.energy_integrated_j:.1f} J ({error:+.2f}%)."]
    lines += ["", f"`flopwatch doctor` exit {report.doctor_exit}:", "", "| check | status |", "|---|---|"]
    lines += [f"| {name} | {status} |" for name, status in report.families.items()]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of GEMM load in all (default 60)")
    parser.add_argument("--sizes", default="8192,16384", help="GEMM sizes n (n x n bf16), comma-separated")
    parser.add_argument("--out", default="device-check", help="directory for device_check.json and .md")
    args = parser.parse_args(argv)
    args.sizes = [int(size) for size in args.sizes.split(",") if size]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="flopwatch-device-check-") as workdir:
        if gpu_available():
            import torch

            report, env, state = Report("gpu", torch.cuda.get_device_name(0)), dict(os.environ), None
        else:
            env, state = library_environment(Path(workdir))
            report = Report("driver-library", "test NVML library (no GPU on this machine), GEMM on CPU")
            print("device check: no GPU here; running against the test NVML library", file=sys.stderr)
        report.host = {"machine": platform.node(), "load": os.getloadavg(), "cpus": os.cpu_count()}
        measure(args, report, env, state)
    (out / "device_check.json").write_text(json.dumps(asdict(report), indent=2) + "\n")
    (out / "device_check.md").write_text(markdown(report))
    print(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())

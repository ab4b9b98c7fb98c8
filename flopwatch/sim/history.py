"""History export: a simulated span (a week, say) written far faster than wall-clock, in the
Prometheus text format with millisecond timestamps that VictoriaMetrics imports at
`/api/v1/import/prometheus` (gzip chunks, one per `chunk` of simulated time).

The samples are the same bytes a scrape would return (each node's SimNodeAgent renders them), with
the timestamp of the tick appended, so loaded history and live scraping cannot differ.
"""

from __future__ import annotations

import gzip
import json
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from flopwatch.sim.fleet import Fleet
from flopwatch.sim.node import SimNodeAgent

MANIFEST = "manifest.json"


@dataclass
class ExportStats:
    samples: int
    ticks: int
    seconds: float
    files: list[str]

    @property
    def samples_per_second(self) -> float:
        return self.samples / self.seconds if self.seconds else 0.0


def timestamped(exposition: bytes, timestamp_ms: int) -> tuple[bytes, int]:
    """Sample lines of an exposition with ` <timestamp_ms>` appended; comments dropped."""
    suffix = b" %d" % timestamp_ms
    lines = [line + suffix for line in exposition.split(b"\n") if line and not line.startswith(b"#")]
    return b"\n".join(lines) + b"\n", len(lines)


def export(fleet: Fleet, out_dir: str | Path, span: float, step: float, *, chunk: float = 6 * 3600.0,
           nvlink_per_link: bool = False, progress: Callable[[float], None] | None = None) -> ExportStats:
    """Advance `fleet` by `span` seconds in ticks of `step`, writing every node's samples."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    agents = [SimNodeAgent(fleet, node, nvlink_per_link) for node in fleet.nodes]
    started = time.perf_counter()
    samples = ticks = 0
    files: list[str] = []
    writer = None
    chunk_end = 0.0
    try:
        while fleet.t < span - 1e-9:
            fleet.advance(min(step, span - fleet.t))
            ticks += 1
            if writer is None or fleet.t > chunk_end:
                if writer is not None:
                    writer.close()
                name = f"history-{len(files):04d}.prom.gz"
                files.append(name)
                writer = gzip.open(out / name, "wb", compresslevel=1)  # noqa: SIM115 - closed below
                chunk_end = fleet.t + chunk
            stamp = int(fleet.now_unix * 1000)
            for agent in agents:
                data, count = timestamped(agent.render(), stamp)
                writer.write(data)
                samples += count
            if progress is not None:
                progress(fleet.t)
    finally:
        if writer is not None:
            writer.close()
    elapsed = time.perf_counter() - started
    manifest = {"scenario": fleet.scenario.name, "start_unix": fleet.start_unix,
                "end_unix": fleet.now_unix, "step": step, "samples": samples, "files": files}
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1))
    return ExportStats(samples, ticks, elapsed, files)


def load_into_victoria_metrics(url: str, history_dir: str | Path, extra_labels: dict[str, str] | None = None) -> int:
    """POST every chunk to VictoriaMetrics' import API; returns the samples the manifest promises."""
    history = Path(history_dir)
    manifest = json.loads((history / MANIFEST).read_text())
    query = "&".join(f"extra_label={k}={v}" for k, v in (extra_labels or {}).items())
    target = f"{url.rstrip('/')}/api/v1/import/prometheus" + (f"?{query}" if query else "")
    for name in manifest["files"]:
        request = urllib.request.Request(target, data=(history / name).read_bytes(), method="POST",
                                         headers={"Content-Encoding": "gzip"})
        with urllib.request.urlopen(request, timeout=600):
            pass
    with urllib.request.urlopen(f"{url.rstrip('/')}/internal/force_flush", timeout=60):
        pass
    return int(manifest["samples"])

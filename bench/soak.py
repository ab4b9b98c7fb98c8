"""Soak: 100 concurrent scrapers and 20,000 training-step events a second against one agent.

The agent is the real `flopwatch agent` (simulated 8x H100 SXM, per-link NVLink, NIC and host
collectors on, `--train`, 1 s interval) as a subprocess. Against it, for `--duration` seconds:

* `--scrapers` (100) keep-alive HTTP clients on one asyncio loop in this process, all firing at
  the same instant every `--scrape-interval` (1 s): the worst case, 100 requests queued at once.
  A scrape fails on a non-200 answer, a body that is cut or not an exposition, a connection error
  or no answer within 10 s; failed scrapes must be zero.
* a sender process on its own core sends `--events-per-s` (20,000) step datagrams in the client's
  wire format from `--ranks` (64) ranks of 4 jobs, with running totals that grow, paced every
  10 ms. It blocks on a full socket queue (the kernel loses nothing) and reports how far behind
  the target it fell; the agent's accepted and rejected counters are read at the end.
* the agent's RSS is sampled every 5 s; growth is measured from the end of `--warmup` to the end.

Reference measured in the same run: the same agent's scrape latency with one sequential client
before the load starts; the soak's p99 is reported as a ratio to it. The targets: zero
failed scrapes, p99 reported, RSS growth under 5% after warm-up.

    .venv/bin/python -m bench.soak [--duration 60] [--warmup 20] [--scrapers 100]
        [--events-per-s 20000] [--ranks 64] [--agent-nice -5] [--json OUT]

`--agent-nice -5` gives the agent the priority deploy/systemd/flopwatch-agent.service gives it
(`Nice=-5`): on a machine shared with other work, that is what decides how much CPU it gets.

The run of record (bench/RESULTS.md) is `--duration 600 --warmup 60`.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import multiprocessing
import os
import platform
import re
import socket
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path

import psutil

from flopwatch.stack import AgentProcess, MissingBinary, ServerError
from flopwatch.train import wire

SCRAPE_TIMEOUT_S = 10.0
TICK_S = 0.01
JOBS = 4
RSS_TARGET = 0.05
REFERENCE_SCRAPES = 300


# -- step events (a process of its own) ----------------------------------------------------------
def send_events(path: str, rate: float, ranks: int, duration: float, start_at: float,
                results: multiprocessing.Queue) -> None:
    """Send `rate` datagrams a second for `duration` seconds, paced in TICK_S slices."""
    packer = wire.RECORD_STRUCTS[wire.ALL_PHASES_MASK]
    per_rank = [(f"soak-{rank % JOBS}".encode(), rank) for rank in range(ranks)]
    steps = [0] * ranks
    buckets_zero = (0,) * (wire.N_BUCKETS - 1)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.settimeout(2.0)
    sock.connect(path)
    sent = timeouts = queue_full = 0
    max_lag = 0.0
    cpu_start = time.process_time()
    while time.time() < start_at:
        time.sleep(0.001)
    began = time.monotonic()
    rank = 0
    while True:
        elapsed = time.monotonic() - began
        if elapsed >= duration:
            break
        due = int(elapsed * rate) - sent
        max_lag = max(max_lag, due / rate)
        for _ in range(min(due, int(rate * 0.05))):   # at most 50 ms of backlog at once
            job, number = per_rank[rank]
            steps[rank] += 1
            n = steps[rank]
            datagram = packer.pack(
                wire.VERSION, 0, wire.ALL_PHASES_MASK, len(job), number, number % 8, number % 8, 7 + number,
                n, 0, *buckets_zero, n, n * 4096.0, n * 1e12, n * 1.3e12, n * 0.1, 0.0, 0.0,
                n * 0.01, n * 0.06, n * 0.02, n * 0.01, 0.0, 1e12, 0.0,
            ) + job
            try:
                try:
                    sock.send(datagram, socket.MSG_DONTWAIT)
                except BlockingIOError:   # the agent's queue is full: wait for its reader
                    queue_full += 1
                    sock.send(datagram)
                sent += 1
            except TimeoutError:
                timeouts += 1
                steps[rank] -= 1
            rank = (rank + 1) % ranks
        next_tick = began + (int(elapsed / TICK_S) + 1) * TICK_S
        time.sleep(max(0.0, next_tick - time.monotonic()))
    results.put({"sent": sent, "timeouts": timeouts, "seconds": time.monotonic() - began,
                 "max_lag_s": max_lag, "queue_full": queue_full, "cpu_s": time.process_time() - cpu_start})


# -- scrapers --------------------------------------------------------------------------------------
@dataclass
class ScrapeStats:
    latencies: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)


async def _scrape_once(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bytes:
    writer.write(b"GET /metrics HTTP/1.1\r\nHost: soak\r\n\r\n")
    await writer.drain()
    head = await reader.readuntil(b"\r\n\r\n")
    status = head[9:12]
    match = re.search(rb"(?i)content-length:\s*(\d+)", head)
    if match is None:
        raise ValueError("no Content-Length")
    body = await reader.readexactly(int(match.group(1)))
    if status != b"200":
        raise ValueError(f"HTTP {status.decode()}")
    if not body.startswith(b"# HELP flopwatch_") or not body.endswith(b"\n") or b"flopwatch_build_info" not in body:
        raise ValueError(f"not a whole exposition ({len(body)} bytes)")
    return body


async def _scraper(port: int, interval: float, until: float, stats: ScrapeStats) -> None:
    connection: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
    loop = asyncio.get_running_loop()
    tick = (int(time.time() / interval) + 1) * interval
    while tick < until:
        await asyncio.sleep(max(0.0, tick - time.time()))
        started = loop.time()
        try:
            if connection is None:
                connection = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), SCRAPE_TIMEOUT_S)
            await asyncio.wait_for(_scrape_once(*connection), SCRAPE_TIMEOUT_S)
            stats.latencies.append(loop.time() - started)
        except (OSError, ValueError, TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError) as error:
            stats.failures.append(f"{time.strftime('%H:%M:%S')} {type(error).__name__}: {error}")
            if connection is not None:
                connection[1].close()
            connection = None
        tick += interval
        while tick < time.time():   # a scrape that took longer than the interval skips slots
            tick += interval
    if connection is not None:
        connection[1].close()


async def _scrape_all(port: int, scrapers: int, interval: float, until: float) -> ScrapeStats:
    stats = ScrapeStats()
    await asyncio.gather(*(_scraper(port, interval, until, stats) for _ in range(scrapers)))
    return stats


# -- the run -------------------------------------------------------------------------------------
@dataclass
class Figures:
    date: str
    machine: str
    command: str
    duration_s: float
    warmup_s: float
    scrapers: int
    scrape_interval_s: float
    exposition_bytes: int
    reference_p50_ms: float
    reference_p99_ms: float
    scrapes_ok: int
    scrapes_failed: int
    first_failures: list[str]
    p50_ms: float
    p99_ms: float
    max_ms: float
    p99_ratio: float
    events_target_per_s: float
    events_sent: int
    events_sent_per_s: float
    sender_max_lag_s: float
    sender_timeouts: int
    sender_queue_full: int
    sender_cpu_percent: float
    bench_cpu_percent: float
    events_accepted: int
    events_rejected: dict[str, int]
    rss_warm_mib: float
    rss_end_mib: float
    rss_max_mib: float
    rss_growth: float
    agent_cpu_percent: float
    agent_nice: int
    load_start: str
    load_end: str


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] if ordered else float("nan")


def _counters(port: int) -> tuple[int, dict[str, int]]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    accepted, rejected = 0, {}
    for line in text.splitlines():
        if line.startswith("flopwatch_train_events_accepted_total{"):
            accepted = int(float(line.rpartition(" ")[2]))
        elif line.startswith("flopwatch_train_events_rejected_total{"):
            reason = re.search(r'reason="([^"]*)"', line)
            if reason:
                rejected[reason.group(1)] = int(float(line.rpartition(" ")[2]))
    return accepted, rejected


def _reference(port: int, count: int) -> list[float]:
    """One client, one keep-alive connection, sequential scrapes of the idle agent."""

    async def run() -> list[float]:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        loop, latencies = asyncio.get_running_loop(), []
        for _ in range(count):
            started = loop.time()
            await _scrape_once(reader, writer)
            latencies.append(loop.time() - started)
            await asyncio.sleep(0.005)
        writer.close()
        return latencies

    return asyncio.run(run())


def _machine() -> str:
    cpu = platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}, {psutil.cpu_count()} cores, Python {platform.python_version()}"


def _load() -> str:
    return ", ".join(f"{x:.1f}" for x in os.getloadavg())


def run(duration: float, warmup: float, scrapers: int, interval: float, rate: float, ranks: int,
        nice: int | None = None) -> Figures:
    date = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    load_start = _load()
    directory = Path(tempfile.mkdtemp(prefix="flopwatch-soak-"))
    socket_path = directory / "steps.sock"
    extra = ["--train", "--train-socket", str(socket_path), "--log-level", "warning"]
    with AgentProcess(node="soak-node", gpus=8, interval=1.0, extra=extra) as agent:
        assert agent.proc is not None
        process = psutil.Process(agent.proc.pid)
        if nice is not None:
            for thread in process.threads():   # Linux: niceness is per thread
                os.setpriority(os.PRIO_PROCESS, thread.id, nice)
        agent_nice = process.nice()
        time.sleep(2.5)
        reference = _reference(agent.port, REFERENCE_SCRAPES)
        exposition = len(urllib.request.urlopen(agent.url + "/metrics", timeout=10).read())
        accepted_before, rejected_before = _counters(agent.port)

        start_at = time.time() + 1.0
        until = start_at + duration
        context = multiprocessing.get_context("spawn")
        results: multiprocessing.Queue = context.Queue()
        sender = context.Process(target=send_events, args=(str(socket_path), rate, ranks, duration, start_at, results),
                                 daemon=True)
        sender.start()

        rss_samples: list[tuple[float, int]] = []
        stop_sampling = threading.Event()
        cpu: list[float] = []

        def sample() -> None:
            while time.time() < start_at:
                time.sleep(0.01)
            times = process.cpu_times()
            cpu.append(times.user + times.system)
            while not stop_sampling.wait(5.0):
                rss_samples.append((time.time() - start_at, process.memory_info().rss))
            times = process.cpu_times()
            cpu.append(times.user + times.system)

        sampler = threading.Thread(target=sample, name="rss", daemon=True)
        sampler.start()
        bench_cpu = time.process_time()
        stats = asyncio.run(_scrape_all(agent.port, scrapers, interval, until))
        bench_cpu = time.process_time() - bench_cpu
        stop_sampling.set()
        sampler.join()
        sent = results.get(timeout=60)
        sender.join(timeout=10)
        time.sleep(1.5)   # the last events reach a snapshot
        accepted, rejected = _counters(agent.port)

    warm = [rss for at, rss in rss_samples if at <= warmup] or [rss_samples[0][1]]
    after = [rss for at, rss in rss_samples if at > warmup] or [rss_samples[-1][1]]
    rss_warm, rss_end = warm[-1], after[-1]
    reference_p99 = _quantile(reference, 0.99)
    p99 = _quantile(stats.latencies, 0.99)
    return Figures(
        date=date, machine=_machine(), command=" ".join([Path(sys.executable).name, "-m", "bench.soak", *sys.argv[1:]]),
        duration_s=duration, warmup_s=warmup, scrapers=scrapers, scrape_interval_s=interval,
        exposition_bytes=exposition,
        reference_p50_ms=statistics.median(reference) * 1e3, reference_p99_ms=reference_p99 * 1e3,
        scrapes_ok=len(stats.latencies), scrapes_failed=len(stats.failures), first_failures=stats.failures[:5],
        p50_ms=_quantile(stats.latencies, 0.5) * 1e3, p99_ms=p99 * 1e3, max_ms=max(stats.latencies, default=0) * 1e3,
        p99_ratio=p99 / reference_p99,
        events_target_per_s=rate, events_sent=sent["sent"], events_sent_per_s=sent["sent"] / sent["seconds"],
        sender_max_lag_s=sent["max_lag_s"], sender_timeouts=sent["timeouts"], sender_queue_full=sent["queue_full"],
        sender_cpu_percent=100 * sent["cpu_s"] / sent["seconds"], bench_cpu_percent=100 * bench_cpu / duration,
        events_accepted=accepted - accepted_before,
        events_rejected={k: n for k, v in rejected.items() if (n := v - rejected_before.get(k, 0))},
        rss_warm_mib=rss_warm / 2**20, rss_end_mib=rss_end / 2**20,
        rss_max_mib=max(rss for _, rss in rss_samples) / 2**20, rss_growth=(rss_end - rss_warm) / rss_warm,
        agent_cpu_percent=100 * (cpu[-1] - cpu[0]) / duration if len(cpu) == 2 else float("nan"),
        agent_nice=agent_nice, load_start=load_start, load_end=_load(),
    )


def table(f: Figures) -> str:
    verdict_failed = "met" if f.scrapes_failed == 0 else "**missed**"
    verdict_rss = "met" if f.rss_growth < RSS_TARGET else "**missed**"
    verdict_rate = "met" if f.events_sent_per_s >= 0.99 * f.events_target_per_s else "**missed**"
    return "\n".join([
        f"{f.date}; {f.machine}; load average {f.load_start} at start, {f.load_end} at the end",
        "",
        "| figure | measured | target |",
        "|---|---:|---|",
        f"| duration (warm-up) | {f.duration_s:.0f} s ({f.warmup_s:.0f} s) | 600 s |",
        f"| scrapes ok / failed | {f.scrapes_ok:,} / **{f.scrapes_failed}** | 0 failed: {verdict_failed} |",
        f"| scrape latency p50 / p99 / max under load | {f.p50_ms:.1f} / **{f.p99_ms:.1f}** / {f.max_ms:.1f} ms | "
        "p99 reported |",
        f"| the same agent idle, one client: p50 / p99 | {f.reference_p50_ms:.2f} / {f.reference_p99_ms:.2f} ms | "
        "reference |",
        f"| p99 under load / idle p99 | {f.p99_ratio:.0f}x | |",
        f"| step events sent | {f.events_sent:,} ({f.events_sent_per_s:,.0f}/s; sender at most "
        f"{f.sender_max_lag_s * 1e3:.0f} ms behind) | {f.events_target_per_s:,.0f}/s: {verdict_rate} |",
        f"| accepted by the agent / rejected | {f.events_accepted:,} / {sum(f.events_rejected.values()):,} "
        f"{f.events_rejected or ''} | all accepted |",
        f"| agent RSS after warm-up / end / max | {f.rss_warm_mib:.1f} / {f.rss_end_mib:.1f} / {f.rss_max_mib:.1f} MiB "
        f"(**{f.rss_growth:+.1%}**) | < 5% growth: {verdict_rss} |",
        f"| agent CPU (nice {f.agent_nice}) | {f.agent_cpu_percent:.0f}% of one core | |",
        f"| sender: CPU / sends that found the agent's queue full | {f.sender_cpu_percent:.0f}% of one core / "
        f"{f.sender_queue_full:,} | |",
        f"| scrapers (this process) CPU | {f.bench_cpu_percent:.0f}% of one core | |",
        f"| exposition | {f.exposition_bytes:,} bytes; {f.scrapers} scrapers every {f.scrape_interval_s:g} s | |",
    ])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of load (the run of record: 600)")
    parser.add_argument("--warmup", type=float, default=20.0, help="seconds before the RSS baseline is taken")
    parser.add_argument("--scrapers", type=int, default=100)
    parser.add_argument("--scrape-interval", type=float, default=1.0)
    parser.add_argument("--events-per-s", type=float, default=20_000.0)
    parser.add_argument("--ranks", type=int, default=64, help="ranks sending (each under the intake's 1,000/s limit)")
    parser.add_argument("--agent-nice", type=int, metavar="N", help="renice the agent (the systemd unit: -5)")
    parser.add_argument("--json", metavar="OUT", help="also write the figures as JSON")
    args = parser.parse_args()
    if args.warmup >= args.duration:
        parser.error("--warmup must be shorter than --duration")
    if args.events_per_s / args.ranks > 900:
        parser.error("more than 900 events/s per rank trips the intake's per-rank flood guard: raise --ranks")
    try:
        figures = run(args.duration, args.warmup, args.scrapers, args.scrape_interval, args.events_per_s, args.ranks,
                      args.agent_nice)
    except (MissingBinary, ServerError) as error:
        print(f"bench.soak: {error}", file=sys.stderr)
        return 1
    print(table(figures))
    if figures.first_failures:
        print("first failures:", *figures.first_failures, sep="\n  ")
    if args.json:
        Path(args.json).write_text(json.dumps(asdict(figures), indent=2))
    return 0 if figures.scrapes_failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())

"""Training-thread cost of the step client, and the agent intake's rate, against references in the run.

Client: the cost on the training thread of one step with all four phases timed
(`with mon.step(): with mon.phase("data"): ... "compute" ... "comm" ... "optimizer"`), each step
timed alone with perf_counter_ns, interleaved in rounds with `prometheus_client.Histogram.observe`
(the reference: what an in-process Prometheus client would pay per step). Two cases:

  * back to back: steps with nothing in them, the default `min_interval` (1 s) coalescing the
    datagrams;
  * 1 ms apart (the thread busy in between, as a training thread is), default `min_interval`:
    a fast training loop, one datagram a second;
  * 1 ms apart with `min_interval=0`: every step sends its datagram — the worst case, and what
    every step of a loop with steps over a second pays. The bare send() is timed the same way.
The references for the last three are `observe` calls with the same busy gap.

The receiving end is a real `flopwatch agent --backend sim --train` subprocess.

Intake: pre-encoded datagrams from 256 ranks of 8 jobs with growing totals. (1) `handle()` alone
on this thread (CPU time); (2) through the socket: the intake's reader thread in this process, a
forked sender on the other core blocking on a full queue (so the kernel loses nothing), counted at
the end: accepted + rejected must equal sent. The targets: <= 5 µs median per step, >= 100,000 events/s.

    .venv/bin/python -m bench.train_client [--steps 20000] [--events 300000] [--json OUT]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import multiprocessing
import os
import platform
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

from prometheus_client import CollectorRegistry, Histogram

from flopwatch.config import TrainOptions
from flopwatch.exporters.train_intake import TrainIntake
from flopwatch.stack import AgentProcess, MissingBinary, ServerError
from flopwatch.train import StepMonitor, wire

CLIENT_TARGET_US = 5.0
INTAKE_TARGET = 100_000
RANKS, JOBS = 256, 8
GAP_S = 0.001


def _percentiles(samples_ns: list[int]) -> dict[str, float]:
    ordered = sorted(samples_ns)
    return {"median_us": statistics.median(ordered) / 1000, "p99_us": ordered[int(len(ordered) * 0.99)] / 1000}


def _busy(seconds: float) -> None:
    """Keep the thread busy (as training compute would) rather than asleep: a VM's idle vCPU comes
    back with cold caches, which would bill the wake-up to whatever is timed next."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def _time_steps(mon: StepMonitor, count: int, gap_s: float = 0.0) -> list[int]:
    clock = time.perf_counter_ns
    out = []
    for _ in range(count):
        started = clock()
        with mon.step():
            with mon.phase("data"):
                pass
            with mon.phase("compute"):
                pass
            with mon.phase("comm"):
                pass
            with mon.phase("optimizer"):
                pass
        out.append(clock() - started)
        if gap_s:
            _busy(gap_s)
    return out


def _time_observe(histogram: Histogram, count: int, gap_s: float = 0.0) -> list[int]:
    clock = time.perf_counter_ns
    out = []
    for i in range(count):
        value = 0.1 + (i % 7) * 0.3
        started = clock()
        histogram.observe(value)
        out.append(clock() - started)
        if gap_s:
            _busy(gap_s)
    return out


def _time_sends(path: str, count: int, gap_s: float) -> list[int]:
    """The bare syscall a sending step makes: one 240-byte datagram to the agent, MSG_DONTWAIT."""
    sender = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sender.connect(path)
    sender.setblocking(False)
    payload = bytes(240)
    clock = time.perf_counter_ns
    out = []
    for _ in range(count):
        started = clock()
        with contextlib.suppress(BlockingIOError):
            sender.send(payload, socket.MSG_DONTWAIT)
        out.append(clock() - started)
        _busy(gap_s)
    sender.close()
    return out


def bench_client(steps: int, sending_steps: int, rounds: int = 5) -> dict:
    workdir = Path(tempfile.mkdtemp(prefix="flopwatch-bench-"))
    sock = workdir / "steps.sock"
    histogram = Histogram("bench_step_seconds", "reference", registry=CollectorRegistry())
    env = {"FLOPWATCH_JOB_ID": "bench", "RANK": "0", "LOCAL_RANK": "0"}
    fast, spaced, sending, reference, reference_gap, sends = [], [], [], [], [], []
    with AgentProcess(node="bench", gpus=1, extra=["--train", "--train-socket", str(sock)]):
        coalescing = StepMonitor(1e12, 4096, socket_path=str(sock), environ=env)
        every = StepMonitor(1e12, 4096, socket_path=str(sock), min_interval=0, environ=dict(env, RANK="1"))
        _time_steps(coalescing, 2000)
        _time_observe(histogram, 2000)
        for _ in range(rounds):                       # interleaved: machine noise hits all alike
            reference += _time_observe(histogram, steps // rounds)
            fast += _time_steps(coalescing, steps // rounds)
            reference_gap += _time_observe(histogram, sending_steps // rounds, gap_s=GAP_S)
            spaced += _time_steps(coalescing, sending_steps // rounds, gap_s=GAP_S)
            sending += _time_steps(every, sending_steps // rounds, gap_s=GAP_S)
            sends += _time_sends(str(sock), sending_steps // rounds, gap_s=GAP_S)
        coalescing.close()
        every.close()
    result = {"reference_observe": _percentiles(reference), "step_back_to_back": _percentiles(fast),
              "reference_observe_gap": _percentiles(reference_gap), "step_spaced": _percentiles(spaced),
              "step_sending": _percentiles(sending),
              "bare_send_syscall": _percentiles(sends),
              "sending_sent": every.sent, "sending_dropped": every.dropped}
    for case, ref in (("step_back_to_back", "reference_observe"), ("step_spaced", "reference_observe_gap"),
                      ("step_sending", "reference_observe_gap"), ("bare_send_syscall", "reference_observe_gap")):
        result[case]["median_ratio"] = result[case]["median_us"] / result[ref]["median_us"]
        result[case]["p99_ratio"] = result[case]["p99_us"] / result[ref]["p99_us"]
    return result


def _datagrams(count: int) -> list[bytes]:
    out = []
    for i in range(count):
        rank, steps = i % RANKS, i // RANKS + 1
        buckets = [0] * wire.N_BUCKETS
        buckets[6] = steps
        out.append(wire.encode(wire.StepRecord(
            job_id=f"job-{rank % JOBS}", rank=rank, local_rank=rank % 8, gpu=rank % 8, instance=1, steps=steps,
            tokens=4096.0 * steps, model_flops=1e12 * steps, hardware_flops=1.2e12 * steps,
            step_seconds=0.4 * steps, buckets=tuple(buckets), analytic_flops_per_step=1e12,
            phases={name: 0.08 * steps for name in wire.PHASES})))
    return out


def _options(path: str) -> TrainOptions:
    return TrainOptions(path, None, 64, 1024, 300.0)


def bench_handle(datagrams: list[bytes]) -> dict:
    intake = TrainIntake(_options("/unused"), "bench", start=False)
    now = time.monotonic()
    started_cpu = time.thread_time()
    for i, data in enumerate(datagrams):
        intake.handle(data, now + i * 1e-5, 0.0)   # 100k/s of simulated time: under every rate limit
    cpu = time.thread_time() - started_cpu
    assert intake.accepted == len(datagrams), intake.rejected
    return {"events": len(datagrams), "cpu_s": cpu, "events_per_cpu_s": len(datagrams) / cpu}


def _send_all(path: str, datagrams: list[bytes], go: multiprocessing.synchronize.Event) -> None:
    sender = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sender.connect(path)
    sender.setblocking(True)      # wait on a full queue: the kernel drops nothing
    go.wait()
    send = sender.send
    for data in datagrams:
        send(data)
    sender.close()


def bench_socket(datagrams: list[bytes]) -> dict:
    workdir = Path(tempfile.mkdtemp(prefix="flopwatch-bench-"))
    intake = TrainIntake(_options(str(workdir / "steps.sock")), "bench")
    context = multiprocessing.get_context("fork")
    go = context.Event()
    sender = context.Process(target=_send_all, args=(str(intake.path), datagrams, go))
    sender.start()
    time.sleep(0.5)
    reader_clock = time.pthread_getcpuclockid(intake._thread.ident)     # the reader thread's CPU time
    reader_before = time.clock_gettime(reader_clock)
    cpu_before = time.process_time()
    started = time.perf_counter()
    go.set()
    deadline = started + 120
    while intake.accepted + sum(intake.rejected.values()) < len(datagrams) and time.perf_counter() < deadline:
        time.sleep(0.005)
    wall = time.perf_counter() - started
    cpu = time.process_time() - cpu_before
    reader_cpu = time.clock_gettime(reader_clock) - reader_before
    sender.join()
    handled = intake.accepted + sum(intake.rejected.values())
    intake.close()
    return {"events": len(datagrams), "accepted": intake.accepted, "rejected": sum(intake.rejected.values()),
            "lost": len(datagrams) - handled, "wall_s": wall, "events_per_s": handled / wall,
            "intake_cpu_s": cpu, "intake_cpu_share_of_one_core": cpu / wall, "reader_cpu_s": reader_cpu,
            "events_per_reader_cpu_s": handled / reader_cpu}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20_000, help="timed back-to-back steps and observes")
    parser.add_argument("--sending-steps", type=int, default=5_000, help="timed steps that each send (1 ms apart)")
    parser.add_argument("--events", type=int, default=300_000, help="datagrams for the intake rate")
    parser.add_argument("--json", metavar="OUT", help="also write the figures as JSON")
    args = parser.parse_args(argv)
    load = os.getloadavg()[0]
    try:
        client = bench_client(args.steps, args.sending_steps)
    except (MissingBinary, ServerError) as error:
        print(f"bench: {error}", file=sys.stderr)
        return 1
    datagrams = _datagrams(args.events)
    handle = bench_handle(datagrams)
    through_socket = bench_socket(datagrams)
    result = {"date": datetime.datetime.now(datetime.UTC).isoformat(timespec="minutes"),
              "python": platform.python_version(), "load_average_at_start": load, "client": client,
              "intake_handle": handle, "intake_socket": through_socket}
    for case, label in (("reference_observe", "Histogram.observe, back to back"),
                        ("step_back_to_back", "step, back to back (coalesced)"),
                        ("reference_observe_gap", "Histogram.observe, 1 ms apart"),
                        ("step_spaced", "step, 1 ms apart (coalesced)"),
                        ("step_sending", "step that sends, 1 ms apart"),
                        ("bare_send_syscall", "its send() alone, 1 ms apart")):
        figures = client[case]
        ratios = f" ({figures['median_ratio']:.1f}x, {figures['p99_ratio']:.1f}x)" if "median_ratio" in figures else ""
        print(f"{label:32s} median {figures['median_us']:6.2f} µs  p99 {figures['p99_us']:6.2f} µs{ratios}")
    print(f"sending steps: {client['sending_sent']} sent, {client['sending_dropped']} dropped")
    print(f"intake handle(): {handle['events_per_cpu_s']:,.0f} events per CPU second")
    print(f"intake via socket: {through_socket['events_per_s']:,.0f} events/s wall, lost {through_socket['lost']}, "
          f"rejected {through_socket['rejected']}; the reader thread had "
          f"{through_socket['reader_cpu_s'] / through_socket['wall_s']:.0%} of a core: "
          f"{through_socket['events_per_reader_cpu_s']:,.0f} events per second of its CPU (recv included)")
    verdict = client["step_spaced"]["median_us"] <= CLIENT_TARGET_US and \
        through_socket["events_per_reader_cpu_s"] >= INTAKE_TARGET and through_socket["lost"] == 0
    print(f"targets (<= {CLIENT_TARGET_US} µs median per step, >= {INTAKE_TARGET:,} events/s on one core, no loss): "
          f"{'met' if verdict else 'MISSED'}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

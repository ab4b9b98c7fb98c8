"""The training-step intake: reads datagrams from training clients on a Unix socket and exports them.

A reader thread owned by the collector drains the socket in batches and keeps, per (job_id, rank),
the latest running totals the client sent (see flopwatch/train/wire.py); `update()` on the agent's
clock expires ranks that went quiet and snapshots the rest, and `collect()` renders the snapshot.
Everything refused is counted by reason; nothing a client sends can grow memory past the caps on
jobs and ranks, raise out of the reader, or move a counter backwards.

Sample output (one rank, abridged):

    flopwatch_train_steps_total{node="n1",job_id="4711",rank="3",gpu="3",stage="1",dp_rank="0"} 1200.0
    flopwatch_train_phase_seconds_total{node="n1",job_id="4711",rank="3",stage="1",...,phase="comm"} 41.5
    flopwatch_train_comm_min_seconds{node="n1",job_id="4711",rank="3",gpu="3",stage="1",dp_rank="0"} 0.021
    flopwatch_train_recent_arrival_seconds{node="n1",job_id="4711",rank="3",gpu="3",stage="1",dp_rank="0"} 0.84
    flopwatch_train_step_seconds_bucket{node="n1",job_id="4711",le="1.0"} 9550.0
    flopwatch_train_job_phase_seconds_total{node="n1",job_id="4711",phase="comm"} 332.0
    flopwatch_train_events_rejected_total{node="n1",reason="bad_value"} 2.0
"""

from __future__ import annotations

import logging
import operator
import select
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.core import Metric as Family

from flopwatch.catalog import train as m
from flopwatch.config import TrainOptions
from flopwatch.exporters import train_recent
from flopwatch.exporters.train_jobs import S_BUCKETS, S_CHECKPOINT, S_PHASES, S_STEP_SECONDS, Job
from flopwatch.exporters.train_socket import open_socket
from flopwatch.train import wire

log = logging.getLogger(__name__)

REASONS: tuple[str, ...] = (
    "truncated", "oversized", "version", "malformed", "unknown_phase", "bad_job_id", "bad_rank",
    "bad_coordinates", "duplicate_coordinates", "bad_value", "non_monotonic", "too_many_jobs",
    "too_many_ranks", "rate_limited",
)
#: Per-rank flood guard: a client sends at most one datagram per step and per second by default.
RATE_PER_S = 1000.0
BURST = 1000.0
BATCH = 512                    # datagrams handled per lock hold
POLL_S = 0.2                   # how often a blocked reader looks at the stop flag
DRAIN_INTERVAL_S = 0.002       # the reader's timer while events flow (the kernel queues 10 or so)
IDLE_AFTER_S = 0.1             # no event for this long: block in poll() again
NEARLY_FULL = 8                # a drain that found this many goes again at once
TRICKLE = 4                    # a drain that found at most this many keeps the timer
RECV_SIZE = wire.MAX_DATAGRAM + 1   # one byte more than the largest valid datagram: oversize shows


class _Rank:
    __slots__ = ("allowance", "analytic", "bits", "comm_min", "coords", "dp_rank", "gpu", "gpu_index", "identity",
                 "instance", "iteration", "job", "job_ranks", "key", "last_step", "measured", "rank", "recent", "seen",
                 "stage")

    def __init__(self, job: str, rank: int, key: tuple[bytes, int]) -> None:
        self.job, self.rank, self.key = job, rank, key
        self.identity: bytes | None = None   # of its last full-mask datagram (the fast-path key)
        self.gpu = ""
        self.gpu_index = -1
        self.instance = -1
        self.bits: tuple[int, ...] = ()      # running totals, doubles as their bits (wire.totals_bits)
        self.analytic = self.measured = 0.0
        self.coords: tuple[int, int, int] | None = None   # (stage, dp rank, tp rank) it claims in its job
        self.stage, self.dp_rank = "0", ""
        self.job_ranks = 0                   # ranks in its whole job as it declares them (0: not said)
        self.comm_min: float | None = None   # its comm floor, once it has completed a block of steps
        self.iteration: int | None = None    # the training iteration of its last step, when it says
        self.last_step = 0.0        # wall time the steps count last grew
        # (monotonic time, totals bits) of each datagram whose steps count grew, since the window
        # start `update()` last found: what the recent gauges are the difference of.
        self.recent = train_recent.reports()
        self.seen = 0.0             # monotonic time of the last accepted datagram
        self.allowance = BURST - 1.0      # it is created by admitting one datagram


_ge = operator.ge
_identity = wire.identity
_iteration_of = wire.iteration_of
_totals_bits = wire.totals_bits
_FULL_SIZE = wire.RECORD_STRUCTS[wire.ALL_PHASES_MASK].size

# Offsets into a rank's totals: record[wire.I_TOTALS:wire.I_END_TOTALS].
_T = wire.I_TOTALS
T_STEPS, T_DROPPED, T_TOKENS = wire.I_STEPS - _T, wire.I_DROPPED - _T, wire.I_TOKENS - _T
T_MODEL, T_HARDWARE = wire.I_MODEL - _T, wire.I_HARDWARE - _T
T_SAVE, T_RESTORE, T_PHASES = wire.I_SAVE - _T, wire.I_RESTORE - _T, wire.I_PHASES - _T


@dataclass(frozen=True)
class _Snapshot:
    ranks: tuple[tuple[str, str, str, str, str, tuple, float, float, float, float | None, int | None,
                       tuple[float, ...] | None], ...] = ()
    jobs: tuple[tuple[str, tuple[int | float, ...]], ...] = ()   # job -> its sums (train_jobs.S_*)
    replayed: tuple[tuple[str, int, float], ...] = ()     # jobs whose ranks report iterations
    job_ranks: tuple[tuple[str, int], ...] = ()           # jobs whose ranks declare their sizes
    accepted: int = 0
    rejected: tuple[tuple[str, int], ...] = ()


class TrainIntake:
    """Collector for the agent: `update()` expires and snapshots, `collect()` renders."""

    name = "train"

    def __init__(self, options: TrainOptions, node: str, *, start: bool = True) -> None:
        self.options = options
        self.node = node
        self.path = Path(options.socket)
        self.accepted = 0
        self.rejected = dict.fromkeys(REASONS, 0)
        self._ranks: dict[tuple[bytes, int], _Rank] = {}
        self._by_identity: dict[bytes, _Rank] = {}
        self._jobs: dict[bytes, Job] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._snapshot = _Snapshot()
        self._thread: threading.Thread | None = None
        self._sock: socket.socket | None = None
        self._inode: int | None = None
        self.reader_failed = False
        if start:
            self._sock, self._inode = open_socket(self.path, options.socket_group)
            self._thread = threading.Thread(target=self._read_loop, name="train-intake", daemon=True)
            self._thread.start()
            log.info("training-step intake on %s", self.path)

    # -- reader thread -------------------------------------------------------------------------
    def _read_loop(self) -> None:
        """Drain the socket: on a timer while events trickle in, woken by each one otherwise.

        A sender whose datagram finds the reader blocked pays for waking it (a cross-CPU wake-up,
        tens of microseconds on a VM) on the training thread. While datagrams trickle in (a drain
        finds at most TRICKLE) the reader looks every DRAIN_INTERVAL_S instead, which the kernel's
        short queue (net.unix.max_dgram_qlen, 10 by default) absorbs. When they come faster it is
        woken by each arrival, drains again at once while it finds the queue nearly full, and
        after IDLE_AFTER_S without any it blocks, costing nothing idle.
        """
        sock = self._sock
        assert sock is not None
        poller = select.poll()
        poller.register(sock, select.POLLIN)
        blocking, busy, last_event = True, False, 0.0
        try:
            while not self._stop.is_set():
                if blocking:
                    if not poller.poll(POLL_S * 1000):
                        continue
                else:
                    time.sleep(0 if busy else DRAIN_INTERVAL_S)
                got = self._drain(sock.recv)
                now = time.monotonic()
                busy = got >= NEARLY_FULL
                if got:
                    last_event = now
                blocking = TRICKLE < got < NEARLY_FULL or (got == 0 and now - last_event > IDLE_AFTER_S)
        except Exception as error:  # an OSError on our own socket, or a bug: say so, stop reading
            if not self._stop.is_set():
                self.reader_failed = True
                log.error("training-step intake stopped reading %s: %r", self.path, error)

    def _drain(self, recv: Callable[[int], bytes]) -> int:
        """Handle what is queued (up to BATCH datagrams); how many there were."""
        got = 0
        with self._lock:
            now, wall = time.monotonic(), time.time()
            handle = self.handle
            for _ in range(BATCH):
                try:
                    data = recv(RECV_SIZE)
                except (BlockingIOError, InterruptedError):
                    break
                handle(data, now, wall)
                got += 1
        return got

    # -- one datagram (reader thread, lock held) -----------------------------------------------
    def handle(self, data: bytes, now: float, wall: float) -> None:
        """Account one datagram; never raises for anything a client can send.

        Fast path: a datagram whose identity (sender, instance, gauges, job id: all but its totals)
        equals the last one this rank sent only needs its totals checked. Anything else goes
        through the full `wire.split`.
        """
        state = self._by_identity.get(_identity(data)) if len(data) > _FULL_SIZE else None
        try:
            if state is not None:
                bits = _totals_bits(data)
                iteration = _iteration_of(data)
            else:
                record, job = wire.split(data, self._jobs)
                bits = wire.bits_of(record)
                iteration = record[wire.I_ITERATION] if record[wire.I_FLAGS] & wire.FLAG_ITERATION else None
        except wire.WireError as error:
            self.rejected[error.reason] += 1
            return
        if state is None:
            state = self._ranks.get((job, record[wire.I_RANK]))
            if state is None:
                if self._claimed_by_other(job, record):
                    return
                state = self._admit(job, record[wire.I_RANK])
                if state is None:
                    return
                state.instance = record[wire.I_INSTANCE]
            elif not self._allowed(state, now):
                return
            elif record[wire.I_INSTANCE] != state.instance:    # the client restarted: totals start over
                self._jobs[job].retire(state.bits)
                state.bits = ()
                state.recent.clear()
                state.instance = record[wire.I_INSTANCE]
            elif not all(map(_ge, bits, state.bits)):
                self.rejected["non_monotonic"] += 1
                return
            if not self._claim(state, record):
                return
            self._identify(state, data, record)
            if not state.bits:                 # its first totals since it was admitted or restarted
                self._jobs[job].readmit(state.rank, state.instance, bits)
        elif not self._allowed(state, now):
            return
        elif not all(map(_ge, bits, state.bits)):
            self.rejected["non_monotonic"] += 1
            return
        if not state.bits or bits[0] > state.bits[0]:
            state.last_step = wall
            train_recent.remember(state.recent, now, bits)
        if iteration is not None:
            self._jobs[state.key[0]].replays.observe(state.rank, iteration, state.iteration, bits, state.bits)
        state.bits = bits
        state.iteration = iteration
        state.seen = now
        self.accepted += 1

    def _allowed(self, state: _Rank, now: float) -> bool:
        """The per-rank flood guard (a token bucket refilled at RATE_PER_S up to BURST)."""
        allowance = state.allowance + (now - state.seen) * RATE_PER_S
        if allowance < 1.0:
            self.rejected["rate_limited"] += 1
            return False
        state.allowance = min(allowance, BURST) - 1.0
        return True

    def _claimed_by_other(self, job: bytes, record: tuple) -> bool:
        """Whether another live rank of `job` here already claims this datagram's coordinates."""
        key = _coordinates(record)
        known = self._jobs.get(job)
        if key is None or known is None or known.claims.get(key, record[wire.I_RANK]) == record[wire.I_RANK]:
            return False
        self.rejected["duplicate_coordinates"] += 1
        return True

    def _claim(self, state: _Rank, record: tuple) -> bool:
        """Take the coordinates of a rank's datagram, unless another rank of its job holds them."""
        key = _coordinates(record)
        if key == state.coords:
            return True
        claims = self._jobs[state.key[0]].claims
        if key is not None and claims.get(key, state.rank) != state.rank:
            self.rejected["duplicate_coordinates"] += 1
            return False
        if state.coords is not None:
            claims.pop(state.coords, None)
        if key is not None:
            claims[key] = state.rank
        state.coords = key
        return True

    def _identify(self, state: _Rank, data: bytes, record: tuple) -> None:
        """Take the sender details of a datagram that passed `split`; re-key the fast path."""
        if state.identity is not None:
            self._by_identity.pop(state.identity, None)
        state.identity = _identity(data) if record[wire.I_MASK] == wire.ALL_PHASES_MASK else None
        if state.identity is not None:
            self._by_identity[state.identity] = state
        state.analytic, state.measured = record[wire.I_ANALYTIC], record[wire.I_MEASURED]
        stage, dp_rank = record[wire.I_PP_STAGE], record[wire.I_DP_RANK]
        state.stage = str(stage) if stage >= 0 else "0"
        state.dp_rank = str(dp_rank) if dp_rank >= 0 else ""
        state.job_ranks = _job_ranks(record)
        state.comm_min = record[wire.I_COMM_MIN] if record[wire.I_COMM_MIN_STEPS] else None
        if record[wire.I_GPU] != state.gpu_index:
            state.gpu_index = record[wire.I_GPU]
            state.gpu = str(state.gpu_index) if state.gpu_index >= 0 else ""

    def _admit(self, job: bytes, rank: int) -> _Rank | None:
        record = self._jobs.get(job)
        if record is None and len(self._jobs) >= self.options.max_jobs:
            self.rejected["too_many_jobs"] += 1
            return None
        if len(self._ranks) >= self.options.max_ranks:
            self.rejected["too_many_ranks"] += 1
            return None
        if record is None:
            record = self._jobs[job] = Job(job.decode("ascii"))
        record.ranks += 1
        state = self._ranks[(job, rank)] = _Rank(record.name, rank, (job, rank))
        return state

    # -- agent clock ---------------------------------------------------------------------------
    def update(self, now: float | None = None) -> int:
        """Expire quiet ranks and jobs, snapshot the rest; 1 error when the reader has stopped.

        `now`: the monotonic clock (tests drive it; the agent leaves it to time.monotonic()).
        """
        with self._lock:
            if now is None:
                now = time.monotonic()
            cutoff = now - self.options.expiry
            for key, state in list(self._ranks.items()):
                if state.seen < cutoff:
                    del self._ranks[key]
                    if state.identity is not None:
                        del self._by_identity[state.identity]
                    record = self._jobs[key[0]]
                    record.ranks -= 1
                    if state.coords is not None and record.claims.get(state.coords) == state.rank:
                        del record.claims[state.coords]
                    if record.ranks:
                        record.expire(state.rank, state.instance, state.bits, self.options.max_ranks)
                    else:
                        del self._jobs[key[0]]
            ranks = []
            by_job: dict[bytes, list[tuple]] = {}  # job -> its live ranks' totals, summed by the job
            sizes: dict[str, int] = {}             # job -> the most ranks one of its ranks declares
            for (job, _), state in self._ranks.items():
                if not state.bits:                 # restarted, and its first datagram was refused
                    continue
                totals = wire.totals_of(state.bits)
                ranks.append((state.job, str(state.rank), state.gpu, state.stage, state.dp_rank, totals,
                              state.analytic, state.measured, state.last_step, state.comm_min, state.iteration,
                              train_recent.per_step(state.recent, now)))
                if state.job_ranks > sizes.get(state.job, 0):
                    sizes[state.job] = state.job_ranks
                group = by_job.get(job)
                if group is None:
                    by_job[job] = [totals]
                else:
                    group.append(totals)
            jobs = tuple((self._jobs[job].name, self._jobs[job].sums(group)) for job, group in by_job.items())
            replayed = tuple((record.name, record.replays.steps, record.replays.seconds)
                             for record in self._jobs.values() if record.replays.marks)
            self._snapshot = _Snapshot(tuple(ranks), jobs, replayed, tuple(sizes.items()), self.accepted,
                                       tuple(self.rejected.items()))
        return 1 if self.reader_failed else 0

    def collect(self) -> Iterator[Family]:
        snap, node = self._snapshot, self.node
        steps, tokens, model, hardware = (m.STEPS.family(), m.TOKENS.family(), m.MODEL_FLOPS.family(),
                                          m.HARDWARE_FLOPS.family())
        phase, checkpoint, last, dropped = (m.PHASE_SECONDS.family(), m.CHECKPOINT_SECONDS.family(),
                                            m.LAST_STEP.family(), m.CLIENT_DROPPED.family())
        per_step, comm_min, iteration = m.FLOPS_PER_STEP.family(), m.COMM_MIN.family(), m.ITERATION.family()
        arrival, recent_arrival, recent_phase = (m.ARRIVAL_SECONDS.family(), m.RECENT_ARRIVAL.family(),
                                                 m.RECENT_PHASE.family())
        for job, rank, gpu, stage, dp_rank, totals, analytic, measured, last_step, floor, step, recent in snap.ranks:
            labels = [node, job, rank, gpu, stage, dp_rank]
            steps.add_metric(labels, totals[T_STEPS])
            tokens.add_metric(labels, totals[T_TOKENS])
            model.add_metric(labels, totals[T_MODEL])
            hardware.add_metric(labels, totals[T_HARDWARE])
            for i, name in enumerate(wire.PHASES):
                phase.add_metric([*labels, name], totals[T_PHASES + i])
            arrival.add_metric(labels, sum(totals[T_PHASES + i] for i in wire.ARRIVAL_INDEX))
            if recent is not None:
                recent_arrival.add_metric(labels, recent[0])
                for name, value in zip(m.RECENT_PHASES, recent[1:], strict=True):
                    recent_phase.add_metric([*labels, name], value)
            checkpoint.add_metric([*labels, "save"], totals[T_SAVE])
            checkpoint.add_metric([*labels, "restore"], totals[T_RESTORE])
            if last_step:
                last.add_metric(labels, last_step)
            if floor is not None:
                comm_min.add_metric(labels, floor)
            if step is not None:
                iteration.add_metric(labels, step)
            dropped.add_metric([node, job, rank], totals[T_DROPPED])
            if analytic:
                per_step.add_metric([node, job, rank, "analytic"], analytic)
            if measured:
                per_step.add_metric([node, job, rank, "measured"], measured)
        histogram, job_phase, job_checkpoint = (m.STEP_SECONDS.family(), m.JOB_PHASE_SECONDS.family(),
                                                m.JOB_CHECKPOINT_SECONDS.family())
        for job, sums in snap.jobs:
            cumulative, running = [], 0
            for bound, count in zip((*wire.STEP_BUCKETS, float("inf")), sums[S_BUCKETS], strict=True):
                running += count
                cumulative.append((_le(bound), running))
            histogram.add_metric([node, job], cumulative, sums[S_STEP_SECONDS])
            for i, name in enumerate(wire.PHASES):
                job_phase.add_metric([node, job, name], sums[S_PHASES + i])
            for i, kind in enumerate(wire.CHECKPOINT_KINDS):
                job_checkpoint.add_metric([node, job, kind], sums[S_CHECKPOINT + i])
        replayed_steps, replayed_seconds = m.REPLAYED_STEPS.family(), m.REPLAYED_STEP_SECONDS.family()
        for job, count, seconds in snap.replayed:
            replayed_steps.add_metric([node, job], count)
            replayed_seconds.add_metric([node, job], seconds)
        job_ranks = m.JOB_RANKS.family()
        for job, size in snap.job_ranks:
            job_ranks.add_metric([node, job], size)
        accepted = m.EVENTS_ACCEPTED.family()
        accepted.add_metric([node], snap.accepted)
        rejected = m.EVENTS_REJECTED.family()
        for reason, count in snap.rejected:
            rejected.add_metric([node, reason], count)
        for family in (steps, tokens, model, hardware, phase, arrival, recent_arrival, recent_phase, checkpoint, last,
                       comm_min, iteration, histogram, job_phase, job_checkpoint, replayed_steps, replayed_seconds,
                       job_ranks, per_step, dropped, accepted, rejected):
            if family.samples:
                yield family

    def close(self) -> None:
        """Stop the reader and remove our socket file (not one a newer agent bound since)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=POLL_S * 10)
        if self._sock is not None:
            self._sock.close()
            self._sock = None
            try:
                if self.path.stat().st_ino == self._inode:
                    self.path.unlink()
            except OSError:
                pass


def _coordinates(record: tuple) -> tuple[int, int, int] | None:
    """What a rank claims to be in its job (stage, dp rank, tp rank), or None when it does not say."""
    if record[wire.I_DP_RANK] < 0:
        return None
    return record[wire.I_PP_STAGE], record[wire.I_DP_RANK], record[wire.I_TP_RANK]


def _job_ranks(record: tuple) -> int:
    """Ranks in the sender's whole job (stages x tensor-parallel x data-parallel size, an unknown
    stage or tensor size counting 1), or 0 when it does not say its data-parallel size."""
    data = record[wire.I_DP_SIZE]
    return max(record[wire.I_PP_SIZE], 1) * max(record[wire.I_TP_SIZE], 1) * data if data > 0 else 0


def _le(bound: float) -> str:
    return "+Inf" if bound == float("inf") else repr(float(bound))

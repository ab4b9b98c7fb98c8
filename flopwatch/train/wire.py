"""The step-telemetry datagram: the one definition shared by the training client and the agent intake.

A client sends a datagram over a Unix datagram socket after a step (at most one per `min_interval`,
so very fast loops coalesce) and after a checkpoint. Every datagram carries the rank's *running
totals* — steps, tokens, FLOPs, phase seconds and its own step-time histogram — never increments:
a datagram lost while the agent restarts or its queue is full costs nothing but freshness, and a
restarted training process (a new `instance`) is an ordinary counter reset.

Layout, little-endian. Version 2 (what clients send): a fixed part of 172 bytes, the phase totals,
the two gauges, the parallel coordinates and the comm floor (28 bytes), then the job id. Version 1
is the same without the 28 bytes; the intake reads both, and a version 1 sender is stage 0 of a
one-stage job with no comm floor.

    B version         1
    B flags           FLAG_ITERATION (version 2): the iteration field is set; other bits reserved
    B phase_mask      bit i set: PHASES[i] is among the phase totals (data, compute, comm, optimizer, other)
    B job_len         1..64 bytes of job_id (printable ASCII, no quote or backslash)
    I rank            0..MAX_RANK
    h local_rank      -1 when unknown
    h gpu             GPU index on this node as NVML numbers it, -1 when unknown
    I instance        random per client process
    Q steps           running totals from here to the phase totals
    Q dropped         datagrams this client could not send so far
    23 x I            steps per step-time bucket: STEP_BUCKETS then +Inf (not cumulative; sum = steps)
    d tokens, model_flops, hardware_flops, step_seconds, checkpoint_save_seconds,
      checkpoint_restore_seconds
    popcount(phase_mask) x d   phase seconds totals, in PHASES order
    d analytic_flops_per_step, measured_flops_per_step   (fixed per client process; 0: not known)
    version 2 only:
    h pp_stage, h pp_size      pipeline stage (-1 unknown) and stages in the job (0 unknown)
    h tp_rank, h tp_size       tensor-parallel rank (-1) and size (0)
    i dp_rank, i dp_size       data-parallel rank (-1) and size (0)
    d comm_min_seconds         shortest comm phase of one step over the last completed block
    I comm_min_steps           steps in that block (0: no block completed yet, no floor)
    Q iteration                the training iteration (global step) of the last step, as the job
                               counts it: after a restart from a checkpoint it starts below the
                               iteration reached before (lost progress); valid with FLAG_ITERATION
    job_len bytes     job_id

So that the intake's hot path is two slices of one unpacked tuple, the running totals are
contiguous and so are the floats (tokens to the gauges), which must be finite and not negative
(not even -0.0: the check reads their sign bits). Everything after the running totals (gauges,
coordinates, comm floor, job id) changes rarely, so it forms the datagram's identity with the head:
the comm floor changes once per block of steps, not per datagram. The iteration, which changes
every step, is left out of the identity and read on its own.
"""

from __future__ import annotations

import math
import os
import struct
from collections.abc import Container, Mapping
from dataclasses import dataclass, field
from pathlib import Path

VERSION = 2
VERSIONS = (1, 2)
FLAG_ITERATION = 0x01
KNOWN_FLAGS = FLAG_ITERATION

PHASES: tuple[str, ...] = ("data", "compute", "comm", "optimizer", "other")
PHASE_INDEX: dict[str, int] = {name: i for i, name in enumerate(PHASES)}
#: The phases of a step before the rank reaches its gradient collective: a rank's arrival time,
#: what straggler detection compares across peers (comm is waiting for the others; the optimizer
#: step comes after the collective).
ARRIVAL_PHASES: tuple[str, ...] = ("data", "compute", "other")
ARRIVAL_INDEX: tuple[int, ...] = tuple(PHASE_INDEX[name] for name in ARRIVAL_PHASES)
ALL_PHASES_MASK = (1 << len(PHASES)) - 1
CHECKPOINT_KINDS: tuple[str, ...] = ("save", "restore")

#: Upper bounds of the step-time histogram buckets (seconds), 10 ms to 10 min; +Inf follows.
STEP_BUCKETS: tuple[float, ...] = (
    0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 7.5, 10.0, 15.0, 20.0,
    30.0, 60.0, 120.0, 300.0, 600.0,
)
N_BUCKETS = len(STEP_BUCKETS) + 1

MAX_JOB_ID = 64
MAX_RANK = 1 << 20

#: Who sends (16 bytes); the running totals before the phases (156 bytes); the gauges (16 bytes).
HEAD = struct.Struct("<BBBBIhhI")
TOTALS = struct.Struct(f"<QQ{N_BUCKETS}I6d")
GAUGES = struct.Struct("<2d")
#: Indices into an unpacked record (phases always at full length, as split() returns it).
I_FLAGS, I_MASK, I_JOB_LEN, I_RANK, I_LOCAL_RANK, I_GPU, I_INSTANCE = 1, 2, 3, 4, 5, 6, 7
I_TOTALS = I_STEPS = 8
I_DROPPED, I_BUCKETS = 9, 10
I_TOKENS = I_BUCKETS + N_BUCKETS
I_MODEL, I_HARDWARE, I_STEP_SECONDS, I_SAVE, I_RESTORE = range(I_TOKENS + 1, I_TOKENS + 6)
I_PHASES = I_RESTORE + 1
I_ANALYTIC = I_END_TOTALS = I_PHASES + len(PHASES)   # record[I_TOTALS:I_END_TOTALS]: running totals
I_MEASURED = I_ANALYTIC + 1
#: The whole record's struct (everything but the job id) by phase mask.
RECORD_STRUCTS: tuple[struct.Struct, ...] = tuple(
    struct.Struct(HEAD.format + TOTALS.format[1:] + "d" * bin(mask).count("1") + GAUGES.format[1:])
    for mask in range(ALL_PHASES_MASK + 1)
)
#: Version 2's parallel coordinates and comm floor, between the gauges and the job id.
COORDS = struct.Struct("<hhhhiidIQ")
MAX_STAGES = 4096
MAX_PARALLEL = MAX_RANK
#: The block of steps over which a client keeps its shortest comm phase.
COMM_MIN_BLOCK = 16
MAX_DATAGRAM = RECORD_STRUCTS[ALL_PHASES_MASK].size + COORDS.size + MAX_JOB_ID   # 328 bytes
#: Indices of the coordinates appended to a record by split() (defaults for version 1).
I_PP_STAGE = I_MEASURED + 1
I_PP_SIZE, I_TP_RANK, I_TP_SIZE, I_DP_RANK, I_DP_SIZE = range(I_PP_STAGE + 1, I_PP_STAGE + 6)
I_COMM_MIN, I_COMM_MIN_STEPS, I_ITERATION = I_PP_STAGE + 6, I_PP_STAGE + 7, I_PP_STAGE + 8
NO_COORDS = (-1, 0, -1, 0, -1, 0, 0.0, 0, 0)
ITERATION = struct.Struct("<Q")

DEFAULT_SOCKET = "/run/flopwatch/steps.sock"
SOCKET_ENV = "FLOPWATCH_SOCKET"


class WireError(ValueError):
    """A datagram that cannot be accepted; `reason` is the label of the rejected counter."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


@dataclass(frozen=True)
class StepRecord:
    """A datagram in readable form (tests, tools, the simulator; the client packs in place)."""

    job_id: str
    rank: int
    local_rank: int = -1
    gpu: int = -1
    instance: int = 0
    analytic_flops_per_step: float = 0.0
    measured_flops_per_step: float = 0.0
    steps: int = 0
    tokens: float = 0.0
    model_flops: float = 0.0
    hardware_flops: float = 0.0
    step_seconds: float = 0.0
    checkpoint_save_seconds: float = 0.0
    checkpoint_restore_seconds: float = 0.0
    dropped: int = 0
    buckets: tuple[int, ...] = ()
    phases: dict[str, float] = field(default_factory=dict)
    pp_stage: int = -1
    pp_size: int = 0
    tp_rank: int = -1
    tp_size: int = 0
    dp_rank: int = -1
    dp_size: int = 0
    comm_min_seconds: float = 0.0
    comm_min_steps: int = 0
    iteration: int | None = None
    version: int = VERSION

    @property
    def coordinates(self) -> tuple:
        return (self.pp_stage, self.pp_size, self.tp_rank, self.tp_size, self.dp_rank, self.dp_size,
                self.comm_min_seconds, self.comm_min_steps, self.iteration or 0)


def encode(record: StepRecord) -> bytes:
    """The datagram for `record`; missing bucket counts put every step in the +Inf bucket."""
    job = record.job_id.encode()
    mask = 0
    totals = []
    for i, name in enumerate(PHASES):
        if name in record.phases:
            mask |= 1 << i
            totals.append(record.phases[name])
    buckets = record.buckets or (0,) * (N_BUCKETS - 1) + (record.steps,)
    coords = COORDS.pack(*record.coordinates) if record.version >= 2 else b""
    flags = FLAG_ITERATION if record.iteration is not None and record.version >= 2 else 0
    return RECORD_STRUCTS[mask].pack(
        record.version, flags, mask, len(job), record.rank, record.local_rank, record.gpu, record.instance,
        record.steps, record.dropped, *buckets, record.tokens, record.model_flops, record.hardware_flops,
        record.step_seconds, record.checkpoint_save_seconds, record.checkpoint_restore_seconds, *totals,
        record.analytic_flops_per_step, record.measured_flops_per_step,
    ) + coords + job


def decode(data: bytes) -> StepRecord:
    """Parse and validate one datagram into a StepRecord; raises WireError."""
    record, job = split(data)
    return StepRecord(
        job.decode("ascii"), record[I_RANK], record[I_LOCAL_RANK], record[I_GPU], record[I_INSTANCE],
        record[I_ANALYTIC], record[I_MEASURED], record[I_STEPS], record[I_TOKENS], record[I_MODEL],
        record[I_HARDWARE], record[I_STEP_SECONDS], record[I_SAVE], record[I_RESTORE], record[I_DROPPED],
        record[I_BUCKETS:I_TOKENS], dict(zip(PHASES, record[I_PHASES:I_ANALYTIC], strict=True)),
        *record[I_PP_STAGE:I_COMM_MIN_STEPS + 1],
        iteration=record[I_ITERATION] if record[I_FLAGS] & FLAG_ITERATION else None, version=record[0],
    )


_FULL = RECORD_STRUCTS[ALL_PHASES_MASK]
_FULL_SIZE = _FULL.size
_NO_JOBS: frozenset[bytes] = frozenset()
#: The floats of a full record read as raw IEEE-754 bits: a double is finite and not negative
#: exactly when its bits, as an unsigned integer, are below those of +Inf (sign bit clear, exponent
#: not all ones), so one max() checks them all.
_FLOAT_OFFSET = HEAD.size + TOTALS.size - 6 * 8
_FLOAT_BITS = struct.Struct(f"<{6 + len(PHASES) + 2}Q")
_INF_BITS = 0x7FF0_0000_0000_0000
_N_FLOAT_TOTALS = I_END_TOTALS - I_TOKENS
#: The running totals with every double read as its bits. For finite, non-negative doubles the bits
#: order exactly as the values do, so these tuples compare elementwise like the totals themselves.
TOTALS_BITS = struct.Struct(f"<QQ{N_BUCKETS}I{_N_FLOAT_TOTALS}Q")
_AS_DOUBLES = struct.Struct(f"<{_N_FLOAT_TOTALS}d")
_AS_BITS = struct.Struct(f"<{_N_FLOAT_TOTALS}Q")
_GAUGES_AT = _FULL_SIZE - GAUGES.size
_COUNTS = I_TOKENS - I_TOTALS           # steps, dropped and the buckets lead the totals


_ITERATION_AT = _FULL_SIZE + COORDS.size - ITERATION.size


def identity(data: bytes) -> bytes:
    """Everything in a full-mask datagram but its running totals and iteration: sender, instance,
    gauges, coordinates, comm floor, job id.

    Two datagrams with equal identities differ only in totals and iteration, so once one of them
    has passed `split`, `totals_bits` alone validates the other (the intake's fast path); the
    iteration needs no check (any 64-bit count is one).
    """
    if data[0] == 2:
        return data[:HEAD.size] + data[_GAUGES_AT:_ITERATION_AT] + data[_ITERATION_AT + ITERATION.size:]
    return data[:HEAD.size] + data[_GAUGES_AT:]


def iteration_of(data: bytes) -> int | None:
    """The iteration of a full-mask datagram whose identity passed `split`, or None if it has none."""
    if data[0] == 2 and data[1] & FLAG_ITERATION:
        return ITERATION.unpack_from(data, _ITERATION_AT)[0]
    return None


def totals_bits(data: bytes) -> tuple[int, ...]:
    """The totals of a datagram whose identity already passed `split`, checked; else WireError."""
    bits = TOTALS_BITS.unpack_from(data, HEAD.size)
    if max(bits[_COUNTS:]) >= _INF_BITS:
        raise WireError("bad_value", "numbers must be finite and not negative")
    if sum(bits[2:_COUNTS]) != bits[0]:
        raise WireError("malformed", "bucket counts do not add up to the step count")
    return bits


def bits_of(record: tuple) -> tuple[int, ...]:
    """The totals of a record from `split`, as `totals_bits` gives them."""
    return record[I_TOTALS:I_TOKENS] + _AS_BITS.unpack(_AS_DOUBLES.pack(*record[I_TOKENS:I_END_TOTALS]))


def totals_of(bits: tuple[int, ...]) -> tuple:
    """Back from bits to record[I_TOTALS:I_END_TOTALS] (ints and floats)."""
    return bits[:_COUNTS] + _AS_DOUBLES.unpack(_AS_BITS.pack(*bits[_COUNTS:]))


def split(data: bytes, trusted_jobs: Container[bytes] = _NO_JOBS) -> tuple[tuple, bytes]:
    """(record fields with all five phase totals and the coordinates, job_id bytes), else WireError.

    A phase the mask leaves out reads as 0.0; a version 1 datagram gets NO_COORDS. Checks all that
    one datagram alone can show; the intake checks the rest (monotonic totals, caps, rates,
    coordinates claimed twice). `trusted_jobs`: job ids already checked.
    """
    size = len(data)
    version = data[0] if size else 0
    extra = COORDS.size if version == 2 else 0
    if size <= _FULL_SIZE + extra or size > MAX_DATAGRAM or version not in VERSIONS \
            or data[2] != ALL_PHASES_MASK:
        record = _odd_shape(data)               # partial phase masks and everything invalid
    else:
        record = _FULL.unpack_from(data)
        expected = _FULL_SIZE + extra + record[I_JOB_LEN]
        if size != expected:
            raise WireError("truncated" if size < expected else "malformed", f"{size} bytes, expected {expected}")
        if max(_FLOAT_BITS.unpack_from(data, _FLOAT_OFFSET)) >= _INF_BITS:
            raise WireError("bad_value", "numbers must be finite and not negative")
        record += COORDS.unpack_from(data, _FULL_SIZE) if extra else NO_COORDS
    job = data[-record[I_JOB_LEN]:]
    if job not in trusted_jobs:
        check_job_id(job)
    if record[I_FLAGS] & ~(KNOWN_FLAGS if extra else 0):
        raise WireError("malformed", f"unknown flags {record[I_FLAGS]:#x}")
    if record[I_RANK] > MAX_RANK or record[I_LOCAL_RANK] < -1 or record[I_GPU] < -1:
        raise WireError("bad_rank", f"rank {record[I_RANK]}, local_rank {record[I_LOCAL_RANK]}, "
                        f"gpu {record[I_GPU]}")
    if sum(record[I_BUCKETS:I_TOKENS]) != record[I_STEPS]:
        raise WireError("malformed", "bucket counts do not add up to the step count")
    if extra:
        check_coordinates(record[I_PP_STAGE:])
    return record, job


def check_coordinates(coords: tuple) -> None:
    """Each parallel rank in -1 (unknown) .. its size - 1 (size 0: unknown); a sane comm floor."""
    stage, stages, tp_rank, tp_size, dp_rank, dp_size, comm_min, _, _ = coords
    for what, index, count, limit in (("pipeline stage", stage, stages, MAX_STAGES),
                                      ("tensor-parallel rank", tp_rank, tp_size, MAX_PARALLEL),
                                      ("data-parallel rank", dp_rank, dp_size, MAX_PARALLEL)):
        if not -1 <= index < limit or not 0 <= count <= limit or (count and index >= count):
            raise WireError("bad_coordinates", f"{what} {index} of {count}")
    if not 0.0 <= comm_min < math.inf or math.copysign(1.0, comm_min) < 0:
        raise WireError("bad_value", "numbers must be finite and not negative")


def _odd_shape(data: bytes) -> tuple:
    """Parse a datagram off the fast path: a partial phase mask, or say what is wrong with it."""
    size = len(data)
    if size > MAX_DATAGRAM:
        raise WireError("oversized", f"{size} bytes, at most {MAX_DATAGRAM}")
    if size == 0:
        raise WireError("truncated", "empty datagram")
    if data[0] not in VERSIONS:
        raise WireError("version", f"version {data[0]}, this agent reads {', '.join(map(str, VERSIONS))}")
    if size < 3:
        raise WireError("truncated", f"{size} bytes")
    mask = data[2]
    if mask > ALL_PHASES_MASK:
        raise WireError("unknown_phase", f"phase mask {mask:#x}")
    struct_ = RECORD_STRUCTS[mask]
    extra = COORDS.size if data[0] == 2 else 0
    fixed = struct_.size + extra
    if size < fixed:
        raise WireError("truncated", f"{size} bytes, the fixed part and phases alone are {fixed}")
    record = struct_.unpack_from(data)
    if size != fixed + record[I_JOB_LEN] or record[I_JOB_LEN] == 0:
        raise WireError("truncated" if size < fixed + record[I_JOB_LEN] else "malformed",
                        f"{size} bytes, expected {fixed + record[I_JOB_LEN]}")
    floats = record[I_TOKENS:]
    if not (sum(floats) < math.inf and min(floats) >= 0.0) or any(math.copysign(1.0, f) < 0 for f in floats):
        raise WireError("bad_value", "numbers must be finite and not negative")   # (-0.0 included)
    phases = iter(record[I_PHASES:-2])
    coords = COORDS.unpack_from(data, struct_.size) if extra else NO_COORDS
    return record[:I_PHASES] + tuple(next(phases) if mask >> i & 1 else 0.0 for i in range(len(PHASES))) \
        + record[-2:] + coords


def check_job_id(job: bytes) -> None:
    if not 0 < len(job) <= MAX_JOB_ID or not job.isascii() or not job.decode("ascii").isprintable() \
            or b'"' in job or b"\\" in job:
        raise WireError("bad_job_id", f"job_id must be 1..{MAX_JOB_ID} printable ASCII characters")


def socket_candidates(environ: Mapping[str, str] | None = None) -> list[str]:
    """Where an agent listens, most specific first: $FLOPWATCH_SOCKET, else the defaults."""
    env = os.environ if environ is None else environ
    if env.get(SOCKET_ENV):
        return [env[SOCKET_ENV]]
    return [DEFAULT_SOCKET, user_socket_path(env)]


def default_socket_path(environ: Mapping[str, str] | None = None) -> str:
    """Where an agent binds by default: /run/flopwatch when it may write there, else a per-user path."""
    directory = Path(DEFAULT_SOCKET).parent
    if os.geteuid() == 0 or (directory.is_dir() and os.access(directory, os.W_OK | os.X_OK)):
        return DEFAULT_SOCKET
    return user_socket_path(environ)


def user_socket_path(environ: Mapping[str, str] | None = None) -> str:
    """The socket of an agent that is not root: $XDG_RUNTIME_DIR/flopwatch, else /tmp/flopwatch-UID."""
    env = os.environ if environ is None else environ
    runtime = env.get("XDG_RUNTIME_DIR")
    if runtime and Path(runtime).is_dir():
        return str(Path(runtime) / "flopwatch" / "steps.sock")
    return f"/tmp/flopwatch-{os.getuid()}/steps.sock"

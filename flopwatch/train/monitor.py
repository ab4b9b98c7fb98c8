"""StepMonitor: times steps and phases in the training loop and hands them to the node agent.

It costs a few microseconds per step, never blocks, never raises into the training loop and never
queues: after a step it sends one non-blocking datagram carrying the rank's running totals (steps
closer together than `min_interval` share one), and a datagram that cannot be sent (agent down,
socket missing, queue full) is dropped and counted — the next one that gets through still brings
every total, the step-time histogram included, up to date.

    mon = StepMonitor(flops_per_step=F, tokens_per_step=T)
    for batch in loader:
        with mon.step():
            with mon.phase("data"): ...
            with mon.phase("compute"): ...
            with mon.phase("comm"): ...
            with mon.phase("optimizer"): ...
    mon.checkpoint(seconds=12.5, kind="save")

Phases are sequential (not nested); time in a step outside every phase counts as `other`.

In a pipeline (3D-parallel) job each rank also says where it sits — `pp_stage`, `dp_rank`,
`tp_rank` (and the sizes when known), or FLOPWATCH_PP_STAGE / FLOPWATCH_DP_RANK /
FLOPWATCH_TP_RANK — so the rules compare it with its peers of the same stage; a rank that says
nothing is stage 0 of a one-stage job. Each rank also keeps its shortest comm phase over blocks
of steps (a comparison per step): the job's floor for measuring per-step waiting.
"""

from __future__ import annotations

import atexit
import logging
import math
import os
import random
import socket
import struct
import time
import weakref
from bisect import bisect_left
from collections.abc import Callable, Mapping

from flopwatch.train import wire
from flopwatch.train.flops import FlopsAccount
from flopwatch.train.identity import (
    LOCAL_RANK_ENV,
    RANK_ENV,
    clean_job_id,
    coordinates,
    env_int,
    job_from_env,
    resolve_gpu,
)

log = logging.getLogger("flopwatch.train")

RECONNECT_INTERVAL_S = 1.0
#: Steps closer together than this share a datagram. The agent renders at most once a second and
#: every datagram carries running totals, so sending more often would buy nothing but cost.
DEFAULT_MIN_INTERVAL_S = 1.0

_OTHER = wire.PHASE_INDEX["other"]
_COMM = wire.PHASE_INDEX["comm"]
_MONITORS: weakref.WeakSet[StepMonitor] = weakref.WeakSet()


class _Phase:
    """Context manager timing one phase; one instance per phase name, reused every step."""

    __slots__ = ("index", "monitor", "started")

    def __init__(self, monitor: StepMonitor, index: int) -> None:
        self.monitor = monitor
        self.index = index
        self.started = 0.0

    def __enter__(self) -> None:
        self.started = self.monitor._clock()

    def __exit__(self, exc_type: object, exc: object, traceback: object) -> None:
        elapsed = self.monitor._clock() - self.started
        monitor = self.monitor
        monitor._phase_totals[self.index] += elapsed
        monitor._step_timed += elapsed


class _Untimed:
    """What `phase()` returns for a name it does not know: the time stays in `other`."""

    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type: object, exc: object, traceback: object) -> None:
        return None


class _Step:
    __slots__ = ("monitor", "started")

    def __init__(self, monitor: StepMonitor) -> None:
        self.monitor = monitor
        self.started = 0.0

    def __enter__(self) -> None:
        self.monitor._step_timed = 0.0
        self.started = self.monitor._clock()

    def __exit__(self, exc_type: object, exc: object, traceback: object) -> None:
        ended = self.monitor._clock()
        if exc_type is not None:  # a failed step is no completed step; let the error through
            return
        monitor = self.monitor
        try:
            seconds = ended - self.started
            untimed = seconds - monitor._step_timed
            if untimed > 0.0:
                monitor._phase_totals[_OTHER] += untimed
            monitor._complete_step(seconds, ended)
        except Exception as error:  # never into the training loop
            monitor._internal_error(error)


class _CheckpointTimer:
    __slots__ = ("kind", "monitor", "started")

    def __init__(self, monitor: StepMonitor, kind: str) -> None:
        self.monitor, self.kind, self.started = monitor, kind, 0.0

    def __enter__(self) -> None:
        self.started = self.monitor._clock()

    def __exit__(self, exc_type: object, exc: object, traceback: object) -> None:
        self.monitor.checkpoint(self.monitor._clock() - self.started, self.kind)


class StepMonitor:
    """Per-rank step telemetry for the FlopWatch node agent (see the module docstring)."""

    def __init__(
        self,
        flops_per_step: float | FlopsAccount = 0.0,
        tokens_per_step: float = 0.0,
        *,
        hardware_flops_per_step: float | None = None,
        job_id: str | None = None,
        rank: int | None = None,
        local_rank: int | None = None,
        gpu: int | None = None,
        socket_path: str | None = None,
        min_interval: float = DEFAULT_MIN_INTERVAL_S,
        environ: Mapping[str, str] | None = None,
        pp_stage: int | None = None,
        dp_rank: int | None = None,
        tp_rank: int | None = None,
        pp_size: int | None = None,
        dp_size: int | None = None,
        tp_size: int | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        env = os.environ if environ is None else environ
        self._clock = clock          # seconds, for the step, phase and checkpoint timers (tests pass their own)
        analytic, measured = self._set_rates(flops_per_step, tokens_per_step, hardware_flops_per_step)
        self.job_id = clean_job_id(job_id if job_id is not None else job_from_env(env))
        self.rank = env_int(rank, RANK_ENV, env, 0, 0, wire.MAX_RANK, "rank")
        self.local_rank = env_int(local_rank, LOCAL_RANK_ENV, env, -1, -1, 32767, "local rank")
        self.gpu = (resolve_gpu(None, self.local_rank, env) if gpu is None
                    else env_int(gpu, (), env, -1, -1, 32767, "GPU index"))
        self.instance = random.getrandbits(32)
        self.coordinates = coordinates(env, pp_stage=pp_stage, pp_size=pp_size, dp_rank=dp_rank,
                                       dp_size=dp_size, tp_rank=tp_rank, tp_size=tp_size)
        self.socket_paths = [socket_path] if socket_path else wire.socket_candidates(env)
        if not 0 <= min_interval <= 60:
            raise ValueError(f"StepMonitor: min_interval = {min_interval!r}; expected 0 to 60 seconds")
        self.min_interval = float(min_interval)
        self._zero_totals()
        self._prepare_datagram(analytic, measured)
        self._sock: socket.socket | None = None
        self._next_connect = 0.0
        self._next_send = 0.0
        self._warned: set[str] = set()
        self._enabled = True
        self._step_cm = _Step(self)
        self._phases = {name: _Phase(self, i) for i, name in enumerate(wire.PHASES) if name != "other"}
        self._untimed = _Untimed()
        _MONITORS.add(self)
        self._connect(self._clock())

    def _set_rates(self, flops_per_step: float | FlopsAccount, tokens_per_step: float,
                   hardware_flops_per_step: float | None) -> tuple[float, float]:
        """FLOPs and tokens per step, from numbers or a FlopsAccount; returns the account's
        (analytic, measured) FLOPs per step, 0 where not given."""
        analytic = measured = 0.0
        if isinstance(flops_per_step, FlopsAccount):
            account = flops_per_step
            tokens_per_step = tokens_per_step or account.tokens_per_step
            flops_per_step = account.model_per_step
            if hardware_flops_per_step is None:
                hardware_flops_per_step = account.hardware_per_step
            analytic = account.analytic_per_step or 0.0
            measured = account.measured_per_step or 0.0
        if hardware_flops_per_step is None:
            hardware_flops_per_step = flops_per_step
        for name, value in (("flops_per_step", flops_per_step), ("tokens_per_step", tokens_per_step),
                            ("hardware_flops_per_step", hardware_flops_per_step)):
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) \
                    or value < 0:
                raise ValueError(f"StepMonitor: {name} = {value!r}; expected a finite number >= 0")
        self.flops_per_step = float(flops_per_step)
        self.tokens_per_step = float(tokens_per_step)
        self.hardware_flops_per_step = float(hardware_flops_per_step)
        self._flops_per_token = self.flops_per_step / self.tokens_per_step if self.tokens_per_step else 0.0
        self._hw_per_token = (self.hardware_flops_per_step / self.tokens_per_step
                              if self.tokens_per_step else 0.0)
        return analytic, measured

    def _zero_totals(self) -> None:
        """The running totals every datagram carries, and the per-step state."""
        self.dropped = 0          # datagrams not handed to the agent
        self.sent = 0
        self.steps = 0
        self.tokens = 0.0
        self.model_flops = 0.0
        self.hardware_flops = 0.0
        self.step_seconds = 0.0
        self.checkpoint_seconds = [0.0, 0.0]   # save, restore
        self.buckets = [0] * wire.N_BUCKETS    # steps per step-time bucket
        self._phase_totals = [0.0] * len(wire.PHASES)
        self._step_timed = 0.0
        self._step_tokens: float | None = None
        self._step_iteration: int | None = None
        self.iteration: int | None = None      # the training iteration of the last step, once given
        self._comm_seen = 0.0          # comm phase total at the end of the last step
        self._block_min = math.inf     # shortest comm phase of a step in the current block
        self._block_steps = 0
        self.comm_min: float | None = None   # of the last completed block

    def _prepare_datagram(self, analytic: float, measured: float) -> None:
        """Who we are rarely changes: pack it once; each send packs only the running totals."""
        self._analytic, self._measured = analytic, measured
        self._totals = struct.Struct(wire.TOTALS.format + "d" * len(wire.PHASES))
        self._buffer = bytearray(wire.HEAD.size + self._totals.size) + wire.GAUGES.pack(analytic, measured) \
            + bytes(wire.COORDS.size) + self.job_id.encode("ascii")
        self._coords_at = wire.HEAD.size + self._totals.size + wire.GAUGES.size
        self._iteration_at = self._coords_at + wire.COORDS.size - wire.ITERATION.size
        self._pack_head()
        self._pack_coordinates()

    # -- the training loop's API ---------------------------------------------------------------
    def step(self, tokens: float | None = None, iteration: int | None = None) -> _Step:
        """Context manager around one training step; `tokens` overrides tokens_per_step for it.

        `iteration`: the job's global step number of this step (restored from the checkpoint after
        a restart), so that steps done again after a restart count as lost progress."""
        self._step_tokens = tokens
        self._step_iteration = iteration
        return self._step_cm

    def phase(self, name: str) -> _Phase | _Untimed:
        """Context manager timing a phase: data, compute, comm or optimizer."""
        timer = self._phases.get(name)
        if timer is None:
            self._warn_once(f"phase:{name}", f"unknown phase {name!r} (known: data, compute, comm, "
                            "optimizer); its time counts as 'other'")
            return self._untimed
        return timer

    def checkpoint(self, seconds: float | None = None, kind: str = "save") -> _CheckpointTimer | None:
        """Record `seconds` spent saving or restoring; without seconds, a context manager timing it."""
        if kind not in wire.CHECKPOINT_KINDS:
            self._warn_once(f"kind:{kind}", f"checkpoint kind {kind!r} ignored; expected save or restore")
            return None
        if seconds is None:
            return _CheckpointTimer(self, kind)
        try:
            if isinstance(seconds, bool) or not isinstance(seconds, int | float) \
                    or not math.isfinite(seconds) or seconds < 0:
                self._warn_once("checkpoint-seconds",
                                f"checkpoint seconds {seconds!r} ignored; expected a finite number >= 0")
                return None
            self.checkpoint_seconds[wire.CHECKPOINT_KINDS.index(kind)] += seconds
            self._send(self._clock())
        except Exception as error:
            self._internal_error(error)
        return None

    def record_step(self, seconds: float, phases: Mapping[str, float], tokens: float | None = None,
                    iteration: int | None = None) -> None:
        """Report a step timed elsewhere (the PyTorch integration); untimed time goes to `other`."""
        try:
            if not 0.0 <= seconds < math.inf:
                seconds = 0.0
            timed = 0.0
            for name, value in phases.items():
                index = wire.PHASE_INDEX.get(name)
                if index is None or index == _OTHER or not 0.0 <= value < math.inf:
                    continue
                self._phase_totals[index] += value
                timed += value
            if seconds > timed:
                self._phase_totals[_OTHER] += seconds - timed
            self._step_tokens = tokens
            self._step_iteration = iteration
            self._complete_step(seconds, self._clock())
        except Exception as error:
            self._internal_error(error)

    def set_coordinates(self, *, pp_stage: int | None = None, dp_rank: int | None = None,
                        tp_rank: int | None = None, pp_size: int | None = None, dp_size: int | None = None,
                        tp_size: int | None = None) -> None:
        """Where this rank sits in a 3D-parallel job, once known (the PyTorch integration reads the
        device mesh); None leaves a coordinate as it was. Invalid values raise ValueError."""
        given = {"pp_stage": pp_stage, "pp_size": pp_size, "tp_rank": tp_rank, "tp_size": tp_size,
                 "dp_rank": dp_rank, "dp_size": dp_size}
        merged = {name: value if value is not None else current
                  for (name, value), current in zip(given.items(), self.coordinates, strict=True)}
        self.coordinates = coordinates({}, **merged)
        self._pack_coordinates()

    def set_gpu(self, gpu: int) -> None:
        """The GPU index this rank uses, once known (the PyTorch integration reads the model's device)."""
        if isinstance(gpu, int) and -1 <= gpu <= 32767:
            self.gpu = gpu
            self._pack_head()

    def flush(self) -> None:
        """Send the totals now (steps inside `min_interval` of the last send wait for the next one)."""
        try:
            self._send(self._clock())
        except Exception as error:
            self._internal_error(error)

    def close(self) -> None:
        """Flush and stop; later steps are counted as dropped."""
        if self._enabled:
            self.flush()
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        self._enabled = False
        self._next_send = 0.0

    def __enter__(self) -> StepMonitor:
        return self

    def __exit__(self, exc_type: object, exc: object, traceback: object) -> None:
        self.close()

    @property
    def phase_seconds(self) -> dict[str, float]:
        return dict(zip(wire.PHASES, self._phase_totals, strict=True))

    # -- internals -----------------------------------------------------------------------------
    def _pack_head(self) -> None:
        flags = wire.FLAG_ITERATION if self.iteration is not None else 0
        wire.HEAD.pack_into(self._buffer, 0, wire.VERSION, flags, wire.ALL_PHASES_MASK, len(self.job_id),
                            self.rank, self.local_rank, self.gpu, self.instance)

    def _pack_coordinates(self) -> None:
        comm_min = self.comm_min
        wire.COORDS.pack_into(self._buffer, self._coords_at, *self.coordinates,
                              comm_min if comm_min is not None else 0.0,
                              wire.COMM_MIN_BLOCK if comm_min is not None else 0, self.iteration or 0)

    def _complete_step(self, seconds: float, now: float) -> None:
        tokens = self._step_tokens
        if self._step_iteration is not None:
            self._take_iteration(self._step_iteration)
        comm = self._phase_totals[_COMM]
        step_comm = comm - self._comm_seen
        self._comm_seen = comm
        if step_comm < self._block_min:   # noqa: PLR1730 (a comparison is cheaper than min() per step)
            self._block_min = step_comm
        self._block_steps += 1
        if self._block_steps == wire.COMM_MIN_BLOCK:
            self.comm_min = max(self._block_min, 0.0)
            self._block_min, self._block_steps = math.inf, 0
            self._pack_coordinates()
        self.steps += 1
        self.step_seconds += seconds
        self.buckets[bisect_left(wire.STEP_BUCKETS, seconds)] += 1
        if tokens is None:
            self.tokens += self.tokens_per_step
            self.model_flops += self.flops_per_step
            self.hardware_flops += self.hardware_flops_per_step
        else:
            self._step_tokens = None
            tokens = float(tokens)
            if not 0.0 <= tokens < math.inf:
                tokens = 0.0
            self.tokens += tokens
            if self._flops_per_token:
                self.model_flops += tokens * self._flops_per_token
                self.hardware_flops += tokens * self._hw_per_token
            else:
                self.model_flops += self.flops_per_step
                self.hardware_flops += self.hardware_flops_per_step
        if now >= self._next_send:
            self._send(now)

    def _take_iteration(self, iteration: object) -> None:
        self._step_iteration = None
        if isinstance(iteration, bool) or not isinstance(iteration, int) or not 0 <= iteration < 1 << 64:
            self._warn_once("iteration", f"iteration {iteration!r} ignored; expected an integer >= 0")
            return
        first = self.iteration is None
        self.iteration = iteration
        if first:
            self._pack_head()                  # the flag says the field is set from now on
        wire.ITERATION.pack_into(self._buffer, self._iteration_at, iteration)

    def _send(self, now: float) -> None:
        self._next_send = now + self.min_interval
        sock = self._sock
        if sock is None:
            if not self._enabled or now < self._next_connect or not self._connect(now):
                self.dropped += 1
                return
            sock = self._sock
        self._totals.pack_into(
            self._buffer, wire.HEAD.size, self.steps, self.dropped, *self.buckets, self.tokens,
            self.model_flops, self.hardware_flops, self.step_seconds, self.checkpoint_seconds[0],
            self.checkpoint_seconds[1], *self._phase_totals,
        )
        try:
            sock.send(self._buffer, socket.MSG_DONTWAIT)  # type: ignore[union-attr]
            self.sent += 1
        except BlockingIOError:          # the agent's queue is full: drop, it will catch up
            self.dropped += 1
        except OSError as error:         # the agent went away (restart, stop): reconnect later
            self.dropped += 1
            self._disconnect(now, error)

    def _connect(self, now: float) -> bool:
        self._next_connect = now + RECONNECT_INTERVAL_S
        if not self._enabled:
            return False
        for path in self.socket_paths:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            try:
                sock.setblocking(False)
                sock.connect(path)
            except OSError as error:
                sock.close()
                if isinstance(error, PermissionError):
                    self._warn_once(f"perm:{path}", f"no permission to write to {path}; ask for the "
                                    "agent's train.socket_group or set FLOPWATCH_SOCKET")
                continue
            self._sock = sock
            if "connected" not in self._warned:
                self._warned.add("connected")
                log.info("step telemetry to %s as job %s rank %d", path, self.job_id, self.rank)
            return True
        self._warn_once("no-agent", f"no FlopWatch agent at {' or '.join(self.socket_paths)}; steps are "
                        "counted and dropped until one appears (set FLOPWATCH_SOCKET to point elsewhere)")
        return False

    def _disconnect(self, now: float, error: OSError) -> None:
        if self._sock is not None:
            self._sock.close()
        self._sock = None
        self._next_connect = now + RECONNECT_INTERVAL_S
        log.debug("step telemetry socket lost (%s); reconnecting", error)

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning("flopwatch: %s", message)

    def _internal_error(self, error: Exception) -> None:
        self.dropped += 1
        self._warn_once(f"internal:{type(error).__name__}", f"step telemetry error ignored: {error!r}")


def _after_fork_in_child() -> None:
    """A forked child (a data-loader worker) must not report as its parent's rank."""
    for monitor in list(_MONITORS):
        monitor._sock = None
        monitor._enabled = False


def _flush_all() -> None:
    """At interpreter exit, send what coalescing held back."""
    for monitor in list(_MONITORS):
        if monitor._enabled:
            monitor.flush()


os.register_at_fork(after_in_child=_after_fork_in_child)
atexit.register(_flush_all)

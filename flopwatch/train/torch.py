"""PyTorch integration: time data, compute, comm and optimizer phases without hand-placed phases.

    model = DistributedDataParallel(net)         # or FSDP, or a plain module
    mon = StepMonitor(flops_per_step=F, tokens_per_step=T)
    telemetry = instrument(model, mon, optimizer)
    for x, y in loader:                           # unchanged training loop
        loss_fn(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad()
    telemetry.close()

Marks are taken by hooks, none of them on the communication path:

  * a forward pre-hook: compute starts; the time since the previous step ended is `data`;
  * gradient hooks on a few output-side parameters, the first of which queues an end-of-backward
    callback. That callback runs once autograd has computed every gradient (so every gradient
    bucket has been handed to the collective) but before the callback DDP or FSDP queued later,
    which waits for the reduction: the compute ends here. It queues one more callback, which runs
    after the wrapper's: the gradients are reduced, the comm wait is over;
  * optimizer step pre/post hooks: `optimizer`; the post hook ends the step.

Each step carries the training iteration (so that steps done again after a restart from a
checkpoint count as lost progress): the loop's, where it gives one (`telemetry.set_iteration(i)`,
`end_step(iteration=i)`, or `instrument(..., iteration=lambda: trainer.step)`), else the
optimizer's own step count (`state["step"]` of Adam, AdamW and most torch optimizers, which a
checkpoint of the optimizer's state_dict restores), read after its step. A count kept on the device
(`capturable`/`fused` optimizers) is read once and then counted on the host, never synchronising per
step; an optimizer without one (plain SGD) sends no iteration unless the loop gives it.

    data      = forward start - previous step end
    compute   = local backward done - forward start    (forward + backward up to the collective)
    comm      = gradients reduced - local backward done (the wait a straggler imposes on the others)
    optimizer = optimizer step end - start;  other = the rest

A checkpoint timed with `StepMonitor.checkpoint()` between two steps is checkpoint time: it is
taken out of the next step's data phase and step time, so it is not counted twice.

DDP's own allreduce (and any communication hook the user registers) is left alone, and no Python
runs on the communication library's threads. FSDP queues its wait for the reductions before any
callback of ours can be queued, so under FSDP the collective time counts as compute (a warning
says so); steps, data, optimizer and step time are right.

On CPU the marks are `time.perf_counter()` readings. On GPU they are CUDA events recorded on the
current stream; they are read at later step boundaries once complete (`Event.query()`), never
synchronising the device, so a step is reported one or more steps late.

Torch is imported lazily (the client library itself never needs it).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from flopwatch.train.identity import resolve_gpu
from flopwatch.train.monitor import StepMonitor

log = logging.getLogger("flopwatch.train")

#: Steps whose CUDA events may still be pending; older ones are reported without GPU phases.
MAX_PENDING_STEPS = 16


class CpuClock:
    """Marks are perf_counter readings: always ready."""

    lazy = False

    def mark(self) -> float:
        return time.perf_counter()

    def ready(self, mark: Any) -> bool:
        return True

    def seconds(self, start: Any, end: Any) -> float:
        return end - start

    def wait(self, mark: Any) -> None:
        return None


class CudaClock:
    """Marks are CUDA events on the current stream, read only once the device has passed them."""

    lazy = True

    def __init__(self) -> None:
        import torch

        self._event = torch.cuda.Event

    def mark(self) -> Any:
        event = self._event(enable_timing=True)
        event.record()
        return event

    def ready(self, mark: Any) -> bool:
        return bool(mark.query())

    def seconds(self, start: Any, end: Any) -> float:
        return start.elapsed_time(end) / 1000.0

    def wait(self, mark: Any) -> None:
        mark.synchronize()


#: Gradient hooks go on this many parameters from the output end (their gradients come first).
WATCHED_PARAMETERS = 8


@dataclass
class _StepMarks:
    start: Any = None          # previous step's end (None for the first step)
    forward: Any = None
    backward_done: Any = None  # every local gradient computed and handed to the collective
    reduced: Any = None        # the wrapper's end-of-backward wait is over
    optimizer_start: Any = None
    end: Any = None
    tokens: float | None = None
    iteration: int | None = None
    checkpointed: float = 0.0  # the monitor's checkpoint seconds when the step started, then at forward
    checkpoint_in_data: float = 0.0   # checkpoint seconds between the previous step and this forward


class OptimizerIteration:
    """The optimizer's step count after its step: `state["step"]` of its first parameter that has one.

    A count on the host is read every step (cheap); one on the device is read once, then counted
    here, so that no step waits for the device.
    """

    def __init__(self, optimizer: Any) -> None:
        self.optimizer = optimizer
        self._counted: int | None = None     # counting on the host since a device read

    def __call__(self) -> int | None:
        if self._counted is not None:
            self._counted += 1
            return self._counted
        step = self._state_step()
        if step is None:
            return None
        if getattr(step, "device", None) is not None and step.device.type != "cpu":
            self._counted = int(step.item())     # one synchronisation, at the first step
            return self._counted
        return int(step.item()) if hasattr(step, "item") else int(step)

    def _state_step(self) -> Any:
        state = self.optimizer.state
        for group in self.optimizer.param_groups:
            for parameter in group["params"]:
                step = state[parameter].get("step") if parameter in state else None
                if step is not None:
                    return step
        return None


class Instrumentation:
    """Hooks on one model and optimizer feeding a StepMonitor; `close()` removes them."""

    def __init__(self, model: Any, monitor: StepMonitor, optimizer: Any = None, *, clock: Any = None,
                 iteration: Callable[[], int | None] | None = None) -> None:
        import torch

        self._torch = torch
        self._engine = torch.autograd.Variable._execution_engine
        self.monitor = monitor
        self.clock = clock if clock is not None else _clock_for(model)
        self._current = _StepMarks(checkpointed=sum(monitor.checkpoint_seconds))
        self._pending: deque[_StepMarks] = deque()
        self._lock = threading.Lock()
        self._handles: list[Any] = []
        self._backward_watched = False
        self._given_iteration: int | None = None
        if iteration is None and optimizer is not None:
            iteration = OptimizerIteration(optimizer)
        self._iteration = iteration
        if _is_fsdp(model):
            log.warning("flopwatch: FSDP waits for its reductions before any end-of-backward callback of "
                        "ours can run, so its collective time counts as compute and comm reads 0; time "
                        "phases by hand (StepMonitor.phase) to split them")
        self._set_gpu(model)
        self._handles.append(model.register_forward_pre_hook(self._on_forward))
        trained = [p for p in model.parameters() if p.requires_grad]
        for parameter in trained[-WATCHED_PARAMETERS:]:
            self._handles.append(parameter.register_post_accumulate_grad_hook(self._on_gradient))
        if optimizer is not None:
            self._handles.append(optimizer.register_step_pre_hook(self._on_optimizer_start))
            self._handles.append(optimizer.register_step_post_hook(self._on_optimizer_end))

    # -- hooks ---------------------------------------------------------------------------------
    def _on_forward(self, module: Any, args: Any) -> None:
        try:
            current = self._current
            if current.forward is None and self._torch.is_grad_enabled():
                current.forward = self.clock.mark()
                # a checkpoint saved between steps is checkpoint time, not this step's data loading
                current.checkpoint_in_data = sum(self.monitor.checkpoint_seconds) - current.checkpointed
        except Exception as error:
            self.monitor._internal_error(error)

    def _on_gradient(self, parameter: Any) -> None:
        """A watched gradient is ready (early in the backward): watch for the backward's end."""
        if self._backward_watched:
            return
        try:
            self._engine.queue_callback(self._after_backward)
            self._backward_watched = True
        except Exception as error:
            self.monitor._internal_error(error)

    def _after_backward(self) -> None:
        """First end-of-backward callback: every gradient is computed and its bucket launched; the
        wrapper's callback (waiting for the reduction) was queued after this one, so one queued
        now runs after it."""
        try:
            self._current.backward_done = self.clock.mark()
            self._engine.queue_callback(self._after_reduce)
        except Exception as error:
            self._backward_watched = False
            self.monitor._internal_error(error)

    def _after_reduce(self) -> None:
        """The gradients are reduced (CPU: the wait is over; GPU: the stream waits for them)."""
        self._backward_watched = False
        try:
            self._current.reduced = self.clock.mark()
        except Exception as error:
            self.monitor._internal_error(error)

    def _on_optimizer_start(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        try:
            self._current.optimizer_start = self.clock.mark()
        except Exception as error:
            self.monitor._internal_error(error)

    def _on_optimizer_end(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        try:
            self.end_step()
        except Exception as error:
            self.monitor._internal_error(error)

    # -- step boundaries -----------------------------------------------------------------------
    def set_iteration(self, iteration: int) -> None:
        """The training iteration of the step in progress (the loop's global step number)."""
        self._given_iteration = iteration

    def end_step(self, tokens: float | None = None, iteration: int | None = None) -> None:
        """End the current step (the optimizer post-hook calls this; call it without an optimizer)."""
        end = self.clock.mark()
        with self._lock:
            marks = self._current
            self._current = _StepMarks(start=end, checkpointed=sum(self.monitor.checkpoint_seconds))
        marks.end, marks.tokens = end, tokens
        marks.iteration = self._step_iteration(iteration)
        self._pending.append(marks)
        self._report_ready()

    def _report_ready(self, wait: bool = False) -> None:
        """Report every pending step whose marks the device has passed, oldest first."""
        clock = self.clock
        while self._pending:
            marks = self._pending[0]
            waited = [mark for mark in (marks.end, marks.reduced) if mark is not None]
            ready = all(clock.ready(mark) for mark in waited)
            if not ready and not wait:
                if len(self._pending) <= MAX_PENDING_STEPS:
                    return
                self._pending.popleft()         # the device is far behind: count the step anyway
                self.monitor.record_step(0.0, {}, marks.tokens, marks.iteration)
                continue
            if not ready:
                for mark in waited:
                    clock.wait(mark)
            self._pending.popleft()
            self._report(marks)

    def _report(self, marks: _StepMarks) -> None:
        seconds = self.clock.seconds
        first = marks.start if marks.start is not None else marks.forward
        if first is None:
            first = marks.optimizer_start if marks.optimizer_start is not None else marks.end
        phases: dict[str, float] = {}
        saved = marks.checkpoint_in_data if marks.start is not None else 0.0
        if marks.forward is not None:
            phases["data"] = seconds(first, marks.forward) - saved
            compute_end = marks.backward_done if marks.backward_done is not None else marks.optimizer_start
            if compute_end is not None:
                phases["compute"] = seconds(marks.forward, compute_end)
        if marks.backward_done is not None and marks.reduced is not None:
            phases["comm"] = seconds(marks.backward_done, marks.reduced)
        if marks.optimizer_start is not None:
            phases["optimizer"] = seconds(marks.optimizer_start, marks.end)
        phases = {name: max(0.0, value) for name, value in phases.items()}
        self.monitor.record_step(max(0.0, seconds(first, marks.end) - saved), phases, marks.tokens, marks.iteration)

    def _step_iteration(self, given: int | None) -> int | None:
        """The iteration of the step that just ended: given to end_step, set by the loop, or read."""
        if given is None:
            given, self._given_iteration = self._given_iteration, None
        if given is not None or self._iteration is None:
            return given
        try:
            return self._iteration()
        except Exception as error:
            self._iteration = None               # a reader that fails once is not asked again
            self.monitor._internal_error(error)
            return None

    def close(self) -> None:
        """Report what is still pending (waiting for the device once, here) and remove the hooks."""
        try:
            self._report_ready(wait=True)
        except Exception as error:
            self.monitor._internal_error(error)
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def _set_gpu(self, model: Any) -> None:
        device = _device_of(model)
        if device is not None and device.type == "cuda" and os.environ.get("FLOPWATCH_GPU") is None:
            index = device.index if device.index is not None else self._torch.cuda.current_device()
            self.monitor.set_gpu(resolve_gpu(index, self.monitor.local_rank, os.environ))


def instrument(model: Any, monitor: StepMonitor, optimizer: Any = None, *, clock: Any = None, mesh: Any = None,
               pp_group: Any = None, dp_group: Any = None, tp_group: Any = None,
               iteration: Callable[[], int | None] | None = None) -> Instrumentation:
    """Hook `model` (DDP, FSDP or any module) and `optimizer` to report every step to `monitor`.

    `clock`: CpuClock or CudaClock (default: from the model's device). In a 3D-parallel job, pass
    the `DeviceMesh` (torchtitan: its `pp`, `dp` or `dp_replicate`/`dp_shard`, and `tp` dimensions)
    or the pipeline, data- and tensor-parallel process groups, so the rank reports its stage and
    is compared with its peers. `iteration`: returns the training iteration of the step that just
    ended (default: the optimizer's step count, see the module docstring).
    """
    coordinates = mesh_coordinates(mesh) if mesh is not None else {}
    coordinates.update(group_coordinates(pp=pp_group, dp=dp_group, tp=tp_group))
    if coordinates:
        monitor.set_coordinates(**coordinates)
    return Instrumentation(model, monitor, optimizer, clock=clock, iteration=iteration)


def mesh_coordinates(mesh: Any) -> dict[str, int]:
    """This rank's place in a DeviceMesh, by dimension name: pp, dp (or dp_replicate x dp_shard), tp."""
    names = tuple(mesh.mesh_dim_names or ())

    def place(name: str) -> tuple[int, int]:
        return int(mesh.get_local_rank(name)), int(mesh.size(names.index(name)))

    out: dict[str, int] = {}
    if "pp" in names:
        out["pp_stage"], out["pp_size"] = place("pp")
    if "tp" in names:
        out["tp_rank"], out["tp_size"] = place("tp")
    if "dp" in names:
        out["dp_rank"], out["dp_size"] = place("dp")
    elif {"dp_replicate", "dp_shard"} & set(names):
        rank, size = 0, 1
        for name in ("dp_replicate", "dp_shard"):      # torchtitan's HSDP dimensions, outer first
            if name in names:
                index, width = place(name)
                rank, size = rank * width + index, size * width
        out["dp_rank"], out["dp_size"] = rank, size
    return out


def group_coordinates(*, pp: Any = None, dp: Any = None, tp: Any = None) -> dict[str, int]:
    """This rank's place from process groups (Megatron-LM's parallel_state groups, for instance)."""
    import torch.distributed as dist

    out: dict[str, int] = {}
    for group, index, size in ((pp, "pp_stage", "pp_size"), (dp, "dp_rank", "dp_size"), (tp, "tp_rank", "tp_size")):
        if group is not None:
            out[index], out[size] = dist.get_rank(group), dist.get_world_size(group)
    return out


def _is_fsdp(model: Any) -> bool:
    try:
        from torch.distributed.fsdp import FSDPModule, FullyShardedDataParallel
    except ImportError:
        return False
    return isinstance(model, FullyShardedDataParallel | FSDPModule)


def _device_of(model: Any) -> Any:
    for parameter in model.parameters():
        return parameter.device
    return None


def _clock_for(model: Any) -> CpuClock | CudaClock:
    device = _device_of(model)
    if device is not None and device.type == "cuda":
        return CudaClock()
    return CpuClock()

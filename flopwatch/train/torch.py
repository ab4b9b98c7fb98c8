"""PyTorch integration: time data, compute, comm and optimizer phases without hand-placed phases.

    model = DistributedDataParallel(net)
    mon = StepMonitor(flops_per_step=F, tokens_per_step=T)
    telemetry = instrument(model, mon, optimizer)
    for x, y in loader:                # unchanged training loop
        loss_fn(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad()
    telemetry.close()

Marks are taken by hooks: a forward pre-hook (compute starts; the time since the last step ended
is `data`), a DDP communication hook wrapping the allreduce (each bucket's launch, and the moment
its result is ready), and optimizer step pre/post hooks (`optimizer`; the post hook ends the step).
Per step:

    data      = forward start - previous step end
    compute   = last gradient bucket launched - forward start   (forward + backward up to the collective)
    comm      = last allreduce done - last bucket launched       (the wait a straggler imposes on the others)
    optimizer = optimizer step end - start;  other = the rest

On CPU the marks are `time.perf_counter()` readings. On GPU they are CUDA events recorded on the
current stream; they are read at later step boundaries once complete (`Event.query()`), never
synchronising the device, so a step is reported one or more steps late. FSDP and other wrappers
without a DDP communication hook get data, compute (collectives included) and optimizer.

Torch is imported lazily (the client library itself never needs it).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from flopwatch.train.monitor import StepMonitor, resolve_gpu

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


@dataclass
class _StepMarks:
    start: Any = None          # previous step's end (None for the first step)
    forward: Any = None
    last_launch: Any = None
    done: list[Any] = field(default_factory=list)
    optimizer_start: Any = None
    end: Any = None
    tokens: float | None = None


class Instrumentation:
    """Hooks on one model and optimizer feeding a StepMonitor; `close()` removes them."""

    def __init__(self, model: Any, monitor: StepMonitor, optimizer: Any = None, *,
                 clock: Any = None, comm_hook: Callable[..., Any] | None = None, comm_state: Any = None,
                 process_group: Any = None) -> None:
        import torch

        self._torch = torch
        self.monitor = monitor
        self.clock = clock if clock is not None else _clock_for(model)
        self._current = _StepMarks()
        self._pending: deque[_StepMarks] = deque()
        self._done_lock = threading.Lock()
        self._handles: list[Any] = []
        self.comm_timed = False
        self._set_gpu(model)
        self._handles.append(model.register_forward_pre_hook(self._on_forward))
        if _is_ddp(model):
            self._install_comm_hook(model, comm_hook, comm_state, process_group)
            self.comm_timed = True
        elif comm_hook is not None:
            raise ValueError("comm_hook is only for DistributedDataParallel models")
        if optimizer is not None:
            self._handles.append(optimizer.register_step_pre_hook(self._on_optimizer_start))
            self._handles.append(optimizer.register_step_post_hook(self._on_optimizer_end))

    # -- hooks (training thread, except _on_done) ----------------------------------------------
    def _on_forward(self, module: Any, args: Any) -> None:
        try:
            if self._current.forward is None and self._torch.is_grad_enabled():
                self._current.forward = self.clock.mark()
        except Exception as error:
            self.monitor._internal_error(error)

    def _install_comm_hook(self, model: Any, inner: Callable[..., Any] | None, state: Any,
                           process_group: Any) -> None:
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        if inner is None:
            inner, state = default_hooks.allreduce_hook, process_group

        def timed_hook(hook_state, bucket):  # type: ignore[no-untyped-def]  # DDP checks annotations
            try:
                self._current.last_launch = self.clock.mark()
            except Exception as error:
                self.monitor._internal_error(error)
            return inner(hook_state, bucket).then(self._on_done)

        model.register_comm_hook(state, timed_hook)

    def _on_done(self, future: Any) -> Any:
        """Runs when a bucket's allreduce is ready (gloo thread on CPU; a synced stream on GPU)."""
        try:
            mark = self.clock.mark()
            with self._done_lock:
                self._current.done.append(mark)
        except Exception as error:
            self.monitor._internal_error(error)
        return future.value()

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
    def end_step(self, tokens: float | None = None) -> None:
        """End the current step (the optimizer post-hook calls this; call it without an optimizer)."""
        end = self.clock.mark()
        with self._done_lock:
            marks, self._current = self._current, _StepMarks(start=end)
        marks.end, marks.tokens = end, tokens
        self._pending.append(marks)
        self._report_ready()

    def _report_ready(self, wait: bool = False) -> None:
        """Report every pending step whose marks the device has passed, oldest first."""
        clock = self.clock
        while self._pending:
            marks = self._pending[0]
            ready = all(clock.ready(mark) for mark in (marks.end, *marks.done))
            if not ready and not wait:
                if len(self._pending) <= MAX_PENDING_STEPS:
                    return
                self._pending.popleft()         # the device is far behind: count the step anyway
                self.monitor.record_step(0.0, {}, marks.tokens)
                continue
            if not ready:
                for mark in (marks.end, *marks.done):
                    clock.wait(mark)
            self._pending.popleft()
            self._report(marks)

    def _report(self, marks: _StepMarks) -> None:
        seconds = self.clock.seconds
        first = marks.start if marks.start is not None else marks.forward
        if first is None:
            first = marks.optimizer_start if marks.optimizer_start is not None else marks.end
        phases: dict[str, float] = {}
        if marks.forward is not None:
            phases["data"] = seconds(first, marks.forward)
            compute_end = marks.last_launch if marks.last_launch is not None else marks.optimizer_start
            if compute_end is not None:
                phases["compute"] = seconds(marks.forward, compute_end)
        if marks.last_launch is not None and marks.done:
            phases["comm"] = max(0.0, *(seconds(marks.last_launch, done) for done in marks.done))
        if marks.optimizer_start is not None:
            phases["optimizer"] = seconds(marks.optimizer_start, marks.end)
        phases = {name: max(0.0, value) for name, value in phases.items()}
        self.monitor.record_step(max(0.0, seconds(first, marks.end)), phases, marks.tokens)

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


def instrument(model: Any, monitor: StepMonitor, optimizer: Any = None, **options: Any) -> Instrumentation:
    """Hook `model` (DDP, FSDP or any module) and `optimizer` to report every step to `monitor`.

    options: comm_hook/comm_state (a DDP communication hook to wrap instead of plain allreduce),
    process_group (for the default allreduce), clock (CpuClock/CudaClock; default from the model's
    device).
    """
    return Instrumentation(model, monitor, optimizer, **options)


def _is_ddp(model: Any) -> bool:
    from torch.nn.parallel import DistributedDataParallel

    return isinstance(model, DistributedDataParallel)


def _device_of(model: Any) -> Any:
    for parameter in model.parameters():
        return parameter.device
    return None


def _clock_for(model: Any) -> CpuClock | CudaClock:
    device = _device_of(model)
    if device is not None and device.type == "cuda":
        return CudaClock()
    return CpuClock()

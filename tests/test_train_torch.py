"""The PyTorch integration on the CPU build of torch: hooks, end-of-backward callbacks, lazy clocks.

Single-process here (gloo, world size 1); the 3-rank straggler job is in tests/integration. CUDA
events cannot run on this machine: the lazy path is driven by a stand-in clock whose marks become
ready only when the test says so — the one seam faked, at the clock.
"""

from __future__ import annotations

import copy
import socket
import threading
import time
from typing import ClassVar

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from flopwatch.train import StepMonitor, wire
from flopwatch.train import torch as integration


@pytest.fixture
def receiver(tmp_path):
    path = str(tmp_path / "steps.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    server.bind(path)
    server.setblocking(False)

    def last() -> wire.StepRecord | None:
        record = None
        while True:
            try:
                record = wire.decode(server.recv(4096))
            except BlockingIOError:
                return record

    yield path, last
    server.close()


@pytest.fixture
def gloo(tmp_path, monkeypatch):
    """A one-rank gloo process group on a file store, its device on loopback."""
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


class Slow(nn.Module):
    def __init__(self, delay: float = 0.0, pause=time.sleep) -> None:
        super().__init__()
        self.delay, self.pause = delay, pause
        self.net = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.pause(self.delay)
        return self.net(x)


def _monitor(path: str) -> StepMonitor:
    return StepMonitor(1e9, 100, socket_path=path, min_interval=0, environ={"FLOPWATCH_JOB_ID": "t", "RANK": "0"})


def _train(model, optimizer, steps: int, data_delay: float = 0.0, pause=time.sleep) -> None:
    x = torch.randn(8, 32)
    for _ in range(steps):
        pause(data_delay)                            # the data loader
        model(x).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()


class SteppingClock:
    """A CPU clock the test moves: each mark is 1 s after the last, and `advance` is time passing
    between marks (a checkpoint save), so the phases are exact whatever the machine's load."""

    lazy = False

    def __init__(self) -> None:
        self.now = 0.0

    def mark(self) -> float:
        self.now += 1.0
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds

    def ready(self, mark: float) -> bool:
        return True

    def seconds(self, start: float, end: float) -> float:
        return end - start


def test_plain_module_gets_data_compute_and_optimizer(receiver):
    path, last = receiver
    clock = SteppingClock()                          # marks 1 s apart, plus the pauses below
    model = Slow(delay=0.25, pause=clock.advance)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    telemetry = integration.instrument(model, _monitor(path), optimizer, clock=clock)
    _train(model, optimizer, 5, data_delay=0.5, pause=clock.advance)
    with torch.no_grad():
        model(torch.randn(2, 32))                    # evaluation does not start a step's compute
    telemetry.close()
    record = last()
    assert record.steps == 5
    assert record.phases["compute"] == 5 * (1 + 0.25)
    assert record.phases["data"] == 4 * (1 + 0.5)    # the first step starts at its forward
    assert record.phases["optimizer"] == 5 * 1.0 and record.phases["comm"] == 5 * 1.0   # no pause: nothing waited
    assert sum(record.phases.values()) == pytest.approx(record.step_seconds)
    _train(model, optimizer, 2)                      # hooks removed: nothing more is reported
    assert last() is None


def test_ddp_phases_and_gradients_stay_right(receiver, gloo):
    path, last = receiver
    torch.manual_seed(0)
    reference = Slow()
    model = DistributedDataParallel(copy.deepcopy(reference))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    reference_optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    telemetry = integration.instrument(model, _monitor(path), optimizer)
    torch.manual_seed(1)
    _train(model, optimizer, 4)
    torch.manual_seed(1)
    _train(reference, reference_optimizer, 4)
    telemetry.close()
    for ours, theirs in zip(model.module.parameters(), reference.parameters(), strict=True):
        assert torch.allclose(ours, theirs, atol=1e-6)
    record = last()
    assert record.steps == 4
    assert record.phases["compute"] > 0 and record.phases["comm"] > 0


def test_the_comm_phase_ends_after_the_wrappers_own_wait(receiver, gloo):
    """A user's communication hook whose result comes 50 ms later: that wait is comm, not compute."""
    path, last = receiver
    model = DistributedDataParallel(Slow())
    before = [p.detach().clone() for p in model.parameters()]
    calls = []

    def slow_zero_hook(state, bucket):
        calls.append(state)
        future = torch.futures.Future()               # an asynchronous collective taking 50 ms
        threading.Timer(0.05, future.set_result, args=(bucket.buffer().mul_(0),)).start()
        return future

    model.register_comm_hook("mine", slow_zero_hook)   # users keep their hooks
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    telemetry = integration.instrument(model, _monitor(path), optimizer)
    _train(model, optimizer, 3)
    telemetry.close()
    assert calls and set(calls) == {"mine"}
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    record = last()
    assert record.steps == 3
    assert record.phases["comm"] >= 3 * 0.045        # were the wait counted as compute, comm would be ~0


class LazyClock:
    """Marks that complete only when the test says the device got there (like CUDA events)."""

    lazy = True

    def __init__(self) -> None:
        self.now = 0.0
        self.device_at = -1.0
        self.waits = 0

    def mark(self) -> float:
        self.now += 1.0
        return self.now

    def ready(self, mark: float) -> bool:
        return mark <= self.device_at

    def seconds(self, start: float, end: float) -> float:
        assert self.ready(start) and self.ready(end), "read an event the device has not reached"
        return end - start

    def wait(self, mark: float) -> None:
        self.waits += 1
        self.device_at = max(self.device_at, mark)


def test_lazy_marks_are_read_at_later_steps_without_waiting(receiver):
    path, last = receiver
    clock = LazyClock()
    model = Slow()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    telemetry = integration.instrument(model, _monitor(path), optimizer, clock=clock)
    _train(model, optimizer, 3)                       # the device has not finished anything yet
    assert last() is None
    clock.device_at = clock.now                       # now it has finished those three
    _train(model, optimizer, 1)
    assert last().steps == 3 and clock.waits == 0
    telemetry.close()                                 # at the end, and only then, wait for the rest
    record = last()
    assert record.steps == 4 and clock.waits >= 1
    # per step: forward, backward done, reduced, optimizer start, optimizer end: 5 marks, 1 s apart
    assert record.phases["compute"] == 4 * 1.0 and record.phases["comm"] == 4 * 1.0
    assert record.phases["optimizer"] == 4 * 1.0 and record.phases["data"] == 3 * 1.0


def test_a_device_far_behind_still_counts_every_step(receiver):
    path, last = receiver
    clock = LazyClock()
    model = Slow()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    integration.instrument(model, _monitor(path), optimizer, clock=clock)
    steps = integration.MAX_PENDING_STEPS + 5
    _train(model, optimizer, steps)
    record = last()
    assert record.steps == 5 and record.step_seconds == 0.0     # reported untimed, never lost


def test_hooks_never_raise_into_training(receiver):
    path, last = receiver

    class Broken(integration.CpuClock):
        def mark(self) -> float:
            raise RuntimeError("clock broke")

    model = Slow()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    monitor = _monitor(path)
    integration.instrument(model, monitor, optimizer, clock=Broken())
    _train(model, optimizer, 3)
    assert monitor.dropped >= 3 and last() is None


@pytest.mark.filterwarnings("ignore:FSDP is switching to use `NO_SHARD`:UserWarning")
def test_fsdp_steps_are_counted_and_the_missing_split_is_said(receiver, gloo, caplog):
    from torch.distributed.fsdp import FullyShardedDataParallel

    path, last = receiver
    model = FullyShardedDataParallel(Slow(), device_id=torch.device("cpu"))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    telemetry = integration.instrument(model, _monitor(path), optimizer)
    assert "FSDP waits for its reductions" in caplog.text
    _train(model, optimizer, 3)
    telemetry.close()
    record = last()
    assert record.steps == 3 and record.phases["compute"] > 0
    assert sum(record.phases.values()) == pytest.approx(record.step_seconds)


def test_a_device_mesh_gives_the_rank_its_stage_and_peers(receiver, gloo):
    """A real one-process DeviceMesh (gloo, CPU) with torchtitan's dimension names."""
    from torch.distributed.device_mesh import init_device_mesh

    path, last = receiver
    mesh = init_device_mesh("cpu", (1, 1, 1, 1), mesh_dim_names=("pp", "dp_replicate", "dp_shard", "tp"))
    model = Slow()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    telemetry = integration.instrument(model, _monitor(path), optimizer, mesh=mesh)
    _train(model, optimizer, 2)
    telemetry.close()
    record = last()
    assert record is not None
    assert (record.pp_stage, record.pp_size, record.dp_rank, record.dp_size, record.tp_rank, record.tp_size) == \
        (0, 1, 0, 1, 0, 1)


class _Mesh:
    """Stands in for a DeviceMesh of 2 x 2 x 4 x 2 ranks as seen from one rank: a real mesh of that
    shape needs 32 processes. Only the three methods instrument() calls."""

    mesh_dim_names = ("pp", "dp_replicate", "dp_shard", "tp")
    shape = (2, 2, 4, 2)
    local: ClassVar[dict[str, int]] = {"pp": 1, "dp_replicate": 1, "dp_shard": 2, "tp": 1}

    def get_local_rank(self, name: str) -> int:
        return self.local[name]

    def size(self, dim: int) -> int:
        return self.shape[dim]


def test_mesh_coordinates_fold_hsdp_dimensions_into_one_data_parallel_rank():
    assert integration.mesh_coordinates(_Mesh()) == {"pp_stage": 1, "pp_size": 2, "tp_rank": 1, "tp_size": 2,
                                                     "dp_rank": 1 * 4 + 2, "dp_size": 8}


def test_process_groups_give_the_coordinates(gloo):
    group = dist.new_group([0])
    assert integration.group_coordinates(pp=group, dp=group) == {"pp_stage": 0, "pp_size": 1, "dp_rank": 0,
                                                                 "dp_size": 1}


def test_the_iteration_is_the_optimizers_step_count_and_survives_a_restore(receiver):
    """Adam keeps `state["step"]`; a checkpoint of its state_dict brings it back after a restart."""
    path, last = receiver
    model = Slow()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    telemetry = integration.instrument(model, _monitor(path), optimizer)
    _train(model, optimizer, 3)
    telemetry.close()
    assert last().iteration == 3
    checkpoint = {"model": copy.deepcopy(model.state_dict()), "optimizer": copy.deepcopy(optimizer.state_dict())}
    _train(model, optimizer, 4)                       # progress after the checkpoint, lost in the crash
    restarted = Slow()                                # a new process restores the checkpoint
    restarted.load_state_dict(checkpoint["model"])
    restarted_optimizer = torch.optim.Adam(restarted.parameters(), lr=0.01)
    restarted_optimizer.load_state_dict(checkpoint["optimizer"])
    telemetry = integration.instrument(restarted, _monitor(path), restarted_optimizer)
    _train(restarted, restarted_optimizer, 2)
    telemetry.close()
    record = last()
    assert record.steps == 2 and record.iteration == 5   # below the 7 reached: steps done again


def test_an_optimizer_without_a_step_count_sends_the_loops_iteration_or_none(receiver):
    path, last = receiver
    model = Slow()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)       # plain SGD keeps no step count
    telemetry = integration.instrument(model, _monitor(path), optimizer)
    _train(model, optimizer, 2)
    telemetry.close()
    assert last().iteration is None
    telemetry = integration.instrument(model, _monitor(path), optimizer)
    x = torch.randn(8, 32)
    for step in range(100, 103):                     # the loop's own global step
        telemetry.set_iteration(step)
        model(x).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()
    telemetry.close()
    assert last().iteration == 102


def test_a_given_iteration_reader_wins_and_a_failing_one_is_dropped(receiver):
    path, last = receiver
    model = Slow()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    trainer = {"step": 40}
    telemetry = integration.instrument(model, _monitor(path), optimizer, iteration=lambda: trainer["step"])
    _train(model, optimizer, 1)
    telemetry.close()
    assert last().iteration == 40                    # not Adam's 1

    def broken() -> int:
        raise RuntimeError("no trainer")

    monitor = _monitor(path)
    telemetry = integration.instrument(model, monitor, optimizer, iteration=broken)
    _train(model, optimizer, 3)
    telemetry.close()
    record = last()
    assert record.steps == 3 and record.iteration is None and monitor.dropped >= 1


def test_a_step_count_on_the_device_is_read_once_then_counted():
    """`capturable` optimizers keep the count on the device: stands in for a CUDA tensor's device."""

    class DeviceStep:
        device = torch.device("meta")
        reads = 0

        def item(self) -> int:
            DeviceStep.reads += 1
            return 41

    parameter = nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.Adam([parameter])
    optimizer.state[parameter]["step"] = DeviceStep()
    read = integration.OptimizerIteration(optimizer)
    assert [read(), read(), read()] == [41, 42, 43] and DeviceStep.reads == 1


def test_a_checkpoint_between_steps_is_checkpoint_time_not_data(receiver):
    path, last = receiver
    model = Slow()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    monitor = _monitor(path)
    clock = SteppingClock()
    telemetry = integration.instrument(model, monitor, optimizer, clock=clock)
    x = torch.randn(8, 32)
    for step in range(4):
        model(x).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()
        if step == 1:                                # saving between steps 2 and 3, for 30 s
            clock.advance(30.0)
            monitor.checkpoint(30.0)
    telemetry.close()
    record = last()
    assert record.checkpoint_save_seconds == 30.0
    # per step 1 s between marks: data (from the step before's end) 1 s in steps 2-4, none in the first
    assert record.phases["data"] == 3 * 1.0          # were the save counted as data: 33
    assert record.phases["compute"] == 4 * 1.0 and record.phases["optimizer"] == 4 * 1.0
    assert sum(record.phases.values()) == pytest.approx(record.step_seconds)

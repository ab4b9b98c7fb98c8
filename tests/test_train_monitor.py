"""StepMonitor against a real Unix datagram socket standing in for the agent (no agent code here)."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import tracemalloc

import pytest

from flopwatch.train import DecoderShape, StepMonitor, account, monitor, wire
from flopwatch.train.identity import resolve_gpu

ENV = {"FLOPWATCH_JOB_ID": "job-1", "RANK": "2", "LOCAL_RANK": "1"}


@pytest.fixture
def agent_socket(tmp_path):
    """A bound datagram socket where the agent would be; yields (path, receive-all function)."""
    path = str(tmp_path / "steps.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    server.bind(path)
    server.setblocking(False)

    def received() -> list[wire.StepRecord]:
        out = []
        while True:
            try:
                out.append(wire.decode(server.recv(4096)))
            except BlockingIOError:
                return out

    yield path, received
    server.close()


def _monitor(path: str, **options) -> StepMonitor:
    options.setdefault("min_interval", 0)
    options.setdefault("environ", ENV)
    return StepMonitor(options.pop("flops", 1e12), options.pop("tokens", 4096), socket_path=path, **options)


class Clock:
    """The monitor's clock, moved by the test: phases last exactly what the test says."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def test_steps_send_running_totals_and_phases_add_up(agent_socket):
    path, received = agent_socket
    clock = Clock()
    mon = _monitor(path, clock=clock)
    for _ in range(3):
        with mon.step():
            with mon.phase("data"):
                clock.advance(0.003)
            with mon.phase("compute"):
                clock.advance(0.006)
            clock.advance(0.004)                     # untimed: counts as other
            with mon.phase("comm"):
                pass
            with mon.phase("optimizer"):
                pass
    records = received()
    assert [r.steps for r in records] == [1, 2, 3]
    last = records[-1]
    assert (last.job_id, last.rank, last.local_rank, last.gpu) == ("job-1", 2, 1, 1)
    assert last.tokens == 3 * 4096 and last.model_flops == 3e12 == last.hardware_flops
    assert last.phases["data"] == pytest.approx(3 * 0.003) and last.phases["compute"] == pytest.approx(3 * 0.006)
    assert last.phases["other"] == pytest.approx(3 * 0.004) and last.phases["comm"] == 0.0
    assert sum(last.phases.values()) == pytest.approx(last.step_seconds, rel=1e-9)
    assert last.step_seconds == pytest.approx(3 * 0.013)
    assert sum(last.buckets) == 3 and last.buckets[0] == 0      # every step took 13 ms
    assert last.dropped == 0 and len({r.instance for r in records}) == 1


def test_histogram_buckets_follow_step_seconds(agent_socket):
    path, received = agent_socket
    mon = _monitor(path)
    for seconds in (0.005, 0.01, 0.4, 2.5, 1000.0):
        mon.record_step(seconds, {"compute": seconds / 2})
    buckets = received()[-1].buckets
    expected = [0] * wire.N_BUCKETS
    for index in (0, 0, wire.STEP_BUCKETS.index(0.5), wire.STEP_BUCKETS.index(3.0), wire.N_BUCKETS - 1):
        expected[index] += 1
    assert list(buckets) == expected


def test_tokens_per_step_override_scales_flops(agent_socket):
    path, received = agent_socket
    mon = _monitor(path, flops=8e12, tokens=8000, hardware_flops_per_step=1e13)
    with mon.step(tokens=2000):
        pass
    with mon.step():
        pass
    last = received()[-1]
    assert last.tokens == 10000
    assert last.model_flops == pytest.approx(2e12 + 8e12)
    assert last.hardware_flops == pytest.approx(2.5e12 + 1e13)


def test_flops_account_sends_both_counts(agent_socket):
    path, received = agent_socket
    shape = DecoderShape(params=1e9, layers=24, heads=16, head_dim=128, seq_len=2048)
    mon = StepMonitor(account(4096, shape, measured_per_step=2.6e13, recompute="full"), socket_path=path,
                      min_interval=0, environ=ENV)
    with mon.step():
        pass
    record = received()[-1]
    assert record.analytic_flops_per_step == shape.model_flops_per_token() * 4096
    assert record.measured_flops_per_step == 2.6e13
    assert record.model_flops == record.analytic_flops_per_step
    assert record.hardware_flops == shape.hardware_flops_per_token("full") * 4096 > record.model_flops


def test_checkpoints_by_seconds_and_by_context(agent_socket):
    path, received = agent_socket
    clock = Clock()
    mon = _monitor(path, clock=clock)
    mon.checkpoint(seconds=12.5, kind="save")
    with mon.checkpoint(kind="restore"):
        clock.advance(0.01)
    records = received()
    assert records[-1].checkpoint_save_seconds == 12.5
    assert records[-1].checkpoint_restore_seconds == pytest.approx(0.01)
    assert records[-1].steps == 0


def test_bad_calls_warn_and_never_raise(agent_socket, caplog):
    path, received = agent_socket
    clock = Clock()
    mon = _monitor(path, clock=clock)
    with caplog.at_level(logging.WARNING, "flopwatch.train"):
        assert mon.checkpoint(seconds=float("nan")) is None
        assert mon.checkpoint(seconds=-3) is None
        assert mon.checkpoint(seconds=1, kind="upload") is None
        with mon.step(), mon.phase("forward"):          # unknown: its time stays in `other`
            clock.advance(0.002)
        mon.record_step(float("nan"), {"compute": -1.0, "bogus": 2.0})
    assert "unknown phase 'forward'" in caplog.text and "checkpoint kind 'upload'" in caplog.text
    last = received()[-1]
    assert last.steps == 2 and last.phases["other"] == pytest.approx(0.002) and last.checkpoint_save_seconds == 0
    assert last.phases["compute"] == 0.0


def test_an_exception_in_the_step_propagates_and_is_not_counted(agent_socket):
    path, received = agent_socket
    mon = _monitor(path)
    with pytest.raises(RuntimeError, match="out of memory"), mon.step():
        raise RuntimeError("out of memory")
    with mon.step():
        pass
    assert received()[-1].steps == 1


def test_agent_down_then_up_loop_runs_drops_are_counted_and_totals_catch_up(tmp_path, monkeypatch):
    monkeypatch.setattr(monitor, "RECONNECT_INTERVAL_S", 0.0)
    path = str(tmp_path / "steps.sock")
    mon = _monitor(path)
    for _ in range(500):
        with mon.step(), mon.phase("compute"):
            pass
    assert mon.dropped == 500 and mon.sent == 0
    server = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    server.bind(path)
    with mon.step():
        pass
    record = wire.decode(server.recv(4096))
    assert record.steps == 501 and record.dropped == 500 and sum(record.buckets) == 501
    server.close()
    os.unlink(path)                                  # the agent goes away again (restart)
    with mon.step():
        pass
    assert mon.dropped == 501
    server = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    server.bind(path)
    with mon.step():
        pass
    record = wire.decode(server.recv(4096))
    assert record.steps == 503 and record.dropped == 501
    server.close()


def test_full_agent_queue_drops_instead_of_blocking(agent_socket):
    path, _ = agent_socket                           # nobody reads: the kernel queue fills up
    mon = _monitor(path)
    for _ in range(2000):
        with mon.step():
            pass
    assert mon.sent + mon.dropped == 2000
    assert mon.dropped > 0 and mon.sent < 2000


def test_memory_does_not_grow_while_the_agent_is_down(tmp_path):
    mon = _monitor(str(tmp_path / "missing.sock"))
    for _ in range(1000):
        with mon.step(), mon.phase("compute"):
            pass
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for _ in range(20000):
        with mon.step(), mon.phase("compute"):
            pass
    grown = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    assert mon.dropped == 21000
    assert grown < 20_000, f"{grown} bytes retained over 20,000 dropped steps"


def test_min_interval_coalesces_fast_steps_and_flush_sends_the_rest(agent_socket):
    path, received = agent_socket
    mon = _monitor(path, min_interval=30)
    for _ in range(5):
        with mon.step():
            pass
    assert [r.steps for r in received()] == [1]
    mon.close()
    assert [r.steps for r in received()] == [5]
    with mon.step():                                 # closed: counted as dropped, still no error
        pass
    assert received() == [] and mon.dropped == 1


def test_forked_child_does_not_report_as_its_parent(agent_socket):
    path, received = agent_socket
    mon = _monitor(path)
    pid = os.fork()
    if pid == 0:                                     # a data-loader worker, say
        try:
            with mon.step():
                pass
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    assert received() == []
    with mon.step():
        pass
    assert [r.steps for r in received()] == [1]


@pytest.mark.parametrize(
    ("env", "job_id", "rank", "local_rank"),
    [
        ({"FLOPWATCH_JOB_ID": "a", "SLURM_JOB_ID": "b", "TORCHELASTIC_RUN_ID": "c"}, "a", 0, -1),
        ({"SLURM_JOB_ID": "b", "TORCHELASTIC_RUN_ID": "c", "SLURM_PROCID": "7", "SLURM_LOCALID": "3"},
         "b", 7, 3),
        ({"TORCHELASTIC_RUN_ID": "c", "RANK": "5", "SLURM_PROCID": "7", "LOCAL_RANK": "1"}, "c", 5, 1),
        ({"MASTER_PORT": "29500", "RANK": "not-a-number"}, "local-29500", 0, -1),
        ({"FLOPWATCH_JOB_ID": 'we"ird\\id', "RANK": "-4"}, "we_ird_id", 0, -1),
        ({"FLOPWATCH_JOB_ID": "x" * 100}, "x" * 64, 0, -1),
    ],
)
def test_identity_from_the_environment(tmp_path, env, job_id, rank, local_rank):
    mon = StepMonitor(socket_path=str(tmp_path / "none.sock"), environ=env)
    assert (mon.job_id, mon.rank, mon.local_rank) == (job_id, rank, local_rank)


def test_job_id_defaults_to_the_process():
    mon = StepMonitor(socket_path="/nonexistent/x.sock", environ={})
    assert mon.job_id == f"local-{os.getpid()}"


@pytest.mark.parametrize(
    ("device", "local_rank", "env", "gpu"),
    [
        (None, 3, {}, 3),                                     # torchrun: cuda:LOCAL_RANK
        (None, 3, {"CUDA_VISIBLE_DEVICES": "4,5,6,7"}, 7),
        (None, 3, {"CUDA_VISIBLE_DEVICES": "6"}, 6),          # Slurm binds one GPU per task
        (None, -1, {}, -1),
        (1, -1, {"CUDA_VISIBLE_DEVICES": "GPU-aaaa,GPU-bbbb"}, -1),
        (1, 0, {"CUDA_VISIBLE_DEVICES": "2,3"}, 3),
        (0, 0, {"FLOPWATCH_GPU": "5", "CUDA_VISIBLE_DEVICES": "2"}, 5),
    ],
)
def test_resolve_gpu(device, local_rank, env, gpu):
    assert resolve_gpu(device, local_rank, env) == gpu


@pytest.mark.parametrize(
    "kwargs",
    [{"flops_per_step": -1.0}, {"tokens_per_step": float("nan")}, {"flops_per_step": "many"},
     {"rank": -1}, {"gpu": 40000}, {"min_interval": -1}, {"hardware_flops_per_step": float("inf")}],
)
def test_nonsense_arguments_are_refused_before_the_loop(kwargs):
    with pytest.raises(ValueError, match="StepMonitor"):
        StepMonitor(socket_path="/nonexistent/x.sock", environ={}, **kwargs)


def test_set_gpu_updates_later_datagrams(agent_socket):
    path, received = agent_socket
    mon = _monitor(path)
    mon.set_gpu(6)
    with mon.step():
        pass
    assert received()[-1].gpu == 6


def test_the_client_imports_neither_the_agent_nor_prometheus_client_nor_torch():
    """A training job pays only for the client (DESIGN.md); torch comes only with the integration's use."""
    import subprocess
    import sys

    code = ("import sys, flopwatch.train, flopwatch.train.torch, flopwatch.train.flops\n"
            "heavy = ('prometheus_client', 'torch', 'yaml', 'numpy', 'flopwatch.exporters', 'flopwatch.catalog',"
            " 'flopwatch.config')\n"
            "print(sorted(m for m in sys.modules if m.startswith(heavy)))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert result.stdout.strip() == "[]"


def test_coordinates_come_from_arguments_or_the_environment_and_are_checked():
    from flopwatch.train import StepMonitor

    env = {"FLOPWATCH_PP_STAGE": "2", "FLOPWATCH_PP_SIZE": "4", "FLOPWATCH_DP_RANK": "5", "FLOPWATCH_TP_RANK": "1"}
    mon = StepMonitor(job_id="j", socket_path="/nonexistent/s.sock", environ=env)
    assert mon.coordinates == (2, 4, 1, 0, 5, 0)
    mon = StepMonitor(job_id="j", socket_path="/nonexistent/s.sock", environ=env, pp_stage=0, dp_rank=7)
    assert mon.coordinates == (0, 4, 1, 0, 7, 0)
    assert StepMonitor(job_id="j", socket_path="/nonexistent/s.sock", environ={}).coordinates == (-1, 0, -1, 0, -1, 0)
    with pytest.raises(ValueError, match="pp_stage = 4 but the size is 4"):
        StepMonitor(job_id="j", socket_path="/nonexistent/s.sock", environ={}, pp_stage=4, pp_size=4)
    mon.set_coordinates(tp_rank=3, tp_size=4)
    assert mon.coordinates == (0, 4, 3, 4, 7, 0)


def test_comm_floor_is_the_shortest_comm_phase_of_the_last_completed_block(tmp_path):
    import socket as socket_module

    from flopwatch.train import StepMonitor, wire

    path = str(tmp_path / "s.sock")
    server = socket_module.socket(socket_module.AF_UNIX, socket_module.SOCK_DGRAM)
    server.bind(path)
    server.setblocking(False)
    mon = StepMonitor(job_id="j", socket_path=path, min_interval=0, environ={}, pp_stage=1, pp_size=2, dp_rank=0)
    waits = [0.3, 0.2, 0.25, 0.05, 0.4, 0.3, 0.2, 0.1] * 2 + [0.01]     # one block, then one more step

    def last() -> wire.StepRecord:
        data = None
        with contextlib.suppress(BlockingIOError):
            while True:
                data = server.recv(wire.MAX_DATAGRAM)
        return wire.decode(data)

    for i, wait in enumerate(waits[:-1]):
        mon.record_step(1.0, {"compute": 0.6, "comm": wait})
        if i == 14:
            assert last().comm_min_steps == 0          # no floor before a block completes
    record = last()
    assert record.comm_min_steps == wire.COMM_MIN_BLOCK and record.comm_min_seconds == pytest.approx(0.05)
    mon.record_step(1.0, {"compute": 0.6, "comm": waits[-1]})      # the next block has not completed
    assert last().comm_min_seconds == pytest.approx(0.05)
    assert (record.pp_stage, record.pp_size, record.dp_rank) == (1, 2, 0)
    server.close()


def test_the_iteration_travels_with_each_step_and_bad_ones_are_ignored(tmp_path, caplog):
    import socket as socket_module

    from flopwatch.train import StepMonitor, wire

    path = str(tmp_path / "s.sock")
    server = socket_module.socket(socket_module.AF_UNIX, socket_module.SOCK_DGRAM)
    server.bind(path)
    server.setblocking(False)
    mon = StepMonitor(job_id="j", socket_path=path, min_interval=0, environ={})
    mon.record_step(1.0, {"compute": 0.5})
    assert wire.decode(server.recv(wire.MAX_DATAGRAM)).iteration is None
    with mon.step(iteration=500):
        pass
    assert wire.decode(server.recv(wire.MAX_DATAGRAM)).iteration == 500
    mon.record_step(1.0, {"compute": 0.5}, iteration=300)      # restored from an older checkpoint
    assert wire.decode(server.recv(wire.MAX_DATAGRAM)).iteration == 300
    with caplog.at_level(logging.WARNING, logger="flopwatch.train"):
        mon.record_step(1.0, {"compute": 0.5}, iteration=-4)
    assert wire.decode(server.recv(wire.MAX_DATAGRAM)).iteration == 300 and "iteration -4 ignored" in caplog.text
    server.close()

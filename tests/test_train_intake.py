"""The agent's training-step intake: aggregation, bounds, hostile input, and its socket.

Datagrams come from the real client (StepMonitor) over a real Unix socket, or straight into
`handle()` where a test needs to control the clock; nothing is faked.
"""

from __future__ import annotations

import dataclasses
import grp
import math
import os
import socket
import stat
import struct
import subprocess
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from flopwatch import config as cfg
from flopwatch.catalog import metrics_of
from flopwatch.catalog import train as m
from flopwatch.config import TrainOptions
from flopwatch.errors import UsageError
from flopwatch.exporters import train_recent
from flopwatch.exporters.agent import Agent
from flopwatch.exporters.train_intake import BURST, REASONS, TrainIntake
from flopwatch.exporters.train_socket import IntakeError, open_socket
from flopwatch.exporters.wiring import build_agent
from flopwatch.train import StepMonitor, wire

NODE = "n1"


def _intake(tmp_path=None, start=False, **options) -> TrainIntake:
    values = {"socket": str(tmp_path / "steps.sock") if tmp_path else "/nonexistent/steps.sock",
              "socket_group": None, "max_jobs": 64, "max_ranks": 1024, "expiry": 300.0}
    values.update(options)
    return TrainIntake(TrainOptions(**values), NODE, start=start)


class _Registry:
    """Reads an intake's rendered families the way Prometheus would see them."""

    def __init__(self, intake: TrainIntake) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(intake)

    def get(self, name: str, **labels: str) -> float | None:
        """A sample; per-rank series default to a rank that gave no coordinates (stage 0, no dp rank)."""
        if name in PER_RANK:
            labels = {"stage": "0", "dp_rank": "", **labels}
        return self.registry.get_sample_value(name, {"node": NODE, **labels})


PER_RANK = {metric.name for metric in metrics_of(m) if "stage" in metric.labels}


def _datagram(job="job-a", rank=0, steps=1, instance=1, gpu=-1, seconds=1.0, **extra) -> bytes:
    buckets = [0] * wire.N_BUCKETS
    buckets[wire.STEP_BUCKETS.index(1.5)] = steps
    fields = {"job_id": job, "rank": rank, "gpu": gpu, "instance": instance, "steps": steps,
              "tokens": 1000.0 * steps, "model_flops": 1e12 * steps, "hardware_flops": 1.3e12 * steps,
              "step_seconds": seconds * steps, "buckets": tuple(buckets),
              "phases": {"data": 0.1 * steps, "compute": 0.6 * steps, "comm": 0.2 * steps,
                         "optimizer": 0.05 * steps, "other": 0.05 * steps}}
    fields.update(extra)
    return wire.encode(wire.StepRecord(**fields))


def test_totals_per_rank_and_histogram_per_job():
    intake = _intake()
    now = time.monotonic()
    for steps in (1, 2, 3):
        intake.handle(_datagram(rank=0, gpu=0, steps=steps), now, 1000.0 + steps)
        intake.handle(_datagram(rank=1, gpu=1, steps=steps), now, 1000.0 + steps)
    intake.handle(_datagram(job="job-b", rank=0, steps=7, analytic_flops_per_step=1e12,
                            measured_flops_per_step=1.01e12), now, 2000.0)
    assert intake.update() == 0
    reg = _Registry(intake)
    rank1 = {"job_id": "job-a", "rank": "1", "gpu": "1"}
    assert reg.get("flopwatch_train_steps_total", **rank1) == 3
    assert reg.get("flopwatch_train_tokens_total", **rank1) == 3000
    assert reg.get("flopwatch_train_model_flops_total", **rank1) == 3e12
    assert reg.get("flopwatch_train_hardware_flops_total", **rank1) == pytest.approx(3.9e12)
    assert reg.get("flopwatch_train_phase_seconds_total", phase="compute", **rank1) == pytest.approx(1.8)
    # arrival = data + compute + other (0.1 + 0.6 + 0.05 per step), never comm or optimizer
    assert reg.get("flopwatch_train_arrival_seconds_total", **rank1) == pytest.approx(3 * 0.75)
    assert reg.get("flopwatch_train_checkpoint_seconds_total", kind="save", **rank1) == 0
    assert reg.get("flopwatch_train_last_step_timestamp_seconds", **rank1) == 1003.0
    assert reg.get("flopwatch_train_client_dropped_events_total", job_id="job-a", rank="1") == 0
    assert reg.get("flopwatch_train_step_seconds_count", job_id="job-a") == 6      # 2 ranks x 3 steps
    assert reg.get("flopwatch_train_step_seconds_sum", job_id="job-a") == pytest.approx(6.0)
    assert reg.get("flopwatch_train_step_seconds_bucket", job_id="job-a", le="1.0") == 0
    assert reg.get("flopwatch_train_step_seconds_bucket", job_id="job-a", le="1.5") == 6
    assert reg.get("flopwatch_train_step_seconds_bucket", job_id="job-a", le="+Inf") == 6
    assert reg.get("flopwatch_train_steps_total", job_id="job-b", rank="0", gpu="") == 7
    assert reg.get("flopwatch_train_model_flops_per_step", job_id="job-b", rank="0", method="analytic") == 1e12
    assert reg.get("flopwatch_train_model_flops_per_step", job_id="job-b", rank="0", method="measured") == 1.01e12
    assert reg.get("flopwatch_train_model_flops_per_step", job_id="job-a", rank="0", method="analytic") is None
    assert reg.get("flopwatch_train_events_accepted_total") == 7
    assert all(reg.get("flopwatch_train_events_rejected_total", reason=r) == 0 for r in REASONS)


def test_restart_resets_counters_but_the_job_histogram_never_goes_back():
    intake = _intake()
    now = time.monotonic()
    intake.handle(_datagram(steps=10, instance=1), now, 0.0)
    intake.handle(_datagram(steps=2, instance=2), now + 1, 0.0)    # the process restarted
    intake.update()
    reg = _Registry(intake)
    assert reg.get("flopwatch_train_steps_total", job_id="job-a", rank="0", gpu="") == 2
    assert reg.get("flopwatch_train_step_seconds_count", job_id="job-a") == 12
    assert reg.get("flopwatch_train_step_seconds_sum", job_id="job-a") == pytest.approx(12.0)


def test_a_changed_sender_detail_takes_the_full_check_and_is_kept():
    intake = _intake()
    now = time.monotonic()
    intake.handle(_datagram(steps=1, gpu=-1), now, 0.0)
    intake.handle(_datagram(steps=2, gpu=-1), now, 0.0)                      # fast path
    intake.handle(_datagram(steps=3, gpu=5, analytic_flops_per_step=2e12), now, 0.0)   # set_gpu()
    intake.handle(_datagram(steps=4, gpu=5, analytic_flops_per_step=2e12), now, 0.0)
    intake.handle(_datagram(steps=3, gpu=5, analytic_flops_per_step=2e12), now, 0.0)   # backwards
    intake.update()
    reg = _Registry(intake)
    assert reg.get("flopwatch_train_steps_total", job_id="job-a", rank="0", gpu="5") == 4
    assert reg.get("flopwatch_train_model_flops_per_step", job_id="job-a", rank="0", method="analytic") == 2e12
    assert intake.accepted == 4 and intake.rejected["non_monotonic"] == 1
    assert len(intake._by_identity) == 1


def test_counters_of_one_client_never_move_backwards():
    intake = _intake()
    now = time.monotonic()
    intake.handle(_datagram(steps=5), now, 0.0)
    intake.handle(_datagram(steps=5), now + 1, 0.0)            # a repeat (flush) is fine
    intake.handle(_datagram(steps=4), now + 2, 0.0)
    intake.handle(_datagram(steps=6, tokens=1.0), now + 3, 0.0)  # tokens went down
    assert intake.accepted == 2 and intake.rejected["non_monotonic"] == 2


def test_caps_on_jobs_and_ranks_and_expiry_frees_them():
    intake = _intake(max_jobs=2, max_ranks=3, expiry=10.0)
    old = time.monotonic() - 60
    intake.handle(_datagram(job="a", rank=0), old, 0.0)
    intake.handle(_datagram(job="b", rank=0), old, 0.0)
    intake.handle(_datagram(job="c", rank=0), old, 0.0)
    intake.handle(_datagram(job="b", rank=1), old, 0.0)
    intake.handle(_datagram(job="b", rank=2), old, 0.0)
    assert intake.rejected["too_many_jobs"] == 1 and intake.rejected["too_many_ranks"] == 1
    intake.handle(_datagram(job="a", rank=0, steps=2), old + 1, 0.0)     # known series still flow
    assert intake.accepted == 4
    intake.update()                                                      # all idle past expiry
    assert _Registry(intake).get("flopwatch_train_steps_total", job_id="a", rank="0", gpu="") is None
    intake.handle(_datagram(job="c", rank=0), time.monotonic(), 0.0)
    intake.update()
    assert _Registry(intake).get("flopwatch_train_steps_total", job_id="c", rank="0", gpu="") == 1


def test_a_rank_expiring_keeps_its_steps_in_the_job_histogram():
    intake = _intake(expiry=10.0)
    now = time.monotonic()
    intake.handle(_datagram(rank=0, steps=4), now - 60, 0.0)             # went quiet
    intake.handle(_datagram(rank=1, steps=3), now, 0.0)
    intake.update()
    reg = _Registry(intake)
    assert reg.get("flopwatch_train_steps_total", job_id="job-a", rank="0", gpu="") is None
    assert reg.get("flopwatch_train_step_seconds_count", job_id="job-a") == 7


def test_a_flooding_client_is_rate_limited():
    intake = _intake()
    now = time.monotonic()
    for steps in range(1, 3001):
        intake.handle(_datagram(steps=steps), now, 0.0)
    assert intake.accepted == BURST
    assert intake.rejected["rate_limited"] == 3000 - BURST
    intake.handle(_datagram(steps=3001), now + 0.01, 0.0)                # 10 ms later: allowance back
    assert intake.accepted == BURST + 1


def test_events_from_the_client_over_the_socket(tmp_path):
    intake = _intake(tmp_path, start=True)
    try:
        info = os.stat(intake.path)
        assert stat.S_ISSOCK(info.st_mode) and stat.S_IMODE(info.st_mode) == 0o660
        mon = StepMonitor(2e12, 512, socket_path=str(intake.path), min_interval=0,
                          environ={"FLOPWATCH_JOB_ID": "4711", "RANK": "3", "LOCAL_RANK": "3"})
        for _ in range(20):
            with mon.step(), mon.phase("compute"):
                pass
        mon.checkpoint(seconds=4.0, kind="save")
        deadline = time.monotonic() + 5
        while intake.accepted < mon.sent and time.monotonic() < deadline:
            time.sleep(0.01)
        mon.flush()               # back-to-back steps may overflow the kernel queue: the last one counts
        while intake.accepted < mon.sent and time.monotonic() < deadline:
            time.sleep(0.01)
        intake.update()
        reg = _Registry(intake)
        labels = {"job_id": "4711", "rank": "3", "gpu": "3"}
        assert reg.get("flopwatch_train_steps_total", **labels) == 20
        assert reg.get("flopwatch_train_model_flops_total", **labels) == 40e12
        assert reg.get("flopwatch_train_checkpoint_seconds_total", kind="save", **labels) == 4.0
        assert reg.get("flopwatch_train_client_dropped_events_total", job_id="4711", rank="3") == mon.dropped
        assert intake.accepted == mon.sent == 22 - mon.dropped
    finally:
        intake.close()
    assert not intake.path.exists()


def test_full_exposition_passes_promtool(tmp_path):
    intake = _intake(tmp_path, start=True)
    agent = Agent(NODE, [intake], "none")
    try:
        intake.handle(_datagram(rank=0, analytic_flops_per_step=1e12), time.monotonic(), time.time())
        agent.collect_once()
        exposition = agent.exposition()
    finally:
        agent.close()
    assert b"flopwatch_train_step_seconds_bucket" in exposition
    try:
        result = subprocess.run(["promtool", "check", "metrics"], input=exposition, capture_output=True,
                                timeout=30, check=False)
    except FileNotFoundError:
        pytest.fail("promtool not found: install the Debian package `prometheus`")
    assert result.returncode == 0 and not result.stdout and not result.stderr, result.stdout + result.stderr


# -- the socket -----------------------------------------------------------------------------------
def test_a_stale_socket_is_replaced_and_a_live_one_refused(tmp_path):
    path = tmp_path / "steps.sock"
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    stale.bind(str(path))
    stale.close()                                                  # an agent that died
    sock, _ = open_socket(path, None)
    try:
        with pytest.raises(IntakeError, match="another process is already reading"):
            open_socket(path, None)
    finally:
        sock.close()


def test_a_file_that_is_not_a_socket_is_left_alone(tmp_path):
    path = tmp_path / "steps.sock"
    path.write_text("precious")
    with pytest.raises(IntakeError, match="not a socket"):
        open_socket(path, None)
    assert path.read_text() == "precious"


def test_socket_group_and_mode(tmp_path):
    group = grp.getgrnam("daemon")
    sock, _ = open_socket(tmp_path / "steps.sock", "daemon")
    try:
        info = os.stat(tmp_path / "steps.sock")
        assert info.st_gid == group.gr_gid and stat.S_IMODE(info.st_mode) == 0o660
    finally:
        sock.close()
    with pytest.raises(IntakeError, match="not a group"):
        open_socket(tmp_path / "other.sock", "no-such-group-here")
    assert [p.name for p in tmp_path.iterdir()] == ["steps.sock"]


def test_a_world_writable_directory_is_refused(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(IntakeError, match="writable by others"):
        open_socket(shared / "steps.sock", None)


def test_close_leaves_a_newer_agents_socket(tmp_path):
    first = _intake(tmp_path, start=True)
    os.unlink(first.path)
    newer = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    newer.bind(str(first.path))
    try:
        first.close()
        assert first.path.exists()
    finally:
        newer.close()


def test_build_agent_wires_the_intake_and_reports_socket_problems(tmp_path):
    path = tmp_path / "run" / "steps.sock"
    config = cfg.load(overrides={"backend": "sim", "node": NODE, "collectors.train": True,
                                 "train.socket": str(path)}, environ={})
    agent = build_agent(config)
    try:
        assert any(isinstance(c, TrainIntake) for c in agent.collectors)
        assert path.exists()
        agent.collect_once()
        assert b'flopwatch_train_events_accepted_total{node="n1"} 0.0' in agent.exposition()
    finally:
        agent.close()
    assert not path.exists()
    path.parent.rmdir()
    path.parent.write_text("a file where the directory should be")
    with pytest.raises(UsageError, match="is not a directory"):
        build_agent(config)


def test_config_keys():
    config = cfg.load(overrides={"train.max_jobs": "8", "train.expiry": "60", "train.socket_group": "daemon"},
                      environ={"FLOPWATCH_TRAIN_SOCKET": "/tmp/x/steps.sock"})
    assert config.train == TrainOptions("/tmp/x/steps.sock", "daemon", 8, 1024, 60.0)
    assert config.collectors["train"] is False
    if os.geteuid() == 0:
        assert cfg.load(environ={}).train.socket == wire.DEFAULT_SOCKET
    for key, value in (("train.max_jobs", 0), ("train.max_ranks", "x"), ("train.expiry", 5)):
        with pytest.raises(cfg.ConfigError, match=key):
            cfg.load(overrides={key: value}, environ={})


# -- hostile input --------------------------------------------------------------------------------
VALID = _datagram(steps=3)
NUMBERS = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.just(-0.0), st.just(-1e-300))


@st.composite
def hostile_datagrams(draw) -> bytes:
    kind = draw(st.sampled_from(["random", "flip", "cut", "grow", "fields"]))
    if kind == "random":
        return draw(st.binary(max_size=600))
    data = bytearray(VALID)
    if kind == "flip":
        for _ in range(draw(st.integers(1, 8))):
            data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
        return bytes(data)
    if kind == "cut":
        return bytes(data[:draw(st.integers(0, len(data)))])
    if kind == "grow":
        return bytes(data) + draw(st.binary(min_size=1, max_size=400))
    offset = wire.HEAD.size + 16 + 4 * wire.N_BUCKETS + 8 * draw(st.integers(0, 12))
    struct.pack_into("<d", data, offset, draw(NUMBERS))
    struct.pack_into("<I", data, 4, draw(st.integers(0, 2**32 - 1)))          # rank
    return bytes(data)


@st.composite
def plausible_datagrams(draw) -> bytes:
    """Well-formed datagrams from many jobs and ranks with arbitrary (often hostile) numbers."""
    steps = draw(st.integers(0, 2**40))
    bucket = draw(st.integers(0, wire.N_BUCKETS - 1))
    buckets = tuple(steps if i == bucket else 0 for i in range(wire.N_BUCKETS)) if steps < 2**32 else ()
    return wire.encode(wire.StepRecord(
        job_id=draw(st.text(st.characters(min_codepoint=33, max_codepoint=126), min_size=1, max_size=8)),
        rank=draw(st.integers(0, 40)), instance=draw(st.integers(0, 3)), gpu=draw(st.integers(-1, 8)),
        steps=steps if buckets else 0, buckets=buckets, tokens=draw(NUMBERS), model_flops=draw(NUMBERS),
        phases={name: draw(NUMBERS) for name in draw(st.sets(st.sampled_from(wire.PHASES)))},
        dropped=draw(st.integers(0, 2**64 - 1)),
    ))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(hostile_datagrams(), plausible_datagrams()), max_size=60))
def test_fuzzed_datagrams_never_raise_nor_grow_past_the_caps(datagrams):
    intake = _intake(max_jobs=5, max_ranks=12)
    now = time.monotonic()
    intake.handle(VALID, now, 1.0)             # mutations of it now take the identity fast path
    for i, data in enumerate(datagrams, 1):
        intake.handle(data, now + i * 1e-4, 1.0)
    assert intake.accepted + sum(intake.rejected.values()) == len(datagrams) + 1
    assert len(intake._jobs) <= 5 and len(intake._ranks) <= 12
    assert len(intake._by_identity) <= len(intake._ranks)
    assert set(intake.rejected) == set(REASONS)
    intake.update()
    for family in intake.collect():
        for sample in family.samples:
            assert math.isfinite(sample.value) and sample.value >= 0, sample


def test_pipeline_coordinates_become_labels_and_the_comm_floor_a_gauge():
    intake = _intake()
    now = time.monotonic()
    intake.handle(_datagram(rank=9, gpu=1, pp_stage=3, pp_size=4, dp_rank=1, dp_size=2,
                            comm_min_seconds=0.125, comm_min_steps=wire.COMM_MIN_BLOCK), now, 1000.0)
    intake.handle(_datagram(rank=2, gpu=2), now, 1000.0)          # no coordinates: stage 0, no dp rank
    intake.update()
    reg = _Registry(intake)
    assert reg.get("flopwatch_train_steps_total", job_id="job-a", rank="9", gpu="1", stage="3", dp_rank="1") == 1
    assert reg.get("flopwatch_train_comm_min_seconds", job_id="job-a", rank="9", gpu="1", stage="3",
                   dp_rank="1") == 0.125
    assert reg.get("flopwatch_train_steps_total", job_id="job-a", rank="2", gpu="2") == 1
    assert reg.get("flopwatch_train_comm_min_seconds", job_id="job-a", rank="2", gpu="2") is None   # no block yet


def test_the_job_size_its_ranks_declare_is_one_gauge_per_job_and_absent_when_unsaid():
    """A shard scraping a few nodes of a large job judges their ranks by the job's whole size."""
    intake = _intake()
    now = time.monotonic()
    intake.handle(_datagram(rank=9, gpu=1, pp_stage=3, pp_size=4, tp_rank=1, tp_size=8, dp_rank=1, dp_size=2),
                  now, 1000.0)
    intake.handle(_datagram(rank=10, gpu=2, pp_stage=3, pp_size=4, tp_rank=2, tp_size=8, dp_rank=1, dp_size=2),
                  now, 1000.0)
    intake.handle(_datagram(job="ddp", rank=3, dp_rank=3, dp_size=16), now, 1000.0)   # no stages or tensor groups
    intake.handle(_datagram(job="plain", rank=0), now, 1000.0)                        # sizes not said
    intake.update()
    reg = _Registry(intake)
    assert reg.get("flopwatch_train_job_ranks", job_id="job-a") == 64
    assert reg.get("flopwatch_train_job_ranks", job_id="ddp") == 16
    assert reg.get("flopwatch_train_job_ranks", job_id="plain") is None


def test_two_ranks_claiming_one_place_in_a_job_are_refused_and_counted():
    intake = _intake()
    now = time.monotonic()
    place = {"pp_stage": 1, "pp_size": 2, "dp_rank": 0, "dp_size": 4}
    intake.handle(_datagram(rank=4, **place), now, 1000.0)
    intake.handle(_datagram(rank=5, **place), now, 1000.0)              # same stage and dp rank
    intake.handle(_datagram(job="job-b", rank=5, **place), now, 1000.0)  # another job: fine
    intake.handle(_datagram(rank=6, **{**place, "tp_rank": 1}), now, 1000.0)   # a tensor-parallel peer: fine
    intake.handle(_datagram(rank=7, pp_stage=2, pp_size=2), now, 1000.0)        # out of range
    intake.update()
    reg = _Registry(intake)
    assert reg.get("flopwatch_train_events_rejected_total", reason="duplicate_coordinates") == 1
    assert reg.get("flopwatch_train_events_rejected_total", reason="bad_coordinates") == 1
    assert reg.get("flopwatch_train_steps_total", job_id="job-a", rank="5", gpu="", stage="1", dp_rank="0") is None
    assert reg.get("flopwatch_train_steps_total", job_id="job-b", rank="5", gpu="", stage="1", dp_rank="0") == 1
    # rank 4 moves elsewhere (a restarted process with new coordinates): its old place is free again
    intake.handle(_datagram(rank=4, instance=2, **{**place, "dp_rank": 3}), now, 1001.0)
    intake.handle(_datagram(rank=5, steps=2, **place), now, 1001.0)
    intake.update()
    assert _Registry(intake).get("flopwatch_train_steps_total", job_id="job-a", rank="5", gpu="", stage="1",
                                 dp_rank="0") == 2


def test_the_iteration_is_exported_per_rank_on_the_fast_path_too():
    intake = _intake()
    now = time.monotonic()
    for steps in (1, 2, 3):                       # one identity: the second and third take the fast path
        intake.handle(_datagram(rank=1, steps=steps, iteration=99 + steps), now, 1000.0 + steps)
    intake.handle(_datagram(rank=2, steps=1), now, 1000.0)          # a client that does not say
    intake.update()
    reg = _Registry(intake)
    assert reg.get("flopwatch_train_iteration", job_id="job-a", rank="1", gpu="") == 102
    assert reg.get("flopwatch_train_steps_total", job_id="job-a", rank="1", gpu="") == 3
    assert reg.get("flopwatch_train_iteration", job_id="job-a", rank="2", gpu="") is None
    # a restart from an older checkpoint: a new instance whose iteration starts below the old one
    intake.handle(_datagram(rank=1, steps=1, instance=2, iteration=51), now, 1010.0)
    intake.update()
    assert _Registry(intake).get("flopwatch_train_iteration", job_id="job-a", rank="1", gpu="") == 51


def _replayed(intake: TrainIntake, job: str = "job-a") -> tuple[float | None, float | None]:
    intake.update()
    reg = _Registry(intake)
    return (reg.get("flopwatch_train_replayed_steps_total", job_id=job),
            reg.get("flopwatch_train_replayed_step_seconds_total", job_id=job))


def test_a_replay_shorter_than_any_window_is_counted_step_by_step():
    """A quick restart redoes 10 one-second steps between two datagrams of 10 s: every one is
    counted, whatever the rules' evaluation clock (their high-water mark alone saw none)."""
    intake = _intake()
    now = time.monotonic()
    intake.handle(_datagram(rank=0, steps=100, iteration=100), now, 1000.0)
    assert _replayed(intake) == (0, 0)                 # a job that reports iterations: 0, not absent
    # the process restarts from the checkpoint at iteration 90 and does 10 steps before it reports
    intake.handle(_datagram(rank=0, steps=10, instance=2, iteration=100), now, 1020.0)
    assert _replayed(intake) == (10, 10.0)
    # then 5 new steps past the mark: none of them is a replay
    intake.handle(_datagram(rank=0, steps=15, instance=2, iteration=105), now, 1025.0)
    assert _replayed(intake) == (10, 10.0)


def test_steps_that_pass_the_mark_count_only_up_to_it():
    intake = _intake()
    now = time.monotonic()
    intake.handle(_datagram(rank=3, steps=50, iteration=200, seconds=2.0), now, 1000.0)
    # restart from 180, 30 steps of 2 s: iterations 181-210, of which 181-200 redo old ones
    intake.handle(_datagram(rank=3, steps=30, instance=2, iteration=210, seconds=2.0), now, 1100.0)
    assert _replayed(intake) == (20, 40.0)


def test_a_rollback_inside_the_same_process_is_a_replay_too():
    intake = _intake()
    now = time.monotonic()
    for steps in (1, 2, 3, 4):
        intake.handle(_datagram(rank=1, steps=steps, iteration=steps), now, 1000.0 + steps)
    # an in-place restart: same process, same running totals, the iteration goes back to 2
    intake.handle(_datagram(rank=1, steps=6, iteration=4), now, 1010.0)
    assert _replayed(intake) == (2, 2.0)


def test_replays_are_counted_per_rank_and_summed_per_job_and_never_go_back():
    intake = _intake()
    now = time.monotonic()
    for rank in (0, 1):
        intake.handle(_datagram(rank=rank, steps=10, iteration=10), now, 1000.0)
    for rank in (0, 1):                                # both restart from iteration 6: 4 replays each
        intake.handle(_datagram(rank=rank, steps=4, instance=2, iteration=10), now, 1010.0)
    intake.handle(_datagram(job="job-b", rank=0, steps=3), now, 1000.0)   # no iterations reported
    assert _replayed(intake) == (8, 8.0)
    assert _replayed(intake, "job-b") == (None, None)
    # rank 1 goes quiet and expires; the job's counters keep what it replayed
    intake.options = dataclasses.replace(intake.options, expiry=0.0)
    intake.handle(_datagram(rank=0, steps=5, instance=2, iteration=11), time.monotonic() + 1, 1020.0)
    assert _replayed(intake) == (8, 8.0)


# -- the recent window ----------------------------------------------------------------------------
BASE = 1000.0          # a monotonic clock the tests drive; whole seconds are exact in binary


class _Client:
    """One rank's running totals, sent as one datagram per step straight into `handle()`."""

    def __init__(self, intake: TrainIntake, rank: int = 0, instance: int = 1) -> None:
        self.intake, self.rank, self.instance = intake, rank, instance
        self.steps = 0
        self.totals = dict.fromkeys(wire.PHASES, 0.0)

    def step(self, now: float, data: float = 0.1, compute: float = 0.6, other: float = 0.05) -> None:
        self.steps += 1
        for name, seconds in (("data", data), ("compute", compute), ("comm", 0.2), ("optimizer", 0.05),
                              ("other", other)):
            self.totals[name] += seconds
        self.intake.handle(_datagram(rank=self.rank, steps=self.steps, instance=self.instance,
                                     phases=dict(self.totals)), now, BASE + now)


def _recent(intake: TrainIntake, now: float, rank: int = 0) -> tuple[float, float, float] | None:
    """(arrival, data, other) per step as exported after `update(now)`; None when all are absent."""
    intake.update(now=now)
    reg = _Registry(intake)
    labels = {"job_id": "job-a", "rank": str(rank), "gpu": ""}
    values = (reg.get("flopwatch_train_recent_arrival_seconds", **labels),
              *(reg.get("flopwatch_train_recent_phase_seconds", phase=phase, **labels) for phase in m.RECENT_PHASES))
    if all(value is None for value in values):
        return None
    assert None not in values, values                 # the gauges come and go together
    return values


def _means(data: list[float], other: list[float], compute: float = 0.6) -> tuple:
    """The gauges' expected values for these per-step seconds, to a relative 1e-9."""
    mean_data, mean_other = sum(data) / len(data), sum(other) / len(other)
    return pytest.approx((mean_data + compute + mean_other, mean_data, mean_other), rel=1e-9)


def test_the_recent_gauges_are_the_mean_of_the_last_window_of_steps():
    """Steps of 1 s: the window ends at the latest report and starts 10 steps before it."""
    intake = _intake()
    slow, steady = _Client(intake, rank=0), _Client(intake, rank=1)
    data = [0.1] * 10 + [0.3] * 5                      # rank 0's data loading slows down at step 11
    other = [0.05] * 12 + [0.02] * 3
    for i in range(15):
        slow.step(BASE + i, data=data[i], other=other[i])
        steady.step(BASE + i)
    assert _recent(intake, BASE + 15) == _means(data[-10:], other[-10:])    # 0.2 data: half slowed
    assert _recent(intake, BASE + 15, rank=1) == _means([0.1] * 10, [0.05] * 10)
    slow.step(BASE + 15, data=0.3)
    assert _recent(intake, BASE + 16) == _means([*data[-9:], 0.3], [*other[-9:], 0.05])
    samples = [s for family in intake.collect() if family.name == "flopwatch_train_recent_phase_seconds"
               for s in family.samples]
    assert sorted((s.labels["rank"], s.labels["phase"]) for s in samples) == [
        ("0", "data"), ("0", "other"), ("1", "data"), ("1", "other")]


def test_the_recent_gauges_are_absent_until_a_full_window_exists():
    intake = _intake()
    client = _Client(intake)
    for i in range(10):                                # reports over 9 s: no report 10 s before the last
        client.step(BASE + i, data=0.1 * (i + 1))
        assert _recent(intake, BASE + i + 0.5) is None
    assert intake._snapshot.ranks and _Registry(intake).get("flopwatch_train_steps_total", job_id="job-a",
                                                            rank="0", gpu="") == 10
    client.step(BASE + 10, data=1.1)                   # exactly 10 s after the first: it starts the window
    assert _recent(intake, BASE + 10.5) == _means([0.1 * i for i in range(2, 12)], [0.05] * 10)


def test_steps_longer_than_the_window_are_measured_over_the_last_two():
    intake = _intake()
    client = _Client(intake)
    client.step(BASE, data=0.5)
    client.step(BASE + 18, data=1.0)
    assert _recent(intake, BASE + 19) is None          # 18 s back, but only one step
    client.step(BASE + 36, data=2.0)
    assert _recent(intake, BASE + 37) == _means([1.0, 2.0], [0.05, 0.05])
    client.step(BASE + 54, data=4.0, other=0.25)
    assert _recent(intake, BASE + 55) == _means([2.0, 4.0], [0.05, 0.25])


def test_the_recent_gauges_go_away_after_30_s_without_a_step_and_come_back():
    intake = _intake()
    client = _Client(intake)
    for i in range(12):
        client.step(BASE + i)
    last = BASE + 11
    assert _recent(intake, last + m.RECENT_STALE_S) == _means([0.1] * 10, [0.05] * 10)
    assert _recent(intake, last + m.RECENT_STALE_S + 0.5) is None
    assert _recent(intake, last + 60) is None
    client.step(last + 61, data=0.7)                   # the rank steps again: the last two steps
    assert _recent(intake, last + 61.5) == _means([0.1, 0.7], [0.05, 0.05])


def test_a_client_restart_starts_the_recent_window_over():
    intake = _intake()
    first = _Client(intake, instance=1)
    for i in range(15):
        first.step(BASE + i, data=0.1)
    assert _recent(intake, BASE + 15) == _means([0.1] * 10, [0.05] * 10)
    second = _Client(intake, instance=2)               # same rank, new process: totals start over
    for i in range(15, 25):                            # 9 s of its reports: none reaches across
        second.step(BASE + i, data=0.4)
        assert _recent(intake, BASE + i + 0.5) is None
    second.step(BASE + 25, data=0.6)
    assert _recent(intake, BASE + 25.5) == _means([0.4] * 9 + [0.6], [0.05] * 10)


def _starts_within(value: tuple, data: list[float], last: int, tick: float) -> bool:
    """Whether `value` is the mean over the steps after some report k that lies between 10 s and
    10 s + two resolutions before report `last` (the start a coalesced history can keep)."""
    span = m.RECENT_WINDOW_S + 2 * train_recent.RESOLUTION_S
    first = last - int(span / tick) - 1
    return any(value == _means(data[k + 1:last + 1], [0.002] * (last - k), compute=0.01)
               for k in range(max(first, 0), last) if (last - k) * tick >= m.RECENT_WINDOW_S)


def test_the_recent_history_stays_bounded_and_right_under_a_flood_of_reports():
    """Reports as fast as the flood guard lets them (one per 2**-10 s, exact in binary): the history
    keeps them half a second apart, never past its bound, and the window still starts 10 s back."""
    intake = _intake()
    client = _Client(intake)
    tick = 2.0 ** -10
    data = [0.001 * (i % 7) for i in range(30_000)]    # varies: a window off by a report shows
    state = None
    for i in range(30_000):
        client.step(BASE + i * tick, data=data[i], compute=0.01, other=0.002)
        state = state or intake._ranks[(b"job-a", 0)]
        assert len(state.recent) <= train_recent.MAXLEN
        if i in (20_000, 29_999):
            value = _recent(intake, BASE + i * tick)
            assert value is not None and _starts_within(value, data, i, tick)
    assert intake.accepted == 30_000
    assert len(state.recent) <= m.RECENT_WINDOW_S / train_recent.RESOLUTION_S * 2 + 2


def test_a_bound_that_drops_the_window_start_leaves_the_gauges_absent_not_wrong(monkeypatch):
    monkeypatch.setattr(train_recent, "MAXLEN", 5)
    intake = _intake()
    client = _Client(intake)
    for i in range(15):                                # 1 s steps: the window needs 11 reports
        client.step(BASE + i, data=0.1 * (i + 1))
    assert len(intake._ranks[(b"job-a", 0)].recent) == 5
    assert _recent(intake, BASE + 15) is None

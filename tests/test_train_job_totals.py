"""The intake's per-job sums on a node: phase and checkpoint seconds and the step-time histogram
summed over a job's ranks, kept counters (never going back) while ranks restart, go quiet and come
back, and never counting a rank twice.

Datagrams go straight into `handle()` and `update(now=...)` runs on an injected clock, as in
tests/test_train_intake.py, whose helpers these are.
"""

from __future__ import annotations

import pytest

from flopwatch.catalog import train as m
from flopwatch.exporters.train_intake import TrainIntake
from flopwatch.train import wire
from tests.test_train_intake import _datagram, _intake, _Registry

T0 = 5000.0                  # the injected monotonic clock starts here
EXPIRY = 10.0
PER_STEP = {"data": 0.1, "compute": 0.6, "comm": 0.2, "optimizer": 0.05, "other": 0.05}   # as _datagram sends
SAVE_PER_STEP, RESTORE_PER_STEP = 2.0, 0.5
JOB_FAMILIES = (m.JOB_PHASE_SECONDS.name, m.JOB_CHECKPOINT_SECONDS.name)


def _send(intake: TrainIntake, at: float, rank: int, steps: int, instance: int = 1, job: str = "job-a") -> None:
    """One datagram of a rank that has run `steps` steps (checkpoint seconds grow with them), accepted."""
    accepted = intake.accepted
    intake.handle(_datagram(job=job, rank=rank, steps=steps, instance=instance,
                            checkpoint_save_seconds=SAVE_PER_STEP * steps,
                            checkpoint_restore_seconds=RESTORE_PER_STEP * steps), T0 + at, 1000.0 + at)
    assert intake.accepted == accepted + 1


def _sums(intake: TrainIntake, at: float, job: str = "job-a") -> dict[str, float | None]:
    """Every per-job series of `job` after `update(now=T0 + at)`."""
    intake.update(now=T0 + at)
    reg = _Registry(intake)
    values = {phase: reg.get(m.JOB_PHASE_SECONDS.name, job_id=job, phase=phase) for phase in wire.PHASES}
    for kind in wire.CHECKPOINT_KINDS:
        values[kind] = reg.get(m.JOB_CHECKPOINT_SECONDS.name, job_id=job, kind=kind)
    values["count"] = reg.get("flopwatch_train_step_seconds_count", job_id=job)
    values["sum"] = reg.get("flopwatch_train_step_seconds_sum", job_id=job)
    values["le=1.5"] = reg.get("flopwatch_train_step_seconds_bucket", job_id=job, le="1.5")
    values["le=1.0"] = reg.get("flopwatch_train_step_seconds_bucket", job_id=job, le="1.0")
    return values


def _expected(steps: int) -> dict[str, object]:
    """The per-job series of ranks whose steps add up to `steps` (each counted once)."""
    values: dict[str, object] = {phase: pytest.approx(seconds * steps) for phase, seconds in PER_STEP.items()}
    values.update(save=pytest.approx(SAVE_PER_STEP * steps), restore=pytest.approx(RESTORE_PER_STEP * steps),
                  count=steps, sum=pytest.approx(1.0 * steps))
    values["le=1.5"], values["le=1.0"] = steps, 0
    return values


class _Counters:
    """Reads a job's series after each update and fails if any of them ever went back."""

    def __init__(self, intake: TrainIntake, job: str = "job-a") -> None:
        self.intake, self.job = intake, job
        self.last: dict[str, float] = {}

    def read(self, at: float) -> dict[str, float | None]:
        values = _sums(self.intake, at, self.job)
        for key, value in values.items():
            assert value is not None, key
            assert value >= self.last.get(key, 0.0), (key, self.last[key], value)
        self.last = values
        return values


def _job_families(intake: TrainIntake) -> set[str]:
    names = {metric.family().name: metric.name for metric in (m.JOB_PHASE_SECONDS, m.JOB_CHECKPOINT_SECONDS)}
    return {names[family.name] for family in intake.collect() if family.name in names}


def test_exact_sums_over_two_ranks_of_a_job_and_a_second_job_apart():
    intake = _intake(expiry=EXPIRY)
    _send(intake, 0, rank=0, steps=3)
    _send(intake, 0, rank=1, steps=5)
    _send(intake, 0, rank=0, steps=7, job="job-b")
    assert _sums(intake, 1) == _expected(8)
    assert _sums(intake, 1, job="job-b") == _expected(7)
    reg = _Registry(intake)
    assert reg.get(m.JOB_PHASE_SECONDS.name, job_id="job-a", phase="compute") == pytest.approx(0.6 * 3 + 0.6 * 5)
    assert reg.get(m.JOB_CHECKPOINT_SECONDS.name, job_id="job-b", kind="save") == pytest.approx(14.0)
    # the per-rank series are still there beside them
    assert reg.get(m.PHASE_SECONDS.name, job_id="job-a", rank="1", gpu="", phase="comm") == pytest.approx(1.0)
    assert _job_families(intake) == set(JOB_FAMILIES)


def test_a_restart_keeps_the_old_totals_and_adds_the_new():
    intake = _intake(expiry=EXPIRY)
    counters = _Counters(intake)
    _send(intake, 0, rank=0, steps=10)
    _send(intake, 0, rank=1, steps=4)
    assert counters.read(1) == _expected(14)
    _send(intake, 2, rank=0, steps=2, instance=2)           # the process restarted: its totals start over
    assert counters.read(3) == _expected(10 + 2 + 4)
    _send(intake, 4, rank=0, steps=5, instance=2)
    _send(intake, 4, rank=1, steps=6)
    assert counters.read(5) == _expected(10 + 5 + 6)
    _send(intake, 6, rank=0, steps=1, instance=3)           # and once more
    assert counters.read(7) == _expected(10 + 5 + 1 + 6)


def test_a_rank_expiring_while_its_job_goes_on_keeps_its_part():
    intake = _intake(expiry=EXPIRY)
    counters = _Counters(intake)
    _send(intake, 0, rank=0, steps=4)
    _send(intake, 0, rank=1, steps=3)
    assert counters.read(1) == _expected(7)
    _send(intake, 15, rank=1, steps=6)
    assert counters.read(20) == _expected(4 + 6)             # rank 0 went quiet at 0: expired at 20
    assert _Registry(intake).get(m.PHASE_SECONDS.name, job_id="job-a", rank="0", gpu="", phase="data") is None
    _send(intake, 25, rank=1, steps=8)
    assert counters.read(26) == _expected(4 + 8)


Expired = tuple[TrainIntake, _Counters]


@pytest.fixture
def expired() -> Expired:
    """Ranks 0 (4 steps, instance 1) and 1 of job-a; rank 0 went quiet and expired, rank 1 is at 6."""
    intake = _intake(expiry=EXPIRY)
    counters = _Counters(intake)
    _send(intake, 0, rank=0, steps=4)
    _send(intake, 0, rank=1, steps=3)
    assert counters.read(1) == _expected(7)
    _send(intake, 15, rank=1, steps=6)
    assert counters.read(20) == _expected(4 + 6)
    return intake, counters


def test_a_rank_back_from_the_same_process_after_expiring_is_not_counted_twice(expired: Expired) -> None:
    intake, counters = expired
    _send(intake, 21, rank=0, steps=9)                       # same instance, its totals went on from 4
    assert counters.read(22) == _expected(9 + 6)             # not 4 + 9 + 6
    _send(intake, 23, rank=0, steps=11)
    _send(intake, 23, rank=1, steps=7)
    assert counters.read(24) == _expected(11 + 7)
    _send(intake, 40, rank=1, steps=8)
    assert counters.read(40) == _expected(11 + 8)            # rank 0 went quiet again: kept once
    _send(intake, 41, rank=0, steps=12)
    assert counters.read(42) == _expected(12 + 8)


def test_a_rank_back_with_the_same_totals_is_not_counted_twice(expired: Expired) -> None:
    """Back from the same process without a step in between: its totals equal those it left with."""
    intake, counters = expired
    _send(intake, 21, rank=0, steps=4)
    assert counters.read(22) == _expected(4 + 6)


def test_a_rank_back_from_a_new_process_after_expiring_counts_old_and_new(expired: Expired) -> None:
    intake, counters = expired
    _send(intake, 21, rank=0, steps=5, instance=2)           # restarted while it was away, ran 5 steps
    assert counters.read(22) == _expected(4 + 5 + 6)
    _send(intake, 23, rank=0, steps=7, instance=2)
    assert counters.read(24) == _expected(4 + 7 + 6)


def test_a_rank_back_from_its_process_with_totals_gone_back_keeps_the_old_ones(expired: Expired) -> None:
    """Totals lower than those it went quiet with are another run's (the live rank's datagram would
    have been refused as non_monotonic): the old ones stay retired, the sums never go back."""
    intake, counters = expired
    _send(intake, 21, rank=0, steps=2)
    assert counters.read(22) == _expected(4 + 2 + 6)


def test_the_jobs_series_go_with_its_last_rank_and_a_new_run_starts_from_nothing():
    intake = _intake(expiry=EXPIRY)
    _send(intake, 0, rank=0, steps=4)
    _send(intake, 5, rank=1, steps=3)
    _send(intake, 5, rank=0, steps=2, job="job-b")
    _send(intake, 12, rank=0, steps=3, job="job-b")
    assert _sums(intake, 12) == _expected(4 + 3)             # rank 0 expired, its part kept
    assert _sums(intake, 16) == dict.fromkeys(_expected(0))  # rank 1 expired too: job-a is gone
    assert _sums(intake, 16, job="job-b") == _expected(3)
    assert b"job-a" not in intake._jobs
    _send(intake, 17, rank=0, steps=5)                       # same process, but its job was dropped
    assert _sums(intake, 18) == _expected(5)


def test_the_families_are_absent_without_ranks():
    intake = _intake(expiry=EXPIRY)
    intake.update(now=T0)
    assert _job_families(intake) == set()
    _send(intake, 0, rank=0, steps=1)
    intake.update(now=T0 + 1)
    assert _job_families(intake) == set(JOB_FAMILIES)
    intake.update(now=T0 + 11)
    assert _job_families(intake) == set()


def test_rounding_never_moves_a_sum_back():
    """Floating-point sums depend on the order of their terms, and a retired part taken back out
    leaves its rounding behind: rank 1 going quiet and coming back without a step would move the
    job's data seconds from 0.5800000000000001 to 0.58 (plain or compensated summation alike),
    which Prometheus would read as a counter reset."""
    intake = _intake(expiry=EXPIRY)
    counters = _Counters(intake)

    def send(at: float, rank: int, data: float, instance: int = 1) -> None:
        intake.handle(_datagram(rank=rank, instance=instance, phases={"data": data}, checkpoint_save_seconds=data),
                      T0 + at, 0.0)

    send(0, 1, 0.08)
    send(5, 0, 0.2)
    send(5, 2, 0.3)
    counters.read(6)
    send(7, 0, 0.0, instance=2)                              # rank 0 restarted: its 0.2 retired
    counters.read(8)
    first = counters.read(12)["data"]                        # rank 1 went quiet: its 0.08 retired too
    send(13, 1, 0.08)                                        # back from its process, no step since
    assert counters.read(14)["data"] == first == pytest.approx(0.58)


def test_a_restarted_rank_whose_first_datagram_is_refused_keeps_the_sums_and_the_update_going():
    """A new process claiming a place another rank holds is refused; until it is accepted the rank
    has no totals, and update() must still run and keep its old ones in the sums."""
    intake = _intake(expiry=EXPIRY)
    counters = _Counters(intake)
    here, there = {"pp_stage": 0, "pp_size": 2, "dp_rank": 0, "dp_size": 4}, {"pp_stage": 1, "pp_size": 2,
                                                                              "dp_rank": 0, "dp_size": 4}
    intake.handle(_datagram(rank=4, steps=4, **here), T0, 0.0)
    intake.handle(_datagram(rank=5, steps=3, **there), T0, 0.0)
    assert counters.read(1)["count"] == 7
    intake.handle(_datagram(rank=4, steps=1, instance=2, **there), T0 + 2, 0.0)
    assert intake.rejected["duplicate_coordinates"] == 1
    assert counters.read(3)["count"] == 7
    assert _Registry(intake).get("flopwatch_train_steps_total", job_id="job-a", rank="4", gpu="") is None
    intake.handle(_datagram(rank=4, steps=2, instance=2, **here), T0 + 4, 0.0)
    assert counters.read(5)["count"] == 4 + 2 + 3


def test_what_a_job_remembers_of_its_quiet_ranks_is_bounded():
    """One entry per rank, at most max_ranks per job (the oldest forgotten), dropped with the job;
    the sums keep every rank's part whatever it forgot."""
    intake = _intake(expiry=EXPIRY, max_ranks=3)
    counters = _Counters(intake)
    for cycle in range(6):                                   # rank 0 stays, two others come and go
        at = 20.0 * cycle
        _send(intake, at, rank=0, steps=cycle + 1)
        counters.read(at)                                    # the last cycle's two went quiet
        _send(intake, at, rank=1 + 2 * cycle, steps=1)
        _send(intake, at, rank=2 + 2 * cycle, steps=1)
        assert counters.read(at + 1) == _expected(cycle + 1 + 2 * (cycle + 1))
    _send(intake, 115, rank=0, steps=7)
    assert counters.read(115) == _expected(7 + 12)
    assert sorted(intake._jobs[b"job-a"].expired) == [10, 11, 12]
    _send(intake, 116, rank=11, steps=2)                     # back from its process: counted once
    assert counters.read(116) == _expected(7 + 12 - 1 + 2)
    assert sorted(intake._jobs[b"job-a"].expired) == [10, 12]
    _send(intake, 117, rank=8, steps=3)                      # forgotten: its old step stays retired
    assert counters.read(117) == _expected(7 + 12 - 1 + 2 + 3)
    _send(intake, 120, rank=8, steps=4)
    assert counters.read(120) == _expected(7 + 12 - 1 + 2 + 4)
    intake.update(now=T0 + 200)
    assert not intake._jobs

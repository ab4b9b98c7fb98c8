"""The datagram format shared by the training client and the agent intake: round trips and refusals."""

from __future__ import annotations

import math
import struct

import pytest

from flopwatch.train import wire


def _record(**changes) -> wire.StepRecord:
    base = {"job_id": "job-7", "rank": 5, "local_rank": 1, "gpu": 3, "instance": 99, "steps": 4,
            "tokens": 16384.0, "model_flops": 4e12, "hardware_flops": 5e12, "step_seconds": 2.0,
            "checkpoint_save_seconds": 1.5, "dropped": 2, "analytic_flops_per_step": 1e12,
            "measured_flops_per_step": 1.01e12, "buckets": (0,) * 8 + (4,) + (0,) * 14,
            "phases": {"data": 0.1, "compute": 1.2, "comm": 0.4, "optimizer": 0.2, "other": 0.1},
            "pp_stage": 2, "pp_size": 4, "tp_rank": 1, "tp_size": 8, "dp_rank": 3, "dp_size": 16,
            "comm_min_seconds": 0.05, "comm_min_steps": 16, "iteration": 120_345}
    base.update(changes)
    return wire.StepRecord(**base)


def test_round_trip_keeps_every_field():
    record = _record()
    assert wire.decode(wire.encode(record)) == record


def test_version_1_still_reads_as_stage_0_without_a_floor():
    record = _record(version=1)
    data = wire.encode(record)
    assert len(data) == len(wire.encode(_record())) - wire.COORDS.size
    decoded = wire.decode(data)
    assert decoded.coordinates == wire.NO_COORDS
    assert decoded.steps == 4 and decoded.phases == record.phases and decoded.version == 1


def test_the_iteration_is_outside_the_identity_and_read_on_its_own():
    one, two = wire.encode(_record(iteration=7)), wire.encode(_record(iteration=8))
    assert wire.identity(one) == wire.identity(two)
    assert (wire.iteration_of(one), wire.iteration_of(two)) == (7, 8)
    assert wire.iteration_of(wire.encode(_record(iteration=None))) is None
    assert wire.decode(wire.encode(_record(iteration=None))).iteration is None
    assert wire.identity(wire.encode(_record(iteration=None))) != wire.identity(one)   # the flag differs


def test_partial_phase_mask_reads_missing_phases_as_zero():
    decoded = wire.decode(wire.encode(_record(phases={"comm": 0.75})))
    assert decoded.phases == {"data": 0.0, "compute": 0.0, "comm": 0.75, "optimizer": 0.0, "other": 0.0}
    assert decoded.measured_flops_per_step == 1.01e12


def test_largest_datagram_is_max_datagram():
    data = wire.encode(_record(job_id="j" * wire.MAX_JOB_ID))
    assert len(data) == wire.MAX_DATAGRAM
    assert wire.decode(data).job_id == "j" * wire.MAX_JOB_ID


def _reason(data: bytes) -> str:
    with pytest.raises(wire.WireError) as caught:
        wire.decode(data)
    return caught.value.reason


def _patch(data: bytes, offset: int, fmt: str, value) -> bytes:
    out = bytearray(data)
    struct.pack_into(fmt, out, offset, value)
    return bytes(out)


GOOD = wire.encode(_record())
GOOD_V1 = wire.encode(_record(version=1))
#: byte offsets of fields in the datagram
OFF_FLAGS, OFF_MASK, OFF_JOB_LEN, OFF_RANK, OFF_LOCAL_RANK, OFF_GPU = 1, 2, 3, 4, 8, 10
OFF_STEPS = wire.HEAD.size
OFF_TOKENS = wire.HEAD.size + 16 + 4 * wire.N_BUCKETS
OFF_COORDS = len(GOOD) - 5 - wire.COORDS.size     # pp_stage, pp_size, tp_rank, tp_size, dp_rank, dp_size
OFF_COMM_MIN = OFF_COORDS + 16


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"", "truncated"),
        (GOOD[:1], "truncated"),
        (GOOD[:100], "truncated"),
        (GOOD[:-1], "truncated"),
        (GOOD + b"x", "malformed"),
        (GOOD + b"x" * 500, "oversized"),
        (b"\x03" + GOOD[1:], "version"),
        (b"\x01" + GOOD[1:], "malformed"),                                 # a v1 datagram is 36 bytes shorter
        (_patch(GOOD_V1, OFF_FLAGS, "B", wire.FLAG_ITERATION), "malformed"),  # no iteration in v1
        (b"\x02" + GOOD_V1[1:], "truncated"),
        (b"\x00" * len(GOOD), "version"),
        (_patch(GOOD, OFF_FLAGS, "B", 0x80), "malformed"),
        (_patch(GOOD, OFF_MASK, "B", 0x20), "unknown_phase"),
        (_patch(GOOD, OFF_MASK, "B", 0xFF), "unknown_phase"),
        (_patch(GOOD, OFF_JOB_LEN, "B", 0), "malformed"),
        (GOOD[:-5] + b'j"b\\7', "bad_job_id"),
        (GOOD[:-5] + b"j\x00b\n7", "bad_job_id"),
        (GOOD[:-5] + "jöb7".encode()[:5], "bad_job_id"),
        (_patch(GOOD, OFF_RANK, "<I", wire.MAX_RANK + 1), "bad_rank"),
        (_patch(GOOD, OFF_LOCAL_RANK, "<h", -2), "bad_rank"),
        (_patch(GOOD, OFF_GPU, "<h", -7), "bad_rank"),
        (_patch(GOOD, OFF_TOKENS, "<d", math.nan), "bad_value"),
        (_patch(GOOD, OFF_TOKENS, "<d", -1.0), "bad_value"),
        (_patch(GOOD, OFF_TOKENS, "<d", math.inf), "bad_value"),
        (_patch(GOOD, OFF_TOKENS, "<d", -0.0), "bad_value"),
        (wire.encode(_record(phases={"comm": math.nan})), "bad_value"),         # partial mask path
        (wire.encode(_record(phases={"comm": -0.0})), "bad_value"),
        (wire.encode(_record(phases={"data": 1.0}, tokens=-2.0)), "bad_value"),
        (_patch(GOOD, OFF_COORDS - 8, "<d", math.nan), "bad_value"),     # measured FLOPs gauge
        (_patch(GOOD, OFF_COORDS - 16 - 8, "<d", -0.5), "bad_value"),     # the last phase total
        (_patch(GOOD_V1, len(GOOD_V1) - 5 - 8, "<d", math.nan), "bad_value"),
        (_patch(GOOD, OFF_COORDS, "<h", 4), "bad_coordinates"),           # stage 4 of 4
        (_patch(GOOD, OFF_COORDS, "<h", -2), "bad_coordinates"),
        (_patch(GOOD, OFF_COORDS + 4, "<h", 8), "bad_coordinates"),       # tp rank 8 of 8
        (_patch(GOOD, OFF_COORDS + 8, "<i", 16), "bad_coordinates"),      # dp rank 16 of 16
        (_patch(GOOD, OFF_COORDS + 12, "<i", -1), "bad_coordinates"),     # a negative size
        (_patch(GOOD, OFF_COMM_MIN, "<d", math.nan), "bad_value"),
        (_patch(GOOD, OFF_COMM_MIN, "<d", -0.0), "bad_value"),
        (wire.encode(_record(phases={"comm": 0.5}, pp_stage=7)), "bad_coordinates"),   # partial mask path
        (_patch(GOOD, OFF_STEPS, "<Q", 5), "malformed"),                  # buckets add up to 4
    ],
)
def test_refusals_carry_the_reason(data, reason):
    assert _reason(data) == reason


def test_every_reason_is_a_known_label():
    from flopwatch.exporters.train_intake import REASONS

    reasons = {"truncated", "oversized", "version", "malformed", "unknown_phase", "bad_job_id", "bad_rank",
               "bad_value", "bad_coordinates", "duplicate_coordinates"}
    assert reasons <= set(REASONS)


def test_trusted_jobs_skip_only_the_job_check():
    bad_job = GOOD[:-5] + b"j\x00b\n7"
    record, job = wire.split(bad_job, {b"j\x00b\n7"})
    assert job == b"j\x00b\n7" and record[wire.I_STEPS] == 4
    with pytest.raises(wire.WireError):
        wire.split(_patch(bad_job, OFF_TOKENS, "<d", math.nan), {b"j\x00b\n7"})


def test_socket_candidates_follow_the_environment(tmp_path):
    assert wire.socket_candidates({"FLOPWATCH_SOCKET": "/x/y.sock"}) == ["/x/y.sock"]
    paths = wire.socket_candidates({"XDG_RUNTIME_DIR": str(tmp_path)})
    assert paths == [wire.DEFAULT_SOCKET, str(tmp_path / "flopwatch" / "steps.sock")]
    assert wire.user_socket_path({}).startswith("/tmp/flopwatch-")

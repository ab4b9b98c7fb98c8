"""Hand-encoded remote-write requests, read back by an independent minimal protobuf and snappy
decoder (the integration tests also write them into a real Prometheus)."""

from __future__ import annotations

import math
import struct

import numpy as np
import pytest

from flopwatch.detect.remote_write import (
    STALE_NAN_BITS,
    encode_labels,
    encode_request,
    encode_samples,
    snappy_literal,
    sorted_labels,
    varint,
)


def read_varint(data: bytes, i: int) -> tuple[int, int]:
    shift = value = 0
    while True:
        byte = data[i]
        value |= (byte & 0x7F) << shift
        i += 1
        if not byte & 0x80:
            return value, i
        shift += 7


def fields(data: bytes):
    i = 0
    while i < len(data):
        key, i = read_varint(data, i)
        number, wire = key >> 3, key & 7
        if wire == 2:
            length, i = read_varint(data, i)
            yield number, data[i:i + length]
            i += length
        elif wire == 1:
            yield number, data[i:i + 8]
            i += 8
        elif wire == 0:
            value, i = read_varint(data, i)
            yield number, value
        else:
            raise AssertionError(f"unexpected wire type {wire}")


def decode(request: bytes):
    out = []
    for number, series in fields(request):
        assert number == 1
        labels, samples = [], []
        for n, part in fields(series):
            if n == 1:
                pair = dict(fields(part))
                labels.append((pair[1].decode(), pair[2].decode()))
            else:
                sample = dict(fields(part))
                samples.append((struct.unpack("<d", sample[1])[0], sample[2]))
        out.append((tuple(labels), samples))
    return out


def unsnappy(data: bytes) -> bytes:
    length, i = read_varint(data, 0)
    out = bytearray()
    while i < len(data):
        tag = data[i]
        assert tag & 3 == 0, "only literals expected"
        size = tag >> 2
        i += 1
        if size >= 60:
            extra = size - 59
            size = int.from_bytes(data[i:i + extra], "little")
            i += extra
        size += 1
        out += data[i:i + size]
        i += size
    assert len(out) == length
    return bytes(out)


def test_varint_matches_protobuf():
    assert varint(1) == b"\x01" and varint(300) == b"\xac\x02" and varint(0) == b"\x00"


def test_request_round_trips_labels_values_timestamps_and_gaps():
    labels = [sorted_labels("m", {"node": "n1", "gpu": "0"}), sorted_labels("m", {"node": "n1", "gpu": "1"})]
    stale = struct.unpack("<d", struct.pack("<Q", STALE_NAN_BITS))[0]
    values = np.array([[1.5, -2.0, 3e12], [0.0, stale, 7.0]])
    present = np.array([[True, True, True], [True, True, False]])
    stamps = np.array([1_700_000_000_000, 1_700_000_005_000, 1_700_000_010_000])
    decoded = decode(encode_request([encode_labels(x) for x in labels], values, present, stamps))
    assert [d[0] for d in decoded] == labels
    assert decoded[0][1] == [(1.5, stamps[0]), (-2.0, stamps[1]), (3e12, stamps[2])]
    (v0, t0), (v1, t1) = decoded[1][1]
    assert (v0, t0, t1) == (0.0, stamps[0], stamps[1])
    assert math.isnan(v1) and struct.unpack("<Q", struct.pack("<d", v1))[0] == STALE_NAN_BITS


def test_series_with_no_sample_is_left_out():
    request = encode_request([encode_labels(sorted_labels("m", {}))], np.zeros((1, 2)), np.zeros((1, 2), bool),
                             np.array([1_700_000_000_000, 1_700_000_001_000]))
    assert request == b""


def test_timestamps_outside_the_fixed_varint_range_are_refused():
    with pytest.raises(ValueError, match="between 1971 and 2109"):
        encode_samples(np.zeros((1, 1)), np.array([1000]))


def test_snappy_literal_frames_decode_to_the_input():
    for data in (b"", b"x", bytes(range(256)) * 1000):
        assert unsnappy(snappy_literal(data)) == data

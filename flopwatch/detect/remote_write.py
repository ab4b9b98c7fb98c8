"""Prometheus remote-write, hand-encoded and vectorised, for loading simulated history fast.

The protocol is a snappy-framed protobuf `WriteRequest{repeated TimeSeries timeseries = 1}` with
`TimeSeries{repeated Label labels = 1; repeated Sample samples = 2}`, `Label{string name = 1;
string value = 2}` and `Sample{double value = 1; int64 timestamp = 2}` (prompb/types.proto). The
messages are tiny, so they are encoded here without a protobuf dependency: every sample of a
modern millisecond timestamp is exactly 18 bytes, which lets numpy build a whole block of samples
at once instead of one Python call per sample.

Snappy's block format allows a stream made only of literals; over loopback compression buys
nothing, so `snappy_literal()` frames the bytes uncompressed and no snappy library is needed.
"""

from __future__ import annotations

import struct
import urllib.error
import urllib.request
from collections.abc import Iterable, Sequence

import numpy as np

#: Prometheus's stale marker: a NaN with this exact bit pattern ends a series (value.StaleNaN).
STALE_NAN_BITS = 0x7FF0000000000002
STALE_NAN: float = struct.unpack("<d", struct.pack("<Q", STALE_NAN_BITS))[0]
#: Milliseconds from 2^35 to 2^42 (1971 to 2109) encode as a 6-byte varint: one fixed layout.
_TS_MIN, _TS_MAX = 1 << 35, 1 << 42
_SAMPLE_BYTES = 18          # 0x12 len(16) | 0x09 double(8) | 0x10 varint(6)
_MAX_LITERAL = (1 << 32) - 1

Labels = tuple[tuple[str, str], ...]


class RemoteWriteError(RuntimeError):
    """Prometheus refused a write; the message carries its answer."""


def varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _field(tag: int, payload: bytes) -> bytes:
    return bytes([tag]) + varint(len(payload)) + payload


def encode_labels(labels: Labels) -> bytes:
    """The labels part of a TimeSeries; `labels` must already be sorted by name."""
    return b"".join(_field(0x0A, _field(0x0A, name.encode()) + _field(0x12, value.encode()))
                    for name, value in labels)


def sorted_labels(name: str, labels: dict[str, str] | Iterable[tuple[str, str]]) -> Labels:
    """__name__ plus labels, sorted by label name as the TSDB requires."""
    items = labels.items() if isinstance(labels, dict) else labels
    return tuple(sorted([("__name__", name), *items]))


def encode_samples(values: np.ndarray, timestamps_ms: np.ndarray) -> np.ndarray:
    """(series, samples) values and (samples,) timestamps -> (series, samples, 18) uint8 rows,
    each one complete `Sample` field of a TimeSeries."""
    values = np.ascontiguousarray(values, dtype="<f8")
    stamps = np.asarray(timestamps_ms, dtype=np.int64)
    if stamps.size and (stamps.min() < _TS_MIN or stamps.max() >= _TS_MAX):
        raise ValueError("timestamps must lie between 1971 and 2109 (6-byte varints)")
    series, count = values.shape
    out = np.empty((series, count, _SAMPLE_BYTES), dtype=np.uint8)
    out[:, :, 0] = 0x12
    out[:, :, 1] = 16
    out[:, :, 2] = 0x09
    out[:, :, 3:11] = values.view(np.uint8).reshape(series, count, 8)
    out[:, :, 11] = 0x10
    shifts = np.arange(6, dtype=np.int64) * 7
    stamp_bytes = ((stamps[:, None] >> shifts) & 0x7F).astype(np.uint8)
    stamp_bytes[:, :5] |= 0x80
    out[:, :, 12:18] = stamp_bytes[None, :, :]
    return out


def encode_request(label_bytes: Sequence[bytes], values: np.ndarray, present: np.ndarray,
                   timestamps_ms: np.ndarray) -> bytes:
    """One WriteRequest: series i has labels `label_bytes[i]` and the samples where present[i]."""
    rows = encode_samples(values, timestamps_ms)
    parts: list[bytes] = []
    full = present.all(axis=1)
    for i, labels in enumerate(label_bytes):
        if full[i]:
            samples = rows[i].tobytes()
        else:
            mask = present[i]
            if not mask.any():
                continue
            samples = rows[i][mask].tobytes()
        body_length = len(labels) + len(samples)
        parts.append(b"\x0a" + varint(body_length) + labels + samples)
    return b"".join(parts)


def snappy_literal(data: bytes) -> bytes:
    """`data` as a valid snappy block made of uncompressed literals."""
    out = [varint(len(data))]
    for start in range(0, len(data), _MAX_LITERAL):
        chunk = data[start:start + _MAX_LITERAL]
        out.append(b"\xfc" + struct.pack("<I", len(chunk) - 1))
        out.append(chunk)
    return b"".join(out)


def post(url: str, request: bytes, timeout: float = 300.0) -> None:
    """POST one encoded WriteRequest to `url` (…/api/v1/write)."""
    body = snappy_literal(request)
    http = urllib.request.Request(url, data=body, method="POST", headers={
        "Content-Type": "application/x-protobuf", "Content-Encoding": "snappy",
        "X-Prometheus-Remote-Write-Version": "0.1.0",
    })
    try:
        with urllib.request.urlopen(http, timeout=timeout):
            pass
    except urllib.error.HTTPError as error:
        detail = error.read(500).decode(errors="replace").strip()
        raise RemoteWriteError(f"remote write to {url} refused (HTTP {error.code}): {detail}") from None
    except (urllib.error.URLError, OSError) as error:
        raise RemoteWriteError(f"cannot remote-write to {url}: {getattr(error, 'reason', error)}") from None

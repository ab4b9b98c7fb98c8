"""The outage buffer: order, bounds, restart recovery, and a failing disk (real files throughout;
the full disk is the kernel's own ENOSPC from /dev/full)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from flopwatch.exporters.influx_buffer import CURSOR, SegmentBuffer


def lines(first: int, count: int, width: int = 0) -> bytes:
    return b"".join(b"m,i=%d value=%d %s\n" % (i, i, b"x" * width) for i in range(first, first + count))


def drain(buffer: SegmentBuffer, batch: int = 1000) -> bytes:
    out = b""
    while (taken := buffer.peek(batch)) is not None:
        out += taken.data
        buffer.commit(taken)
    return out


def test_points_leave_in_order_across_segments_and_sent_segments_are_deleted(tmp_path):
    buffer = SegmentBuffer(tmp_path, 10 * 2**20, segment_bytes=2000)
    sent = b""
    for cycle in range(20):
        buffer.append(lines(cycle * 50, 50), 50)
        if cycle % 3 == 0:  # the writer keeps up only now and then
            batch = buffer.peek(70)
            assert batch is not None and batch.lines <= 70
            sent += batch.data
            buffer.commit(batch)
    assert len(list(tmp_path.glob("*.lp"))) > 3
    sent += drain(buffer, 70)
    assert sent == lines(0, 1000)
    assert buffer.lines == buffer.bytes == 0
    assert len(list(tmp_path.glob("*.lp"))) <= 1  # only the segment still being appended to


def test_an_uncommitted_batch_is_offered_again(tmp_path):
    buffer = SegmentBuffer(tmp_path, 2**20)
    buffer.append(lines(0, 10), 10)
    first = buffer.peek(4)
    buffer.release()  # the write failed
    again = buffer.peek(4)
    assert first == again and again.data == lines(0, 4)
    buffer.commit(again)
    assert buffer.peek(100).data == lines(4, 6)


def test_over_the_bound_the_oldest_segments_are_dropped_and_counted(tmp_path):
    bound = 2**20
    buffer = SegmentBuffer(tmp_path, bound, segment_bytes=64 * 1024)
    per_cycle, width = 100, 900  # ~92 KiB a cycle
    for cycle in range(30):
        buffer.append(lines(cycle * per_cycle, per_cycle, width), per_cycle)
    assert buffer.bytes <= bound + 64 * 1024 + 100 * 1000
    assert buffer.dropped > 0
    kept = drain(buffer)
    survivors = kept.count(b"\n")
    assert survivors + buffer.dropped == 30 * per_cycle
    # what survived is the newest points, in order
    assert kept == lines(30 * per_cycle - survivors, survivors, width)


def test_a_restarted_agent_resumes_from_the_cursor(tmp_path):
    buffer = SegmentBuffer(tmp_path, 2**20, segment_bytes=4096)
    for cycle in range(10):
        buffer.append(lines(cycle * 20, 20), 20)
    for _ in range(3):
        buffer.commit(buffer.peek(25))
    buffer.close()
    assert (tmp_path / CURSOR).exists()
    again = SegmentBuffer(tmp_path, 2**20, segment_bytes=4096)
    assert again.lines == 200 - 75
    assert drain(again) == lines(75, 125)
    again.append(lines(1000, 1), 1)
    assert drain(again) == lines(1000, 1)


def test_a_half_written_line_from_a_crash_is_cut_off(tmp_path):
    buffer = SegmentBuffer(tmp_path, 2**20)
    buffer.append(lines(0, 5), 5)
    buffer.close()
    segment = next(tmp_path.glob("*.lp"))
    with open(segment, "ab") as handle:
        handle.write(b"m,i=5 val")  # the process died mid-append
    again = SegmentBuffer(tmp_path, 2**20)
    assert again.lines == 5
    assert drain(again) == lines(0, 5)


def test_an_unusable_directory_buffers_in_memory_and_says_so(tmp_path, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    buffer = SegmentBuffer(blocker / "buffer", 2**20)
    assert buffer.disk_error is not None and "Not a directory" in buffer.disk_error
    assert "influx.buffer_dir" in caplog.text
    assert not buffer.on_disk
    buffer.append(lines(0, 10), 10)
    assert drain(buffer, 3) == lines(0, 10)


def test_a_full_disk_falls_back_to_memory_without_losing_order(tmp_path, caplog):
    buffer = SegmentBuffer(tmp_path, 2**20, segment_bytes=1000)
    buffer.append(lines(0, 10, 100), 10)       # segment 1 on disk; over 1000 bytes, so it rolls
    os.symlink("/dev/full", tmp_path / "000000000002.lp")   # the next segment's file: ENOSPC
    buffer.append(lines(10, 10, 100), 10)
    assert buffer.disk_error is not None and "No space left" in buffer.disk_error
    assert not buffer.on_disk
    buffer.append(lines(20, 10, 100), 10)      # the memory segment rolled: segment 4 goes to disk
    assert buffer.on_disk and buffer.disk_error is None
    assert "writable again" in caplog.text
    buffer.append(lines(30, 5, 100), 5)
    assert drain(buffer, 7) == lines(0, 35, 100)


def test_memory_only_buffer_is_bounded_by_max_bytes(tmp_path):
    buffer = SegmentBuffer(None, 2**20)
    for cycle in range(40):
        buffer.append(lines(cycle * 100, 100, 400), 100)
    assert 0 < buffer.bytes <= 2**20 + 200 * 1024
    assert buffer.dropped > 0
    assert not list(Path(tmp_path).iterdir())


@pytest.mark.parametrize("max_lines", [1, 7, 10_000])
def test_batches_hold_whole_lines(tmp_path, max_lines):
    buffer = SegmentBuffer(tmp_path, 2**20)
    buffer.append(lines(0, 50), 50)
    batch = buffer.peek(max_lines)
    assert batch.lines == min(max_lines, 50)
    assert batch.data.endswith(b"\n") and batch.data.count(b"\n") == batch.lines

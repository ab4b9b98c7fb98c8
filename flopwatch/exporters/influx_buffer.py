"""The InfluxDB sink's outage buffer: a bounded FIFO of line-protocol points in segment files.

Every collection cycle's points are appended to the newest segment (`<seq>.lp`, append-only,
whole lines); the writer reads the oldest segment from a cursor, sends a batch, and only then
`commit()`s it, which moves the cursor (kept in the `cursor` file so a restarted agent resumes
where it stopped) and deletes a segment once it is fully sent. Points therefore leave in the order
they were collected, and a batch is removed only after the server accepted it.

Bounded: when the segments outgrow `max_bytes`, whole oldest segments are dropped and their
points counted. When the directory is unset, unwritable or full, points go to segments held in
memory (at most `memory_max_bytes`) and the disk is tried again at the next segment; collection
never waits on the disk.

A crash between a write and its commit sends that batch again after a restart. Line protocol
makes that harmless on InfluxDB (a point with the same measurement, tags and timestamp replaces
the old one); on VictoriaMetrics set `-dedup.minScrapeInterval=1ms` for the same effect.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

SUFFIX = ".lp"
CURSOR = "cursor"
MAX_READ = 4 * 2**20  # bytes read for one batch at most
DEFAULT_MEMORY_MAX = 32 * 2**20


@dataclass
class _Segment:
    seq: int
    path: Path | None                      # None: held in memory
    data: bytearray = field(default_factory=bytearray)   # memory segments only
    size: int = 0                          # bytes appended
    lines: int = 0                         # lines appended
    offset: int = 0                        # bytes already sent
    sent_lines: int = 0                    # lines already sent
    sealed: bool = False                   # no more appends

    @property
    def pending_bytes(self) -> int:
        return self.size - self.offset

    @property
    def pending_lines(self) -> int:
        return self.lines - self.sent_lines


@dataclass(frozen=True)
class Batch:
    """Whole lines from one segment, oldest first; hand it back to commit() once written."""

    seq: int
    start: int
    end: int
    lines: int
    data: bytes


class SegmentBuffer:
    """Thread-safe: one thread appends, another peeks and commits."""

    def __init__(self, directory: str | Path | None, max_bytes: int, *, segment_bytes: int | None = None,
                 memory_max_bytes: int = DEFAULT_MEMORY_MAX) -> None:
        self.directory = Path(directory) if directory is not None else None
        self.max_bytes = max_bytes
        self.segment_bytes = segment_bytes or max(64 * 1024, min(4 * 2**20, max_bytes // 8))
        # memory is the fallback for a failing disk; with no directory at all it is the buffer
        self.memory_max_bytes = max_bytes if directory is None else min(memory_max_bytes, max_bytes)
        self.dropped = 0               # lines dropped because the buffer was full
        self.disk_error: str | None = None
        self._segments: list[_Segment] = []
        self._next_seq = 1
        self._lock = threading.Lock()
        self._fd: int | None = None     # append descriptor of the newest disk segment
        self._read_fd: tuple[int, int] | None = None  # (seq, descriptor) of the segment being read
        self._inflight: Batch | None = None
        if self.directory is not None:
            try:
                self.directory.mkdir(parents=True, exist_ok=True)
                self._recover()
            except OSError as error:
                self._disk_failed(error)

    # -- state ---------------------------------------------------------------------------------
    @property
    def bytes(self) -> int:
        with self._lock:
            return sum(s.pending_bytes for s in self._segments)

    @property
    def lines(self) -> int:
        with self._lock:
            return sum(s.pending_lines for s in self._segments)

    @property
    def on_disk(self) -> bool:
        """True while new points go to a file (not memory)."""
        with self._lock:
            if self._segments and not self._segments[-1].sealed:
                return self._segments[-1].path is not None
            return self.directory is not None and self.disk_error is None

    # -- appending -----------------------------------------------------------------------------
    def append(self, data: bytes, lines: int) -> None:
        """Add whole lines (each ending in a newline); drops the oldest points when over the bound."""
        if not data:
            return
        with self._lock:
            segment = self._active()
            if segment.path is not None and not self._write(segment, data):
                segment = self._new_segment(memory=True)
            if segment.path is None:
                segment.data += data
            segment.size += len(data)
            segment.lines += lines
            if segment.size >= self.segment_bytes:
                self._seal(segment)
            self._enforce_bounds()

    def _active(self) -> _Segment:
        if self._segments and not self._segments[-1].sealed:
            return self._segments[-1]
        return self._new_segment(memory=False)

    def _new_segment(self, memory: bool) -> _Segment:
        if self._segments and not self._segments[-1].sealed:
            self._seal(self._segments[-1])
        seq, self._next_seq = self._next_seq, self._next_seq + 1
        path = None
        if not memory and self.directory is not None:
            path = self.directory / f"{seq:012d}{SUFFIX}"
            try:
                self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            except OSError as error:
                self._disk_failed(error)
                path = None
            else:
                if self.disk_error is not None:
                    log.warning("influx buffer: %s is writable again; buffering on disk", self.directory)
                    self.disk_error = None
        segment = _Segment(seq, path)
        self._segments.append(segment)
        return segment

    def _write(self, segment: _Segment, data: bytes) -> bool:
        """Append to the segment's file, all or nothing; False (and memory from now on) on failure."""
        assert self._fd is not None
        view = memoryview(data)
        written = 0
        try:
            while written < len(data):
                written += os.write(self._fd, view[written:])
            return True
        except OSError as error:
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, segment.size)  # no half line left behind
            self._disk_failed(error)
            return False

    def _seal(self, segment: _Segment) -> None:
        segment.sealed = True
        if segment.path is not None and self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None

    def _disk_failed(self, error: OSError) -> None:
        message = f"{self.directory}: {error.strerror or error}"
        if message != self.disk_error:
            log.error("influx buffer: cannot write %s; holding up to %d MiB of points in memory instead "
                      "(fix the directory, free space or set influx.buffer_dir)",
                      message, self.memory_max_bytes // 2**20)
        self.disk_error = message

    def _enforce_bounds(self) -> None:
        while len(self._segments) > 1 and sum(s.pending_bytes for s in self._segments) > self.max_bytes:
            self._drop(self._segments[0])
        while True:
            in_memory = [s for s in self._segments if s.path is None]
            if len(in_memory) < 2 or sum(s.pending_bytes for s in in_memory) <= self.memory_max_bytes:
                break
            self._drop(in_memory[0])

    def _drop(self, segment: _Segment) -> None:
        lost = segment.pending_lines
        inflight = self._inflight
        if inflight is not None and inflight.seq == segment.seq:
            lost -= inflight.lines  # being sent right now: counted as written or rejected by the sender
        self.dropped += max(lost, 0)
        log.warning("influx buffer full (%d MiB): dropped the oldest %d points", self.max_bytes // 2**20, lost)
        self._remove(segment)

    def _remove(self, segment: _Segment) -> None:
        if segment is self._segments[-1] and not segment.sealed:
            self._seal(segment)
        self._segments.remove(segment)
        if self._read_fd is not None and self._read_fd[0] == segment.seq:
            with contextlib.suppress(OSError):
                os.close(self._read_fd[1])
            self._read_fd = None
        if segment.path is not None:
            with contextlib.suppress(OSError):
                segment.path.unlink()

    # -- reading -------------------------------------------------------------------------------
    def peek(self, max_lines: int) -> Batch | None:
        """Up to `max_lines` of the oldest unsent lines (one segment at a time), or None."""
        with self._lock:
            while self._segments:
                segment = self._segments[0]
                if segment.pending_bytes > 0:
                    break
                if not segment.sealed:
                    return None
                self._remove(segment)
                self._save_cursor()
            else:
                return None
            chunk = self._read(segment, min(segment.pending_bytes, MAX_READ))
            end, lines = _whole_lines(chunk, max_lines)
            if lines == 0:
                return None
            batch = Batch(segment.seq, segment.offset, segment.offset + end, lines, chunk[:end])
            self._inflight = batch
            return batch

    def _read(self, segment: _Segment, length: int) -> bytes:
        if segment.path is None:
            return bytes(segment.data[segment.offset:segment.offset + length])
        if self._read_fd is None or self._read_fd[0] != segment.seq:
            if self._read_fd is not None:
                with contextlib.suppress(OSError):
                    os.close(self._read_fd[1])
            self._read_fd = (segment.seq, os.open(segment.path, os.O_RDONLY))
        return os.pread(self._read_fd[1], length, segment.offset)

    def commit(self, batch: Batch) -> None:
        """The batch reached the server (or was rejected for good): remove it from the buffer."""
        with self._lock:
            self._inflight = None
            segment = next((s for s in self._segments if s.seq == batch.seq), None)
            if segment is None or segment.offset != batch.start:
                return  # dropped for space while it was in flight
            if segment.path is None:  # free memory as it goes (a memory segment's offset stays 0)
                del segment.data[:batch.end - batch.start]
                segment.size -= batch.end - batch.start
                segment.lines -= batch.lines
            else:
                segment.offset, segment.sent_lines = batch.end, segment.sent_lines + batch.lines
            if segment.pending_bytes == 0 and segment.sealed:
                self._remove(segment)
            self._save_cursor()

    def release(self) -> None:
        """The in-flight batch was not written: it stays for the next try."""
        with self._lock:
            self._inflight = None

    # -- persistence ---------------------------------------------------------------------------
    def _save_cursor(self) -> None:
        if self.directory is None or self.disk_error is not None:
            return
        first = next((s for s in self._segments if s.path is not None), None)
        text = f"{first.seq} {first.offset} {first.sent_lines}\n" if first else ""
        partial = self.directory / (CURSOR + ".tmp")
        try:
            partial.write_text(text)
            partial.replace(self.directory / CURSOR)
        except OSError as error:
            log.debug("influx buffer: cannot save the cursor: %s", error)

    def _recover(self) -> None:
        """Pick up the segments a previous run left, resuming from its cursor."""
        assert self.directory is not None
        paths = sorted(p for p in self.directory.glob("*" + SUFFIX) if p.stem.isdigit())
        cursor = _read_cursor(self.directory / CURSOR)
        for path in paths:
            seq = int(path.stem)
            data = path.read_bytes()
            whole = data.rfind(b"\n") + 1
            if whole < len(data):  # a crash mid-append: drop the partial line
                with open(path, "r+b") as handle:
                    handle.truncate(whole)
            segment = _Segment(seq, path, size=whole, lines=data.count(b"\n", 0, whole), sealed=True)
            if cursor is not None and cursor[0] == seq and cursor[1] <= whole:
                segment.offset, segment.sent_lines = cursor[1], cursor[2]
            elif cursor is not None and seq < cursor[0]:
                path.unlink()  # fully sent before the restart
                continue
            if segment.pending_bytes == 0:
                path.unlink()
                continue
            self._segments.append(segment)
            self._next_seq = max(self._next_seq, seq + 1)
        if self._segments:
            log.info("influx buffer: %d points from before the restart wait in %s",
                     sum(s.pending_lines for s in self._segments), self.directory)
        self._enforce_bounds()

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                with contextlib.suppress(OSError):
                    os.close(self._fd)
                self._fd = None
            if self._read_fd is not None:
                with contextlib.suppress(OSError):
                    os.close(self._read_fd[1])
                self._read_fd = None
            for segment in self._segments:
                segment.sealed = True
            self._save_cursor()


def _whole_lines(chunk: bytes, max_lines: int) -> tuple[int, int]:
    """(bytes, lines) of the first `max_lines` complete lines in `chunk`."""
    end = lines = 0
    while lines < max_lines:
        newline = chunk.find(b"\n", end)
        if newline < 0:
            break
        end, lines = newline + 1, lines + 1
    return end, lines


def _read_cursor(path: Path) -> tuple[int, int, int] | None:
    try:
        fields = path.read_text().split()
        seq, offset, sent = (int(x) for x in fields)
    except (OSError, ValueError):
        return None
    return seq, offset, sent

"""Stops a program's servers when the program dies without stopping them (SIGKILL, a crash, the
OOM killer): the servers are Debian's binaries, which cannot watch their parent themselves.

process.py starts one watchdog per program, in its own session (a terminal's hang-up or Ctrl-C
does not reach it), reading a pipe whose only writer is the program. The program writes
"+ PID START_TIME" for every server it starts and "- PID" when it stops one. When the pipe closes
(the program is gone, however it ended) the watchdog SIGTERMs the process group of every server
still registered, SIGKILLs what is left after a grace period, and exits. START_TIME guards
against killing a process that reused a dead server's pid.

Run as a script (`python watchdog.py GRACE_SECONDS`, the pipe on stdin) so it does not import
the flopwatch package: it starts in a few milliseconds and needs only psutil.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time

try:
    import psutil
except ImportError:  # pragma: no cover - psutil is a dependency; without it, pids are trusted
    psutil = None


def started_at(pid: int) -> float | None:
    """The process's start time (psutil's create_time), None when it is gone."""
    if psutil is None:
        return 0.0
    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return None


def still_ours(pid: int, start: float) -> bool:
    now = started_at(pid)
    return now is not None and (psutil is None or abs(now - start) < 0.5)


def read_registrations(stream) -> dict[int, float]:
    """Registered servers (pid -> start time) once `stream` reaches end of file."""
    servers: dict[int, float] = {}
    for line in stream:
        parts = line.split()
        with contextlib.suppress(ValueError, IndexError):
            if parts[0] == "+":
                servers[int(parts[1])] = float(parts[2])
            elif parts[0] == "-":
                servers.pop(int(parts[1]), None)
    return servers


def stop_groups(servers: dict[int, float], grace: float) -> None:
    """SIGTERM each server's process group, SIGKILL the groups still there after `grace` seconds."""
    alive = {pid: start for pid, start in servers.items() if still_ours(pid, start)}
    for pid in alive:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while alive and time.monotonic() < deadline:
        time.sleep(0.1)
        alive = {pid: start for pid, start in alive.items() if still_ours(pid, start) and not _zombie(pid)}
    for pid in alive:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)


def _zombie(pid: int) -> bool:
    if psutil is None:
        return False
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.Error:
        return True


def main(argv: list[str]) -> int:
    for signum in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
        signal.signal(signum, signal.SIG_IGN)  # only the pipe's closing ends a watchdog
    grace = float(argv[1]) if len(argv) > 1 else 10.0
    stop_groups(read_registrations(sys.stdin), grace)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

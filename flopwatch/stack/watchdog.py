"""Stops a program's servers when the program dies without stopping them (SIGKILL, a crash, the
OOM killer): the servers are Debian's binaries, which cannot watch their parent themselves.

process.py starts one watchdog per program, in its own session (a terminal's hang-up or Ctrl-C
does not reach it), reading a pipe whose only writer is the program. The program writes
"? TIME WORKDIR" before it starts a server, "+ PID START_TIME WORKDIR" once it has, and "- PID"
when it stops one. When the pipe closes (the program is gone, however it ended) the watchdog
SIGTERMs the process group of every server still registered, SIGKILLs what is left after a
grace period, and exits. START_TIME guards against killing a process that reused a dead
server's pid. A program killed between starting a server and registering its pid leaves only
the "?" line: the watchdog then stops the processes started since TIME whose working directory
is WORKDIR (each server runs in its own).

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


def read_registrations(stream) -> tuple[dict[int, float], dict[str, float]]:
    """Once `stream` reaches end of file: the registered servers (pid -> start time) and the
    servers announced but never registered (workdir -> when they were about to start)."""
    servers: dict[int, float] = {}
    expected: dict[str, float] = {}
    for line in stream:
        parts = line.rstrip("\n").split(" ", 3 if line.startswith("+") else 2)
        with contextlib.suppress(ValueError, IndexError):
            if parts[0] == "?":
                expected[parts[2]] = float(parts[1])
            elif parts[0] == "+":
                servers[int(parts[1])] = float(parts[2])
                expected.pop(parts[3] if len(parts) > 3 else "", None)
            elif parts[0] == "-":
                servers.pop(int(parts[1]), None)
    return servers, expected


def started_in(expected: dict[str, float]) -> dict[int, float]:
    """Processes (pid -> start time) whose working directory is one of `expected`'s and which
    started after it was announced there: the servers whose pids never reached the pipe."""
    if psutil is None or not expected:
        return {}
    found: dict[int, float] = {}
    for process in psutil.process_iter(["cwd", "create_time"]):
        cwd, start = process.info["cwd"], process.info["create_time"]
        # create_time counts from a boot time rounded down to the second: up to 1 s early
        if cwd in expected and start is not None and start >= expected[cwd] - 1.0:
            found[process.pid] = start
    return found


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
    servers, expected = read_registrations(sys.stdin)
    stop_groups({**started_in(expected), **servers}, grace)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

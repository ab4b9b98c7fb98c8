"""The server watchdog (flopwatch/stack/watchdog.py) run as the program runs it: a script reading
a pipe. Real processes (`sleep`) stand in for servers; no server is needed to show which it stops."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil

from flopwatch.stack import watchdog

SCRIPT = Path(watchdog.__file__)


def test_registrations_pair_announcements_with_pids_and_keep_spaces_in_paths():
    stream = io.StringIO("? 100.5 /tmp/a b\n+ 41 101.000 /tmp/a b\n? 102 /tmp/c\n+ 42 103 /tmp/d\n- 42\n"
                         "garbage\n+ x y\n")
    servers, expected = watchdog.read_registrations(stream)
    assert servers == {41: 101.0}
    assert expected == {"/tmp/c": 102.0}    # /tmp/a b was registered; /tmp/c never was


def sleeper(cwd: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(["sleep", "300"], cwd=cwd, start_new_session=True)


def gone(proc: subprocess.Popen[bytes], timeout: float) -> bool:
    try:
        proc.wait(timeout)
        return True
    except subprocess.TimeoutExpired:
        return False


def test_a_server_announced_but_never_registered_is_stopped_when_the_program_dies(tmp_path):
    """The program died between starting a server and sending its pid: the announcement of its
    working directory is enough. Processes started there before the announcement, or elsewhere,
    are left alone."""
    (tmp_path / "server dir").mkdir()
    (tmp_path / "other").mkdir()
    earlier = sleeper(tmp_path / "server dir")
    time.sleep(2.5)     # well before the announcement (psutil's start times may read up to 1 s early)
    read_end, write_end = os.pipe()
    dog = subprocess.Popen([sys.executable, str(SCRIPT), "2"], stdin=read_end, start_new_session=True)
    os.close(read_end)
    server = other = None
    try:
        with os.fdopen(write_end, "w") as pipe:
            pipe.write(f"? {time.time():.3f} {(tmp_path / 'server dir').resolve()}\n")
            pipe.flush()
            server, other = sleeper(tmp_path / "server dir"), sleeper(tmp_path / "other")
            psutil.Process(server.pid).cwd()    # it runs before the pipe closes
        assert dog.wait(30) == 0
        assert gone(server, 10), "the announced server outlived its program"
        assert not gone(earlier, 0.5) and not gone(other, 0.5)
    finally:
        for proc in (earlier, server, other, dog):
            if proc is not None:
                proc.kill()
                proc.wait()


def test_a_registered_server_is_stopped_and_an_unregistered_one_is_not(tmp_path):
    read_end, write_end = os.pipe()
    dog = subprocess.Popen([sys.executable, str(SCRIPT), "2"], stdin=read_end, start_new_session=True)
    os.close(read_end)
    kept, stopped = sleeper(tmp_path), sleeper(tmp_path)
    try:
        with os.fdopen(write_end, "w") as pipe:
            for proc in (kept, stopped):
                start = psutil.Process(proc.pid).create_time()
                pipe.write(f"+ {proc.pid} {start:.3f} {tmp_path.resolve()}\n")
            pipe.write(f"- {kept.pid}\n")
        assert dog.wait(30) == 0
        assert gone(stopped, 10)
        assert not gone(kept, 0.5)
    finally:
        for proc in (kept, stopped, dog):
            proc.kill()
            proc.wait()

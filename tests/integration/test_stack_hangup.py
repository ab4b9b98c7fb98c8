"""Servers started through flopwatch.stack do not outlive their program: a hang-up (the terminal
closed) stops them as Ctrl-C does, and after a SIGKILL the program's watchdog stops them.

Each program under test resets SIGHUP (and SIGINT) to their defaults first: a test runner started
under nohup, or in the background by a non-interactive shell, passes them on ignored, and the
programs must see what they would see in a terminal.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

pytestmark = pytest.mark.integration

RESET = ("import signal; signal.signal(signal.SIGHUP, signal.SIG_DFL); "
         "signal.signal(signal.SIGINT, signal.default_int_handler)")
DEMO = textwrap.dedent(f"""
    {RESET}
    import sys
    from flopwatch.cli import main
    sys.exit(main(["demo", "--duration", "0", "--nodes", "2", "--inject-after", "-1"]))
""")
PLAIN = textwrap.dedent(f"""
    {RESET}
    import time
    from flopwatch.stack import Alertmanager, Prometheus
    with Alertmanager({{"route": {{"receiver": "null"}}, "receivers": [{{"name": "null"}}]}}):
        with Prometheus():
            print("ready", flush=True)
            time.sleep(300)
""")
SERVERS = {"prometheus", "prometheus-alertmanager"}


def servers_of(pid: int, log: Path, timeout: float = 60) -> list[psutil.Process]:
    """The program's Prometheus and Alertmanager processes once both run (and its watchdog)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            children = psutil.Process(pid).children(recursive=True)
            names = {child.name() for child in children}
        except psutil.Error:
            children, names = [], set()
        if names >= SERVERS and any("watchdog" in " ".join(_cmdline(c)) for c in children):
            return children
        time.sleep(0.2)
    pytest.fail(f"the program never ran both servers and a watchdog; it printed:\n{log.read_text()[-3000:]}")


def _cmdline(process: psutil.Process) -> list[str]:
    try:
        return process.cmdline()
    except psutil.Error:
        return []


def running(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def wait_gone(processes: list[psutil.Process], timeout: float) -> list[str]:
    """Poll until none runs or `timeout` passes; the names of those still running."""
    deadline = time.monotonic() + timeout
    left = [p for p in processes if running(p)]
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = [p for p in left if running(p)]
    return [f"{p.pid} {' '.join(_cmdline(p))[:120]}" for p in left]


def start(script: str, tmp_path: Path) -> tuple[subprocess.Popen[bytes], Path]:
    log = tmp_path / "program.log"
    with log.open("wb") as out:
        program = subprocess.Popen([sys.executable, "-c", script], stdout=out, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL)
    return program, log


@pytest.mark.parametrize("script", [DEMO, PLAIN], ids=["demo", "program"])
def test_hang_up_stops_every_server(script, tmp_path):
    program, log = start(script, tmp_path)
    try:
        servers = servers_of(program.pid, log)
        program.send_signal(signal.SIGHUP)
        try:
            code = program.wait(45)  # a graceful stop gives each server 10 s before SIGKILL
        except subprocess.TimeoutExpired:
            pytest.fail(f"the hung-up program did not exit within 45 s; it printed:\n{log.read_text()[-3000:]}")
        assert code != -signal.SIGHUP, "the hang-up killed the program before it could clean up"
        # the program stopped them itself before exiting; allow the kernel a moment to reap them
        assert wait_gone(servers, 10) == []
    finally:
        program.kill()


@pytest.mark.parametrize("script", [DEMO, PLAIN], ids=["demo", "program"])
def test_servers_of_a_sigkilled_program_stop_within_a_minute(script, tmp_path):
    program, log = start(script, tmp_path)
    try:
        servers = servers_of(program.pid, log)
        program.kill()
        program.wait(10)
        left = wait_gone(servers, 60)
        assert left == [], f"still running a minute after the SIGKILL: {left}"
    finally:
        program.kill()

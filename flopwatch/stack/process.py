"""Starting, waiting for and stopping one server process, with nothing left behind."""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Self

import psutil

log = logging.getLogger(__name__)

_LIVE: set[ServerProcess] = set()
_LIVE_LOCK = threading.Lock()
#: Seconds a server gets to exit on SIGTERM before SIGKILL (stop() and the watchdog alike).
STOP_GRACE_S = 10.0


class ServerError(RuntimeError):
    """A server failed to start or become ready; the message includes the tail of its log."""


class MissingBinary(ServerError):
    """The server's binary is not installed; the message names the Debian package."""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago on `host` (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def require_binary(binary: str, package: str) -> str:
    path = shutil.which(binary)
    if path is None:
        raise MissingBinary(
            f"{binary} not found: install the Debian package '{package}' "
            f"(apt-get install {package}, or run `make test`/`make demo`, which install it)"
        )
    return path


class Watchdog:
    """This program's watchdog process (watchdog.py): it stops the registered servers when the
    program dies without stopping them. One per program, started with its first server; a
    forked child gets its own."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pid: int | None = None       # the program that owns the pipe
        self._pipe: object | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    def _ensure(self) -> None:
        if self._pid == os.getpid() and self._proc is not None and self._proc.poll() is None:
            return
        read_end, write_end = os.pipe()   # neither end is inherited by the servers (close_fds)
        try:
            self._proc = subprocess.Popen(
                [sys.executable, str(Path(__file__).with_name("watchdog.py")), f"{STOP_GRACE_S:g}"],
                stdin=read_end, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        finally:
            os.close(read_end)
        self._pipe = os.fdopen(write_end, "w", buffering=1)
        self._pid = os.getpid()

    def _send(self, line: str) -> None:
        with self._lock:
            try:
                self._ensure()
                self._pipe.write(line + "\n")  # type: ignore[union-attr]
            except OSError as error:  # no watchdog: stop() and atexit still clean up
                log.warning("server watchdog unavailable (%s): a SIGKILLed program would leave servers", error)

    def expect(self, workdir: Path) -> None:
        """Announce a server about to start in `workdir`, so one started just before the program
        dies (its pid not yet sent) is still found there."""
        self._send(f"? {time.time():.3f} {workdir.resolve()}")

    def watch(self, proc: subprocess.Popen[bytes], workdir: Path) -> None:
        try:
            start = psutil.Process(proc.pid).create_time()
        except psutil.Error:
            return  # already gone
        self._send(f"+ {proc.pid} {start:.3f} {workdir.resolve()}")

    def forget(self, pid: int) -> None:
        if self._pid == os.getpid():
            self._send(f"- {pid}")


_WATCHDOG = Watchdog()


def _on_hangup(signum: int, frame: object) -> None:
    """SIGHUP (the terminal closed) unwinds like Ctrl-C, so context managers, finally blocks and
    atexit stop the servers."""
    raise SystemExit(128 + signum)


def _catch_hangup() -> None:
    """Turn a hang-up into an orderly exit, unless the program chose otherwise (a handler of its
    own, or SIGHUP ignored under nohup: then the program is meant to outlive the terminal)."""
    if threading.current_thread() is not threading.main_thread():
        return
    with contextlib.suppress(ValueError, OSError):
        if signal.getsignal(signal.SIGHUP) == signal.SIG_DFL:
            signal.signal(signal.SIGHUP, _on_hangup)


class ServerProcess:
    """A server on 127.0.0.1:`port` with its own temporary directory and log file."""

    binary = ""
    package = ""
    ready_path = "/"

    def __init__(self, port: int | None = None, workdir: Path | None = None, *,
                 extra_args: Sequence[str] = ()) -> None:
        self.host = "127.0.0.1"
        self.extra_args = list(extra_args)      # appended to the server's own arguments
        self.port = port or free_port()
        self._own_dir = workdir is None
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix=f"flopwatch-{Path(self.binary).name}-"))
        self.log_path = self.workdir / "server.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def args(self) -> list[str]:
        raise NotImplementedError

    def command(self) -> list[str]:
        """The program to run (before args()); a missing binary names its Debian package."""
        return [require_binary(self.binary, self.package)]

    def prepare(self) -> None:
        """Write config files into workdir before the process starts."""

    def environment(self) -> dict[str, str] | None:
        """The process's environment (None: this program's own)."""
        return None

    # -- lifecycle -------------------------------------------------------------------------------
    def start(self, timeout: float = 30.0) -> Self:
        command = self.command()
        self.prepare()
        _WATCHDOG.expect(self.workdir)
        with open(self.log_path, "ab") as log_file:
            self.proc = subprocess.Popen(
                [*command, *self.args()], cwd=self.workdir, stdout=log_file, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True, env=self.environment(),
            )
        with _LIVE_LOCK:
            _LIVE.add(self)
        _WATCHDOG.watch(self.proc, self.workdir)
        _catch_hangup()
        try:
            self.wait_ready(timeout)
        except BaseException:
            self.stop()
            raise
        log.debug("%s ready at %s", self.binary, self.url)
        return self

    def wait_ready(self, timeout: float) -> None:
        self.wait_until(self._answers_ready, timeout, f" at {self.url}{self.ready_path}")

    def wait_until(self, ready: Callable[[], bool], timeout: float, where: str = "") -> None:
        """Poll `ready()` until it holds; a ServerError with the log's tail if the process exits
        first or `timeout` passes."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise ServerError(f"{self.binary} exited with code {self.proc.returncode} while "
                                  f"starting:\n{self.log_tail()}")
            if ready():
                return
            time.sleep(0.05)
        raise ServerError(f"{self.binary} not ready{where} after {timeout:g}s:\n{self.log_tail()}")

    def _answers_ready(self) -> bool:
        """The ready path answers 200, from our own process."""
        try:
            with urllib.request.urlopen(self.url + self.ready_path, timeout=2) as answer:
                return answer.status == 200 and self._owns_port()
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
            return False

    def _owns_port(self) -> bool:
        """True when our process (not another that won a race for the port) listens on it."""
        if self.proc is None:
            return False
        try:
            sockets = psutil.Process(self.proc.pid).net_connections(kind="tcp")
        except psutil.Error:
            return True  # cannot tell (no permission): trust the answer
        return any(conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == self.port
                   for conn in sockets)

    def log_tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout: float = STOP_GRACE_S) -> None:
        """SIGTERM the process group, SIGKILL it after `timeout`; remove our temporary directory."""
        proc = self.proc
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        if proc is not None:
            _WATCHDOG.forget(proc.pid)
        with _LIVE_LOCK:
            _LIVE.discard(self)
        if self._own_dir and os.environ.get("FLOPWATCH_KEEP_STACK_DIRS") != "1":
            shutil.rmtree(self.workdir, ignore_errors=True)

    def kill(self) -> None:
        """Stop abruptly (SIGKILL), keeping the data directory: for outage tests."""
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def restart(self, timeout: float = 30.0) -> Self:
        """Start again on the same port and directory (after stop(keep)/kill)."""
        if self.running():
            self.kill()
        own, self._own_dir = self._own_dir, False
        try:
            return self.start(timeout)
        finally:
            self._own_dir = own

    def __enter__(self) -> Self:
        return self.start() if self.proc is None else self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def stop_all() -> None:
    """Stop every server this process started (atexit, signal handlers, test teardown)."""
    with _LIVE_LOCK:
        servers = list(_LIVE)
    for server in servers:
        with contextlib.suppress(Exception):
            server.stop()


atexit.register(stop_all)

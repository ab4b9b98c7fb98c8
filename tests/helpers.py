"""Helpers the tests share (import as `from helpers import ...`; tests/ is on the path).

`wait_for` is the one way a test waits for something another thread or process does: it polls
(briefly at first, then backing off to half a second, so a quick condition costs little and a
slow server is not hammered) and fails the test naming what never happened."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TypeVar

import pytest

T = TypeVar("T")


def wait_for(predicate: Callable[[], T], timeout: float = 5.0, what: str = "the condition") -> T:
    """The first truthy value of `predicate()` within `timeout` seconds; AssertionError after."""
    deadline = time.monotonic() + timeout
    pause = 0.02
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(min(pause, max(0.0, deadline - time.monotonic())))
        pause = min(pause * 1.5, 0.5)


def usage_error(main: Callable[[], object], argv: list[str], monkeypatch: pytest.MonkeyPatch,
                capsys: pytest.CaptureFixture[str]) -> str:
    """The last stderr line of a command-line `main()` refusing `argv`, after checking that it
    exits with code 2 and shows no traceback."""
    monkeypatch.setattr(sys, "argv", ["prog", *argv])
    with pytest.raises(SystemExit) as stopped:
        main()
    assert stopped.value.code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert "Traceback" not in last
    return last


def program(name: str, release: str | None = None) -> str:
    """The path of a server program (flopwatch.stack.releases.PROGRAMS) in `release`, or a failed
    test naming the Debian package or the build that provides it (never a skip)."""
    from flopwatch.stack import MissingBinary, releases

    try:
        return releases.binary(name, release)
    except MissingBinary as error:
        pytest.fail(str(error))

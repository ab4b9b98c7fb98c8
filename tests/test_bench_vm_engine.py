"""bench/vm_engine.py's last queries ask again while VictoriaMetrics answers 503 (busy) and give up
on anything else. The seam: a stand-in client and a stand-in sleep (no server is needed to answer
503; the real engine runs in tests/integration/test_bench_engines.py)."""

from __future__ import annotations

import pytest

from bench import vm_engine
from flopwatch.promql import PromError


class _Busy:
    def __init__(self, errors: list[int], value: float) -> None:
        self.errors, self.value, self.asked = list(errors), value, 0

    def scalar(self, expr: str) -> float:
        self.asked += 1
        if self.errors:
            status = self.errors.pop(0)
            raise PromError(f"http://127.0.0.1:1: HTTP {status} for 'up': ", status=status)
        return self.value


@pytest.fixture
def pauses(monkeypatch) -> list[float]:
    slept: list[float] = []
    monkeypatch.setattr(vm_engine.time, "sleep", slept.append)
    return slept


def test_a_busy_server_is_asked_again_until_it_answers(pauses):
    client = _Busy([503, 503], 7.0)
    assert vm_engine._answered(client, "up") == 7.0
    assert client.asked == 3
    assert pauses == [5.0, 10.0]


def test_other_errors_and_a_server_that_stays_busy_are_raised(pauses):
    with pytest.raises(PromError, match="HTTP 400"):
        vm_engine._answered(_Busy([400], 1.0), "up")
    client = _Busy([503] * 3, 1.0)
    with pytest.raises(PromError, match="HTTP 503"):
        vm_engine._answered(client, "up", attempts=3)
    assert client.asked == 3

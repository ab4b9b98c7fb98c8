"""Lost progress as the agent sees it: the steps of a job's ranks that redo iterations a rank had
reached before (a restart from an older checkpoint, in a new process or in place).

Each datagram carries a rank's running totals and the iteration of its last step, so its new steps
are the iterations (iteration - new steps, iteration]; those at or below the rank's highest iteration
so far (its mark) are replays, and their step seconds count in proportion. Counting here, as the
datagrams arrive, sees a replay of a few seconds that no rule evaluated every 15 s or more could
catch between two of its reads of the iteration gauge. The marks live as long as the job does on
this agent; across the agent's own restarts the rules' one-day high-water mark takes over.
"""

from __future__ import annotations

from flopwatch.train import wire

_STEP_SECONDS = wire.I_STEP_SECONDS - wire.I_TOTALS   # offset into a datagram's totals


class JobReplays:
    """One job's marks per rank and its replayed steps and seconds (counters: they never go back)."""

    __slots__ = ("marks", "seconds", "steps")

    def __init__(self) -> None:
        self.marks: dict[int, int] = {}
        self.steps = 0
        self.seconds = 0.0

    def observe(self, rank: int, iteration: int, last_iteration: int | None, bits: tuple[int, ...],
                last_bits: tuple[int, ...]) -> None:
        """Account a rank's datagram: `bits` its totals (wire.totals_bits), `last_bits` those of the
        rank's datagram before in the same process (empty after a restart), `last_iteration` that
        datagram's iteration. The common case (a rank past its mark, moving on) costs two compares."""
        mark = self.marks.get(rank)
        self.marks[rank] = iteration if mark is None or iteration > mark else mark
        if mark is None or (iteration > mark and last_bits and last_iteration is not None
                            and last_iteration >= mark):
            return
        new_steps = bits[0] - (last_bits[0] if last_bits else 0)
        replayed = min(new_steps, mark - (iteration - new_steps))
        if replayed <= 0:
            return
        seconds = wire.totals_of(bits)[_STEP_SECONDS]
        if last_bits:
            seconds -= wire.totals_of(last_bits)[_STEP_SECONDS]
        self.steps += replayed
        self.seconds += seconds * replayed / new_steps

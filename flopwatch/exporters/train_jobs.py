"""One training job as the agent's intake keeps it: its ranks' claims, its replays, and the sums over
its ranks on this node (the step-time histogram, phase and checkpoint seconds).

Apart from train_intake (which imports this module, never the reverse) so that the rules that keep
those sums counters live in one place: a rank whose totals go away (its process restarted, or it
went quiet while the job goes on) is retired into the job's vector and stays in the sums, and a
rank that went quiet and then reports again from the same process, its totals going on from where
they were, is taken back out so that it is not counted twice.
"""

from __future__ import annotations

import operator

from flopwatch.exporters.train_replays import JobReplays
from flopwatch.train import wire

_T = wire.I_TOTALS
_BUCKETS, _TOKENS, _STEP_SECONDS = wire.I_BUCKETS - _T, wire.I_TOKENS - _T, wire.I_STEP_SECONDS - _T
#: A job's sums, what `summed` takes of a rank's totals: the step-time bucket counts, then step
#: seconds, checkpoint save and restore seconds and the phase seconds (wire.PHASES order), which
#: end a rank's totals in that order.
S_BUCKETS = slice(0, wire.N_BUCKETS)
S_STEP_SECONDS = wire.N_BUCKETS
S_CHECKPOINT = S_STEP_SECONDS + 1                 # then one per wire.CHECKPOINT_KINDS (save, restore)
S_PHASES = S_CHECKPOINT + len(wire.CHECKPOINT_KINDS)
WIDTH = S_PHASES + len(wire.PHASES)
_WIRE_TAIL = tuple(i - wire.I_STEP_SECONDS for i in (wire.I_SAVE, wire.I_RESTORE, wire.I_PHASES, wire.I_END_TOTALS))
_OUR_TAIL = tuple(i - S_STEP_SECONDS for i in (S_CHECKPOINT, S_CHECKPOINT + 1, S_PHASES, WIDTH))
if _WIRE_TAIL != _OUR_TAIL:
    raise ImportError("train_jobs: the wire's totals no longer end in step, checkpoint and phase seconds")

_add, _sub, _ge = operator.add, operator.sub, operator.ge


def summed(totals: tuple | list) -> tuple | list:
    """The part of a rank's totals (wire.totals_of) that its job sums, in the S_ layout (or of a
    list in the order of the totals, such as their columns over ranks)."""
    return totals[_BUCKETS:_TOKENS] + totals[_STEP_SECONDS:]


class Job:
    """A job with ranks on this node: dropped, sums and all, with its last rank."""

    __slots__ = ("claims", "expired", "exported", "name", "ranks", "replays", "retired")

    def __init__(self, name: str) -> None:
        self.name = name
        self.ranks = 0
        # (stage, dp rank, tp rank) -> the rank on this node that claims it.
        self.claims: dict[tuple[int, int, int], int] = {}
        # The summed totals of ranks that restarted or went quiet while the job went on.
        self.retired: list[int | float] = [0] * wire.N_BUCKETS + [0.0] * (WIDTH - wire.N_BUCKETS)
        # rank -> (instance, totals bits packed) of each rank retired by going quiet, at most one
        # per rank: what to take back out should it report again from that process.
        self.expired: dict[int, tuple[int, bytes]] = {}
        self.exported: list[int | float] = list(self.retired)   # the sums `sums` last gave
        self.replays = JobReplays()          # steps that redo iterations (lost progress)

    def retire(self, bits: tuple[int, ...]) -> None:
        """Keep a rank's totals (wire.totals_bits; empty: none yet) in the sums when they go away."""
        if bits:
            self.retired = list(map(_add, self.retired, summed(wire.totals_of(bits))))

    def expire(self, rank: int, instance: int, bits: tuple[int, ...], limit: int) -> None:
        """A rank went quiet while the job goes on: retire its totals and remember them, keeping
        at most `limit` ranks (the oldest goes first and stays retired for good)."""
        if not bits:
            return
        self.retire(bits)
        self.expired.pop(rank, None)
        while len(self.expired) >= limit > 0:
            del self.expired[next(iter(self.expired))]
        if limit > 0:
            self.expired[rank] = (instance, wire.TOTALS_BITS.pack(*bits))

    def readmit(self, rank: int, instance: int, bits: tuple[int, ...]) -> None:
        """A rank's first accepted totals since it was admitted again (or restarted). One that went
        quiet and reports from the same process, its totals no lower than when it went, has them
        counted again as its own: take them back out of the retired ones. From a new process (or
        with totals that went back) they were another run's and stay retired."""
        entry = self.expired.pop(rank, None)
        if entry is None or entry[0] != instance:
            return
        old = wire.TOTALS_BITS.unpack(entry[1])
        if all(map(_ge, bits, old)):
            self.retired = list(map(_sub, self.retired, summed(wire.totals_of(old))))

    def sums(self, totals: list[tuple]) -> tuple[int | float, ...]:
        """The sums to export: the retired ones plus those of `totals` (wire.totals_of of each of the
        job's live ranks), never below the last ones.

        Exactly they never go back, but floating-point sums depend on the order of their terms,
        which expiries and returns change; a counter one ulp lower reads as a reset to Prometheus.
        """
        columns = summed(list(zip(*totals, strict=True)))           # each a total over the ranks
        self.exported = list(map(max, map(sum, columns, self.retired), self.exported))
        return tuple(self.exported)

"""bench/prometheus_profile.py: the pprof reader and the split of Prometheus's CPU into rules, GC,
scraping and the rest. The profiles are written here in profile.proto's wire format (the format Go's
net/http/pprof serves), with stacks whose parts are known."""

from __future__ import annotations

import gzip

import pytest

from bench import prometheus_profile
from bench.prometheus_profile import parse_profile, part_of, split_cpu, totals
from flopwatch.detect.remote_write import varint as _varint
from tests.helpers import usage_error


def _field(number: int, value: int | bytes) -> bytes:
    if isinstance(value, int):
        return _varint(number << 3) + _varint(value)
    return _varint(number << 3 | 2) + _varint(len(value)) + value


def _packed(values: list[int]) -> bytes:
    return b"".join(_varint(v) for v in values)


def _profile(types: list[str], stacks: list[tuple[list[str], list[int]]], packed: bool = True) -> bytes:
    """A gzipped profile.proto message: one location and function per distinct name."""
    strings = ["", *types]
    names = sorted({name for stack, _ in stacks for name in stack})
    strings += names
    index = {name: strings.index(name) for name in names}
    body = b"".join(_field(1, _field(1, strings.index(t)) + _field(2, 0)) for t in types)
    for stack, values in stacks:
        ids = [names.index(name) + 1 for name in stack]
        if packed:
            body += _field(2, _field(1, _packed(ids)) + _field(2, _packed(values)))
        else:
            body += _field(2, b"".join(_field(1, i) for i in ids) + b"".join(_field(2, v) for v in values))
    for number, name in enumerate(names, start=1):
        body += _field(4, _field(1, number) + _field(4, _field(1, number) + _field(2, 7)))
        body += _field(5, _field(1, number) + _field(2, index[name]))
    body += b"".join(_field(6, s.encode()) for s in strings)
    return gzip.compress(body)


RULE = ["promql.(*evaluator).eval", "github.com/prometheus/prometheus/rules.(*Group).Eval", "runtime.goexit"]
GC = ["runtime.scanobject", "runtime.gcBgMarkWorker", "runtime.goexit"]
SCRAPE = ["textparse.(*PromParser).Next", "github.com/prometheus/prometheus/scrape.(*scrapeLoop).run"]
OTHER = ["tsdb.(*DB).Compact", "runtime.goexit"]


@pytest.mark.parametrize("packed", [True, False], ids=["packed", "unpacked"])
def test_cpu_samples_are_summed_by_what_their_stack_does(packed: bool) -> None:
    raw = _profile(["samples", "cpu"], [(RULE, [3, 3_000_000_000]), (GC, [2, 2_000_000_000]),
                                        (RULE, [1, 1_000_000_000]), (SCRAPE, [1, 500_000_000]),
                                        (OTHER, [1, 250_000_000])], packed)
    profile = parse_profile(raw)
    assert profile.sample_types == ["samples", "cpu"]
    assert totals(profile, "cpu") == {"rules": 4_000_000_000, "gc": 2_000_000_000,
                                      "scrape": 500_000_000, "other": 250_000_000}


def test_an_allocation_inside_rule_evaluation_is_the_rules_even_when_gc_assists_it() -> None:
    assert part_of(["runtime.gcAssistAlloc", "runtime.mallocgc", *RULE]) == "rules"
    assert part_of(GC) == "gc"
    assert part_of(OTHER) == "other"


def test_background_gc_is_shared_out_by_bytes_allocated() -> None:
    cpu = parse_profile(_profile(["samples", "cpu"], [(RULE, [1, 10_000_000_000]), (GC, [1, 6_000_000_000]),
                                                      (SCRAPE, [1, 2_000_000_000])]))
    allocs = parse_profile(_profile(["alloc_objects", "alloc_space", "inuse_objects", "inuse_space"],
                                    [(RULE, [9, 900, 0, 0]), (SCRAPE, [1, 100, 0, 0])]))
    cores = split_cpu(cpu, allocs, seconds=20)
    assert cores["rules"] == pytest.approx(0.5)
    assert cores["gc"] == pytest.approx(0.3)
    assert cores["rules_gc"] == pytest.approx(0.27)
    assert cores["scrape_gc"] == pytest.approx(0.03)
    assert cores["rule_cpu"] == pytest.approx(0.77)
    assert cores["total"] == pytest.approx(0.9)


def test_a_profile_without_the_wanted_samples_is_refused_by_name() -> None:
    profile = parse_profile(_profile(["samples", "cpu"], [(RULE, [1, 1])]))
    with pytest.raises(ValueError, match="no 'alloc_space' samples"):
        totals(profile, "alloc_space")


def test_bad_arguments_exit_2_with_one_line(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                                            tmp_path) -> None:
    assert "no rule files" in usage_error(prometheus_profile.main, ["--rules", str(tmp_path)], monkeypatch, capsys)
    assert "--seconds at least 10" in usage_error(prometheus_profile.main, ["--seconds", "2"], monkeypatch, capsys)

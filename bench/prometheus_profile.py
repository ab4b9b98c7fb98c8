"""Where Prometheus's CPU goes with the FlopWatch rules: rule evaluation, the garbage collection
the rules' allocations cause, scraping and the rest, from Prometheus's own Go profiles.

    .venv/bin/python -m bench.prometheus_profile --nodes 125 --history 240 --seconds 120 --json out.json

A simulated fleet (bench/scale_prometheus.py's, `--nodes` of 8 GPUs) is scraped by a real
Prometheus running the rule files of `--rules` (default alerts/) for `--history` seconds; then its
CPU profile and its allocation profile are taken over the same `--seconds` (`/debug/pprof/profile`
and `/debug/pprof/allocs?seconds=`, both served by every Prometheus). Each CPU sample is put
under what its stack shows it doing:

- `rules`: inside a rule group's evaluation (the query engine, the storage reads, appending the
  records), garbage-collection assists charged to it included;
- `gc`: the runtime's background mark workers, which no request owns;
- `scrape`: the scrape loops (fetching, parsing, appending the samples);
- `other`: the rest (compaction, the WAL, the HTTP API).

The background GC is shared out by the bytes each part allocated in the same seconds (`rules_gc`
is the rules' share), since a Go collector's work grows with what is allocated. The rules' CPU is
`rules + rules_gc`, read from one run: no scrape-only window to subtract, so it does not depend
on the load in two different minutes. Figures are cores; `*_per_1000_gpus` divide by the fleet.

`go tool pprof` (Debian's golang-go) reads the saved profiles (`--save DIR`) function by function.
Prometheus inherits this process's environment, so `GOGC=200 python -m bench.prometheus_profile`
measures it under another garbage-collection target (its resident memory is reported too).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil

from bench.fleet_prometheus import scraped_fleet
from bench.rule_samples import rule_files
from bench.scale_prometheus import bench_scenario, uptime

ROOT = Path(__file__).resolve().parents[1]
#: What a stack does, by the first of these function names it holds (checked in this order).
PARTS = (("rules", "prometheus/rules.(*Group).Eval"),
         ("gc", "runtime.gcBgMarkWorker"),
         ("scrape", "prometheus/scrape.(*scrapeLoop)"))


def _varint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, at
        shift += 7


def _fields(data: bytes) -> Iterator[tuple[int, int | bytes]]:
    """(field number, value) of one protobuf message: an int for varints, bytes for the rest."""
    at = 0
    while at < len(data):
        key, at = _varint(data, at)
        number, kind = key >> 3, key & 7
        if kind == 0:
            value, at = _varint(data, at)
            yield number, value
        elif kind == 2:
            size, at = _varint(data, at)
            yield number, data[at:at + size]
            at += size
        elif kind == 1:
            yield number, int.from_bytes(data[at:at + 8], "little")
            at += 8
        elif kind == 5:
            yield number, int.from_bytes(data[at:at + 4], "little")
            at += 4
        else:
            raise ValueError(f"not a pprof profile: protobuf wire type {kind}")


def _ints(value: int | bytes) -> list[int]:
    """A repeated integer field's values, packed or not (int64s come back as unsigned)."""
    if isinstance(value, int):
        return [value]
    out, at = [], 0
    while at < len(value):
        number, at = _varint(value, at)
        out.append(number)
    return out


@dataclass
class Profile:
    """The parts of a pprof profile (profile.proto) this benchmark reads."""
    sample_types: list[str]
    samples: list[tuple[list[int], list[int]]]   # (location ids, leaf first; values)
    location_functions: dict[int, list[str]]     # location id -> function names, inlined first

    def stack(self, locations: list[int]) -> list[str]:
        return [name for location in locations for name in self.location_functions.get(location, [])]


def parse_profile(raw: bytes) -> Profile:
    """A pprof profile from its bytes (gzipped, as Go serves it, or not)."""
    data = gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw
    strings: list[str] = []
    type_ids: list[int] = []
    samples: list[tuple[list[int], list[int]]] = []
    locations: dict[int, list[int]] = {}
    functions: dict[int, int] = {}
    for number, value in _fields(data):
        if number == 6:
            strings.append(bytes(value).decode("utf-8", "replace"))
        elif number == 1:
            type_ids.append(next((v for n, v in _fields(value) if n == 1), 0))
        elif number == 2:
            ids: list[int] = []
            values: list[int] = []
            for field, item in _fields(value):
                if field == 1:
                    ids += _ints(item)
                elif field == 2:
                    values += _ints(item)
            samples.append((ids, values))
        elif number == 4:
            location_id, function_ids = 0, []
            for field, item in _fields(value):
                if field == 1:
                    location_id = item
                elif field == 4:
                    function_ids += [v for n, v in _fields(item) if n == 1]
            locations[location_id] = function_ids
        elif number == 5:
            fields = dict(_fields(value))
            functions[fields.get(1, 0)] = fields.get(2, 0)
    return Profile([strings[i] for i in type_ids], samples,
                   {location: [strings[functions.get(f, 0)] for f in ids] for location, ids in locations.items()})


def part_of(stack: list[str]) -> str:
    """What a stack is doing (PARTS), else `other`."""
    for part, marker in PARTS:
        if any(marker in name for name in stack):
            return part
    return "other"


def totals(profile: Profile, sample_type: str) -> Counter[str]:
    """The values of `sample_type` summed by part."""
    if sample_type not in profile.sample_types:
        raise ValueError(f"the profile has no {sample_type!r} samples (it has {', '.join(profile.sample_types)})")
    column = profile.sample_types.index(sample_type)
    out: Counter[str] = Counter()
    for locations, values in profile.samples:
        out[part_of(profile.stack(locations))] += values[column]
    return out


def split_cpu(cpu: Profile, allocs: Profile, seconds: float) -> dict[str, float]:
    """Cores per part over `seconds`, and the background GC shared out by bytes allocated."""
    nanoseconds = totals(cpu, "cpu")
    cores = {part: nanoseconds.get(part, 0) / 1e9 / seconds for part in ("rules", "gc", "scrape", "other")}
    allocated = totals(allocs, "alloc_space")
    owned = sum(allocated.get(part, 0) for part in ("rules", "scrape", "other"))
    for part in ("rules", "scrape", "other"):
        share = allocated.get(part, 0) / owned if owned else 0.0
        cores[f"{part}_alloc_share"] = share
        cores[f"{part}_gc"] = cores["gc"] * share
    cores["total"] = sum(cores[part] for part in ("rules", "gc", "scrape", "other"))
    cores["rule_cpu"] = cores["rules"] + cores["rules_gc"]
    return cores


def _fetch(url: str, timeout: float) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as answer:
        return answer.read()


def profiles(url: str, seconds: int) -> tuple[bytes, bytes]:
    """Prometheus's CPU profile and allocation delta over the same `seconds`."""
    out: dict[str, bytes] = {}
    allocs = threading.Thread(target=lambda: out.__setitem__(
        "allocs", _fetch(f"{url}/debug/pprof/allocs?seconds={seconds}", seconds + 120)))
    allocs.start()
    cpu = _fetch(f"{url}/debug/pprof/profile?seconds={seconds}", seconds + 120)
    allocs.join()
    return cpu, out["allocs"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=125, help="simulated nodes of 8 GPUs (default 125)")
    parser.add_argument("--history", type=float, default=240.0,
                        help="seconds of scrapes and evaluations before profiling (default 240)")
    parser.add_argument("--seconds", type=int, default=120, help="seconds profiled (default 120)")
    parser.add_argument("--rules", type=Path, default=ROOT / "alerts", help="the rules Prometheus runs")
    parser.add_argument("--save", type=Path, metavar="DIR", help="also keep the two profiles here")
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args()
    if not rule_files(args.rules):
        parser.error(f"no rule files (flopwatch-*.yml) in {args.rules}: give a folder like alerts/")
    if args.nodes < 1 or args.history < 0 or args.seconds < 10:
        parser.error("--nodes must be at least 1, --history at least 0 and --seconds at least 10")
    scenario = bench_scenario(args.nodes)
    gpus = args.nodes * scenario.fleet.gpus_per_node
    with scraped_fleet(scenario, rule_files=rule_files(args.rules), self_scrape=False) as scraped:
        print(f"{gpus} GPUs scraped; {args.history:g} s of history (load {uptime()})", file=sys.stderr)
        time.sleep(args.history)
        load_before = uptime()
        print(f"profiling {args.seconds} s (load {load_before})", file=sys.stderr)
        cpu_raw, allocs_raw = profiles(scraped.prometheus.url, args.seconds)
        rss = psutil.Process(scraped.prometheus.proc.pid).memory_info().rss if scraped.prometheus.proc else 0
    if args.save:
        args.save.mkdir(parents=True, exist_ok=True)
        (args.save / "cpu.pb.gz").write_bytes(cpu_raw)
        (args.save / "allocs.pb.gz").write_bytes(allocs_raw)
    cores = split_cpu(parse_profile(cpu_raw), parse_profile(allocs_raw), args.seconds)
    report = {"gpus": gpus, "seconds": args.seconds, "history_s": args.history, "load_before": load_before,
              "load_after": uptime(), "gogc": os.environ.get("GOGC", "100 (Go's default)"),
              "prometheus_rss_bytes": rss, "cores": cores,
              "per_1000_gpus": {key: value * 1000 / gpus for key, value in cores.items() if "share" not in key}}
    print(f"Prometheus over {args.seconds} s, {gpus} GPUs (load {load_before} -> {report['load_after']}): cores")
    for key in ("total", "rules", "gc", "rules_gc", "scrape", "other", "rule_cpu"):
        print(f"  {key:9} {cores[key]:.4f}   ({cores[key] * 1000 / gpus:.4f} per 1,000 GPUs)")
    print(f"  rules allocated {cores['rules_alloc_share']:.1%} of the bytes; Prometheus RSS {rss / 2**30:.2f} GiB"
          f" (GOGC {report['gogc']})")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()

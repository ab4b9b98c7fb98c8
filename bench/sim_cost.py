"""What the fleet simulator costs per second of simulated time, so a scale benchmark measures
Prometheus and not the simulator (target: 10,000 GPUs in at most 0.3 of a core).

    .venv/bin/python -m bench.sim_cost --nodes 125,1250 --ticks 12 --serve-seconds 60 --json out.json
    .venv/bin/python -m bench.sim_cost --nodes 1250 --serve-seconds 0 --against /tmp/old-checkout

`ticks`: one fleet (bench/sim_capacity.py's: a 1,024-GPU job per 128 nodes) advanced in 5 s ticks;
after each, every node rendered twice: by its simulator agent (flopwatch/sim/gpu_collector.py's
fast GPU collector) and by a reference agent with the plain GpuCollector, which reads every GPU
every cycle (the simulator's path before the fast collector). CPU is this thread's (time.thread_time),
taken in turns in the same run, so both see the same load; figures are core-seconds per simulated
second and the reference's over the simulator's.

`against`: with `--against DIR`, the same fleet ticked by another checkout's simulator (an older
commit, unpacked with `git archive`) and by this one, each in a fresh process running its own
FleetServer.tick, in turns; the figure is the other's CPU over this one's (best run of each), and
`same_expositions` says whether both served the same bytes on every measured tick (the agents'
timing of themselves aside): a change meant only to make the simulator cheaper must leave it true,
and then the detection suite's inputs did not change.

`floor`: what any Python renderer of these expositions would pay at least. After the ticks, each
node's exposition is turned into one `%` template with every sample value a `%r` slot; then every
node is formatted from its template and its values alone (nothing collected, nothing compared),
CPU per simulated second, beside the ticks' own in the same process; and the share of sample
values that the measured ticks left unchanged (at least that share is unchanged from one tick to the
next; a renderer that kept those in its text would format only the rest).

`serve`: the fleet ticking in real time behind its HTTP server while a scraper in another process
fetches every node every interval over keep-alive connections (as Prometheus does); this process's
CPU (ticks + serving) per wall second, from psutil. The scraper's own CPU is not counted.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

from bench.sim_capacity import cpu_seconds, fleet_scenario, report
from flopwatch.sim.fleet import Fleet
from flopwatch.sim.node import SimNodeAgent
from flopwatch.sim.serve import FleetServer

INTERVAL_S = 5.0
#: The scraper process: every path every interval, one keep-alive connection per worker thread.
SCRAPER = """
import http.client, sys, threading, time
host, port, nodes = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
interval, seconds = float(sys.argv[4]), float(sys.argv[5])
def worker(paths):
    conn = http.client.HTTPConnection(host, port, timeout=30)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        started = time.monotonic()
        for path in paths:
            conn.request("GET", path)
            conn.getresponse().read()
        time.sleep(max(0.0, interval - (time.monotonic() - started)))
paths = [f"/node/{i}/metrics" for i in range(nodes)]
threads = [threading.Thread(target=worker, args=(paths[k::8],)) for k in range(8)]
for t in threads: t.start()
for t in threads: t.join()
"""


#: One run of a tree's own FleetServer.tick (advance + render every node): CPU per simulated second,
#: and a digest of every exposition of every measured tick but the agent's timing of itself (the
#: fleet starts at a fixed time, so two trees that render the same bytes give the same digest).
TICKS = """
import hashlib, json, sys, time
from bench.sim_capacity import fleet_scenario
from flopwatch.sim.fleet import Fleet
from flopwatch.sim.serve import FleetServer
nodes, ticks = int(sys.argv[1]), int(sys.argv[2])
timing = (b"flopwatch_collector_duration_seconds", b"flopwatch_collector_last_success_timestamp_seconds")
server = FleetServer(Fleet(fleet_scenario(nodes), start_unix=1.7e9))
server.render_all()
for _ in range(2):
    server.tick(5.0)
spent, digest = 0.0, hashlib.sha256()
for _ in range(ticks):
    started = time.thread_time()
    server.tick(5.0)
    spent += time.thread_time() - started
    for body in server.expositions + server.dcgm_expositions:
        digest.update(b"\\n".join(line for line in body.split(b"\\n") if not line.startswith(timing)) + b"\\0")
print(json.dumps({"cores": spent / (ticks * 5.0), "digest": digest.hexdigest()}))
"""


def against_tree(nodes: int, ticks: int, tree: Path, rounds: int = 2) -> dict[str, float | str | bool]:
    """This tree's simulator against another checkout's (e.g. `git archive` of an older commit), each
    running its own FleetServer.tick in a fresh process, in turns (A B A B ...) under the same load;
    `same_expositions`: whether both rendered the same bytes on every measured tick (their own
    timing aside), which a change meant only to make the simulator cheaper must keep."""
    spent: dict[str, list[float]] = {"this": [], "other": []}
    digests: dict[str, set[str]] = {"this": set(), "other": set()}
    load0 = os.getloadavg()[0]
    for _ in range(rounds):
        for name, root in (("other", tree), ("this", Path(__file__).resolve().parents[1])):
            done = subprocess.run([sys.executable, "-c", TICKS, str(nodes), str(ticks)], cwd=root, check=True,
                                  capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(root)})
            run = json.loads(done.stdout.strip().splitlines()[-1])
            spent[name].append(run["cores"])
            digests[name].add(run["digest"])
    this, other = min(spent["this"]), min(spent["other"])
    return {"nodes": nodes, "ticks_per_run": ticks, "runs_each": rounds, "other_tree": str(tree),
            "sim_cores": round(this, 4), "other_tree_sim_cores": round(other, 4),
            "other_over_this": round(other / this, 2),
            "same_expositions": len(digests["this"] | digests["other"]) == 1,
            "load_average_1m_at_start": round(load0, 2), "load_average_1m_at_end": round(os.getloadavg()[0], 2)}


def tick_cost(nodes: int, ticks: int) -> dict[str, float]:
    """Advance and render CPU per simulated second, the simulator's agents against the reference's."""
    fleet = Fleet(fleet_scenario(nodes), start_unix=time.time())
    fast = [SimNodeAgent(fleet, node) for node in fleet.nodes]
    plain = [SimNodeAgent(fleet, node, reference=True) for node in fleet.nodes]
    spent = {"advance": 0.0, "render": 0.0, "reference_render": 0.0}
    load0 = os.getloadavg()[0]
    for tick in range(ticks + 2):   # two ticks to warm up: every series exists, templates cached
        measured = {}
        started = time.thread_time()
        fleet.advance(INTERVAL_S)
        measured["advance"] = time.thread_time() - started
        order = (("render", fast), ("reference_render", plain)) if tick % 2 else \
            (("reference_render", plain), ("render", fast))
        for name, agents in order:
            started = time.thread_time()
            for agent in agents:
                agent.render()
            measured[name] = time.thread_time() - started
        if tick >= 2:
            for name, seconds in measured.items():
                spent[name] += seconds
    simulated = ticks * INTERVAL_S
    mine = (spent["advance"] + spent["render"]) / simulated
    theirs = (spent["advance"] + spent["reference_render"]) / simulated
    return {"nodes": nodes, "gpus": nodes * fleet.scenario.fleet.gpus_per_node, "ticks": ticks,
            "advance_cores": _figure(spent["advance"] / simulated),
            "render_cores": _figure(spent["render"] / simulated),
            "reference_render_cores": _figure(spent["reference_render"] / simulated),
            "sim_cores": _figure(mine), "reference_sim_cores": _figure(theirs),
            "reference_over_sim": round(theirs / mine, 2),
            "sim_ms_per_node_tick": _figure(1e3 * mine * INTERVAL_S / nodes),
            "load_average_1m_at_start": round(load0, 2), "load_average_1m_at_end": round(os.getloadavg()[0], 2)}


#: A sample line of the text format: everything up to the value, and the value (no timestamps here).
_SAMPLE = re.compile(rb"^([^#\n][^\n]* )(\S+)$", re.M)


def value_template(exposition: bytes) -> tuple[str, tuple[float, ...]]:
    """The exposition as one `%` template with a `%r` slot per sample value, and those values."""
    values: list[float] = []

    def slot(match: re.Match[bytes]) -> bytes:
        values.append(float(match.group(2)))
        return match.group(1) + b"%r"

    return _SAMPLE.sub(slot, exposition.replace(b"%", b"%%")).decode(), tuple(values)


def _samples(exposition: bytes) -> dict[bytes, bytes]:
    """Each series (its line up to the value) and its value's text."""
    return {match.group(1): match.group(2) for match in _SAMPLE.finditer(exposition)}


def format_floor(nodes: int, ticks: int) -> dict[str, float]:
    """Formatting every node from its template and values alone, against the ticks, per simulated second."""
    server = FleetServer(Fleet(fleet_scenario(nodes), start_unix=time.time()))
    server.render_all()
    for _ in range(2):   # warm: templates cached (a small fleet's job may not be training yet)
        server.tick(INTERVAL_S)
    bodies = list(server.expositions)
    templates = [value_template(body) for body in bodies]
    pairs_of_bodies = zip(templates, bodies, strict=True)
    if any((text % values).encode() != body for (text, values), body in pairs_of_bodies):
        raise SystemExit("floor: a template did not give back its exposition byte for byte")
    started = time.thread_time()
    for _ in range(ticks):
        for text, values in templates:
            (text % values).encode()
    floor = (time.thread_time() - started) / (ticks * INTERVAL_S)
    started = time.thread_time()
    for _ in range(ticks):
        server.tick(INTERVAL_S)
    tick = (time.thread_time() - started) / (ticks * INTERVAL_S)
    before = [_samples(body) for body in bodies]
    now = [_samples(body) for body in server.expositions]
    pairs = [(old[key], new[key]) for old, new in zip(before, now, strict=True) for key in old.keys() & new.keys()]
    return {"nodes": nodes, "ticks": ticks, "format_floor_cores": _figure(floor), "tick_cores": _figure(tick),
            "tick_over_floor": round(tick / floor, 2),
            "values_unchanged_after_ticks_share": round(sum(a == b for a, b in pairs) / max(1, len(pairs)), 3),
            "series_compared": len(pairs),
            "load_average_1m_at_end": round(os.getloadavg()[0], 2)}


def _figure(value: float) -> float:
    """Four significant digits: a small fleet's cores are thousandths."""
    return float(f"{value:.4g}")


def serve_cost(nodes: int, seconds: float) -> dict[str, float]:
    """This process's CPU per wall second while the fleet ticks every 5 s and every node is scraped."""
    server = FleetServer(Fleet(fleet_scenario(nodes), start_unix=time.time()))
    host, port = server.start()
    stop = threading.Event()
    ticker = threading.Thread(target=server.run, args=(0, stop, INTERVAL_S), daemon=True)
    ticker.start()
    me = psutil.Process()
    scraper = subprocess.Popen([sys.executable, "-c", SCRAPER, host, str(port), str(nodes), str(INTERVAL_S),
                                str(seconds + 2 * INTERVAL_S)])
    try:
        time.sleep(2 * INTERVAL_S)   # the first round of scrapes and ticks
        load0, cpu0, wall0, ticks0 = os.getloadavg()[0], cpu_seconds(me), time.monotonic(), server.ticks
        served0 = server.http.responses[200]
        time.sleep(seconds)
        wall, cpu = time.monotonic() - wall0, cpu_seconds(me) - cpu0
        served = server.http.responses[200] - served0
        ticks = list(server.tick_seconds)[-(server.ticks - ticks0):] if server.ticks > ticks0 else [0.0]
    finally:
        stop.set()
        scraper.wait(timeout=seconds + 60)
        ticker.join(30)
        server.stop()
    return {"nodes": nodes, "window_s": round(wall, 1), "scrapes_per_s": round(served / wall, 1),
            "sim_cores_with_serving": round(cpu / wall, 4), "tick_mean_s": round(sum(ticks) / len(ticks), 3),
            "tick_max_s": round(max(ticks), 3), "load_average_1m_at_start": round(load0, 2),
            "load_average_1m_at_end": round(os.getloadavg()[0], 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="125,1250", help="fleet sizes, comma-separated (default 125,1250)")
    parser.add_argument("--ticks", type=int, default=12, help="measured 5 s ticks per size (default 12)")
    parser.add_argument("--serve-seconds", type=float, default=60,
                        help="seconds of real-time serving at the largest size (0: skip)")
    parser.add_argument("--floor", action="store_true",
                        help="also measure the formatting floor at the largest size (see `floor` above)")
    parser.add_argument("--against", metavar="DIR", type=Path,
                        help="also time another checkout's simulator at the largest size, in turns with this one "
                        "(e.g. `git archive <commit> | tar -x -C DIR`)")
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args()
    if args.against is not None and not (args.against / "flopwatch" / "sim" / "serve.py").is_file():
        parser.error(f"--against: {args.against} holds no flopwatch/sim/serve.py; give a checkout of this repository")
    try:
        sizes = [int(size) for size in args.nodes.split(",") if size.strip()]
    except ValueError:
        parser.error(f"--nodes: expected node counts separated by commas, got {args.nodes!r}")
    if not sizes or min(sizes) < 1:
        parser.error("--nodes: give at least one fleet size of 1 node or more")
    results: dict[str, dict[str, float]] = {}
    for size in sizes:
        print(f"ticks at {size} nodes ...", file=sys.stderr)
        results[f"ticks_{size}"] = tick_cost(size, args.ticks)
    if args.floor:
        print(f"formatting floor at {max(sizes)} nodes ...", file=sys.stderr)
        results["floor"] = format_floor(max(sizes), args.ticks)
    if args.against is not None:
        print(f"{max(sizes)} nodes against {args.against} ...", file=sys.stderr)
        results["against"] = against_tree(max(sizes), args.ticks, args.against)
    if args.serve_seconds > 0:
        print(f"serving {max(sizes)} nodes for {args.serve_seconds:g} s ...", file=sys.stderr)
        results["serve"] = serve_cost(max(sizes), args.serve_seconds)
    report(results, args.json)  # type: ignore[arg-type]


if __name__ == "__main__":
    main()

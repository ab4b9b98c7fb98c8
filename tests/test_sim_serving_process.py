"""The simulator's expositions served from a child process (flopwatch/sim/serving_process.py):
every path answers what the ticking process rendered for that tick, the child's answers are
counted, a port in use is the bind's own error, and the child goes when told or when its parent
does. Real HTTP on loopback; the fleet is simulated."""

from __future__ import annotations

import errno
import socket
import urllib.error
import urllib.request

import psutil
import pytest

from flopwatch.sim.fleet import Fleet
from flopwatch.sim.scenario import parse
from flopwatch.sim.serve import FleetServer
from flopwatch.sim.serving_process import ServingProcess

MODEL = {"params": 1e9, "layers": 8, "heads": 8, "head_dim": 64, "seq_len": 1024}


def scenario(exporter: str) -> object:
    return parse({"name": "p", "duration": "20m", "seed": 3,
                  "fleet": {"nodes": 3, "gpus_per_node": 4, "nics_per_node": 1, "exporter": exporter},
                  "jobs": [{"id": "77", "nodes": "0-2", "tokens_per_step": 65536, "target_mfu": 0.4,
                            "model": MODEL}]})


def get(host: str, port: int, path: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(f"http://{host}:{port}{path}", timeout=10) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


@pytest.mark.parametrize("exporter", ["agent", "dcgm"])
def test_every_path_serves_the_bytes_the_ticking_process_rendered_for_the_latest_tick(exporter: str) -> None:
    server = FleetServer(Fleet(scenario(exporter), start_unix=1.7e9), separate_process=True)
    host, port = server.start()
    try:
        assert server.serving_pid is not None and server.serving_pid != psutil.Process().pid
        served = [get(host, port, target["labels"]["__metrics_path__"]) for target in server.targets()]
        assert served == [(200, body) for body in server.expositions + server.dcgm_expositions]
        before = list(server.expositions)
        server.tick(5.0)
        assert server.expositions != before   # the tick changed what the nodes show
        served = [get(host, port, target["labels"]["__metrics_path__"]) for target in server.targets()]
        assert served == [(200, body) for body in server.expositions + server.dcgm_expositions]
        assert len(served) == (3 if exporter == "agent" else 6)
        assert get(host, port, "/") == (200, b"FlopWatch simulator: 3 nodes at /node/<index>/metrics\n")
        assert get(host, port, "/node/3/metrics")[0] == 404
        assert get(host, port, "/node/0/dcgm/metrics")[0] == (404 if exporter == "agent" else 200)
        counted = server.responses()
        assert counted[200] == 2 * len(served) + 1 + (exporter == "dcgm")
        assert counted[404] == 1 + (exporter == "agent")
    finally:
        server.stop()


def test_the_child_answers_like_the_in_process_server() -> None:
    fleet = Fleet(scenario("dcgm"), start_unix=1.7e9)
    servers = FleetServer(fleet, separate_process=True), FleetServer(fleet)
    addresses = [server.start() for server in servers]
    try:
        paths = ["/", "/node/1/metrics", "/node/2/dcgm/metrics", "/node/9/metrics", "/node/x/metrics", "/nodes"]
        answers = [[get(host, port, path) for path in paths] for host, port in addresses]
        assert [status for status, _ in answers[0]] == [status for status, _ in answers[1]] == \
            [200, 200, 200, 404, 404, 404]
        for server, answer in zip(servers, answers, strict=True):   # each agent has its own self-metrics
            assert answer[1:3] == [(200, server.expositions[1]), (200, server.dcgm_expositions[2])]
        assert answers[0][:1] + answers[0][3:] == answers[1][:1] + answers[1][3:]
    finally:
        for server in servers:
            server.stop()


def test_a_port_in_use_is_the_binds_own_error_and_leaves_no_child() -> None:
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    try:
        serving = ServingProcess("127.0.0.1", taken.getsockname()[1])
        first = ServingProcess()   # multiprocessing's resource tracker starts with a first child, and stays
        first.start()
        first.stop()
        children = {child.pid for child in psutil.Process().children()}
        with pytest.raises(OSError) as raised:
            serving.start()
        assert raised.value.errno == errno.EADDRINUSE
        assert serving.pid is None
        assert {child.pid for child in psutil.Process().children()} <= children
    finally:
        taken.close()


def test_the_child_exits_when_stopped_and_when_its_parent_end_closes() -> None:
    stopped = ServingProcess()
    stopped.start()
    pid = stopped.pid
    assert pid is not None and psutil.pid_exists(pid)
    stopped.stop()
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert stopped.responses() == {}   # nothing to ask once stopped

    orphaned = ServingProcess()
    orphaned.start()
    process = orphaned._process
    assert process is not None and orphaned._conn is not None
    orphaned._conn.close()   # as when the parent dies: the socket pair closes
    process.join(10)
    assert process.exitcode == 0


def test_publishing_before_start_is_a_programming_error() -> None:
    with pytest.raises(RuntimeError, match="publish before start"):
        ServingProcess().publish([b"x"])

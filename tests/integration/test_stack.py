"""flopwatch.stack starts real servers and leaves nothing behind, in both releases it supports
(`server_release`: Debian's packages and the current upstream builds; the node exporter is Debian's
in both)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import urllib.request

import pytest
from helpers import wait_for

from flopwatch.promql import PromClient, PromError
from flopwatch.stack import Alertmanager, MissingBinary, NodeExporter, Prometheus, VictoriaMetrics, free_port, releases
from flopwatch.stack.process import ServerProcess

pytestmark = pytest.mark.integration

#: Debian bookworm's packages (the current release's versions are its pins, releases.version()).
DEBIAN_VERSIONS = {"prometheus": "2.42.0", "alertmanager": "0.25.0"}


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie still answers kill(0); look at its state
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def starts_ready_and_stops_cleanly(server: ServerProcess) -> None:
    with server:
        pid = server.proc.pid
        assert server.running()
        workdir = server.workdir
    assert not alive(pid)
    assert not workdir.exists()


@pytest.mark.parametrize("server_class", [Prometheus, VictoriaMetrics])
def test_servers_start_ready_and_stop_cleanly(server_class, server_release):
    starts_ready_and_stops_cleanly(server_class())


def test_alertmanager_starts_with_a_config_and_stops_cleanly(server_release):
    starts_ready_and_stops_cleanly(Alertmanager({"route": {"receiver": "null"}, "receivers": [{"name": "null"}]}))


def test_each_release_runs_its_own_build(server_release):
    """The matrix is real: the servers started under a release report that release's version."""
    def answer_of(url: str) -> dict:
        with urllib.request.urlopen(url, timeout=10) as answer:
            return json.load(answer)

    expected = {program: DEBIAN_VERSIONS[program] if server_release == "debian"
                else releases.version(program, server_release) for program in DEBIAN_VERSIONS}
    with Prometheus() as prom, Alertmanager({"route": {"receiver": "null"}, "receivers": [{"name": "null"}]}) as am:
        running = {"prometheus": answer_of(prom.url + "/api/v1/status/buildinfo")["data"]["version"],
                   "alertmanager": answer_of(am.url + "/api/v2/status")["versionInfo"]["version"]}
    assert {program: v.split("+")[0] for program, v in running.items()} == expected


def test_node_exporter_starts_ready_and_stops_cleanly():
    starts_ready_and_stops_cleanly(NodeExporter())


def test_prometheus_answers_queries_and_scrapes_itself(server_release):
    with Prometheus([{"job_name": "self", "static_configs": [{"targets": ["127.0.0.1:1"]}]}]) as prom:
        client = PromClient(prom.url)
        assert client.scalar("1 + 1") == 2
        with pytest.raises(PromError, match="parse error"):
            client.query("sum(")


def test_unreachable_prometheus_is_one_clear_error():
    with pytest.raises(PromError, match=r"cannot reach Prometheus at http://127\.0\.0\.1:"):
        PromClient(f"http://127.0.0.1:{free_port()}", timeout=2).query("up")


def test_missing_binary_names_the_debian_package():
    class Nothing(ServerProcess):
        binary = "flopwatch-no-such-server"
        package = "flopwatch-no-such-package"

    with pytest.raises(MissingBinary, match="install the Debian package 'flopwatch-no-such-package'"):
        Nothing().start()


def test_server_that_exits_early_reports_its_log(server_release):
    broken = Prometheus(extra_args=["--no-such-flag"])
    with pytest.raises(Exception, match="exited with code"):
        broken.start(timeout=10)
    assert not broken.running()


def test_ctrl_c_in_a_user_process_leaves_no_server(tmp_path, server_release):
    """A program using the stack is interrupted: its atexit/cleanup stops the servers."""
    pid_file = tmp_path / "pid"
    # Python leaves SIGINT ignored when it starts with it ignored (a runner launched in the
    # background by a non-interactive shell): the program turns Ctrl-C back into KeyboardInterrupt,
    # as it is in a terminal, so the test does not depend on how the test runner was started.
    script = textwrap.dedent(f"""
        import signal
        import time
        signal.signal(signal.SIGINT, signal.default_int_handler)
        from flopwatch.stack import Prometheus
        prom = Prometheus().start()
        open({str(pid_file)!r}, "w").write(str(prom.proc.pid))
        time.sleep(60)
    """)
    log = (tmp_path / "child.log").open("w+")
    child = subprocess.Popen([sys.executable, "-c", script], stdout=log, stderr=subprocess.STDOUT)
    wait_for(lambda: pid_file.exists() and pid_file.read_text(), 30, "the child to start Prometheus")
    server_pid = int(pid_file.read_text())
    assert alive(server_pid)
    child.send_signal(signal.SIGINT)
    # the cleanup gives Prometheus 10 s to exit on SIGTERM before SIGKILL; allow that twice over
    try:
        child.wait(45)
    except subprocess.TimeoutExpired:
        child.kill()
        log.seek(0)
        pytest.fail(f"the interrupted program did not exit within 45 s; it printed:\n{log.read()[-3000:]}")
    wait_for(lambda: not alive(server_pid), 10, "the child's Prometheus to exit")

"""The remediator's built-in health check through a node's agent, over HTTP on loopback.

Healthy: a real `flopwatch agent --backend sim` process (flopwatch.stack.AgentProcess) named
`localhost`, so `return.agent: http://{node}:<port>/metrics` reaches it as it would reach a node by
name. Faulty: the agent's sim backend has no switch to lose a GPU from the command line, so the
faulty node's /metrics is what the agent's own collectors render for a simulated node whose GPU 2
is lost (SimNodeAgent over a fleet with a gpu_lost fault), served by the agent's HTTP server class.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from flopwatch.exporters.http import HttpServer, Response
from flopwatch.remediate.journal import Journal
from flopwatch.remediate.service import Remediator, state_path
from flopwatch.remediate.settings import Settings, load
from flopwatch.sim.fleet import Fleet
from flopwatch.sim.node import SimNodeAgent
from flopwatch.sim.scenario import parse
from flopwatch.stack import free_port
from flopwatch.stack.agent import AgentProcess

pytestmark = pytest.mark.integration


class NoScheduler:
    """The health check never reaches the scheduler: any call fails the test."""

    name = "none"

    def __getattr__(self, attribute: str) -> object:
        raise AssertionError(f"the health check called the scheduler's {attribute}")


def remediator(tmp_path: Path, agent: str, command: str = "") -> Remediator:
    settings: Settings = load(None, {}, {"state_dir": str(tmp_path), "return.agent": agent,
                                         "return.health_check": command, "return.health_timeout": "10s"})
    return Remediator(settings, NoScheduler(), Journal(state_path(settings)))  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def agent() -> Iterator[AgentProcess]:
    with AgentProcess(node="localhost", gpus=4) as process:
        yield process


@pytest.fixture(scope="module")
def lost_gpu_node() -> Iterator[str]:
    """URL pattern of a server whose /<node>/metrics is node0001's agent exposition, GPU 2 lost."""
    fleet = Fleet(parse({
        "name": "lost", "seed": 1, "duration": "10m", "scrape_interval": "5s",
        "fleet": {"nodes": 2, "gpus_per_node": 4, "gpu_model": "H100-SXM", "nics_per_node": 1},
        "faults": [{"kind": "gpu_lost", "node": 1, "gpu": 2, "start": "5s", "duration": "5m"}],
    }), start_unix=1.7e9)
    renders = {node.name: SimNodeAgent(fleet, node, False) for node in fleet.nodes}
    while fleet.t < 30:
        fleet.advance(5.0)
    bodies = {f"/{name}/metrics": agent.render() for name, agent in renders.items()}
    server = HttpServer("127.0.0.1", 0, lambda path: Response(200, bodies[path]) if path in bodies
                        else Response(404, b"not found\n", "text/plain"))
    host, port = server.start()
    try:
        yield f"http://{host}:{port}/{{node}}/metrics"
    finally:
        server.stop()


def test_a_healthy_agent_passes(tmp_path: Path, agent: AgentProcess) -> None:
    assert remediator(tmp_path, f"http://{{node}}:{agent.port}/metrics").health_check("localhost") == (
        True, "4 GPU(s) up, no page-level XID")


def test_the_command_runs_too_and_both_must_pass(tmp_path: Path, agent: AgentProcess) -> None:
    pattern = f"http://{{node}}:{agent.port}/metrics"
    assert remediator(tmp_path, pattern, "true").health_check("localhost")[0] is True
    passed, why = remediator(tmp_path, pattern, "false {node}").health_check("localhost")
    assert not passed and "exited 1" in why


def test_a_node_whose_agent_reports_a_gpu_down_fails(tmp_path: Path, lost_gpu_node: str) -> None:
    check = remediator(tmp_path, lost_gpu_node)
    assert check.health_check("node0000")[0] is True      # the same server, the healthy node
    assert check.health_check("node0001") == (False, "GPU 2 down (flopwatch_gpu_up 0)")


def test_an_agent_that_does_not_answer_fails(tmp_path: Path) -> None:
    passed, why = remediator(tmp_path, f"http://{{node}}:{free_port()}/metrics").health_check("localhost")
    assert not passed and why.startswith("agent http://localhost:")


"""The agent health check's verdict (flopwatch/remediate/health.py) on expositions rendered by the
agent's own collectors over a simulated fleet (SimNodeAgent): a lost GPU and a held page-level XID
keep a node drained, a ticket-level XID does not; `return.agent` must name the node."""

from __future__ import annotations

import pytest

from flopwatch.config import ConfigError
from flopwatch.remediate.health import judge_exposition
from flopwatch.remediate.settings import load
from flopwatch.sim.fleet import Fleet
from flopwatch.sim.node import SimNodeAgent
from flopwatch.sim.scenario import parse


@pytest.fixture(scope="module")
def renders() -> dict[str, str]:
    """node name -> its agent's exposition 30 s in: node0000 healthy, node0001 GPU 2 lost,
    node0002 XID 48 on GPU 1 (a page code; the GPU still answers), node0003 XID 13 (a ticket)."""
    fleet = Fleet(parse({
        "name": "health", "seed": 1, "duration": "10m", "scrape_interval": "5s",
        "fleet": {"nodes": 4, "gpus_per_node": 4, "gpu_model": "H100-SXM", "nics_per_node": 1},
        "faults": [{"kind": "gpu_lost", "node": 1, "gpu": 2, "start": "5s", "duration": "5m"},
                   {"kind": "xid", "node": 2, "gpu": 1, "xid": 48, "start": "5s", "duration": "1m"},
                   {"kind": "xid", "node": 3, "gpu": 0, "xid": 13, "start": "5s", "duration": "1m"}],
    }), start_unix=1.7e9)
    agents = [SimNodeAgent(fleet, node, False) for node in fleet.nodes]
    while fleet.t < 30:
        fleet.advance(5.0)
    return {node.name: agent.render().decode() for node, agent in zip(fleet.nodes, agents, strict=True)}


def test_every_gpu_up_and_no_page_xid_passes(renders: dict[str, str]) -> None:
    assert judge_exposition(renders["node0000"], "node0000") == (True, "4 GPU(s) up, no page-level XID")


def test_a_ticket_level_xid_does_not_hold_the_node(renders: dict[str, str]) -> None:
    assert 'xid="13"' in renders["node0003"]
    assert judge_exposition(renders["node0003"], "node0003")[0] is True


def test_a_lost_gpu_fails(renders: dict[str, str]) -> None:
    assert judge_exposition(renders["node0001"], "node0001") == (False, "GPU 2 down (flopwatch_gpu_up 0)")


def test_a_held_page_level_xid_fails_while_every_gpu_answers(renders: dict[str, str]) -> None:
    passed, why = judge_exposition(renders["node0002"], "node0002")
    assert not passed and why == "page-level XID held since the agent started: GPU 1 XID 48"


def test_another_nodes_agent_fails(renders: dict[str, str]) -> None:
    passed, why = judge_exposition(renders["node0000"], "node0009")
    assert not passed and "reports node 'node0000', not 'node0009'" in why


@pytest.mark.parametrize(("text", "why"), [
    ("", "the agent reports no GPU"),
    ("flopwatch_build_info{version=\"1\"} 1\n", "the agent reports no GPU"),
    ("flopwatch_gpu_up{gpu=\"0\"} one\n", "does not parse"),
])
def test_an_answer_that_cannot_tell_fails(text: str, why: str) -> None:
    passed, said = judge_exposition(text, "n1")
    assert not passed and why in said


def test_the_agent_url_must_name_the_node() -> None:
    assert load(None, {}, {"return.agent": "http://{node}:9847/metrics"})["return.agent"] == \
        "http://{node}:9847/metrics"
    with pytest.raises(ConfigError, match=r"return\.agent: expected the node's agent"):
        load(None, {}, {"return.agent": "http://gpu01:9847/metrics"})

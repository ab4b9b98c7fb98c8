"""The built-in health check that lets a drained node return: its own FlopWatch agent's /metrics.

A node passes when the agent answers, reports at least one GPU, every GPU reports
`flopwatch_gpu_up 1`, and no GPU holds a page-level XID (a non-zero
`flopwatch_gpu_xid_errors_total` for a code flopwatch.xid rates `page`). The agent counts XIDs
since it started, so a page-level XID stays held until the agent restarts: after a reboot, or
after the GPU reset the runbook asks for and a restart of the agent. A check that cannot tell
(no answer, a body that does not parse, another node's agent) fails: the node stays drained.
"""

from __future__ import annotations

import urllib.error
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from flopwatch import xid
from flopwatch.catalog import gpu as g

PAGE_XIDS = frozenset(str(code) for code in xid.codes("page"))


def agent_url(pattern: str, node: str) -> str:
    return pattern.replace("{node}", node)


def check_agent(pattern: str, node: str, timeout: float) -> tuple[bool, str]:
    """(passed, why) for `node`, read from the agent at `pattern` with {node} replaced."""
    url = agent_url(pattern, node)
    try:
        with urllib.request.urlopen(url, timeout=timeout) as answer:
            text = answer.read().decode("utf-8", "replace")
    except (urllib.error.URLError, OSError, ValueError) as error:
        return False, f"agent {url}: {getattr(error, 'reason', error)}"
    return judge_exposition(text, node)


def judge_exposition(text: str, node: str) -> tuple[bool, str]:
    """(passed, why) from an agent's exposition: the pure half of `check_agent`."""
    up: dict[str, float] = {}
    held: list[str] = []
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                labels = sample.labels
                if sample.name in (g.UP.name, g.XID_ERRORS.name) and labels.get("node", node) != node:
                    return False, f"the agent there reports node {labels['node']!r}, not {node!r}"
                if sample.name == g.UP.name:
                    up[labels.get("gpu", "?")] = sample.value
                elif sample.name == g.XID_ERRORS.name and labels.get("xid") in PAGE_XIDS and sample.value > 0:
                    held.append(f"GPU {labels.get('gpu', '?')} XID {labels['xid']}")
    except ValueError as error:
        return False, f"the agent's /metrics does not parse: {error}"
    if not up:
        return False, f"the agent reports no GPU ({g.UP.name} absent)"
    down = sorted((gpu for gpu, value in up.items() if value != 1), key=_index)
    if down:
        return False, f"GPU {', '.join(down)} down ({g.UP.name} 0)"
    if held:
        return False, f"page-level XID held since the agent started: {', '.join(held)}"
    return True, f"{len(up)} GPU(s) up, no page-level XID"


def _index(gpu: str) -> tuple[int, str]:
    return (int(gpu), "") if gpu.isdigit() else (1 << 30, gpu)

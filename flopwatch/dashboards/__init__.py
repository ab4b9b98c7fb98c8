"""Grafana dashboards as code (grafana-foundation-sdk, Grafana 11.6 schema), one module per dashboard.

`flopwatch dashboards build` writes them to dashboards/<uid>.json (committed; a test fails when the
files and this code disagree) and `flopwatch dashboards push` uploads them to a Grafana.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import dashboard as dm

from flopwatch.dashboards import common, fabric, fleet, job, network, node, reliability

#: uid -> builder, in the order the dashboards are listed and pushed.
BUILDERS: dict[str, Callable[[str], dm.Dashboard]] = {
    fleet.UID: fleet.build,
    job.UID: job.build,
    node.UID: node.build,
    network.UID: network.build,
    fabric.UID: fabric.build,
    reliability.UID: reliability.build,
}


def build(uid: str, docs_url: str = common.DOCS_URL) -> dict[str, Any]:
    """One dashboard as the JSON object Grafana stores."""
    return json.loads(json.dumps(BUILDERS[uid](docs_url), cls=JSONEncoder))


def build_all(docs_url: str = common.DOCS_URL) -> dict[str, dict[str, Any]]:
    return {uid: build(uid, docs_url) for uid in BUILDERS}


def render(dashboard: dict[str, Any]) -> str:
    """Stable text for the committed files: sorted keys, two-space indent, final newline."""
    return json.dumps(dashboard, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def filename(uid: str) -> str:
    return f"{uid}.json"


def write_all(out_dir: str | Path, docs_url: str = common.DOCS_URL) -> list[Path]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for uid, dashboard in build_all(docs_url).items():
        path = out / filename(uid)
        path.write_text(render(dashboard), encoding="utf-8")
        written.append(path)
    return written


def stale_files(out_dir: str | Path, docs_url: str = common.DOCS_URL) -> list[str]:
    """Files in `out_dir` that differ from (or lack) what the code builds now."""
    out = Path(out_dir)
    stale = []
    for uid, dashboard in build_all(docs_url).items():
        path = out / filename(uid)
        if not path.is_file() or path.read_text(encoding="utf-8") != render(dashboard):
            stale.append(str(path))
    return stale


def expand(expr: str, values: dict[str, str]) -> str:
    """A panel query as Grafana sends it: `$name`/`${name}` replaced by the chosen values (a multi-value
    selection as a regex alternation like `(a|b)`, All as `.*`, $__rate_interval and $__range as
    durations such as `20s`); longest names first, so `$node` never eats `$node_x`."""
    for name in sorted(values, key=len, reverse=True):
        expr = expr.replace("${" + name + "}", values[name]).replace("$" + name, values[name])
    return expr


def panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel that shows data (rows left out, panels inside collapsed rows included)."""
    for panel in dashboard.get("panels", []):
        if panel.get("type") == "row":
            yield from panel.get("panels", [])
        else:
            yield panel

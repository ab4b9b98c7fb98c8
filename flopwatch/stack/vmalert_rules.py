"""Rule files vmalert starts on: vmalert refuses a whole file for one field it does not know
(Debian's 1.79: `keep_firing_for`, which 1.92 added; 1.79 and 1.151 alike: Prometheus's
`query_offset`) and names one problem per group per run of `-dryRun`. `vmalert_rules` repeats the
dry run on a copy of each file, takes out what vmalert names (the field, else the rule, else the
group) and reports every removal with vmalert's reason, so the benchmarks and the tests that run
the shipped rules through vmalert evaluate everything else and say what they left out. On the
current release the shipped files need no removal.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import yaml

from flopwatch.stack import releases

_PROBLEM = re.compile(r'invalid group "(?P<group>[^"]+)" in file "[^"]+": (?P<reason>.+)')
# a rule is named `rule "group"."name": ` by 1.79, `rule "name": ` by current releases
_RULE = re.compile(r'rule (?:"[^"]*"\.)?"(?P<rule>[^"]+)": ')
_UNKNOWN = re.compile(r'unknown fields in (?:rule|group(?: "[^"]*")?): (?P<fields>[\w, ]+)$')
_DRY_RUNS_MAX = 50


def dry_run(vmalert: str, path: Path) -> list[str]:
    """vmalert's complaints about one rule file, one a line (none when it would start on it)."""
    done = subprocess.run([vmalert, "-dryRun", f"-rule={path}", "-loggerLevel=ERROR"],
                          check=False, capture_output=True, text=True, timeout=60)
    text = done.stdout + done.stderr
    if "fatal" not in text and done.returncode == 0:
        return []
    problems = [match.group(0) for match in _PROBLEM.finditer(text)]
    return problems or [text.strip().rsplit("\t", 1)[-1] or f"exit code {done.returncode}"]


def _take_out(doc: dict[str, Any], complaint: str) -> dict[str, str]:
    """Remove from `doc` what vmalert complained of; what was removed and why."""
    match = _PROBLEM.search(complaint)
    group = next((g for g in doc["groups"] if match and g["name"] == match["group"]), None)
    if not match or group is None:
        doc["groups"] = []
        return {"group": "*", "rule": "*", "removed": "file", "reason": complaint}
    reason, rule, unknown = match["reason"].strip(), _RULE.search(match["reason"]), _UNKNOWN.search(match["reason"])
    target: dict[str, Any] | None = group
    if rule:
        target = next((r for r in group["rules"] if (r.get("alert") or r.get("record")) == rule["rule"]), None)
    if unknown and target is not None:
        fields = [field.strip() for field in unknown["fields"].split(",") if field.strip()]
        for field in fields:
            target.pop(field, None)
        removed = "field " + ", ".join(fields)
    elif rule and target is not None:
        group["rules"].remove(target)
        removed = "rule"
    else:
        doc["groups"].remove(group)
        removed = "group"
    return {"group": match["group"], "rule": rule["rule"] if rule else "*", "removed": removed, "reason": reason}


def vmalert_rules(rule_files: list[Path], workdir: Path) -> tuple[list[Path], list[dict[str, str]]]:
    """Copies of `rule_files` that vmalert starts on, and each removal (file, group, rule, what, why)."""
    vmalert = releases.binary("vmalert")
    workdir.mkdir(parents=True, exist_ok=True)
    out, removals = [], []
    for source in rule_files:
        copy = workdir / source.name
        copy.write_text(source.read_text())
        doc: dict[str, Any] | None = None
        for _ in range(_DRY_RUNS_MAX):
            complaints = dry_run(vmalert, copy)
            if not complaints:
                break
            doc = doc or yaml.safe_load(source.read_text())
            removals.extend({"file": source.name, **_take_out(doc, complaint)} for complaint in complaints)
            copy.write_text(yaml.safe_dump(doc, sort_keys=False))
        else:
            raise SystemExit(f"vmalert still rejects {source} after {_DRY_RUNS_MAX} removals; run "
                             f"`vmalert -dryRun -rule={copy}` to see why")
        if doc is None or doc["groups"]:
            out.append(copy)
    return out, removals

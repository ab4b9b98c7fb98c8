"""Shards judge ranks, the global tier judges jobs: the rule set of each tier of a topology
(docs/configuration.md, "Topology"), and the configs that wire the tiers together.

- The shard rule set is every rule file without the job-level alerts (JOB_ALERTS): stragglers,
  hardware, network and fabric pages come from the shard that holds the data and never depend on
  the global tier; the job records stay (the shard's straggler and fabric rules and local
  dashboards read them).
- The global rule set is the files and groups that compute job figures from sums (GLOBAL_FILES,
  GLOBAL_GROUPS) and templates/global/*.yml, with only the job-level alerts: each fires once per
  job, from vmalert over the global store, whichever shards hold the job's ranks.
- The shards forward by remote write exactly the series the global rules read and do not record
  themselves (`forwarded_names`), without the replica label, so the replicas of a shard write
  identical series for the global store to deduplicate.

Both rule sets are cut from the rendered rule files as text, so their comments stay: a rule starts
at its `- alert:` or `- record:` line (with the comment lines just above it at its indentation),
a group at its `- name:` line (likewise), and each runs to the next. A group left without rules is
dropped, and a file left without groups. Each cut is checked against the YAML it came from.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any
from urllib.parse import urlsplit

import yaml

from flopwatch.mixin import build, render
from flopwatch.mixin.config import MixinConfig
from flopwatch.mixin.scrape import Scrape
from flopwatch.mixin.topology import Topology
from flopwatch.report.queries import every_query

#: The job-level alerts: they fire once per job, from the global tier only.
JOB_ALERTS: frozenset[str] = frozenset({
    "FlopWatchJobMfuRegression", "FlopWatchTrainingStalled", "FlopWatchGoodputLow", "FlopWatchIdleAllocatedGpus",
    "FlopWatchCheckpointIntervalOff", "FlopWatchPipelineImbalance",
})
#: Rule files the global tier evaluates whole (their alerts other than JOB_ALERTS removed).
GLOBAL_FILES: frozenset[str] = frozenset({
    "flopwatch-mfu.yml", "flopwatch-goodput.yml", "flopwatch-jobs.yml", "flopwatch-interruptions.yml",
})
#: Rule file -> the groups of it the global tier evaluates.
GLOBAL_GROUPS: Mapping[str, frozenset[str]] = MappingProxyType({
    "flopwatch-stragglers.yml": frozenset({"flopwatch-pipeline"}),
})
#: Rule files among the rendered outputs (the glob deploy/prometheus.yml loads).
RULE_FILE = re.compile(r"^flopwatch-[^/]*\.yml$")
#: Remote write's queue, sized to catch up after an outage of the global tier: Prometheus retries a
#: failed batch (every 5 s at most) and keeps the samples in its WAL meanwhile (about 2 hours);
#: once the store answers, up to 50 shards of 5,000-sample batches drain that backlog (some 10^6
#: samples/s at 250 ms a batch, for a few thousand per second written), and a 429 is retried, not dropped.
QUEUE_CONFIG: Mapping[str, Any] = MappingProxyType({
    "capacity": 20000, "min_shards": 4, "max_shards": 50, "max_samples_per_send": 5000,
    "batch_send_deadline": "5s", "min_backoff": "30ms", "max_backoff": "5s", "retry_on_http_429": True,
})
#: The evaluation interval of a group without one (FlopWatch's groups all set theirs).
EVALUATION_INTERVAL = "15s"

_GROUP = re.compile(r"^( *)- name:\s*(\S+)")
_RULE = re.compile(r"^( *)- (alert|record):\s*(\S+)")


# --- cutting rule files as text ------------------------------------------------------------------
@dataclass(eq=False)
class _Block:
    kind: str                 # "group", "alert" or "record"
    name: str
    lines: list[str]
    rules: list[_Block] = field(default_factory=list)   # a group's


def _blocks(text: str) -> tuple[list[str], list[_Block]]:
    """The lines before the first group, and the groups with their rules."""
    lines = text.split("\n")
    marks = [(i, m) for i, line in enumerate(lines) if (m := _GROUP.match(line) or _RULE.match(line))]
    starts, previous = [], 0
    for i, match in marks:
        start, indent = i, match.group(1) + "#"
        while start > previous and lines[start - 1].startswith(indent):   # its comment lines above it
            start -= 1
        starts.append(start)
        previous = i + 1
    ends = [*starts[1:], len(lines)]
    head = lines[:starts[0]] if starts else lines
    groups: list[_Block] = []
    for (i, match), start, end in zip(marks, starts, ends, strict=True):
        if match.re is _GROUP:
            groups.append(_Block("group", match.group(2).strip("'\""), lines[start:end]))
        elif groups:
            groups[-1].rules.append(_Block(match.group(2), match.group(3).strip("'\""), lines[start:end]))
        else:
            raise ValueError(f"line {i + 1}: a rule before any group")
    return head, groups


def _trailing_blank(lines: list[str]) -> list[str]:
    kept = len(lines)
    while kept and not lines[kept - 1].strip():
        kept -= 1
    return lines[kept:]


def _kind(rule: dict[str, Any]) -> tuple[str, str]:
    """("alert" or "record", name) of a parsed rule."""
    return ("alert", rule["alert"]) if "alert" in rule else ("record", rule.get("record", ""))


def cut(text: str, name: str, keep_group: Callable[[str], bool], keep_rule: Callable[[str, str], bool],
        note: str) -> str | None:
    """Rule file `text` with only the groups `keep_group(group)` and in them the rules
    `keep_rule(kind, name)` ("alert" or "record"), `note` written under its first line; None when
    no group keeps a rule. ValueError (naming the file `name`) when the cut reads differently as
    YAML from the same selection made on the parsed file."""
    head, groups = _blocks(text)
    first = 1 if head and head[0].startswith("#") else 0      # under the generated header
    out = [*head[:first], f"# {note}", *head[first:]]
    for group in groups:
        keep = [keep_rule(rule.kind, rule.name) for rule in group.rules]
        if not keep_group(group.name) or not any(keep):
            continue
        out += group.lines
        for rule, kept in zip(group.rules, keep, strict=True):
            if kept:
                out += rule.lines
            elif rule is group.rules[-1]:
                out += _trailing_blank(rule.lines)   # what separated this group from the next
    expected = [{**group, "rules": rules} for group in (yaml.safe_load(text) or {}).get("groups") or []
                if keep_group(group["name"])
                and (rules := [rule for rule in group.get("rules") or [] if keep_rule(*_kind(rule))])]
    result = "\n".join(out).rstrip("\n") + "\n" if expected else None
    if ((yaml.safe_load(result) or {}).get("groups") if result else []) != expected:
        raise ValueError(f"{name}: the tier cut (flopwatch/mixin/tiers.py) misread this rule file's layout: each "
                         "group must start at `- name:` and each rule at `- alert:` or `- record:`, one per line")
    return result


# --- the two rule sets ---------------------------------------------------------------------------
def _rule_files(config: MixinConfig) -> dict[str, str]:
    return {name: text for name, text in build.rules(config).items() if RULE_FILE.match(name)}


def shard_rules(config: MixinConfig) -> dict[str, str]:
    """File name -> text: every rule file without the job-level alerts (a file left empty is left out)."""
    note = "Shard rule set (flopwatch/mixin/tiers.py): without the job-level alerts, which the global tier evaluates."
    files = {name: cut(text, name, lambda group: True, lambda kind, rule: rule not in JOB_ALERTS, note)
             for name, text in _rule_files(config).items()}
    return {name: text for name, text in files.items() if text is not None}


def global_rules(config: MixinConfig) -> dict[str, str]:
    """File name -> text: the global rule set, recording rules and the job-level alerts only."""
    note = "Global rule set (flopwatch/mixin/tiers.py): for vmalert over the global store; job-level alerts only."
    sources = _rule_files(config)
    missing = sorted(name for name in (*GLOBAL_FILES, *GLOBAL_GROUPS) if name not in sources)
    if missing:
        raise ValueError(f"flopwatch/mixin/tiers.py names rule files the build does not write: {', '.join(missing)}")
    extra = build.global_templates(config)
    clash = sorted(set(extra) & (GLOBAL_FILES | set(GLOBAL_GROUPS)))
    if clash:
        raise ValueError(f"templates/global/ repeats the name of a rule file: {', '.join(clash)}")
    chosen = {name: (text, lambda group: True) for name, text in sources.items() if name in GLOBAL_FILES}
    chosen |= {name: (sources[name], groups.__contains__) for name, groups in GLOBAL_GROUPS.items()}
    chosen |= {name: (text, lambda group: True) for name, text in extra.items()}
    files = {}
    for name in sorted(chosen):
        text, keep_group = chosen[name]
        cut_text = cut(text, name, keep_group, lambda kind, rule: kind == "record" or rule in JOB_ALERTS, note)
        if cut_text is None:
            raise ValueError(f"{name}: none of the groups the global rule set takes from it is there")
        files[name] = cut_text
    return files


# --- the series the global rules read -----------------------------------------------------------
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_BRACES = re.compile(r"\{[^{}]*\}")
_RANGE = re.compile(r"\[[^\[\]]*\]")
_LABEL_LIST = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_COMMENT = re.compile(r"#[^\n]*")
#: An identifier that is not part of a number or duration (`1e-06`, `10m`) and not a function's name.
_NAME = re.compile(r"(?<![\w:.])[a-zA-Z_:][\w:]*(?![\w:]|\s*\()")
_KEYWORDS = frozenset({"and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right",
                       "offset", "bool", "atan2", "inf", "nan", "Inf", "NaN"})
_TEMPLATE_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_RAW_SERIES = re.compile("|".join(render.SERIES.values()))


def series_in(expr: str) -> set[str]:
    """The series names a PromQL expression selects (not its functions, keywords or labels)."""
    text = _COMMENT.sub(" ", _STRING.sub(" ", expr))
    for pattern in (_BRACES, _RANGE, _LABEL_LIST):
        text = pattern.sub(" ", text)
    return {name for name in _NAME.findall(text) if name not in _KEYWORDS}


def _template_series(text: str) -> set[str]:
    """Series an annotation's Go template queries: names in its strings that are recorded
    (`level:metric:operations`) or exported (render.SERIES)."""
    found = {name for literal in _TEMPLATE_STRING.findall(text) for name in series_in(literal[1:-1])}
    return {name for name in found if ":" in name or _RAW_SERIES.fullmatch(name)}


#: The dashboards whose views cross shards (the fleet, a job, reliability): they read the global
#: tier, so what they read is forwarded. The node, network and fabric dashboards drill into one
#: node, port or switch and read the Prometheus pair of its shard (their `datasource` variable).
GLOBAL_DASHBOARDS = ("flopwatch-fleet", "flopwatch-job", "flopwatch-reliability")


@functools.lru_cache(maxsize=8)
def _forwarded_for(config: MixinConfig) -> tuple[str, ...]:
    return tuple(_forwarded(global_rules(config).values(), report_names() | dashboard_names(config)))


@functools.lru_cache(maxsize=8)
def dashboard_names(config: MixinConfig) -> frozenset[str]:
    """The series names GLOBAL_DASHBOARDS' queries read (panels and variables)."""
    boards = build.dashboards(config)
    found: set[str] = set()

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key in ("expr", "query") and isinstance(value, str):
                    found.update(series_in(value))
                else:
                    walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    for uid in GLOBAL_DASHBOARDS:
        walk(yaml.safe_load(boards[f"{uid}.json"]))
    return frozenset(name for name in found if ":" in name or _RAW_SERIES.fullmatch(name) or name == "ALERTS")


def forwarded_names(config: MixinConfig) -> list[str]:
    """Sorted: every series name the global rules read (expressions and annotation queries), or
    `flopwatch report` or GLOBAL_DASHBOARDS read, and that the global rules do not record
    themselves: what each shard remote-writes to the global tier, and nothing else. The report's
    and dashboards' names make them whole on the global tier for jobs that span shards."""
    return list(_forwarded_for(config))


def global_rule_inputs(config: MixinConfig) -> list[str]:
    """Sorted: the forwarded names the global rules alone read (without what the report and the
    cross-shard dashboards add): the least a shard can forward for the global rules to work."""
    return _forwarded(global_rules(config).values())


@functools.lru_cache(maxsize=1)
def report_names() -> frozenset[str]:
    """The series names `flopwatch report` reads (ALERTS included: the shards' straggler pages)."""
    return frozenset(name for query in every_query() for name in series_in(query.expr))


def _forwarded(global_texts: Iterable[str], also_read: Iterable[str] = ()) -> list[str]:
    recorded, read = set(), set(also_read)
    for text in global_texts:
        for group in yaml.safe_load(text)["groups"]:
            for rule in group["rules"]:
                recorded |= {rule["record"]} if "record" in rule else set()
                read |= series_in(rule["expr"])
                read |= {name for value in (rule.get("annotations") or {}).values()
                         for name in _template_series(str(value))}
    return sorted(read - recorded)


# --- configs of the servers ----------------------------------------------------------------------
def _topology(config: MixinConfig) -> Topology:
    if config.topology is None:
        raise ValueError("the settings have no topology: section (docs/configuration.md, \"Topology\")")
    return config.topology


def _host_port(url: str) -> tuple[str, str, str]:
    """(scheme, host:port, path) of an http(s) URL; the port defaults to the scheme's."""
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return parts.scheme, f"{parts.hostname}:{port}", parts.path.rstrip("/")


def _alertmanagers(topology: Topology) -> list[dict[str, Any]]:
    """Prometheus's `alerting.alertmanagers`: one entry per scheme and path prefix."""
    entries: dict[tuple[str, str], list[str]] = {}
    for member in topology.alertmanagers:
        scheme, target, prefix = _host_port(member.url)
        entries.setdefault((scheme, prefix), []).append(target)
    return [{"scheme": scheme, **({"path_prefix": prefix} if prefix else {}), "static_configs": [{"targets": targets}]}
            for (scheme, prefix), targets in entries.items()]


def prometheus_config(config: MixinConfig, shard: str, replica: str, *, rule_files: Sequence[str],
                      scrape_configs: Sequence[dict[str, Any]],
                      evaluation_interval: str | None = None) -> dict[str, Any]:
    """prometheus.yml of one replica of a shard: its external labels, the rules, alerts to every
    Alertmanager without the replica label, and remote write of `forwarded_names` (exact names,
    replica label dropped after the external labels are attached) to the global tier."""
    replicas = _topology(config).shard(shard).replicas
    if replica not in replicas:
        raise ValueError(f"shard {shard!r} has no replica {replica!r} (replicas: {', '.join(replicas)})")
    return _prometheus(config, shard, replica, rule_files, scrape_configs, evaluation_interval,
                       forwarded_names(config))


def _prometheus(config: MixinConfig, shard: str, replica: str, rule_files: Sequence[str],
                scrape_configs: Sequence[dict[str, Any]], evaluation_interval: str | None,
                forwarded: Sequence[str]) -> dict[str, Any]:
    topology = _topology(config)
    label = topology.replica_label
    every = evaluation_interval or Scrape.of(config.scrape_interval).every(EVALUATION_INTERVAL)
    return {
        "global": {"scrape_interval": config.scrape_interval, "evaluation_interval": every,
                   "external_labels": {config.labels.cluster: topology.cluster, topology.shard_label: shard,
                                       label: replica}},
        "rule_files": list(rule_files),
        "scrape_configs": [dict(job) for job in scrape_configs],
        "alerting": {"alert_relabel_configs": [{"regex": label, "action": "labeldrop"}],
                     "alertmanagers": _alertmanagers(topology)},
        "remote_write": [{
            "url": topology.global_tier.write_url,
            "write_relabel_configs": [
                {"source_labels": ["__name__"], "regex": "|".join(forwarded), "action": "keep"},
                {"regex": label, "action": "labeldrop"},
            ],
            "queue_config": dict(QUEUE_CONFIG),
        }],
    }


#: How often vmalert re-sends a firing alert: Alertmanager resolves an alert it has not heard of
#: for 4 x max(group interval, this), so a ticket survives an outage of the global store this long
#: (4 minutes) instead of resolving and firing again (a second notification) when the store returns.
VMALERT_RESEND_DELAY = "1m"
#: The path vmalert appends to -remoteWrite.url unless told not to (-remoteWrite.disablePathAppend).
VMALERT_WRITE_PATH = "/api/v1/write"


def vmalert_args(config: MixinConfig, rule_files: Sequence[str]) -> list[str]:
    """vmalert's flags for the global rule set: reads and restores alert state from the read URL,
    writes records and alert state to the global store, notifies every Alertmanager. vmalert
    appends /api/v1/write to -remoteWrite.url (1.79 and 1.151 alike): a write URL ending so is
    given without it, any other as it is with -remoteWrite.disablePathAppend."""
    topology = _topology(config)
    write = topology.global_tier.write_url
    base = write.removesuffix(VMALERT_WRITE_PATH)
    return [f"-datasource.url={topology.global_tier.read_url}", f"-remoteRead.url={topology.global_tier.read_url}",
            f"-remoteWrite.url={base}", *([] if base != write else ["-remoteWrite.disablePathAppend"]),
            f"-rule.resendDelay={VMALERT_RESEND_DELAY}",
            *(f"-notifier.url={member.url}" for member in topology.alertmanagers),
            *(f"-rule={path}" for path in rule_files)]


def alertmanager_args(config: MixinConfig, index: int, *, listen: str) -> list[str]:
    """Gossip flags of Alertmanager `index` (0-based, in the order of topology.alertmanagers): it
    listens on `listen` and names every other member's peer address."""
    members = _topology(config).alertmanagers
    if not 0 <= index < len(members):
        raise ValueError(f"no Alertmanager {index} in the topology (it lists {len(members)}, counted from 0)")
    return [f"--cluster.listen-address={listen}",
            *(f"--cluster.peer={member.peer}" for position, member in enumerate(members) if position != index)]


# --- what `flopwatch rules build` writes for a topology -----------------------------------------
def scrape_job(config: MixinConfig, shard: str) -> dict[str, Any]:
    """The shard's scrape job of FlopWatch agents: file_sd targets in targets/<shard>.json beside its
    prometheus.yml, named as selectors.agent's `job` (else flopwatch)."""
    return {"job_name": render.input_label(config.selectors.agent, "job", "flopwatch"),
            "file_sd_configs": [{"files": [f"targets/{shard}.json"]}]}


def _header(what: str) -> str:
    return (f"# GENERATED by `flopwatch rules build` from the topology: section of the settings "
            f"(flopwatch/mixin/tiers.py): {what}. Edit the settings and build again.\n")


def outputs(config: MixinConfig, rules_dir: Path) -> dict[Path, str]:
    """The files a topology adds to the rules folder: shard/ and global/ rule sets, and in topology/
    each replica's prometheus.yml, vmalert's and each Alertmanager's flags (one per line; paths
    relative to topology/)."""
    topology = _topology(config)
    shard_files, global_files = shard_rules(config), global_rules(config)
    forwarded = list(_forwarded_for(config))
    files = {rules_dir / "shard" / name: text for name, text in shard_files.items()}
    files |= {rules_dir / "global" / name: text for name, text in global_files.items()}
    folder = rules_dir / "topology"
    for shard in topology.shards:
        for replica in shard.replicas:
            settings = _prometheus(config, shard.name, replica, [f"../shard/{n}" for n in shard_files],
                                   [scrape_job(config, shard.name)], None, forwarded)
            files[folder / f"prometheus-{shard.name}-{replica}.yml"] = (
                _header(f"Prometheus of shard {shard.name}, replica {replica}")
                + yaml.safe_dump(settings, sort_keys=False, width=10**6))
    files[folder / "vmalert.args"] = "\n".join(vmalert_args(config, [f"../global/{n}" for n in global_files])) + "\n"
    for index, member in enumerate(topology.alertmanagers):
        flags = alertmanager_args(config, index, listen="0.0.0.0:" + member.peer.rsplit(":", 1)[1])
        files[folder / f"alertmanager-{index + 1}.args"] = "\n".join(flags) + "\n"
    return files

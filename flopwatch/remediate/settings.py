"""`flopwatch remediate`'s settings: the `remediation:` section of FlopWatch's one settings file
(the file `flopwatch rules build --config` reads), then FLOPWATCH_REMEDIATE_* environment, then flags.

Every key is declared once in `FIELDS` (dotted below `remediation`) with its parser, default and
what to write; `actions` maps alert names to actions. A wrong key, value, alert or action is one
line naming the file and line (`UsageError` at the CLI: exit 2). docs/remediation.md lists them.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from flopwatch import durations, yamlfile
from flopwatch.config import ConfigError, parse_boolean, parse_listen
from flopwatch.mixin import names

SECTION = "remediation"
ENV_PREFIX = "FLOPWATCH_REMEDIATE_"
#: What an alert can make FlopWatch do to its node; `none` pages people and touches nothing.
ACTIONS = ("drain", "none")
#: Alerts whose only evidence is an agent that stopped answering: never acted on.
SILENT_AGENT_ALERTS = ("FlopWatchAgentDown",)
#: The policy FlopWatch ships: the faults after which a node should take no new job.
DEFAULT_ACTIONS: dict[str, str] = {
    "FlopWatchGpuXidCritical": "drain", "FlopWatchGpuLost": "drain", "FlopWatchGpuRowRemapFailure": "drain",
}

Parser = Callable[[Any], Any]


@dataclass(frozen=True)
class Field:
    parse: Parser
    default: Any
    expected: str


def _seconds(value: Any) -> float:
    return durations.parse_duration(value, "value", bare_seconds=False)


def _share(value: Any) -> float:
    if isinstance(value, bool) or not 0 < float(value) <= 1:
        raise ValueError
    return float(value)


def _count(value: Any) -> int:
    if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()) or int(value) < 1:
        raise ValueError
    return int(value)


def _text(value: Any) -> str:
    if not isinstance(value, str | int) or isinstance(value, bool):
        raise ValueError
    return str(value).strip()


def _url(value: Any) -> str:
    text = _text(value).rstrip("/")
    if text and not re.fullmatch(r"https?://[^\s/?#]+(/[^\s?#]*)?", text):
        raise ValueError
    return text


def _agent_url(value: Any) -> str:
    text = _url(value)
    if text and "{node}" not in text:
        raise ValueError
    return text


def _choice(*choices: str) -> Parser:
    def parse(value: Any) -> str:
        if str(value) not in choices:
            raise ValueError
        return str(value)
    return parse


def _listen(value: Any) -> str:
    host, port = parse_listen(value)
    return f"{host}:{port}"


FIELDS: dict[str, Field] = {
    "dry_run": Field(parse_boolean, True, "true or false: true writes the plan and the commands, runs none"),
    "scheduler": Field(_choice("slurm", "kubernetes"), "slurm", "slurm or kubernetes"),
    "listen": Field(_listen, "127.0.0.1:9848", "HOST:PORT of the webhook and /metrics"),
    "web_config": Field(_text, "", "a web config file (TLS, basic auth, bearer tokens), as the agent's --web-config"),
    "max_body": Field(_count, 1 << 20, "the largest webhook body in bytes"),
    "alertmanager": Field(_url, "", "Alertmanager's URL: alerts are reconciled from it and pages sent to it"),
    "reconcile_interval": Field(_seconds, 120.0, "a duration like 2m: how often Alertmanager is read back"),
    "state_dir": Field(_text, "/var/lib/flopwatch/remediate", "a directory for the journal and the plan"),
    "topology": Field(_text, "", "Slurm's topology.conf, for switch escalation (empty: the running slurmctld's, "
                      "from scontrol show topology; none without a topology plugin)"),
    "command_timeout": Field(_seconds, 30.0, "a duration: a scheduler command running longer is killed"),
    "retries": Field(_count, 3, "failures of one action before it is paged"),
    "backoff": Field(_seconds, 10.0, "a duration: the wait after a first failure, doubled after each"),
    "breaker.max_nodes": Field(_count, 8, "nodes drained per window at most"),
    "breaker.partition_share": Field(_share, 0.1, "share of a partition drained per window at most (0-1]"),
    "breaker.switch_share": Field(_share, 0.5, "share of one leaf switch's nodes drained per window at most"),
    "breaker.window": Field(_seconds, 3600.0, "a duration like 1h"),
    "escalation.switch_share": Field(_share, 0.5, "this share of a leaf's nodes failing together is the switch"),
    "escalation.min_nodes": Field(_count, 3, "... and at least this many nodes"),
    "return.hold_down": Field(_seconds, 1800.0, "a duration: how long a cleared node waits before its check"),
    "return.health_check": Field(_text, "", "a command that exits 0 when the node is healthy; {node} is "
                                 "replaced by its name (empty: nodes are never returned automatically)"),
    "return.agent": Field(_agent_url, "", "the node's agent /metrics as a URL with {node}, e.g. "
                          "http://{node}:9847/metrics: passes when every GPU is up and no page-level XID is held "
                          "(empty: no agent check)"),
    "return.health_timeout": Field(_seconds, 300.0, "a duration: a health check running longer failed"),
    "return.lemon_occasions": Field(_count, 2, "drains on this many separate occasions make a lemon, kept drained"),
    "return.lemon_window": Field(_seconds, 7 * 86400.0, "a duration like 7d: how far back occasions count"),
    "slurm.bin_dir": Field(_text, "", "the directory of scontrol and sinfo (empty: the PATH)"),
    "kubernetes.taint_key": Field(_text, "flopwatch.io/remediation", "the NoSchedule taint's key"),
}


@dataclass(frozen=True)
class Settings:
    values: Mapping[str, Any]
    actions: Mapping[str, str] = field(default_factory=lambda: dict(DEFAULT_ACTIONS))

    def __getitem__(self, key: str) -> Any:
        return self.values[key]

    def action(self, alertname: str) -> str:
        return self.actions.get(alertname, "none")

    @property
    def state_dir(self) -> Path:
        return Path(self.values["state_dir"])


def _parse(key: str, value: Any, where: str) -> Any:
    spec = FIELDS[key]
    try:
        return spec.parse(value)
    except (ValueError, TypeError):
        raise ConfigError(f"{where}: {SECTION}.{key}: expected {spec.expected}, got {value!r}") from None


def _flatten(node: yaml.MappingNode, path: Path, prefix: str = "") -> dict[str, tuple[Any, str]]:
    """key -> (value, "file:line") for the scalars of the section."""
    out: dict[str, tuple[Any, str]] = {}
    for key_node, value_node in node.value:
        key, where = f"{prefix}{key_node.value}", f"{path}:{key_node.start_mark.line + 1}"
        if isinstance(value_node, yaml.MappingNode) and key != "actions" and any(
                name.startswith(key + ".") for name in FIELDS):
            out.update(_flatten(value_node, path, key + "."))
            continue
        if key == "actions":
            out[key] = (value_node, where)
            continue
        if key not in FIELDS:
            raise ConfigError(f"{where}: unknown setting '{SECTION}.{key}' (known: actions, "
                              f"{', '.join(FIELDS)})")
        if not isinstance(value_node, yaml.ScalarNode):
            raise ConfigError(f"{where}: {SECTION}.{key}: expected a single value, not a list or mapping")
        out[key] = (yaml.safe_load(yaml.serialize(value_node)), where)
    return out


def _actions(node: yaml.Node, path: Path, where: str) -> dict[str, str]:
    if not isinstance(node, yaml.MappingNode):
        raise ConfigError(f"{where}: {SECTION}.actions: expected a mapping of alert names to actions")
    actions = dict(DEFAULT_ACTIONS)
    for key_node, value_node in node.value:
        line, alert, action = f"{path}:{key_node.start_mark.line + 1}", key_node.value, value_node.value
        if alert not in names.ALERTS:
            raise ConfigError(f"{line}: {SECTION}.actions: unknown alert {alert!r} (FlopWatch's alerts: "
                              f"{', '.join(names.ALERTS)})")
        if not isinstance(value_node, yaml.ScalarNode) or action not in ACTIONS:
            raise ConfigError(f"{line}: {SECTION}.actions.{alert}: unknown action {action!r} (known: "
                              f"{', '.join(ACTIONS)})")
        if action != "none" and alert in SILENT_AGENT_ALERTS:
            raise ConfigError(f"{line}: {SECTION}.actions.{alert}: its only evidence is an agent that stopped "
                              "answering; FlopWatch never acts on it (use none)")
        actions[alert] = action
    return actions


def load(path: str | Path | None = None, environ: Mapping[str, str] | None = None,
         overrides: Mapping[str, Any] | None = None) -> Settings:
    """Defaults < the file's `remediation:` section < FLOPWATCH_REMEDIATE_* < `overrides` (flags)."""
    values = {key: spec.default for key, spec in FIELDS.items()}
    actions = dict(DEFAULT_ACTIONS)
    if path is not None:
        path = Path(path)
        try:
            root = yamlfile.compose(path, "settings file")
        except yamlfile.YamlFileError as error:
            raise ConfigError(str(error)) from None
        section = None
        if isinstance(root, yaml.MappingNode):
            section = next((v for k, v in root.value if k.value == SECTION), None)
        elif root is not None:
            raise ConfigError(f"{path}:1: expected a mapping of settings")
        if section is not None and not (isinstance(section, yaml.ScalarNode) and section.value in ("", "null")):
            if not isinstance(section, yaml.MappingNode):
                raise ConfigError(f"{path}:{section.start_mark.line + 1}: {SECTION}: expected a mapping")
            for key, (value, where) in _flatten(section, path).items():
                if key == "actions":
                    actions = _actions(value, path, where)
                else:
                    values[key] = _parse(key, value, where)
    for key in FIELDS:
        name = ENV_PREFIX + key.upper().replace(".", "_")
        if environ is not None and name in environ:
            values[key] = _parse(key, environ[name], f"environment {name}")
    for key, value in (overrides or {}).items():
        if value is not None:
            values[key] = _parse(key, value, f"flag for {key}")
    return Settings(values, actions)


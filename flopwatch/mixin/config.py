"""The mixin's settings: selectors, dtype, thresholds, windows, severities and URLs, as typed
dataclasses whose defaults are the shipped rules' behaviour.

`load(path)` reads a YAML file of overrides (any subset of defaults.yml, which documents every key);
a wrong key or value is one line naming the file, the line and what is expected. Durations use
Prometheus's grammar (flopwatch/durations.py: `90s`, `1m30s`, `6h`), because they are written into
PromQL as they are; the file is read and composed (for line numbers) by flopwatch/yamlfile.py.
"""

from __future__ import annotations

import dataclasses
import re
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NewType, NoReturn

import yaml

from flopwatch import catalog, durations, yamlfile
from flopwatch.config import ConfigError
from flopwatch.mixin import names, scrape
from flopwatch.mixin.topology import (
    DEFAULT_CLUSTER,
    DEFAULT_REPLICA_LABEL,
    DEFAULT_REPLICAS,
    DEFAULT_SHARD_LABEL,
    AlertmanagerPeer,
    GlobalTier,
    Shard,
    Topology,
)

#: A Prometheus duration as written in PromQL (`30s`, `1m30s`, `6h`).
Duration = NewType("Duration", str)
#: Label matchers added to the raw series of an exporter, e.g. `job="flopwatch"` ("" selects all).
Selector = NewType("Selector", str)
#: An absolute http(s) URL without a trailing slash.
Url = NewType("Url", str)
#: The interval at which Prometheus scrapes FlopWatch's targets: a Duration from 1s to 1m.
ScrapeInterval = NewType("ScrapeInterval", str)
#: A Prometheus label name (`cluster`, `site`).
LabelName = NewType("LabelName", str)
#: The `dtype` label value of the peak FLOP/s that MFU divides by (bf16, fp16, fp8, tf32...).
Dtype = NewType("Dtype", str)
#: A shard's name or a replica's label value: it names files too (prometheus-<shard>-<replica>.yml).
TierName = NewType("TierName", str)
#: host:port of an Alertmanager's gossip listener.
HostPort = NewType("HostPort", str)

_MATCHER = r'\s*[a-zA-Z_][a-zA-Z0-9_]*\s*(?:=~|!~|!=|=)\s*"(?:[^"\\]|\\.)*"\s*'
_SELECTOR = re.compile(rf"^(?:{_MATCHER}(?:,{_MATCHER})*)?$")
_LABEL = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_DTYPE = re.compile(r"^[a-z0-9_]+$")
_TIER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_HOST_PORT = re.compile(r"^(?:[A-Za-z0-9_.-]+|\[[0-9A-Fa-f:.]+\]):[0-9]{1,5}$")


def duration_seconds(text: str) -> float:
    """Seconds of a Prometheus duration (`1m30s` -> 90.0); ValueError when it is not one."""
    return durations.parse_duration(text, "duration", bare_seconds=False)


@dataclass(frozen=True)
class Selectors:
    agent: Selector = Selector("")
    dcgm: Selector = Selector("")


@dataclass(frozen=True)
class Labels:
    #: The external label that names a cluster (each Prometheus's `external_labels`): Alertmanager
    #: groups and inhibits within a cluster by it, and `flopwatch report --rules-config` groups by it.
    cluster: LabelName = LabelName("cluster")


@dataclass(frozen=True)
class Severities:
    page: str = "page"
    ticket: str = "ticket"


@dataclass(frozen=True)
class Urls:
    runbooks: Url = Url(names.RUNBOOKS_URL)
    docs: Url = Url(names.DOCS_URL)


@dataclass(frozen=True)
class Mfu:
    busy_utilization: float = 0.1


@dataclass(frozen=True)
class MfuRegression:
    ratio: float = 0.85
    window: Duration = Duration("10m")
    baseline: Duration = Duration("6h")
    history: Duration = Duration("70m")
    for_: Duration = Duration("15m")


@dataclass(frozen=True)
class Stalled:
    step_multiple: float = 5
    minimum: Duration = Duration("5m")
    for_: Duration = Duration("1m")


@dataclass(frozen=True)
class GoodputLow:
    target: float = 0.8
    window: Duration = Duration("30m")
    for_: Duration = Duration("15m")


@dataclass(frozen=True)
class IdleGpus:
    window: Duration = Duration("30m")
    utilization: float = 0.05
    for_: Duration = Duration("5m")


@dataclass(frozen=True)
class Jobs:
    mfu_regression: MfuRegression = field(default_factory=MfuRegression)
    stalled: Stalled = field(default_factory=Stalled)
    goodput_low: GoodputLow = field(default_factory=GoodputLow)
    idle_gpus: IdleGpus = field(default_factory=IdleGpus)


@dataclass(frozen=True)
class Agent:
    down_for: Duration = Duration("2m")
    collector_errors_per_second: float = 0.01
    collector_errors_for: Duration = Duration("10m")


@dataclass(frozen=True)
class Network:
    symbol_errors_per_hour: float = 120
    symbol_errors_for: Duration = Duration("1m")
    link_downed_window: Duration = Duration("5m")
    flapping_downs: int = 2
    flapping_window: Duration = Duration("10m")


@dataclass(frozen=True)
class Fabric:
    rate_ratio: float = 0.9
    flap_window: Duration = Duration("5m")
    wait_fleet_multiple: float = 5
    wait_own_multiple: float = 5
    port_share: float = 0.25
    min_nodes: int = 3
    job_slowdown: float = 0.05
    cause_hold: Duration = Duration("10m")
    cause_window: Duration = Duration("20m")
    spine_leaf_share: float = 0.5
    spine_min_leaves: int = 2


@dataclass(frozen=True)
class Gpu:
    lost_for: Duration = Duration("30s")
    nvlink_errors_per_second: float = 1
    nvlink_errors_for: Duration = Duration("30s")
    pcie_replays_per_second: float = 0.1
    pcie_busy_utilization: float = 0.5
    pcie_for: Duration = Duration("1m")
    throttled_clock_ratio: float = 0.9
    throttled_for: Duration = Duration("5m")


@dataclass(frozen=True)
class Dcgm:
    clock_below_max_ratio: float = 0.9
    busy_utilization: float = 0.5


@dataclass(frozen=True)
class Stragglers:
    min_ranks: int = 8
    corroborated_margin: float = 0.02
    corroborated_sigmas: float = 3
    clock_and_data_sigmas: float = 2
    uncorroborated_margin: float = 0.03
    uncorroborated_sigmas: float = 5
    unexplained_margin: float = 0.035
    phase_share: float = 0.5
    gpu_clock_margin: float = 0.03
    gpu_clock_for: Duration = Duration("1m")
    host_cpu_busy: float = 0.9
    host_cpu_pressure: float = 0.2
    stage_margin: float = 0.1
    stage_step_time_lost: float = 0.02
    stage_for: Duration = Duration("10m")
    vote_min_peers: int = 3
    own_history: Duration = Duration("1h")
    own_margin: float = 0.15


@dataclass(frozen=True)
class Interruptions:
    step_multiple: float = 5
    minimum: Duration = Duration("2m")
    cause_window: Duration = Duration("15m")
    memory: Duration = Duration("6h")
    checkpoint_off_ratio: float = 2
    checkpoint_held: Duration = Duration("23h")
    checkpoint_for: Duration = Duration("1h")
    min_interruptions: int = 3


@dataclass(frozen=True)
class MixinConfig:
    #: The interval the rules' windows and evaluation intervals are derived for (flopwatch/mixin/scrape.py).
    scrape_interval: ScrapeInterval = ScrapeInterval("5s")
    selectors: Selectors = field(default_factory=Selectors)
    labels: Labels = field(default_factory=Labels)
    dtype: Dtype = Dtype("bf16")
    severities: Severities = field(default_factory=Severities)
    urls: Urls = field(default_factory=Urls)
    mfu: Mfu = field(default_factory=Mfu)
    jobs: Jobs = field(default_factory=Jobs)
    agent: Agent = field(default_factory=Agent)
    network: Network = field(default_factory=Network)
    fabric: Fabric = field(default_factory=Fabric)
    gpu: Gpu = field(default_factory=Gpu)
    dcgm: Dcgm = field(default_factory=Dcgm)
    stragglers: Stragglers = field(default_factory=Stragglers)
    interruptions: Interruptions = field(default_factory=Interruptions)
    #: Shards, global tier and Alertmanager cluster (docs/configuration.md, "Topology"); None: one Prometheus.
    topology: Topology | None = None


def yaml_key(name: str) -> str:
    """The YAML key of a dataclass field (`for_` is written `for`)."""
    return name.rstrip("_")


def _scalar(kind: Any, value: Any) -> tuple[Any, str]:
    """`value` as `kind`, or (None, what was expected)."""
    if kind in (float, int):
        ok = isinstance(value, int | float) and not isinstance(value, bool) and value >= 0 and (
            kind is float or float(value).is_integer())
        return (kind(value) if ok else None), "a number, 0 or more" if kind is float else "a whole number"
    text = value if isinstance(value, str) else None
    if kind is Duration:
        try:
            duration_seconds(text or "")
        except ValueError:
            return None, "a Prometheus duration like 30s, 5m, 1m30s or 6h"
        return text, ""
    if kind is ScrapeInterval:
        try:
            ok = scrape.MINIMUM_SECONDS <= duration_seconds(text or "") <= scrape.MAXIMUM_SECONDS
        except ValueError:
            ok = False
        return (text if ok else None), (
            f"a Prometheus duration from {durations.format_duration(scrape.MINIMUM_SECONDS)} to "
            f"{durations.format_duration(scrape.MAXIMUM_SECONDS)}: the scrape_interval Prometheus uses for "
            "FlopWatch's agents (for a coarser one the rules cannot hold their windows: scrape the agents at "
            f"least every {durations.format_duration(scrape.MAXIMUM_SECONDS)})")
    if kind is Selector:
        ok = text is not None and _SELECTOR.match(text) is not None
        return (", ".join(part.strip() for part in _split_matchers(text)) if ok else None), \
            'label matchers like job="flopwatch" (or "" for every series)'
    if kind is Url:
        ok = text is not None and re.match(r"^https?://\S+$", text) is not None
        return (text.rstrip("/") if ok else None), "an absolute http(s):// URL"
    if kind is LabelName:
        ok = text is not None and _LABEL.match(text) is not None and text not in _series_labels()
        return (text if ok else None), ("a label name of letters, digits and underscores, like cluster, that "
                                        "FlopWatch's series do not carry already (node, gpu, job_id, ...)")
    if kind is Dtype:
        ok = text is not None and _DTYPE.match(text) is not None
        return (text if ok else None), "a dtype label value like bf16, fp16 or fp8"
    if kind is TierName:
        ok = text is not None and _TIER_NAME.match(text) is not None
        return (text if ok else None), "a name of letters, digits, '-', '_' and '.' like shard-1 (it names files)"
    if kind is HostPort:
        ok = text is not None and _HOST_PORT.match(text) is not None
        return (text if ok else None), "host:port of the Alertmanager's gossip listener, like am-1:9094"
    ok = text is not None and _LABEL.match(text) is not None
    return (text if ok else None), "a label value of letters, digits and underscores"


def _series_labels() -> set[str]:
    """Labels the agent's series carry, and Prometheus's own: a cluster label must be none of them."""
    return {"job", "instance", "le", *(label for _, metric in catalog.all_metrics() for label in metric.all_labels)}


def _split_matchers(text: str) -> list[str]:
    return [match.group(0) for match in re.finditer(_MATCHER, text)]


#: Top-level sections of the same settings file that other commands read and check themselves.
OTHER_SECTIONS = {"remediation": "flopwatch remediate (flopwatch/remediate/settings.py)"}


def _build(cls: type, node: yaml.Node, path: Path, where: str) -> Any:
    """An instance of dataclass `cls` from a YAML mapping node; unknown keys and bad values fail."""
    hints = typing.get_type_hints(cls)
    fields = {yaml_key(f.name): f.name for f in dataclasses.fields(cls)}
    if not isinstance(node, yaml.MappingNode):
        raise ConfigError(f"{path}:{node.start_mark.line + 1}: {where or 'the file'}: expected a mapping of "
                          f"settings ({', '.join(fields)})")
    values: dict[str, Any] = {}
    for key_node, value_node in node.value:
        key = key_node.value
        dotted = f"{where}.{key}" if where else key
        line = key_node.start_mark.line + 1
        if not where and key in OTHER_SECTIONS:
            continue
        if key not in fields:
            raise ConfigError(f"{path}:{line}: unknown setting {dotted!r} (known here: {', '.join(fields)})")
        kind = hints[fields[key]]
        if dataclasses.is_dataclass(kind):
            values[fields[key]] = _build(kind, value_node, path, dotted)
            continue
        if not isinstance(value_node, yaml.ScalarNode):
            raise ConfigError(f"{path}:{line}: {dotted}: expected a single value, not a list or mapping")
        raw = yaml.safe_load(yaml.serialize(value_node))
        value, expected = _scalar(kind, raw)
        if value is None:
            raise ConfigError(f"{path}:{line}: {dotted}: expected {expected}, got {raw!r}")
        values[fields[key]] = value
    return cls(**values)


def load(path: str | Path | None = None) -> MixinConfig:
    """The defaults, overridden by the settings in `path` (YAML; None: the defaults alone)."""
    if path is None:
        return MixinConfig()
    path = Path(path)
    try:
        node = yamlfile.compose(path, "rules config")
    except yamlfile.YamlFileError as error:
        raise ConfigError(str(error)) from None
    if node is None:
        return MixinConfig()
    topology = None
    if isinstance(node, yaml.MappingNode):   # read last: it is checked against labels and stragglers
        topology = next((pair for pair in node.value if pair[0].value == "topology"), None)
        node.value = [pair for pair in node.value if pair is not topology]
    config = _build(MixinConfig, node, path, "")
    return config if topology is None else dataclasses.replace(config, topology=_topology(topology[1], path, config))


# --- topology: lists of mappings, checked against the rest of the settings ----------------------
def _fail(path: Path, node: yaml.Node, where: str, what: str) -> NoReturn:
    raise ConfigError(f"{path}:{node.start_mark.line + 1}: {where}: {what}")


def _entries(node: yaml.Node, path: Path, where: str, keys: dict[str, bool]) -> dict[str, yaml.Node]:
    """The values of mapping `node` by key; an unknown key, or a missing one that `keys` marks True, fails."""
    if not isinstance(node, yaml.MappingNode):
        _fail(path, node, where, f"expected a mapping of {', '.join(keys)}")
    found = {}
    for key_node, value_node in node.value:
        if key_node.value not in keys:
            raise ConfigError(f"{path}:{key_node.start_mark.line + 1}: unknown setting "
                              f"{where + '.' + key_node.value!r} (known here: {', '.join(keys)})")
        found[key_node.value] = value_node
    missing = [key for key, required in keys.items() if required and key not in found]
    if missing:
        _fail(path, node, where, f"missing {', '.join(missing)}")
    return found


def _items(node: yaml.Node, path: Path, where: str, example: str) -> list[yaml.Node]:
    if not isinstance(node, yaml.SequenceNode) or not node.value:
        _fail(path, node, where, f"expected a list of at least one, like {example}")
    return list(node.value)


def _value(node: yaml.Node, path: Path, where: str, kind: Any) -> Any:
    if not isinstance(node, yaml.ScalarNode):
        _fail(path, node, where, "expected a single value, not a list or mapping")
    raw = yaml.safe_load(yaml.serialize(node))
    value, expected = _scalar(kind, raw)
    if value is None:
        _fail(path, node, where, f"expected {expected}, got {raw!r}")
    return value


def _shard(node: yaml.Node, path: Path, where: str, config: MixinConfig) -> Shard:
    entries = _entries(node, path, where, {"name": True, "replicas": False, "gpus": False})
    name = _value(entries["name"], path, f"{where}.name", TierName)
    replicas = DEFAULT_REPLICAS
    if "replicas" in entries:
        items = _items(entries["replicas"], path, f"{where}.replicas", "[a, b]")
        replicas = tuple(_value(item, path, f"{where}.replicas", TierName) for item in items)
        for position, item in enumerate(items):
            if replicas[position] in replicas[:position]:
                replica = replicas[position]
                _fail(path, item, f"{where}.replicas", f"replica {replica!r} is listed twice in shard {name!r}")
    gpus = None
    if "gpus" in entries:
        gpus = _value(entries["gpus"], path, f"{where}.gpus", int)
        if gpus < config.stragglers.vote_min_peers:
            _fail(path, entries["gpus"], f"{where}.gpus", f"{gpus} GPUs are fewer than stragglers.vote_min_peers "
                  f"({config.stragglers.vote_min_peers}): no peer group in this shard could vote; merge it into "
                  "another shard")
    return Shard(name, replicas, gpus)


def _topology(node: yaml.Node, path: Path, config: MixinConfig) -> Topology:
    """The `topology:` section: shards, the global tier's URLs and the Alertmanager cluster."""
    entries = _entries(node, path, "topology", {"cluster": False, "shard_label": False, "replica_label": False,
                                                "shards": True, "global": True, "alertmanagers": True})
    cluster = DEFAULT_CLUSTER if "cluster" not in entries else _value(entries["cluster"], path, "topology.cluster",
                                                                       TierName)
    labels = {"labels.cluster": config.labels.cluster}
    for key, default, role in (("shard_label", DEFAULT_SHARD_LABEL, "the shards"),
                               ("replica_label", DEFAULT_REPLICA_LABEL, "the replicas of a shard")):
        given = entries.get(key)
        label = default if given is None else _value(given, path, f"topology.{key}", LabelName)
        taken = next((name for name, value in labels.items() if value == label), None)
        if taken:
            _fail(path, given or node, f"topology.{key}", f"{label!r} is already the label of {taken}: "
                  f"{role} need a label of their own")
        labels[f"topology.{key}"] = label
    shards: list[Shard] = []
    for index, item in enumerate(_items(entries["shards"], path, "topology.shards", "[{name: shard-1}]")):
        shard = _shard(item, path, f"topology.shards[{index}]", config)
        if shard.name in [other.name for other in shards]:
            _fail(path, item, f"topology.shards[{index}].name", f"shard {shard.name!r} is listed twice")
        shards.append(shard)
    urls = _entries(entries["global"], path, "topology.global", {"write_url": True, "read_url": True})
    tier = GlobalTier(*(_value(urls[key], path, f"topology.global.{key}", Url) for key in ("write_url", "read_url")))
    members = []
    for index, item in enumerate(_items(entries["alertmanagers"], path, "topology.alertmanagers",
                                        "[{url: http://am-1:9093, peer: am-1:9094}]")):
        where = f"topology.alertmanagers[{index}]"
        member = _entries(item, path, where, {"url": True, "peer": True})
        members.append(AlertmanagerPeer(_value(member["url"], path, f"{where}.url", Url),
                                        _value(member["peer"], path, f"{where}.peer", HostPort)))
        if members[-1].url in [other.url for other in members[:-1]]:
            _fail(path, member["url"], f"{where}.url", f"Alertmanager {members[-1].url} is listed twice")
    return Topology(tuple(shards), tier, tuple(members), labels["topology.replica_label"], cluster,
                    labels["topology.shard_label"])


def _as_yaml(value: Any) -> Any:
    if dataclasses.is_dataclass(value):
        return as_dict(value)
    return [_as_yaml(item) for item in value] if isinstance(value, tuple) else value


def as_dict(config: Any) -> dict[str, Any]:
    """Settings as YAML writes them (`for_` as `for`, a field's `yaml` metadata as its key), for docs
    and tests; an optional section that is absent (None, such as no topology) is left out."""
    return {field_.metadata.get("yaml", yaml_key(field_.name)): _as_yaml(getattr(config, field_.name))
            for field_ in dataclasses.fields(config) if getattr(config, field_.name) is not None}

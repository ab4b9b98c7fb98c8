"""Agent configuration: defaults, then a YAML file, then FLOPWATCH_* environment, then flags.

Every key is declared once in `FIELDS` with its parser, so a wrong value anywhere yields the same
one-line error naming the key and what was expected (the CLI turns it into exit code 2).
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flopwatch import yamlfile
from flopwatch.hardware import DTYPES, known_names, model_by_name
from flopwatch.train.wire import default_socket_path

#: Virtual Ethernet interfaces that carry no training traffic of their own (nic.net_exclude).
DEFAULT_NET_EXCLUDE = r"lo|veth.*|docker.*|br-.*|virbr.*|cali.*|flannel.*|cni.*|lxc.*|tap.*|tun.*"
DEFAULT_PORT = 9847  # not dcgm-exporter's 9400 nor node_exporter's 9100
ENV_PREFIX = "FLOPWATCH_"


class ConfigError(ValueError):
    """A configuration value is wrong; the message names the key and what is expected."""


Parser = Callable[[Any], Any]


@dataclass(frozen=True)
class Field:
    parse: Parser
    default: Any
    expected: str  # what a user should write, for error messages and docs


def _number(low: float, high: float) -> Parser:
    def parse(value: Any) -> float:
        if isinstance(value, bool):
            raise ValueError
        number = float(value)
        if not low <= number <= high:
            raise ValueError
        return number

    return parse


def _integer(low: int, high: int) -> Parser:
    def parse(value: Any) -> int:
        if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
            raise ValueError
        number = int(str(value), 10) if isinstance(value, str) else int(value)
        if not low <= number <= high:
            raise ValueError
        return number

    return parse


def _choice(*choices: str) -> Parser:
    def parse(value: Any) -> str:
        text = str(value).lower()
        if text not in choices:
            raise ValueError
        return text

    return parse


def parse_boolean(value: Any) -> bool:
    """true/false, yes/no, on/off, 1/0 (any case); ValueError otherwise."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ValueError


def _optional(parse: Parser) -> Parser:
    def parse_optional(value: Any) -> Any:
        if value is None or (isinstance(value, str) and value.strip().lower() in ("", "none", "null")):
            return None
        return parse(value)

    return parse_optional


def _shown(value: Any) -> str:
    """A value as an error message quotes it: whole when short, cut when absurdly long."""
    text = repr(value)
    return text if len(text) <= 80 else f"{text[:60]}... ({len(text)} characters)"


def _node_name(value: Any) -> str:
    """A node label value: printable (no newline or control character), at most 253 characters."""
    text = _text(value)
    if len(text) > 253 or not text.isprintable():
        raise ValueError
    return text


def _text(value: Any) -> str:
    if not isinstance(value, str | int) or isinstance(value, bool) or not str(value).strip():
        raise ValueError
    return str(value).strip()


def _gpu_model(value: Any) -> str:
    model = model_by_name(str(value))
    if model is None:
        raise ValueError
    return model.name


def _regex(value: Any) -> str:
    text = str(value)
    try:
        re.compile(text)
    except re.error:
        raise ValueError from None
    return text


def _rails(value: Any) -> dict[int, tuple[str, str]]:
    """'0=mlx5_0,1=mlx5_1:1' -> {0: ('mlx5_0', '1'), 1: ('mlx5_1', '1')} (port 1 when omitted)."""
    rails: dict[int, tuple[str, str]] = {}
    for pair in str(value).split(","):
        gpu, sep, nic = pair.strip().partition("=")
        device, _, port = nic.strip().partition(":")
        if not sep or not gpu.strip().isdigit() or not device or not (port or "1").isdigit():
            raise ValueError
        rails[int(gpu)] = (device, port or "1")
    return rails


_SIZE_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "kib": 2**10, "mib": 2**20, "gib": 2**30}


def _size(low: int, high: int) -> Parser:
    """Bytes as an integer or with a unit: 268435456, '256MiB', '1GB'."""

    def parse(value: Any) -> int:
        if isinstance(value, bool):
            raise ValueError
        match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmg]i?b|b)?\s*", str(value), re.IGNORECASE)
        if match is None:
            raise ValueError
        number = int(float(match.group(1)) * _SIZE_UNITS[(match.group(2) or "").lower()])
        if not low <= number <= high:
            raise ValueError
        return number

    return parse


def _http_url(value: Any) -> str:
    text = str(value).strip().rstrip("/")
    if not re.fullmatch(r"https?://[^\s/?#]+(/[^\s?#]*)?", text):
        raise ValueError
    return text


#: Keys only the environment (or the file the *_file key names) may set: never a config file that
#: others can read, never a flag that `ps` shows; --print-config masks them.
SECRET_KEYS = {"influx.token": "set FLOPWATCH_INFLUX_TOKEN or influx.token_file instead"}


def parse_listen(value: Any) -> tuple[str, int]:
    """'HOST:PORT', ':PORT' or '[v6]:PORT' -> (host, port); port 0 picks a free port."""
    text = str(value).strip()
    host, sep, port_text = text.rpartition(":")
    if not sep or not port_text.isdigit():
        raise ValueError
    port = int(port_text)
    if not 0 <= port <= 65535:
        raise ValueError
    host = host.strip("[]") or "0.0.0.0"
    return host, port


FIELDS: dict[str, Field] = {
    "node": Field(_node_name, None, "a node name, printable, up to 253 characters (default: this host's name)"),
    "listen": Field(parse_listen, f"0.0.0.0:{DEFAULT_PORT}", "HOST:PORT, e.g. 127.0.0.1:9847"),
    "web_config": Field(_optional(_text), None,
                        "a web config file (exporter-toolkit format: TLS certificate and key, client CA, "
                        "basic-auth users with bcrypt hashes), e.g. /etc/flopwatch/web.yml; docs/operations.md"),
    "interval": Field(_number(1, 3600), 5.0, "seconds between collections, 1 to 3600"),
    "backend": Field(_choice("auto", "nvml", "dcgm", "sim"), "auto", "one of auto, nvml, dcgm, sim"),
    "log_level": Field(_choice("debug", "info", "warning", "error"), "info",
                       "one of debug, info, warning, error"),
    "gpu.peak_flops": Field(_optional(_number(1e9, 1e17)), None,
                            "dense peak FLOP/s per GPU for unknown models, e.g. 989.4e12"),
    "gpu.dtype": Field(_choice(*DTYPES), "bf16", f"one of {', '.join(DTYPES)}"),
    "gpu.nvlink_per_link": Field(parse_boolean, True, "true or false"),
    "gpu.timeout": Field(_number(0.05, 60), 2.0, "seconds one GPU's read may take, 0.05 to 60"),
    "gpu.dcgm_host": Field(_text, "127.0.0.1", "the nv-hostengine address, e.g. 127.0.0.1"),
    "sim.gpus": Field(_integer(1, 64), 8, "GPUs on the simulated node, 1 to 64"),
    "sim.model": Field(_gpu_model, "H100-SXM", f"one of {', '.join(known_names())}"),
    "sim.seed": Field(_integer(0, 2**32 - 1), 0, "an integer seed"),
    "train.socket": Field(_optional(_text), None,
                          "a Unix socket path (default /run/flopwatch/steps.sock, or a per-user path "
                          "when that directory is not writable)"),
    "train.socket_group": Field(_optional(_text), None, "a group name or id allowed to send step events"),
    "train.max_jobs": Field(_integer(1, 10_000), 64, "training jobs tracked at once, 1 to 10000"),
    "train.max_ranks": Field(_integer(1, 100_000), 1024, "ranks tracked at once on this node, 1 to 100000"),
    "train.expiry": Field(_number(10, 86_400), 300.0,
                          "seconds after a rank's last event before its series go, 10 to 86400"),
    "nic.sysfs_root": Field(_text, "/sys", "the sysfs root holding class/infiniband and class/net, e.g. /sys"),
    "nic.net_exclude": Field(_regex, DEFAULT_NET_EXCLUDE,
                             "a regular expression of Ethernet interface names to skip (full match)"),
    "host.procfs_root": Field(_text, "/proc", "the procfs root, e.g. /proc (or /host/proc in a container)"),
    "host.sysfs_root": Field(_optional(_text), None, "the sysfs root for NUMA layout (default: nic.sysfs_root)"),
    "attribution.mapping_dir": Field(_optional(_text), "/run/flopwatch/gpu-jobs",
                                     "the Slurm prolog/epilog GPU-to-job mapping directory, or none"),
    "attribution.procfs_root": Field(_optional(_text), "/proc",
                                     "the procfs root for process environments, or none to skip them"),
    "attribution.kubelet_socket": Field(_optional(_text), None,
                                        "the kubelet pod-resources socket, e.g. "
                                        "/var/lib/kubelet/pod-resources/kubelet.sock (off by default)"),
    "attribution.nic_rails": Field(_optional(_rails), None,
                                   "GPU=DEVICE[:PORT] pairs naming each GPU's NIC rail, e.g. 0=mlx5_0,1=mlx5_1"),
    "topology.slurm": Field(_optional(_text), None,
                            "Slurm's topology.conf (tree or block syntax), e.g. /etc/slurm/topology.conf, or none"),
    "topology.rails": Field(_optional(_text), None,
                            "a rails YAML naming each NIC's leaf and each leaf's spines, e.g. "
                            "/etc/flopwatch/rails.yml (docs/network-and-attribution.md), or none"),
    "collectors.gpu": Field(parse_boolean, True, "true or false"),
    "collectors.nic": Field(parse_boolean, True, "true or false (InfiniBand, RoCE and Ethernet from sysfs)"),
    "collectors.host": Field(parse_boolean, True, "true or false (CPU per NUMA node, memory, PSI)"),
    "collectors.attribution": Field(parse_boolean, True, "true or false (flopwatch_gpu_job_info)"),
    "collectors.train": Field(parse_boolean, False, "true or false (the training-step intake socket)"),
    "influx.url": Field(_optional(_http_url), None,
                        "an InfluxDB v2 write API base URL, e.g. http://influxdb:8086 (unset: no sink)"),
    "influx.org": Field(_text, "flopwatch", "the organization name or ID to write to"),
    "influx.bucket": Field(_text, "flopwatch", "the bucket to write to"),
    "influx.token": Field(_optional(_text), None, "an API token; environment only (FLOPWATCH_INFLUX_TOKEN)"),
    "influx.token_file": Field(_optional(_text), None, "a file holding the API token, e.g. /run/secrets/influx"),
    "influx.batch_size": Field(_integer(1, 100_000), 5000, "points per write request, 1 to 100000"),
    "influx.flush_interval": Field(_number(0.1, 60), 1.0,
                                   "seconds a partial batch waits before it is written, 0.1 to 60"),
    "influx.buffer_dir": Field(_optional(_text), "/var/lib/flopwatch/influx",
                               "directory for the outage buffer, or none to buffer in memory only"),
    "influx.buffer_max_bytes": Field(_size(2**20, 2**40), 256 * 2**20,
                                     "bytes of buffered points kept during an outage, e.g. 256MiB (1MiB to "
                                     "1TiB); the oldest go first"),
    "influx.gzip": Field(parse_boolean, True, "true or false (gzip request bodies)"),
}


@dataclass(frozen=True)
class GpuOptions:
    peak_flops: float | None
    dtype: str
    nvlink_per_link: bool
    timeout: float
    dcgm_host: str


@dataclass(frozen=True)
class SimOptions:
    gpus: int
    model: str
    seed: int


@dataclass(frozen=True)
class TrainOptions:
    socket: str
    socket_group: str | None
    max_jobs: int
    max_ranks: int
    expiry: float


@dataclass(frozen=True)
class NicOptions:
    sysfs_root: str = "/sys"
    net_exclude: str = DEFAULT_NET_EXCLUDE


@dataclass(frozen=True)
class HostOptions:
    procfs_root: str = "/proc"
    sysfs_root: str | None = None  # None: nic.sysfs_root


@dataclass(frozen=True)
class AttributionOptions:
    mapping_dir: str | None = "/run/flopwatch/gpu-jobs"
    procfs_root: str | None = "/proc"
    kubelet_socket: str | None = None
    nic_rails: dict[int, tuple[str, str]] | None = None


@dataclass(frozen=True)
class TopologyOptions:
    slurm: str | None = None
    rails: str | None = None


@dataclass(frozen=True)
class InfluxOptions:
    url: str | None = None
    org: str = "flopwatch"
    bucket: str = "flopwatch"
    token: str | None = field(default=None, repr=False)  # a secret: never logged or printed
    token_file: str | None = None
    batch_size: int = 5000
    flush_interval: float = 1.0
    buffer_dir: str | None = "/var/lib/flopwatch/influx"
    buffer_max_bytes: int = 256 * 2**20
    gzip: bool = True


@dataclass(frozen=True)
class AgentConfig:
    node: str
    listen: tuple[str, int]
    interval: float
    backend: str
    log_level: str
    gpu: GpuOptions
    sim: SimOptions
    collectors: dict[str, bool]
    nic: NicOptions = NicOptions()
    host: HostOptions = HostOptions()
    attribution: AttributionOptions = AttributionOptions()
    train: TrainOptions = TrainOptions(default_socket_path(), None, 64, 1024, 300.0)
    influx: InfluxOptions = InfluxOptions()
    web_config: str | None = None
    topology: TopologyOptions = TopologyOptions()

    @property
    def values(self) -> dict[str, Any]:
        """Flat `section.key` view, for `flopwatch agent --print-config`."""
        flat: dict[str, Any] = {}
        for key in FIELDS:
            section, _, name = key.partition(".")
            if key == "listen":
                host, port = self.listen
                flat[key] = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
            elif not name:
                flat[key] = getattr(self, key)
            elif key in SECRET_KEYS:
                flat[key] = None if getattr(self.influx, name) is None else "(set)"
            elif section == "collectors":
                flat[key] = self.collectors[name]
            else:
                flat[key] = getattr(getattr(self, section), name)
        return flat


MAX_FILE_KEYS = 1000       # flattened keys; also stops YAML alias bombs before they expand


def _flatten(data: Mapping[str, Any], prefix: str = "", flat: dict[str, Any] | None = None) -> dict[str, Any]:
    flat = {} if flat is None else flat
    for key, value in data.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, Mapping):
            _flatten(value, dotted + ".", flat)
        else:
            flat[dotted] = value
        if len(flat) > MAX_FILE_KEYS:
            raise ValueError(f"more than {MAX_FILE_KEYS} settings (nested too deep, or repeated through YAML aliases)")
    return flat


def read_text_file(path: Path, what: str = "config file") -> str:
    """The text of a small UTF-8 file (a config); one-line ConfigError when it cannot be one."""
    try:
        return yamlfile.read_text(path, what)
    except yamlfile.YamlFileError as error:
        raise ConfigError(str(error)) from None


def env_name(key: str) -> str:
    return ENV_PREFIX + key.upper().replace(".", "_")


def _read_file(path: Path) -> dict[str, Any]:
    try:
        data = yamlfile.load(path, "config file") or {}
    except yamlfile.YamlFileError as error:
        raise ConfigError(str(error)) from None
    if not isinstance(data, Mapping):
        raise ConfigError(f"config file {path}: expected a mapping of keys to values at the top")
    try:
        return _flatten(data)
    except ValueError as error:
        raise ConfigError(f"config file {path}: {error}") from None


def load(
    path: str | Path | None = None,
    overrides: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> AgentConfig:
    """Merge defaults < file < environment < overrides (flags) and validate every key."""
    environ = os.environ if environ is None else environ
    raw: dict[str, tuple[Any, str]] = {key: (field.default, "default") for key, field in FIELDS.items()}
    if path is not None:
        for key, value in _read_file(Path(path)).items():
            if key not in FIELDS:
                raise ConfigError(f"config file {path}: unknown key {key!r} (known: {', '.join(FIELDS)})")
            if key in SECRET_KEYS:
                raise ConfigError(f"config file {path}: {key} must not be written in a config file; "
                                  f"{SECRET_KEYS[key]}")
            raw[key] = (value, f"config file {path}")
    for key in FIELDS:
        if env_name(key) in environ:
            raw[key] = (environ[env_name(key)], f"environment {env_name(key)}")
    for key, value in (overrides or {}).items():
        if key not in FIELDS:
            raise ConfigError(f"unknown setting {key!r}")
        if key in SECRET_KEYS and value is not None:
            raise ConfigError(f"{key} cannot be given on the command line; {SECRET_KEYS[key]}")
        if value is not None:
            raw[key] = (value, "command line")
    parsed: dict[str, Any] = {}
    for key, (value, source) in raw.items():
        field = FIELDS[key]
        if value is None and field.default is None:
            parsed[key] = None
            continue
        try:
            parsed[key] = field.parse(value)
        except (ValueError, TypeError):
            shown = "(secret)" if key in SECRET_KEYS else _shown(value)
            raise ConfigError(f"{key} = {shown} ({source}): expected {field.expected}") from None
    return AgentConfig(
        node=parsed["node"] or socket.gethostname(),
        listen=parsed["listen"],
        web_config=parsed["web_config"],
        interval=parsed["interval"],
        backend=parsed["backend"],
        log_level=parsed["log_level"],
        gpu=GpuOptions(**_section(parsed, "gpu")),
        sim=SimOptions(**_section(parsed, "sim")),
        collectors=_section(parsed, "collectors"),
        nic=NicOptions(**_section(parsed, "nic")),
        host=HostOptions(**_section(parsed, "host")),
        attribution=AttributionOptions(**_section(parsed, "attribution")),
        influx=InfluxOptions(**_section(parsed, "influx")),
        topology=TopologyOptions(**_section(parsed, "topology")),
        train=TrainOptions(**{**_section(parsed, "train"),
                              "socket": parsed["train.socket"] or default_socket_path(environ)}),
    )


def _section(parsed: Mapping[str, Any], section: str) -> dict[str, Any]:
    prefix = section + "."
    return {key[len(prefix):]: value for key, value in parsed.items() if key.startswith(prefix)}

"""The servers FlopWatch runs for its demo and tests, each configured for fast loopback use."""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from flopwatch import resources, yamlfile
from flopwatch.stack import releases
from flopwatch.stack.process import ServerProcess, free_port

#: The external label that tells a Prometheus HA pair's replicas apart (dropped from their alerts).
REPLICA_LABEL = "replica"


def scrape_job(name: str, targets: Sequence[str], metrics_path: str = "/metrics",
               interval: str | None = None, **extra: Any) -> dict[str, Any]:
    """A static scrape config for `targets` ("host:port")."""
    job: dict[str, Any] = {"job_name": name, "metrics_path": metrics_path,
                           "static_configs": [{"targets": list(targets)}]}
    if interval:
        job["scrape_interval"] = interval
    job.update(extra)
    return job


class ReleasedServer(ServerProcess):
    """A server whose binary comes from the release in use (flopwatch.stack.releases): Debian's
    package or the current upstream build."""

    program = ""

    def __init__(self, port: int | None = None, workdir: Path | None = None, *,
                 extra_args: Sequence[str] = ()) -> None:
        self.release = releases.current()           # fixed when made: a server never changes build
        super().__init__(port, workdir, extra_args=extra_args)

    def command(self) -> list[str]:
        return [releases.binary(self.program, self.release)]

    @property
    def upstream(self) -> bool:
        """True on the current upstream build (flags and defaults that Debian's older one lacks)."""
        return self.release == "current"


class Prometheus(ReleasedServer):
    """prometheus (Debian package `prometheus`, or Prometheus 3 built from its module), with
    optional rules and Alertmanager. A `replica` is one server of an HA pair (see ha_pair())."""

    binary = "prometheus"
    program = "prometheus"
    package = "prometheus"
    ready_path = "/-/ready"

    def __init__(self, scrape_configs: Sequence[dict[str, Any]] = (), *,
                 rule_files: Sequence[str | Path] = (), alertmanagers: Sequence[str] = (),
                 scrape_interval: str = "1s", evaluation_interval: str = "1s",
                 external_labels: dict[str, str] | None = None, replica: str | None = None,
                 remote_write: Sequence[dict[str, Any]] = (), extra_args: Sequence[str] = (),
                 remote_write_receiver: bool = False, out_of_order_window: str | None = None,
                 port: int | None = None, workdir: Path | None = None) -> None:
        super().__init__(port, workdir, extra_args=extra_args)
        self.config: dict[str, Any] = {
            "global": {"scrape_interval": scrape_interval, "evaluation_interval": evaluation_interval,
                       "scrape_timeout": scrape_interval},
            "scrape_configs": list(scrape_configs),
        }
        if replica is not None:     # the pair's servers differ in this label only ...
            external_labels = {**(external_labels or {}), REPLICA_LABEL: replica}
        if external_labels:
            self.config["global"]["external_labels"] = external_labels
        if rule_files:
            self.config["rule_files"] = [str(Path(path).resolve()) for path in rule_files]
        if alertmanagers:
            self.config["alerting"] = {"alertmanagers": [{"static_configs": [
                {"targets": [url.removeprefix("http://") for url in alertmanagers]}]}]}
            if replica is not None:  # ... which their alerts leave out: to Alertmanager both send one alert
                self.config["alerting"]["alert_relabel_configs"] = [{"regex": REPLICA_LABEL, "action": "labeldrop"}]
        if remote_write:
            self.config["remote_write"] = list(remote_write)
        if out_of_order_window:
            self.config["storage"] = {"tsdb": {"out_of_order_time_window": out_of_order_window}}
        if alertmanagers:
            self.extra_args.append("--rules.alert.resend-delay=1s")
        if remote_write_receiver:
            self.extra_args.append("--web.enable-remote-write-receiver")
        if remote_write:
            self.extra_args.append("--storage.remote.flush-deadline=2s")

    @classmethod
    def from_config(cls, config: dict[str, Any], *, extra_args: Sequence[str] = (), port: int | None = None,
                    workdir: Path | None = None) -> Prometheus:
        """A server (not started) running a whole prometheus.yml as given (the sharded layout's,
        flopwatch.mixin.tiers.prometheus_config), with the same loopback flags as __init__ adds
        for what the config does: alerts resent every second, remote write flushed on stop."""
        server = cls(extra_args=extra_args, port=port, workdir=workdir)
        server.config = dict(config)
        if config.get("alerting"):
            server.extra_args.append("--rules.alert.resend-delay=1s")
        if config.get("remote_write"):
            server.extra_args.append("--storage.remote.flush-deadline=2s")
        return server

    @property
    def config_path(self) -> Path:
        return self.workdir / "prometheus.yml"

    def prepare(self) -> None:
        self.config_path.write_text(yaml.safe_dump(self.config, sort_keys=False))

    def args(self) -> list[str]:
        return [
            f"--config.file={self.config_path}", f"--storage.tsdb.path={self.workdir / 'data'}",
            f"--web.listen-address={self.host}:{self.port}", "--web.enable-lifecycle",
            "--log.level=warn", *self.extra_args,
        ]

    def reload(self) -> None:
        """Re-read the config (after editing `config` in place) through the lifecycle API."""
        self.prepare()
        request = urllib.request.Request(self.url + "/-/reload", method="POST")
        with urllib.request.urlopen(request, timeout=10):
            pass


def ha_pair(scrape_configs: Sequence[dict[str, Any]], *, cluster: str, alertmanagers: Sequence[str],
            replicas: Sequence[str] = ("a", "b"), **options: Any) -> list[Prometheus]:
    """One shard as an HA pair (not started): identical Prometheus servers (same targets, rules and
    options) labelled `cluster` and each its own `replica`, every one sending to every Alertmanager
    of the cluster. Alertmanager sees one alert per rule and series and pages once; losing either
    server loses no page."""
    labels = {"cluster": cluster, **options.pop("external_labels", {})}
    return [Prometheus(scrape_configs, alertmanagers=alertmanagers, replica=replica, external_labels=labels,
                       **options) for replica in replicas]


def alertmanager_config(webhook_url: str) -> dict[str, Any]:
    """FlopWatch's alertmanager.yml (routes, inhibitions, templates) with every receiver's
    integrations replaced by the local webhook, so nothing leaves the machine, and waits cut to
    seconds. A missing config is an error (resources.MissingResource), not a quiet stand-in."""
    path = resources.file("alerts", "alertmanager.yml")
    config = yamlfile.load(path, "Alertmanager config")
    config["templates"] = [str(path.parent / pattern) for pattern in config.get("templates", [])]
    for receiver in config["receivers"]:
        for key in [key for key in receiver if key.endswith("_configs")]:
            del receiver[key]
        receiver["webhook_configs"] = [{"url": webhook_url, "send_resolved": True}]
    routes = [config["route"]]
    while routes:
        route = routes.pop()
        route.update(group_wait="1s", group_interval="5s")
        routes.extend(route.get("routes", []))
    return config


def rfc3339(unix: float) -> str:
    """A unix time as Alertmanager's API writes times (UTC, milliseconds)."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(unix)) + f".{int(unix % 1 * 1000):03d}Z"


class Alertmanager(ReleasedServer):
    """prometheus-alertmanager (Debian package `prometheus-alertmanager`, or the current release
    built from its module): on its own with gossip disabled, or one member of a cluster when given
    `peers` (see cluster()).

    Clustered members gossip the notification log and silences, and before sending a group's
    notification the member at position k (members sorted by name) waits k x `peer_timeout` and
    skips what another member already logged: one notification per group when the cluster is
    whole, and at least one while any member lives. The gossip timings here are cut for loopback
    tests; every cluster flag used means the same in 0.25 and the current release."""

    binary = "prometheus-alertmanager"
    program = "alertmanager"
    package = "prometheus-alertmanager"
    ready_path = "/-/ready"

    def __init__(self, config: dict[str, Any] | str, *, peers: Sequence[str] | None = None,
                 cluster_port: int | None = None, peer_timeout: str = "2s", port: int | None = None,
                 workdir: Path | None = None) -> None:
        super().__init__(port, workdir)
        self.config_text = config if isinstance(config, str) else yaml.safe_dump(config, sort_keys=False)
        self.peers = None if peers is None else list(peers)   # None: gossip disabled
        self.cluster_port = cluster_port or (free_port() if peers is not None else None)
        self.peer_timeout = peer_timeout

    @classmethod
    def cluster(cls, config: dict[str, Any] | str, size: int = 2, *, peer_timeout: str = "2s",
                workdirs: Sequence[Path] | None = None) -> list[Alertmanager]:
        """`size` members (not started) with the same config, each naming every other as a peer;
        each in its own folder of `workdirs` when given (else a temporary one)."""
        ports = [free_port() for _ in range(size)]
        folders = list(workdirs) if workdirs is not None else [None] * size
        if len(folders) != size:
            raise ValueError(f"{size} Alertmanagers need {size} folders, not {len(folders)}")
        return [cls(config, peers=[f"127.0.0.1:{other}" for other in ports if other != own],
                    cluster_port=own, peer_timeout=peer_timeout, workdir=folder)
                for own, folder in zip(ports, folders, strict=True)]

    @property
    def cluster_address(self) -> str | None:
        """host:port of its gossip listener (TCP and UDP), None when gossip is disabled."""
        return None if self.cluster_port is None else f"{self.host}:{self.cluster_port}"

    @property
    def config_path(self) -> Path:
        return self.workdir / "alertmanager.yml"

    def prepare(self) -> None:
        self.config_path.write_text(self.config_text)

    def args(self) -> list[str]:
        return [
            f"--config.file={self.config_path}", f"--storage.path={self.workdir / 'data'}",
            f"--web.listen-address={self.host}:{self.port}", *self.cluster_args(), "--log.level=warn",
        ]

    def cluster_args(self) -> list[str]:
        """Gossip flags: an empty listen address disables it. On loopback the bind address is also
        the advertised one (no --cluster.advertise-address needed when every peer is local)."""
        if self.peers is None:
            return ["--cluster.listen-address="]
        return [
            f"--cluster.listen-address={self.cluster_address}",
            *(f"--cluster.peer={peer}" for peer in self.peers),
            f"--cluster.peer-timeout={self.peer_timeout}",
            "--cluster.gossip-interval=50ms", "--cluster.pushpull-interval=2s",
            "--cluster.probe-interval=200ms", "--cluster.probe-timeout=100ms",
            "--cluster.reconnect-interval=1s", "--cluster.settle-timeout=10s",
        ]

    def status(self) -> dict[str, Any]:
        """/api/v2/status: `cluster` holds `name` (this member), `status` and `peers`."""
        with urllib.request.urlopen(self.url + "/api/v2/status", timeout=10) as answer:
            return json.load(answer)

    def clustered(self, members: int) -> bool:
        """True once gossip has settled ("ready") with `members` members, itself included."""
        cluster = self.status()["cluster"]
        return cluster.get("status") == "ready" and len(cluster.get("peers") or []) == members

    def position(self) -> int:
        """Its place among the members it sees, sorted by name: it waits position x peer_timeout
        before sending a notification (0: sends at once)."""
        cluster = self.status()["cluster"]
        return sorted(peer["name"] for peer in cluster["peers"]).index(cluster["name"])

    def peer_update_messages(self) -> float:
        """Gossip updates received from peers (notification-log entries and silences): it rises
        once another member's notification reached this one's log."""
        with urllib.request.urlopen(self.url + "/metrics", timeout=10) as answer:
            lines = answer.read().decode().splitlines()
        prefix = 'alertmanager_cluster_messages_received_total{msg_type="update"} '
        return sum(float(line.removeprefix(prefix)) for line in lines if line.startswith(prefix))

    def post_alerts(self, alerts: Iterable[Mapping[str, Any]], ends_in_s: float = 600.0) -> None:
        """Post alerts as Prometheus's notifier does (POST /api/v2/alerts): each a mapping with
        `labels` and optionally `annotations`, and `startsAt`/`endsAt` in unix seconds (by default
        a second ago and `ends_in_s` from now; an `endsAt` of now resolves it)."""
        now = time.time()
        body = [{**alert, "startsAt": rfc3339(alert.get("startsAt", now - 1)),
                 "endsAt": rfc3339(alert.get("endsAt", now + ends_in_s))} for alert in alerts]
        request = urllib.request.Request(self.url + "/api/v2/alerts", json.dumps(body).encode(),
                                         {"Content-Type": "application/json"}, method="POST")
        with urllib.request.urlopen(request, timeout=10):
            pass

    def alerts(self) -> list[dict[str, Any]]:
        """The alerts it holds (/api/v2/alerts), each once however many Prometheus replicas sent it."""
        with urllib.request.urlopen(self.url + "/api/v2/alerts", timeout=10) as answer:
            return json.load(answer)


class VictoriaMetrics(ReleasedServer):
    """victoria-metrics single node (Debian package `victoria-metrics` 1.79, or the current release:
    every flag below means the same in both). What was written is visible to queries at once
    (`-search.latencyOffset=0s`, not 30 s), so tests and vmalert read back without waiting."""

    binary = "victoria-metrics"
    program = "victoria-metrics"
    package = "victoria-metrics"
    ready_path = "/health"

    def __init__(self, port: int | None = None, workdir: Path | None = None, *, extra_args: Sequence[str] = (),
                 dedup_interval: str | None = None) -> None:
        super().__init__(port, workdir, extra_args=extra_args)
        #: -dedup.minScrapeInterval: one sample per series and interval is kept, so the identical
        #: series an HA pair's two replicas write count once (the global tier's store).
        self.dedup_interval = dedup_interval

    def args(self) -> list[str]:
        return [
            f"-httpListenAddr={self.host}:{self.port}", f"-storageDataPath={self.workdir / 'data'}",
            "-retentionPeriod=100y", "-search.latencyOffset=0s", "-loggerLevel=WARN",
            *([f"-dedup.minScrapeInterval={self.dedup_interval}"] if self.dedup_interval else []), *self.extra_args,
        ]

    def flush(self) -> None:
        """Make every row written so far searchable now (/internal/force_flush, both releases):
        otherwise rows wait a second or two in memory, and a query that looks for a new series
        before then can keep missing it for about 10 s (the store caches what a search found)."""
        with urllib.request.urlopen(self.url + "/internal/force_flush", timeout=10):
            pass


class VmAlert(ReleasedServer):
    """vmalert (Debian package `victoria-metrics` 1.79, or the current release): evaluates
    Prometheus rule files against a datasource speaking the Prometheus query API and writes results
    back through remote write. Rule files with alerting rules need an Alertmanager (`notifiers`), as
    vmalert refuses to start without one.

    vmalert 1.95 and later evaluate 30 s in the past by default (`-rule.evalDelay`, meant to equal
    the datasource's `-search.latencyOffset`); FlopWatch's VictoriaMetrics shows data at once, so
    the current release is told 0 s, which is what 1.79 does without the flag (it has none)."""

    binary = "vmalert"
    program = "vmalert"
    package = "victoria-metrics"
    ready_path = "/health"

    def __init__(self, rule_files: Sequence[str | Path], datasource_url: str, *, remote_write_url: str | None = None,
                 notifiers: Sequence[str] = (), evaluation_interval: str = "5s",
                 external_labels: dict[str, str] | None = None, extra_args: Sequence[str] = (),
                 port: int | None = None, workdir: Path | None = None) -> None:
        super().__init__(port, workdir, extra_args=extra_args)
        self.rule_files = [str(Path(path).resolve()) for path in rule_files]
        self.datasource_url = datasource_url
        self.remote_write_url = remote_write_url or datasource_url
        self.notifiers = list(notifiers)
        self.evaluation_interval = evaluation_interval
        self.external_labels = dict(external_labels or {})
        self.given_args: list[str] | None = None   # from_args(): the whole configuration as flags
        self.eval_delay = "0s"                      # -rule.evalDelay on the current release

    @classmethod
    def from_args(cls, args: Sequence[str], *, evaluation_interval: str = "5s", eval_delay: str = "0s",
                  port: int | None = None, workdir: Path | None = None) -> VmAlert:
        """A vmalert (not started) on the datasource, remote write, notifiers and rules that `args`
        name (the sharded layout's, flopwatch.mixin.tiers.vmalert_args), with the loopback flags
        args() adds: its own listen address, writes flushed every second, and on the current
        release an evaluation `eval_delay` in the past (the time remote-written samples take to
        arrive: evaluated sooner, every window would miss its newest seconds)."""
        server = cls([], "", evaluation_interval=evaluation_interval, port=port, workdir=workdir)
        server.given_args = list(args)
        server.eval_delay = eval_delay
        return server

    def args(self) -> list[str]:
        loopback = [f"-httpListenAddr={self.host}:{self.port}", "-remoteWrite.flushInterval=1s",
                    f"-evaluationInterval={self.evaluation_interval}", "-loggerLevel=WARN",
                    *([f"-rule.evalDelay={self.eval_delay}"] if self.upstream else [])]
        if self.given_args is not None:
            return [*loopback, *self.given_args, *self.extra_args]
        return [
            *loopback, f"-datasource.url={self.datasource_url}", f"-remoteWrite.url={self.remote_write_url}",
            *(f"-rule={path}" for path in self.rule_files),
            *(f"-notifier.url={url}" for url in self.notifiers),
            *(f"-external.label={name}={value}" for name, value in self.external_labels.items()),
            *self.extra_args,
        ]

    def rules(self) -> list[dict[str, Any]]:
        """Every rule vmalert runs, as /api/v1/rules describes it (`group` added): name, type,
        lastError and lastEvaluation in both releases; keep_firing_for only in the current one."""
        with urllib.request.urlopen(self.url + "/api/v1/rules", timeout=10) as answer:
            groups = json.load(answer)["data"]["groups"]
        return [{**rule, "group": group["name"]} for group in groups for rule in group["rules"]]

    def rule_errors(self) -> dict[str, str]:
        """Each rule whose last evaluation failed ("group/rule") -> vmalert's error, read from the API
        because the per-rule metrics were renamed (1.79's `vmalert_*_rules_error` gauges are
        `vmalert_*_rules_errors_total` counters in the current release)."""
        return {f"{rule['group']}/{rule['name']}": rule["lastError"] for rule in self.rules() if rule.get("lastError")}

    def failed_executions(self) -> float:
        """Rule evaluations that failed since vmalert started (`vmalert_execution_errors_total`, the
        same counter in both releases): a rule that failed once and then recovered counts here."""
        with urllib.request.urlopen(self.url + "/metrics", timeout=10) as answer:
            lines = answer.read().decode().splitlines()
        name = "vmalert_execution_errors_total"
        counted = [float(line.split()[1]) for line in lines if line.split(" ", 1)[0] == name]
        if not counted:
            raise LookupError(f"{self.url}/metrics has no {name}")
        return counted[0]


class NodeExporter(ServerProcess):
    """prometheus-node-exporter (Debian package `prometheus-node-exporter`)."""

    binary = "prometheus-node-exporter"
    package = "prometheus-node-exporter"
    ready_path = "/metrics"

    def args(self) -> list[str]:
        return [f"--web.listen-address={self.host}:{self.port}", "--log.level=warn", *self.extra_args]

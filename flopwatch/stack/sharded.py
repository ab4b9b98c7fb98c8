"""The two-tier layout (shards judge ranks, the global tier judges jobs) on loopback, from one
settings object: what `flopwatch demo --shards` runs and the tests of the tiers start.

- Each shard is identical Prometheus replicas (an HA pair by default) scraping the shard's targets
  and evaluating the shard rule set; alerts go to every Alertmanager without the replica label, and
  the series the global rules read are remote-written to the global tier (flopwatch.mixin.tiers).
- The global tier is single-node VictoriaMetrics (deduplicating the replicas' identical series at the
  scrape interval) behind the cluster's URL paths (vm_paths.ClusterPaths, a stand-in for vminsert
  and vmselect, whose `-cluster` builds cannot be fetched here), and vmalert evaluating the global
  rule set over it.
- An Alertmanager cluster (gossip) routes everything to one receiver (the shipped alertmanager.yml,
  servers.alertmanager_config).
- Optionally a reference: one Prometheus scraping every target with the single-Prometheus rule
  files built from the same settings, the truth the tiers are compared with.

Ports are chosen when the stack is made, so `settings.topology` (filled here) names the real URLs
before anything starts, and the rule files are written then too. Servers start in parallel where
nothing waits on another; stop() stops whatever runs, also after a partial start.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Self
from urllib.parse import urlsplit

from flopwatch.mixin import build, tiers
from flopwatch.mixin.config import MixinConfig
from flopwatch.mixin.topology import AlertmanagerPeer, GlobalTier, Shard, Topology
from flopwatch.stack.process import ServerProcess
from flopwatch.stack.servers import (
    Alertmanager,
    Prometheus,
    VictoriaMetrics,
    VmAlert,
    alertmanager_config,
)
from flopwatch.stack.vm_paths import ClusterPaths
from flopwatch.stack.vmalert_rules import vmalert_rules

#: A target of a shard: "host:port", "http://host:port/metrics/path", or a file_sd target group
#: ({"targets": [...], "labels": {...}}, as FleetServer.targets() lists them).
Target = str | Mapping[str, Any]
#: Seconds for the Alertmanager members to find each other (gossip settled with every member).
CLUSTER_SETTLE_S = 30.0
#: How far in the past the global vmalert evaluates: production vmalert's default, which matches
#: VictoriaMetrics' default -search.latencyOffset. It must exceed the shards' remote-write lag
#: (a batch at most 5 s late, tiers.QUEUE_CONFIG's batch_send_deadline, more on a loaded machine):
#: a goodput tile (a difference over 15 s) evaluated before its newest samples arrived reads short,
#: and the next tile starts from the complete sample, so the time is lost, not deferred. At 10 s,
#: a loaded 2-core machine read a job's ETTR 0.6 pp under the reference's for over 5 minutes.
GLOBAL_EVAL_DELAY = "30s"


def target_group(target: Target) -> dict[str, Any]:
    """One file_sd target group for a shard's target."""
    if not isinstance(target, str):
        return {"targets": list(target["targets"]), "labels": dict(target.get("labels") or {})}
    parts = urlsplit(target if "://" in target else f"http://{target}")
    labels = {"__metrics_path__": parts.path} if parts.path not in ("", "/") else {}
    if parts.scheme == "https":
        labels["__scheme__"] = "https"
    return {"targets": [parts.netloc], "labels": labels}


def _write_rules(files: Mapping[str, str], folder: Path) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, text in sorted(files.items()):
        path = folder / name
        path.write_text(text, encoding="utf-8")
        paths.append(path.resolve())
    return paths


def _write_targets(targets: Sequence[Target], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps([target_group(target) for target in targets], indent=1))
    return path.resolve()


def _all(tasks: Sequence[Callable[[], object]]) -> None:
    """Run `tasks` at once and wait for every one; the first failure is raised after all ended."""
    if not tasks:
        return
    with ThreadPoolExecutor(max_workers=len(tasks)) as pool:
        futures = [pool.submit(task) for task in tasks]
    errors = [future.exception() for future in futures if future.exception() is not None]
    if errors:
        raise errors[0]


class ShardedStack:
    """Every server of the two-tier layout, made (ports chosen, topology filled, rule files written)
    but not started: start() starts it, stop() stops it."""

    def __init__(self, settings: MixinConfig, shard_targets: Mapping[str, Sequence[Target]], *, receiver_url: str,
                 workdir: Path, replicas: Sequence[str] = ("a", "b"), alertmanagers: int = 2,
                 reference: bool = False, evaluation_interval: str | None = None,
                 alertmanager: dict[str, Any] | None = None) -> None:
        """`shard_targets`: shard name -> its targets. `alertmanager`: the Alertmanager config
        (default: the shipped one routed to `receiver_url`)."""
        if not shard_targets:
            raise ValueError("a sharded stack needs at least one shard")
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.replicas = tuple(replicas)
        self.global_store = VictoriaMetrics(workdir=self._folder("global-store"),
                                            dedup_interval=settings.scrape_interval)
        self.paths = ClusterPaths(self.global_store.url)
        self.alertmanagers = Alertmanager.cluster(
            alertmanager or alertmanager_config(receiver_url), alertmanagers,
            workdirs=[self._folder(f"alertmanager-{index + 1}") for index in range(alertmanagers)])
        # The settings' own labels and cluster name (if they have a topology), the servers made here.
        given = settings.topology or Topology((), GlobalTier("", ""), ())
        self.settings = dataclasses.replace(settings, topology=dataclasses.replace(
            given, shards=tuple(Shard(name, self.replicas) for name in shard_targets),
            global_tier=GlobalTier(self.paths.insert_url, self.paths.select_url),
            alertmanagers=tuple(AlertmanagerPeer(member.url, str(member.cluster_address))
                                for member in self.alertmanagers)))
        rules = self.workdir / "rules"
        self.shard_rule_files = _write_rules(tiers.shard_rules(self.settings), rules / "shard")
        global_files = _write_rules(tiers.global_rules(self.settings), rules / "global")
        #: vmalert's copies of the global rules, less what its release refuses (`vmalert_removed`).
        self.vmalert_rule_files, self.vmalert_removed = vmalert_rules(global_files, rules / "vmalert")
        self.shards: dict[str, list[Prometheus]] = {
            name: self._shard(name, targets, evaluation_interval) for name, targets in shard_targets.items()}
        every = evaluation_interval or settings.scrape_interval
        self.vmalert = VmAlert.from_args(tiers.vmalert_args(self.settings, [str(p) for p in self.vmalert_rule_files]),
                                         evaluation_interval=every, eval_delay=GLOBAL_EVAL_DELAY,
                                         workdir=self._folder("vmalert"))
        self.reference: Prometheus | None = None
        if reference:
            single = {name: text for name, text in build.rules(settings).items() if tiers.RULE_FILE.match(name)}
            everything = [target for targets in shard_targets.values() for target in targets]
            job = self._scrape_job(next(iter(shard_targets)), _write_targets(everything, self.workdir / "targets"
                                                                              / "all.json"))
            self.reference = Prometheus([job], rule_files=_write_rules(single, rules / "single"),
                                        scrape_interval=settings.scrape_interval, evaluation_interval=every,
                                        workdir=self._folder("reference"))

    def _folder(self, name: str) -> Path:
        """A server's own folder (config, data, log) in the stack's, kept across kill and restart."""
        folder = self.workdir / name
        folder.mkdir(parents=True, exist_ok=True)
        return folder

    def _scrape_job(self, shard: str, targets_file: Path) -> dict[str, Any]:
        """tiers.scrape_job's job (its name follows selectors.agent) on an absolute targets file."""
        return {**tiers.scrape_job(self.settings, shard), "file_sd_configs": [{"files": [str(targets_file)]}]}

    def _shard(self, name: str, targets: Sequence[Target], evaluation_interval: str | None) -> list[Prometheus]:
        job = self._scrape_job(name, _write_targets(targets, self.workdir / "targets" / f"{name}.json"))
        rule_files = [str(path) for path in self.shard_rule_files]
        return [Prometheus.from_config(
                    tiers.prometheus_config(self.settings, name, replica, rule_files=rule_files, scrape_configs=[job],
                                            evaluation_interval=evaluation_interval),
                    workdir=self._folder(f"prometheus-{name}-{replica}"))
                for replica in self.replicas]

    # -- what runs ---------------------------------------------------------------------------------
    @property
    def global_url(self) -> str:
        """The global tier's query API base (vmselect's path): a PromClient's URL."""
        return self.paths.select_url

    @property
    def topology(self) -> Topology:
        assert self.settings.topology is not None
        return self.settings.topology

    def replica(self, shard: str, replica: str) -> Prometheus:
        """The Prometheus of `shard` labelled `replica`; KeyError naming what there is."""
        if shard not in self.shards or replica not in self.replicas:
            raise KeyError(f"no replica {replica!r} of shard {shard!r} (shards: {', '.join(self.shards)}; "
                           f"replicas: {', '.join(self.replicas)})")
        return self.shards[shard][self.replicas.index(replica)]

    def servers(self) -> list[ServerProcess]:
        """Every server process of the stack (the proxy is a thread, not a process)."""
        return [self.global_store, *self.alertmanagers, *self._writers()]

    def _writers(self) -> list[ServerProcess]:
        """The servers that evaluate rules (started after the global tier and the Alertmanagers they
        write and send to, stopped before them)."""
        return [*(server for replicas in self.shards.values() for server in replicas), self.vmalert,
                *([self.reference] if self.reference else [])]

    # -- lifecycle ---------------------------------------------------------------------------------
    def start(self) -> Self:
        """The global tier and the Alertmanagers first, then every shard replica, vmalert and the
        reference at once, while the Alertmanager cluster settles. ServerError (everything
        stopped) when a server does not come up."""
        try:
            _all([self.start_global, *(member.start for member in self.alertmanagers)])
            _all([*(server.start for server in self._writers()), self._settle])
        except BaseException:
            self.stop()
            raise
        return self

    def _settle(self) -> None:
        members = self.alertmanagers
        if len(members) > 1:
            members[0].wait_until(lambda: all(member.clustered(len(members)) for member in members), CLUSTER_SETTLE_S,
                                  f": the {len(members)} Alertmanagers did not settle into one cluster")

    def stop(self) -> None:
        """Stop every server and the proxy (what never started is skipped): the writers first, so
        their last remote writes and alerts still find the global tier and the Alertmanagers."""
        _all([server.stop for server in self._writers()])
        self.paths.stop()
        _all([server.stop for server in (self.global_store, *self.alertmanagers)])

    def stop_global(self) -> None:
        """The global tier down (proxy first, so writers see the outage at once; then the store),
        ports and data kept for start_global()."""
        self.paths.stop()
        self.global_store.stop()

    def start_global(self) -> None:
        """The global store and its proxy (up again on the same ports and data after stop_global())."""
        if self.global_store.proc is None:
            self.global_store.start()
        else:
            self.global_store.restart()
        self.paths.start()

    def kill_replica(self, shard: str, replica: str) -> None:
        """SIGKILL one Prometheus of a shard (its data kept: restart() brings it back)."""
        self.replica(shard, replica).kill()

    def kill_alertmanager(self, index: int) -> None:
        """SIGKILL one member of the Alertmanager cluster."""
        self.alertmanagers[index].kill()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

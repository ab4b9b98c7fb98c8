"""A real Slurm cluster on loopback: munged, slurmctld and one slurmd per node, from Debian's
packages (`munge`, `slurmctld`, `slurmd`, `slurm-client`: Slurm 22.05 on bookworm).

Every node runs its own `slurmd -N <name>` on its own port (Slurm's "multiple slurmd" layout:
`NodeName=... NodeHostname=<this host> NodeAddr=127.0.0.1 Port=<port>`), so `sinfo` shows as many
nodes as asked and jobs submitted with `sbatch -w <node>` run as ordinary processes on this
machine. munged gets its own key and socket (`AuthInfo=socket=`), so nothing of the machine's own
Slurm or MUNGE is used or touched. Clients (`sinfo`, `scontrol`, `sbatch`, ...) find the cluster
through `SLURM_CONF` in `env`.

The daemons run as the current user (`SlurmUser`/`SlurmdUser`); jobs run as that user too. Jobs
are cancelled before the daemons stop, and any job step left behind (slurmstepd starts its own
session, in the cluster's directory) is killed with them: nothing is left running.
"""

from __future__ import annotations

import contextlib
import getpass
import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Self

import psutil

from flopwatch.stack.process import ServerError, ServerProcess, free_port, require_binary

#: Client programs the cluster and its users call, and the Debian package of each.
CLIENTS = {"sinfo": "slurm-client", "scontrol": "slurm-client", "sbatch": "slurm-client",
           "squeue": "slurm-client", "scancel": "slurm-client"}
CLIENT_TIMEOUT_S = 15.0
#: What a node's GPUs are in gres.conf: slurmd refuses a File= that is not a character or block
#: device, and no GPU exists here, so each GPU is a link to one of these (one device per GPU).
STAND_IN_DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/urandom")


class _Daemon(ServerProcess):
    """One daemon of the cluster, logging into the cluster's directory; ready when `ready()` says."""

    def __init__(self, binary: str, package: str, argv: Sequence[str], workdir: Path, log_name: str,
                 ready: Callable[[_Daemon], bool], port: int | None = None) -> None:
        self.binary, self.package = binary, package
        super().__init__(port, workdir)
        self.log_path = workdir / log_name
        self._argv = list(argv)
        self._ready = ready

    def args(self) -> list[str]:
        return self._argv

    def wait_ready(self, timeout: float) -> None:
        self.wait_until(lambda: self._ready(self), timeout)

    def listening(self) -> bool:
        return self._owns_port()


def _port_outside_the_ephemeral_range(taken: set[int]) -> int:
    """A loopback port free now and below the kernel's ephemeral range: the daemons bind theirs one
    after another, seconds after the ports are chosen, and a port the kernel may hand to any
    outgoing connection in between (as free_port()'s are) was taken before slurmd bound it in 2 of 6
    starts of an 80-node cluster."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    candidates = list(range(max(1024, low - 12000), low))
    random.shuffle(candidates)
    for port in candidates:
        if port in taken:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
        taken.add(port)
        return port
    return free_port()


class SlurmCluster:
    """munged + slurmctld + one slurmd per node on 127.0.0.1, with one partition of every node.

    `topology`, when given, is a topology.conf text: Slurm loads it (topology/tree) and it is kept
    at `topology_path` for readers of the fabric. `gpus` gives every node a GRES of type gpu with
    that many devices: no GPU exists here, so each is a link to a character device standing in for
    it (gres.conf `AutoDetect=off`, `File=`), which is all Slurm needs to allocate and number them.
    `prolog` and `epilog` are scripts slurmd runs at each job's allocation (`PrologFlags=Alloc`) and
    end, as the job's node would."""

    def __init__(self, nodes: Sequence[str], *, partition: str = "gpu", topology: str | None = None,
                 workdir: Path | None = None, gpus: int = 0, prolog: Path | None = None,
                 epilog: Path | None = None) -> None:
        if not nodes:
            raise ValueError("a Slurm cluster needs at least one node")
        if gpus > len(STAND_IN_DEVICES):
            raise ValueError(f"at most {len(STAND_IN_DEVICES)} stand-in GPUs per node, not {gpus}")
        self.nodes = list(nodes)
        self.partition = partition
        self.topology = topology
        self.gpus, self.prolog, self.epilog = gpus, prolog, epilog
        self._own_dir = workdir is None
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="flopwatch-slurm-"))
        self.host = socket.gethostname().split(".")[0]
        taken: set[int] = set()
        self.ctld_port = _port_outside_the_ephemeral_range(taken)
        self.node_ports = {node: _port_outside_the_ephemeral_range(taken) for node in self.nodes}
        self.daemons: list[_Daemon] = []

    # -- paths and environment -------------------------------------------------------------------
    @property
    def conf_path(self) -> Path:
        return self.workdir / "slurm.conf"

    @property
    def topology_path(self) -> Path:
        return self.workdir / "topology.conf"

    @property
    def gres_path(self) -> Path:
        """gres.conf: Slurm reads it from slurm.conf's directory."""
        return self.workdir / "gres.conf"

    @property
    def munge_socket(self) -> Path:
        return self.workdir / "munge" / "munge.sock"

    @property
    def env(self) -> dict[str, str]:
        """The environment a Slurm client needs to reach this cluster (and only this one)."""
        return {**os.environ, "SLURM_CONF": str(self.conf_path)}

    def slurm_conf(self) -> str:
        user, work = getpass.getuser(), self.workdir
        lines = [
            "ClusterName=flopwatch", f"SlurmctldHost={self.host}(127.0.0.1)", f"SlurmctldPort={self.ctld_port}",
            f"SlurmdPort={next(iter(self.node_ports.values()))}", f"SlurmUser={user}", f"SlurmdUser={user}",
            "AuthType=auth/munge", "CredType=cred/munge", f"AuthInfo=socket={self.munge_socket}",
            f"StateSaveLocation={work}/state", f"SlurmdSpoolDir={work}/spool/%n",
            f"SlurmctldPidFile={work}/slurmctld.pid", f"SlurmdPidFile={work}/slurmd-%n.pid",
            f"SlurmctldLogFile={work}/slurmctld.log", f"SlurmdLogFile={work}/slurmd-%n.log",
            "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core", "SchedulerType=sched/builtin", "ReturnToService=2", "MpiDefault=none",
            "JobAcctGatherType=jobacct_gather/none", "AccountingStorageType=accounting_storage/none",
            "MailProg=/bin/true", "MessageTimeout=5", "SlurmdTimeout=60", "InactiveLimit=0", "KillWait=2",
            f"TopologyPlugin=topology/{'tree' if self.topology else 'none'}",
        ]
        if self.gpus:
            lines.append("GresTypes=gpu")
        if self.prolog:
            lines += [f"Prolog={self.prolog}", "PrologFlags=Alloc"]
        if self.epilog:
            lines.append(f"Epilog={self.epilog}")
        gres = f" Gres=gpu:{self.gpus}" if self.gpus else ""
        lines += [f"NodeName={node} NodeHostname={self.host} NodeAddr=127.0.0.1 Port={port} CPUs=1 "
                  f"RealMemory=100{gres} State=UNKNOWN" for node, port in self.node_ports.items()]
        lines.append(f"PartitionName={self.partition} Nodes=ALL Default=YES MaxTime=INFINITE State=UP")
        return "\n".join(lines) + "\n"

    # -- lifecycle -------------------------------------------------------------------------------
    def start(self, timeout: float = 30.0) -> Self:
        """Start every daemon and wait until sinfo shows every node idle."""
        for client, package in CLIENTS.items():
            require_binary(client, package)
        self._prepare()
        conf = str(self.conf_path)
        try:
            munge_dir = self.munge_socket.parent
            self._start(_Daemon("munged", "munge", [
                "-F", "-f", f"--socket={self.munge_socket}", f"--key-file={munge_dir / 'munge.key'}",
                f"--log-file={munge_dir / 'munged.log'}", f"--pid-file={munge_dir / 'munged.pid'}",
                f"--seed-file={munge_dir / 'munged.seed'}"], self.workdir, "munged.out",
                lambda d: self.munge_socket.exists()), timeout)
            self._start(_Daemon("slurmctld", "slurmctld", ["-D", "-i", "-f", conf], self.workdir, "slurmctld.out",
                                _Daemon.listening, self.ctld_port), timeout)
            for node, port in self.node_ports.items():
                self._start(_Daemon("slurmd", "slurmd", ["-D", "-N", node, "-f", conf], self.workdir,
                                    f"slurmd-{node}.out", _Daemon.listening, port), timeout)
            self.wait_for(lambda: all(state == "idle" for state, _ in self.node_states().values()), timeout,
                          "every node idle in sinfo")
        except BaseException:
            self.stop()
            raise
        return self

    def _prepare(self) -> None:
        for sub in ("state", "spool", "munge", "jobs"):
            (self.workdir / sub).mkdir(parents=True, exist_ok=True)
        for node in self.nodes:
            (self.workdir / "spool" / node).mkdir(exist_ok=True)
        os.chmod(self.munge_socket.parent, 0o700)
        key = self.munge_socket.parent / "munge.key"
        key.write_bytes(os.urandom(1024))
        os.chmod(key, 0o600)
        self.conf_path.write_text(self.slurm_conf())
        if self.gpus:
            devices = self.workdir / "dev"
            devices.mkdir(exist_ok=True)
            lines = ["AutoDetect=off"]
            for node in self.nodes:
                for index, target in zip(range(self.gpus), STAND_IN_DEVICES, strict=False):
                    link = devices / f"{node}-nvidia{index}"
                    if not link.is_symlink():
                        link.symlink_to(target)
                lines.append(f"NodeName={node} Name=gpu File={devices}/{node}-nvidia[0-{self.gpus - 1}]")
            self.gres_path.write_text("\n".join(lines) + "\n")
        if self.topology:
            self.topology_path.write_text(self.topology)

    def _start(self, daemon: _Daemon, timeout: float) -> None:
        self.daemons.append(daemon)
        daemon.start(timeout)

    def stop(self) -> None:
        """Cancel every job, stop the daemons (slurmds first), kill any job step left, remove the
        directory (kept with FLOPWATCH_KEEP_STACK_DIRS=1)."""
        ctld = next((d for d in self.daemons if d.binary == "slurmctld" and d.running()), None)
        if ctld is not None:
            with contextlib.suppress(subprocess.SubprocessError, OSError):
                self.client("scancel", "--full", f"--partition={self.partition}", check=False)
                self.wait_for(lambda: not self.jobs(), 10.0, "every job gone", fail=False)
        for daemon in sorted(self.daemons, key=lambda d: {"slurmd": 0, "slurmctld": 1}.get(d.binary, 2)):
            daemon.stop(timeout=5.0)
        self.daemons.clear()
        self._kill_strays()
        if self._own_dir and os.environ.get("FLOPWATCH_KEEP_STACK_DIRS") != "1":
            shutil.rmtree(self.workdir, ignore_errors=True)

    def _kill_strays(self) -> None:
        """Job steps (slurmstepd and the job's processes) run in sessions of their own, in the
        cluster's directory: end each such session."""
        root = str(self.workdir)
        for proc in psutil.process_iter(["cwd", "name"]):
            with contextlib.suppress(psutil.Error, OSError):
                cwd = proc.info.get("cwd") or ""
                if proc.info.get("name") == "slurmstepd" and (cwd == root or cwd.startswith(root + "/")):
                    os.killpg(os.getsid(proc.pid), signal.SIGKILL)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- clients ---------------------------------------------------------------------------------
    def client(self, program: str, *args: str, check: bool = True, timeout: float = CLIENT_TIMEOUT_S) -> str:
        """The stdout of a Slurm client program run against this cluster."""
        done = subprocess.run([require_binary(program, CLIENTS[program]), *args], env=self.env, text=True,
                              capture_output=True, timeout=timeout, check=False)
        if check and done.returncode != 0:
            raise ServerError(f"{program} {' '.join(args)} failed ({done.returncode}): {done.stderr.strip()}")
        return done.stdout

    def node_states(self) -> dict[str, tuple[str, str]]:
        """node -> (state as sinfo's %T prints it: idle, allocated, draining, drained, ...; reason)."""
        out = self.client("sinfo", "--noheader", "--Node", "--format=%N|%T|%E")
        states: dict[str, tuple[str, str]] = {}
        for line in out.splitlines():
            node, state, reason = line.split("|", 2)
            states[node] = (state, "" if reason == "none" else reason)
        return states

    def submit(self, node: str, command: str = "sleep 600", *, gpus: int = 0) -> str:
        """Submit a batch job pinned to `node` (with `gpus` of its GPUs); its id."""
        out = self.client("sbatch", "--parsable", f"--nodelist={node}", f"--output={self.workdir}/jobs/%j.out",
                          f"--chdir={self.workdir}/jobs", *([f"--gres=gpu:{gpus}"] if gpus else []),
                          f"--wrap={command}")
        return out.strip().split(";")[0]

    def jobs(self) -> dict[str, tuple[str, str]]:
        """job id -> (state as squeue's %T prints it: PENDING, RUNNING, ...; node list)."""
        out = self.client("squeue", "--noheader", "--format=%i|%T|%N")
        return {job: (state, nodes) for job, state, nodes in (line.split("|", 2) for line in out.splitlines())}

    @staticmethod
    def wait_for(predicate: Callable[[], object], timeout: float, what: str, *, fail: bool = True) -> bool:
        """Poll `predicate` (client errors count as not yet) until true or `timeout`."""
        deadline = time.monotonic() + timeout
        while True:
            with contextlib.suppress(ServerError, subprocess.SubprocessError, ValueError):
                if predicate():
                    return True
            if time.monotonic() >= deadline:
                if fail:
                    raise ServerError(f"Slurm: timed out after {timeout:g}s waiting for {what}")
                return False
            time.sleep(0.1)


def state_map(states: Mapping[str, tuple[str, str]]) -> dict[str, str]:
    """node -> state alone, for compact assertions and messages."""
    return {node: state for node, (state, _) in states.items()}

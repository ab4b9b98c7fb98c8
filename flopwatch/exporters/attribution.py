"""Job attribution: which jobs hold each GPU (and its NIC rail), exported as info series.

MFU per job needs to know which GPUs belong to which job. Sources, per GPU, in order; the first
that names any job for a GPU wins for that GPU:

1. The Slurm prolog/epilog mapping directory: one file per GPU index holding job IDs, one per
   line (dcgm-exporter's `--hpc-job-mapping-dir` format, so one directory feeds both). FlopWatch's
   prolog (deploy/slurm/prolog.sh) also writes `users/<job_id>` holding the job's user; entries
   that are directories or dot-files are ignored, as dcgm-exporter ignores them.
2. The environment of the processes on the GPU (`/proc/<pid>/environ`, readable as root or as the
   job's user): FLOPWATCH_JOB_ID, SLURM_JOB_ID, or torchrun's TORCHELASTIC_RUN_ID (not "none").
3. The kubelet pod-resources socket (optional, off by default): namespace/pod as job_id, the
   namespace as user.

The PIDs on each GPU come through a narrow seam, a callable returning `GpuProcesses` (wiring.py's
build_agent reads the GPU collector's last readings); this module never touches GPU hardware. A job ending
removes its series on the next cycle because every cycle rebuilds the claims from scratch.

Sample output:

    flopwatch_gpu_job_info{node="n1",gpu="0",job_id="81723",user="alice"} 1.0
    flopwatch_gpu_job_info{node="n1",gpu="1",job_id="ml/llm-70b-0",user="ml"} 1.0
    flopwatch_nic_job_info{node="n1",device="mlx5_0",port="1",job_id="81723",user="alice"} 1.0
    flopwatch_job_attribution_skipped_total{node="n1",source="process_env",reason="unreadable"} 3.0
"""

from __future__ import annotations

import logging
import os
import pwd
import re
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from prometheus_client.core import Metric as Family

from flopwatch.catalog import job as m

log = logging.getLogger(__name__)

#: Environment variables naming a job, most specific first.
JOB_VARIABLES = ("FLOPWATCH_JOB_ID", "SLURM_JOB_ID", "TORCHELASTIC_RUN_ID")
USER_VARIABLES = ("SLURM_JOB_USER",)
NO_RUN_ID = "none"  # torchrun's default rendezvous id: names no job
MAX_JOB_ID = 256
USERS_DIR = "users"
BROKEN_REASONS = frozenset({"unreadable", "unreachable"})
#: The variables we look for in an environ block (NUL-separated NAME=value), matched in C.
_WANTED = re.compile(rb"(?:^|\0)(" + b"|".join(n.encode() for n in JOB_VARIABLES + USER_VARIABLES) + rb")=([^\0]*)")


@dataclass(frozen=True)
class GpuProcesses:
    """What the GPU collector knows of one GPU: its index, UUID and compute PIDs (None: unknown)."""

    index: int
    uuid: str | None = None
    pids: tuple[int, ...] | None = None


@dataclass(frozen=True, order=True)
class JobClaim:
    job_id: str
    user: str = ""


GpuProcessSource = Callable[[], Sequence[GpuProcesses]]
Claims = dict[int, set[JobClaim]]
Skipped = Counter[tuple[str, str]]  # (source, reason) -> count


class MappingDirectory:
    """Reads the prolog/epilog mapping directory; a missing directory means 'no Slurm here'."""

    source = "mapping_dir"

    def __init__(self, path: str) -> None:
        self.path = path

    def read(self, skipped: Skipped) -> Claims:
        try:
            entries = os.listdir(self.path)
        except FileNotFoundError:
            return {}
        except OSError as error:
            skipped[(self.source, "unreadable")] += 1
            log.warning("attribution: cannot list %s: %s", self.path, error.strerror)
            return {}
        claims: Claims = {}
        for name in sorted(entries):
            full = os.path.join(self.path, name)
            if name.startswith(".") or os.path.isdir(full):
                continue  # the prolog's temporary files, the users/ directory
            if not name.isdigit():
                skipped[(self.source, "bad_name")] += 1
                continue
            try:
                with open(full, encoding="utf-8", errors="replace") as handle:
                    lines = handle.read().splitlines()
            except FileNotFoundError:
                continue  # the epilog removed it between listing and reading
            except OSError:
                skipped[(self.source, "unreadable")] += 1
                continue
            for line in lines:
                job_id = line.strip()
                if not job_id:
                    continue
                if len(job_id) > MAX_JOB_ID or any(c.isspace() for c in job_id):
                    skipped[(self.source, "bad_job_id")] += 1
                    continue
                claims.setdefault(int(name), set()).add(JobClaim(job_id, self._user(job_id)))
        return claims

    def _user(self, job_id: str) -> str:
        if "/" in job_id or job_id.startswith("."):
            return ""
        try:
            with open(os.path.join(self.path, USERS_DIR, job_id), encoding="utf-8") as handle:
                return handle.readline().strip()
        except (OSError, UnicodeDecodeError):
            return ""


class ProcessEnvironment:
    """Reads job variables from /proc/<pid>/environ of the processes on each GPU."""

    source = "process_env"

    def __init__(self, procfs_root: str = "/proc") -> None:
        self.procfs_root = procfs_root
        self._users: dict[int, str] = {}

    def read(self, gpus: Sequence[GpuProcesses], skipped: Skipped) -> Claims:
        claims: Claims = {}
        seen: dict[int, JobClaim | None] = {}  # a PID on several GPUs is read once
        for gpu in gpus:
            for pid in gpu.pids or ():
                if pid not in seen:
                    seen[pid] = self._claim(pid, skipped)
                claim = seen[pid]
                if claim is not None:
                    claims.setdefault(gpu.index, set()).add(claim)
        return claims

    def _claim(self, pid: int, skipped: Skipped) -> JobClaim | None:
        base = os.path.join(self.procfs_root, str(pid))
        try:
            with open(os.path.join(base, "environ"), "rb") as handle:
                raw = handle.read()
        except (FileNotFoundError, ProcessLookupError):
            return None  # the process ended
        except OSError:
            skipped[(self.source, "unreadable")] += 1
            return None
        env = {key.decode(): value.decode("utf-8", "replace").strip() for key, value in _WANTED.findall(raw)}
        job_id = next((env[name] for name in JOB_VARIABLES if env.get(name) not in (None, "", NO_RUN_ID)), "")
        if not job_id:
            skipped[(self.source, "no_job_variable")] += 1
            return None
        if len(job_id) > MAX_JOB_ID:
            skipped[(self.source, "bad_job_id")] += 1
            return None
        user = next((env[name] for name in USER_VARIABLES if env.get(name)), "")
        return JobClaim(job_id, user or self._owner(base))

    def _owner(self, base: str) -> str:
        try:
            with open(os.path.join(base, "status"), encoding="utf-8") as handle:
                uid = next(int(line.split()[1]) for line in handle if line.startswith("Uid:"))
        except (OSError, StopIteration, ValueError, IndexError):
            return ""
        if uid not in self._users:
            try:
                self._users[uid] = pwd.getpwuid(uid).pw_name
            except KeyError:
                self._users[uid] = str(uid)  # no passwd entry (containers): the number
        return self._users[uid]


class KubeletSource:
    """Wraps the pod-resources client; maps device IDs (GPU UUIDs or indices) to GPU indices."""

    source = "kubelet"

    def __init__(self, socket_path: str, timeout: float = 2.0) -> None:
        from flopwatch.exporters.attribution_kubelet import PodResourcesClient

        self.client = PodResourcesClient(socket_path, timeout)

    def read(self, gpus: Sequence[GpuProcesses], skipped: Skipped) -> Claims:
        from flopwatch.exporters.attribution_kubelet import KubeletError

        try:
            pods = self.client.list_gpu_devices()
        except KubeletError as error:
            skipped[(self.source, "unreachable")] += 1
            log.warning("attribution: %s", error)
            return {}
        by_uuid = {gpu.uuid: gpu.index for gpu in gpus if gpu.uuid}
        claims: Claims = {}
        for namespace, pod, device_id in pods:
            base = device_id.split("::", 1)[0]  # time-slicing replicas: GPU-<uuid>::<n>
            index = by_uuid.get(base, int(base) if base.isdigit() else None)
            if index is None:
                skipped[(self.source, "unknown_device")] += 1  # e.g. a MIG UUID: see docs
                continue
            claims.setdefault(index, set()).add(JobClaim(f"{namespace}/{pod}", namespace))
        return claims


class AttributionCollector:
    """prometheus_client custom collector: `update()` gathers claims, `collect()` only renders."""

    name = "attribution"

    def __init__(self, node: str, gpu_processes: GpuProcessSource, *, mapping_dir: str | None = None,
                 procfs_root: str | None = "/proc", kubelet_socket: str | None = None,
                 nic_rails: dict[int, tuple[str, str]] | None = None) -> None:
        self.node = node
        self.gpu_processes = gpu_processes
        self.mapping = MappingDirectory(mapping_dir) if mapping_dir else None
        self.environment = ProcessEnvironment(procfs_root) if procfs_root else None
        self.kubelet = KubeletSource(kubelet_socket) if kubelet_socket else None
        self.nic_rails = dict(nic_rails or {})
        self.skipped: Skipped = Counter()
        self._claims: Claims = {}

    def update(self) -> int:
        errors = 0
        try:
            gpus = list(self.gpu_processes())
        except Exception as error:  # the seam failing must not stop the mapping directory
            log.warning("attribution: cannot read GPU processes: %s", error)
            gpus, errors = [], 1
        broken_before = self._broken()
        layers: list[Claims] = []
        if self.mapping is not None:
            layers.append(self.mapping.read(self.skipped))
        if self.environment is not None:
            layers.append(self.environment.read(gpus, self.skipped))
        if self.kubelet is not None:
            layers.append(self.kubelet.read(gpus, self.skipped))
        merged: Claims = {}
        for layer in layers:
            for index, jobs in layer.items():
                merged.setdefault(index, jobs)  # an earlier source wins the whole GPU
        self._claims = merged
        return errors + self._broken() - broken_before

    def _broken(self) -> int:
        """Skips that mean a source is broken (collector errors), not just an input to pass over:
        an unreadable mapping directory or file, an unreachable kubelet. Unreadable environments
        (an agent not running as root) are only counted as skipped."""
        return sum(count for (source, reason), count in self.skipped.items()
                   if source != ProcessEnvironment.source and reason in BROKEN_REASONS)

    def claims(self) -> dict[int, list[JobClaim]]:
        """GPU index -> the jobs holding it, from the last update."""
        return {index: sorted(jobs) for index, jobs in sorted(self._claims.items())}

    def close(self) -> None:
        if self.kubelet is not None:
            self.kubelet.client.close()

    def collect(self) -> Iterator[Family]:
        node = self.node
        gpu_info, nic_info, skipped = m.GPU_JOB_INFO.family(), m.NIC_JOB_INFO.family(), \
            m.ATTRIBUTION_SKIPPED.family()
        rails: dict[tuple[str, str], set[JobClaim]] = {}
        for index, jobs in self.claims().items():
            for job in jobs:
                gpu_info.add_metric([node, str(index), job.job_id, job.user], 1)
            if index in self.nic_rails:
                rails.setdefault(self.nic_rails[index], set()).update(jobs)
        for (device, port), jobs in sorted(rails.items()):
            for job in sorted(jobs):
                nic_info.add_metric([node, device, port, job.job_id, job.user], 1)
        for (source, reason), count in sorted(self.skipped.items()):
            skipped.add_metric([node, source, reason], count)
        yield from (family for family in (gpu_info, nic_info, skipped) if family.samples)

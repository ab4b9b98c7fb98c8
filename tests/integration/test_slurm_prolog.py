"""deploy/slurm/prolog.sh and epilog.sh run by a real slurmd (Slurm 22.05, flopwatch.stack.slurm):
a job given GPUs through Slurm's gres is written to the GPU-to-job mapping directory in
dcgm-exporter's --hpc-job-mapping-dir format (one file per GPU index, one job ID a line, and
users/<job>), the agent's reader (flopwatch.exporters.attribution.MappingDirectory) attributes it,
and the epilog removes it when the job ends.

Faked, because no GPU exists here: the GPUs. gres.conf lists each as a link to a character device
(slurmd refuses a plain file), so Slurm allocates and numbers them and sets SLURM_JOB_GPUS in the
prolog exactly as for real devices. slurmd runs a prolog with an environment of its own making, so
the mapping directory reaches the scripts through a two-line wrapper setting FLOPWATCH_GPU_JOB_DIR,
as a site would install them.
"""

from __future__ import annotations

import getpass
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from flopwatch.exporters.attribution import JobClaim, MappingDirectory
from flopwatch.stack.slurm import SlurmCluster

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def _wrapper(path: Path, script: str, mapping: Path) -> Path:
    path.write_text(f"#!/bin/bash\nexport FLOPWATCH_GPU_JOB_DIR={mapping}\nexec {ROOT / 'deploy/slurm' / script}\n")
    path.chmod(0o755)
    return path


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[SlurmCluster, Path]]:
    base = tmp_path_factory.mktemp("prolog")
    mapping = base / "gpu-jobs"
    with SlurmCluster(["gpu01"], gpus=3, prolog=_wrapper(base / "prolog", "prolog.sh", mapping),
                      epilog=_wrapper(base / "epilog", "epilog.sh", mapping)) as slurm:
        yield slurm, mapping


def test_a_jobs_gpus_are_mapped_while_it_runs_and_unmapped_when_it_ends(cluster: tuple[SlurmCluster, Path]) -> None:
    slurm, mapping = cluster
    job = slurm.submit("gpu01", gpus=2)
    slurm.wait_for(lambda: slurm.jobs().get(job, ("",))[0] == "RUNNING", 30, f"job {job} running")
    # slurmd reports the job RUNNING as it starts the allocation prolog, not when the prolog ends.
    slurm.wait_for((mapping / "users" / job).exists, 30, "the prolog to write the job's mapping")
    files = sorted(p.name for p in mapping.iterdir() if p.is_file() and not p.name.startswith("."))
    assert files == ["0", "1"], "one file per allocated GPU index (SLURM_JOB_GPUS), none for GPU 2"
    assert [(mapping / name).read_text() for name in files] == [f"{job}\n", f"{job}\n"]
    assert (mapping / "users" / job).read_text() == f"{getpass.getuser()}\n"
    skipped: Counter[tuple[str, str]] = Counter()
    claim = JobClaim(job, getpass.getuser())
    assert MappingDirectory(str(mapping)).read(skipped) == {0: {claim}, 1: {claim}}
    assert not skipped

    slurm.client("scancel", job)
    slurm.wait_for(lambda: job not in slurm.jobs(), 30, f"job {job} gone")
    slurm.wait_for(lambda: not (mapping / "0").exists() and not (mapping / "1").exists()
                   and not (mapping / "users" / job).exists(), 30, "the epilog to remove the job's mapping")
    assert MappingDirectory(str(mapping)).read(skipped) == {}

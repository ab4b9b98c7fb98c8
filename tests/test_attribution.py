"""Job attribution from a Slurm mapping directory and from process environments.

No GPU here: the PIDs on each GPU come through the collector's seam (a callable returning
GpuProcesses), exactly where build_agent plugs in the GPU collector's readings. Process
environments are read from fake /proc trees in a temporary directory, and once from the real
/proc of a child process started with Slurm variables.
"""

from __future__ import annotations

import os
import pwd
import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from flopwatch.exporters.attribution import AttributionCollector, GpuProcesses, JobClaim


def registry_of(collector: AttributionCollector) -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(collector)
    return registry


def info_series(collector: AttributionCollector) -> set[tuple[str, str, str]]:
    return {(s.labels["gpu"], s.labels["job_id"], s.labels["user"])
            for family in collector.collect() if family.name == "flopwatch_gpu_job_info"
            for s in family.samples if s.value == 1}


def skipped(collector: AttributionCollector, source: str, reason: str) -> float | None:
    return registry_of(collector).get_sample_value(
        "flopwatch_job_attribution_skipped_total", {"node": "n1", "source": source, "reason": reason})


def no_gpus() -> list[GpuProcesses]:
    return []


@pytest.fixture
def mapping(tmp_path: Path) -> Path:
    """A mapping directory as deploy/slurm/prolog.sh leaves it for two jobs sharing GPU 2."""
    root = tmp_path / "gpu-jobs"
    (root / "users").mkdir(parents=True)
    (root / "0").write_text("81723\n")
    (root / "1").write_text("81723\n")
    (root / "2").write_text("81723\n81799\n")
    (root / "users" / "81723").write_text("alice\n")
    (root / "users" / "81799").write_text("bob\n")
    return root


def fake_process(procfs: Path, pid: int, env: dict[str, str], uid: int = 0) -> None:
    base = procfs / str(pid)
    base.mkdir(parents=True)
    (base / "environ").write_bytes(b"".join(f"{k}={v}".encode() + b"\0" for k, v in env.items()))
    (base / "status").write_text(f"Name:\tpython\nPid:\t{pid}\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n")


def test_mapping_directory_with_shared_gpu(mapping):
    collector = AttributionCollector("n1", no_gpus, mapping_dir=str(mapping), procfs_root=None)
    assert collector.update() == 0
    assert info_series(collector) == {("0", "81723", "alice"), ("1", "81723", "alice"),
                                      ("2", "81723", "alice"), ("2", "81799", "bob")}


def test_job_ending_removes_its_series(mapping):
    collector = AttributionCollector("n1", no_gpus, mapping_dir=str(mapping), procfs_root=None)
    collector.update()
    (mapping / "2").write_text("81723\n")  # what the epilog of 81799 leaves
    (mapping / "users" / "81799").unlink()
    collector.update()
    assert ("2", "81799", "bob") not in info_series(collector)
    for gpu in ("0", "1", "2"):
        (mapping / gpu).unlink()  # 81723 ends too
    collector.update()
    assert info_series(collector) == set()
    assert list(collector.collect()) == []  # no empty families either


def test_mapping_directory_ignores_what_dcgm_exporter_ignores_and_counts_bad_input(mapping):
    (mapping / ".3.tmp").write_text("99999\n")       # the prolog's half-written file
    (mapping / "README").write_text("not a GPU\n")   # a stray file
    (mapping / "4").write_text("\n  \nbad job id\n5005\n")
    collector = AttributionCollector("n1", no_gpus, mapping_dir=str(mapping), procfs_root=None)
    assert collector.update() == 0
    jobs = info_series(collector)
    assert ("4", "5005", "") in jobs
    assert not any(job == "99999" for _, job, _ in jobs)
    assert skipped(collector, "mapping_dir", "bad_name") == 1
    assert skipped(collector, "mapping_dir", "bad_job_id") == 1


def test_missing_mapping_directory_is_no_slurm_not_an_error(tmp_path):
    collector = AttributionCollector("n1", no_gpus, mapping_dir=str(tmp_path / "absent"), procfs_root=None)
    assert collector.update() == 0
    assert info_series(collector) == set()


def test_unreadable_mapping_directory_counts_an_error(tmp_path):
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    collector = AttributionCollector("n1", no_gpus, mapping_dir=str(not_a_dir), procfs_root=None)
    assert collector.update() == 1
    assert skipped(collector, "mapping_dir", "unreadable") == 1


def test_process_environment(tmp_path):
    procfs = tmp_path / "proc"
    fake_process(procfs, 100, {"SLURM_JOB_ID": "4242", "SLURM_JOB_USER": "carol", "PATH": "/bin"})
    fake_process(procfs, 101, {"SLURM_JOB_ID": "4242", "SLURM_JOB_USER": "carol"})
    fake_process(procfs, 200, {"TORCHELASTIC_RUN_ID": "llm-run-7"}, uid=0)
    fake_process(procfs, 300, {"TORCHELASTIC_RUN_ID": "none", "HOME": "/root"})
    gpus = [GpuProcesses(0, "GPU-a", (100, 101)), GpuProcesses(1, "GPU-b", (200,)),
            GpuProcesses(2, "GPU-c", (300, 999)),  # 999 ended before we looked
            GpuProcesses(3, "GPU-d", None)]          # backend cannot list PIDs
    collector = AttributionCollector("n1", lambda: gpus, procfs_root=str(procfs))
    assert collector.update() == 0
    assert info_series(collector) == {("0", "4242", "carol"), ("1", "llm-run-7", pwd.getpwuid(0).pw_name)}
    assert skipped(collector, "process_env", "no_job_variable") == 1


def test_flopwatch_job_id_wins_over_slurm(tmp_path):
    procfs = tmp_path / "proc"
    fake_process(procfs, 7, {"SLURM_JOB_ID": "1", "FLOPWATCH_JOB_ID": "llm-70b", "SLURM_JOB_USER": "dan"})
    collector = AttributionCollector("n1", lambda: [GpuProcesses(0, None, (7,))], procfs_root=str(procfs))
    collector.update()
    assert collector.claims() == {0: [JobClaim("llm-70b", "dan")]}


def test_real_process_environment_from_proc():
    """A real child process with Slurm variables, read through the real /proc."""
    env = {**os.environ, "SLURM_JOB_ID": "777001", "SLURM_JOB_USER": "erin"}
    child = subprocess.Popen([sys.executable, "-c", "import time; print('ready', flush=True); time.sleep(30)"],
                             env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline() == "ready\n"  # exec'd: /proc shows its own environment now
        collector = AttributionCollector("n1", lambda: [GpuProcesses(5, None, (child.pid,))])
        assert collector.update() == 0
        assert info_series(collector) == {("5", "777001", "erin")}
    finally:
        child.kill()
        child.wait()
    collector.update()
    assert info_series(collector) == set()  # the process is gone: so is the claim


def test_mapping_directory_wins_over_process_environment_per_gpu(mapping, tmp_path):
    procfs = tmp_path / "proc"
    fake_process(procfs, 10, {"SLURM_JOB_ID": "stale"})
    fake_process(procfs, 11, {"SLURM_JOB_ID": "90001", "SLURM_JOB_USER": "fay"})
    gpus = [GpuProcesses(0, None, (10,)), GpuProcesses(5, None, (11,))]
    collector = AttributionCollector("n1", lambda: gpus, mapping_dir=str(mapping), procfs_root=str(procfs))
    collector.update()
    claims = collector.claims()
    assert claims[0] == [JobClaim("81723", "alice")]
    assert claims[5] == [JobClaim("90001", "fay")]


def test_nic_rails_follow_their_gpus(mapping):
    rails = {0: ("mlx5_0", "1"), 2: ("mlx5_1", "1")}
    collector = AttributionCollector("n1", no_gpus, mapping_dir=str(mapping), procfs_root=None, nic_rails=rails)
    collector.update()
    registry = registry_of(collector)

    def nic(device: str, job: str, user: str) -> float | None:
        return registry.get_sample_value("flopwatch_nic_job_info", {
            "node": "n1", "device": device, "port": "1", "job_id": job, "user": user})

    assert nic("mlx5_0", "81723", "alice") == 1
    assert nic("mlx5_1", "81723", "alice") == 1
    assert nic("mlx5_1", "81799", "bob") == 1
    assert nic("mlx5_0", "81799", "bob") is None


def test_seam_failure_counts_an_error_and_the_mapping_still_works(mapping):
    def broken() -> list[GpuProcesses]:
        raise RuntimeError("GPU collector not started")

    collector = AttributionCollector("n1", broken, mapping_dir=str(mapping))
    assert collector.update() == 1
    assert ("0", "81723", "alice") in info_series(collector)


def test_build_agent_feeds_attribution_from_the_gpu_collector(mapping):
    """build_agent's seam: PIDs and UUIDs come from the GPU collector's last readings (sim backend)."""
    from flopwatch import config as cfg
    from flopwatch.exporters.wiring import build_agent, gpu_processes_of

    config = cfg.load(overrides={"backend": "sim", "node": "n1", "sim.gpus": 3,
                                 "attribution.mapping_dir": str(mapping)}, environ={})
    agent = build_agent(config)
    try:
        assert [c.name for c in agent.collectors] == ["gpu", "nic", "host", "attribution"]
        gpu = agent.collectors[0]
        assert gpu_processes_of(gpu)() == [GpuProcesses(i, None, None) for i in range(3)]  # nothing read yet
        agent.collect_once()
        seen = gpu_processes_of(gpu)()
        assert [p.index for p in seen] == [0, 1, 2]
        assert all(p.pids == () for p in seen)  # the simulator lists no processes: known, empty
        uuids = {s.labels["gpu"]: s.labels["uuid"] for f in gpu.collect() if f.name == "flopwatch_gpu_info"
                 for s in f.samples}
        assert {str(p.index): p.uuid for p in seen} == uuids
        attribution = agent.collectors[3]
        assert info_series(attribution) >= {("0", "81723", "alice"), ("2", "81799", "bob")}
    finally:
        agent.close()
    assert gpu_processes_of(None)() == []


DEPLOY = Path(__file__).resolve().parents[1] / "deploy" / "slurm"


def run_script(name: str, mapping_dir: Path, **env: str) -> subprocess.CompletedProcess:
    """The shipped Slurm prolog/epilog under real bash and flock, as slurmd would run them."""
    environment = {"PATH": os.environ["PATH"], "FLOPWATCH_GPU_JOB_DIR": str(mapping_dir), **env}
    return subprocess.run(["bash", str(DEPLOY / name)], env=environment, capture_output=True, text=True,
                          timeout=30, check=False)


def test_shipped_prolog_and_epilog_drive_attribution(tmp_path):
    mapping_dir = tmp_path / "gpu-jobs"
    collector = AttributionCollector("n1", no_gpus, mapping_dir=str(mapping_dir), procfs_root=None)
    first = run_script("prolog.sh", mapping_dir, SLURM_JOB_ID="5001", SLURM_JOB_USER="alice", SLURM_JOB_GPUS="0,1")
    second = run_script("prolog.sh", mapping_dir, SLURM_JOB_ID="5002", SLURM_JOB_USER="bob",
                        CUDA_VISIBLE_DEVICES="1,MIG-4f1e")  # older Slurm: no SLURM_JOB_GPUS
    assert first.returncode == second.returncode == 0
    assert "MIG-4f1e" in second.stderr  # said why it skipped it
    assert (mapping_dir / "1").read_text() == "5001\n5002\n"  # dcgm-exporter's format
    collector.update()
    assert info_series(collector) == {("0", "5001", "alice"), ("1", "5001", "alice"), ("1", "5002", "bob")}
    assert run_script("prolog.sh", mapping_dir, SLURM_JOB_ID="5001", SLURM_JOB_GPUS="0,1").returncode == 0
    assert (mapping_dir / "0").read_text() == "5001\n"  # a rerun does not duplicate the line
    assert run_script("epilog.sh", mapping_dir, SLURM_JOB_ID="5001").returncode == 0
    collector.update()
    assert info_series(collector) == {("1", "5002", "bob")}
    assert not (mapping_dir / "0").exists()
    assert run_script("epilog.sh", mapping_dir, SLURM_JOB_ID="5002").returncode == 0
    collector.update()
    assert info_series(collector) == set()
    assert sorted(p.name for p in mapping_dir.iterdir() if not p.name.startswith(".")) == ["users"]
    assert list((mapping_dir / "users").iterdir()) == []


def test_prolog_never_fails_the_job(tmp_path):
    blocked = tmp_path / "file"
    blocked.write_text("")
    result = run_script("prolog.sh", blocked / "sub", SLURM_JOB_ID="1", SLURM_JOB_GPUS="0")
    assert result.returncode == 0
    assert "cannot create" in result.stderr
    assert run_script("prolog.sh", tmp_path / "m").returncode == 0  # no SLURM_JOB_ID
    assert run_script("epilog.sh", tmp_path / "absent", SLURM_JOB_ID="1").returncode == 0

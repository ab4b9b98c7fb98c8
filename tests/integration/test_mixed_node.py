"""A mixed node: dcgm-exporter reports the GPUs, `flopwatch agent` with its GPU collector off
(`collectors.gpu: false`) serves the training-step intake, and a real Prometheus scrapes both with
every rule file of alerts/. The shipped rules join the two sources on node and GPU: job MFU over the
dense peak of dcgm-exporter's GPUs, goodput, and a FlopWatchStraggler page naming the slow rank's
node, GPU and rank, with the cause dcgm-exporter's clock-event bitmask corroborates (sw_thermal on
that GPU: cause thermal).

The agent also runs its Slurm attribution (mapping files), as a Slurm node beside dcgm-exporter would:
goodput's allocated-GPU count (alerts/flopwatch-goodput.yml) reads the agent's flopwatch_gpu_job_info,
not dcgm-exporter's hpc_job.

Real: Prometheus (Debian package), the agent as a subprocess (flopwatch.stack.AgentProcess), eight
`flopwatch.train.StepMonitor` clients (threads, one per GPU) sending over the agent's Unix socket.
Faked, because no GPU or DCGM runs here: dcgm-exporter, its expositions rendered from its source's
formats (tests/fixtures/dcgm_exporter/, integration/dcgm_serving.py) with GPU 5 throttled (sw_thermal
bitmask, 1650 of 1980 MHz) and no other fault; the training is sleeps, rank 5's compute 15% longer,
every rank's step the same length (the others wait in comm, as a synchronous job does).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from helpers import wait_for

from flopwatch.promql import PromClient
from flopwatch.stack import AgentProcess, Prometheus
from flopwatch.stack.servers import scrape_job
from integration.dashboard_checks import RULE_FILES
from integration.dcgm_serving import FIX, serve
from integration.fleets import RankThreads

pytestmark = pytest.mark.integration

NODE, JOB_ID, RANKS, SLOW_RANK = "dgx05", "mixed-job", 8, 5
STEP_S, COMPUTE_S, SLOWDOWN = 0.2, 0.12, 0.15
H100_BF16 = 989.4e12                     # flopwatch/hardware.py H100-SXM dense bf16
#: FLOPs per step that make a 0.2 s step 40% MFU on an H100.
FLOPS_PER_STEP = 0.4 * H100_BF16 * STEP_S
DEADLINE_S = 150


class ThrottledNode(FIX.Node):
    """The node's dcgm-exporter with one fault only: GPU 5 sw-thermal throttled (bitmask 32, 1650 MHz)."""

    def clock(self, gpu: int) -> int:
        return 1650 if gpu == SLOW_RANK else FIX.MAX_MHZ

    def value(self, name: str, gpu: int) -> float | None:
        if name == "DCGM_FI_DEV_CLOCKS_EVENT_REASONS" and gpu == SLOW_RANK:
            return 32
        return super().value(name, gpu)


def _agent_config(tmp_path: Path, socket_path: Path) -> Path:
    """The agent beside dcgm-exporter: the step intake and Slurm's GPU-to-job mapping files (the same
    job dcgm-exporter's --hpc-job-mapping-dir gives as hpc_job); no GPU, NIC or host collectors."""
    mapping = tmp_path / "gpu-jobs"
    mapping.mkdir()
    for gpu in range(RANKS):
        (mapping / str(gpu)).write_text(f"{JOB_ID}\n")
    path = tmp_path / "agent.yml"
    path.write_text(yaml.safe_dump({
        "collectors": {"gpu": False, "train": True, "nic": False, "host": False, "attribution": True},
        "attribution": {"mapping_dir": str(mapping), "procfs_root": None},
        "train": {"socket": str(socket_path)}}))
    return path


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("mixed")
    socket_path = tmp_path / "run" / "steps.sock"
    node = ThrottledNode(host=NODE, generation="v4-hostname", job=JOB_ID, opt_in=True)
    agent = AgentProcess(node=NODE, extra=["--config", str(_agent_config(tmp_path, socket_path))])
    with serve({"dcgm": node}) as dcgm, agent:
        prom = Prometheus([*dcgm, scrape_job("flopwatch", [f"127.0.0.1:{agent.port}"])], rule_files=RULE_FILES)
        try:
            prom.start()
            client = PromClient(prom.url)
            wait_for(lambda: client.query(f'count(node_gpu:flopwatch_gpu_up:max{{node="{NODE}"}} == 1) == 8'),
                     DEADLINE_S, "dcgm-exporter's GPUs")
            with RankThreads(socket_path, JOB_ID, RANKS, STEP_S, FLOPS_PER_STEP, 4096.0,
                             lambda rank: COMPUTE_S * (1 + SLOWDOWN if rank == SLOW_RANK else 1)):
                yield client
        finally:
            prom.stop()


def test_the_agent_exports_no_gpu_telemetry(mixed) -> None:
    """The GPU collector is off: the agent's only GPU series is the job attribution, and the canonical
    records hold each of dcgm-exporter's 8 GPUs once."""
    client = mixed
    wait_for(lambda: client.query(f'flopwatch_train_steps_total{{job_id="{JOB_ID}"}}'), DEADLINE_S, "the ranks' steps")
    names = {s.labels["__name__"] for s in client.query('{__name__=~"flopwatch_gpu_.+", job="flopwatch"}')}
    assert names == {"flopwatch_gpu_job_info"}
    assert client.query(f'count(node_gpu:flopwatch_gpu_up:max{{node="{NODE}"}})')[0].value == 8
    assert client.query(f'count(job_id_gpu:flopwatch_gpu_job_info:max{{job_id="{JOB_ID}"}})')[0].value == 8


def test_job_mfu_over_dcgm_exporter_gpus(mixed) -> None:
    """MFU = the ranks' model FLOP/s over the dense peak of the 8 H100s dcgm-exporter reports for the job:
    40% at exactly STEP_S per step, a little less as sleeps overrun."""
    client = mixed
    query = f'job_id:flopwatch_mfu:ratio{{job_id="{JOB_ID}"}}'
    wait_for(lambda: client.query(query), DEADLINE_S, query)
    peak = client.query(f'job_id:flopwatch_peak_flops:sum{{job_id="{JOB_ID}"}}')[0].value
    assert peak == pytest.approx(RANKS * H100_BF16)
    wait_for(lambda: 0.30 < client.query(query)[0].value <= 0.401, DEADLINE_S, f"{query} near 0.40")


def test_goodput_counts_the_wait_for_the_straggler(mixed) -> None:
    """Goodput and badput over the 8 allocated GPUs add up to 1, and the straggler's share of the time
    the job steps is the wait for it: rank 5 arrives SLOWDOWN x COMPUTE_S late, the mean rank 1/8 of
    that, so (1 - 1/8) x 0.15 x 0.12 s of each 0.2 s step is lost, 7.9%. (For its first 5 minutes the
    5-minute window counts the time before the job started as restart badput; the share and the sum
    do not depend on it.)"""
    client = mixed
    expected = (1 - 1 / RANKS) * SLOWDOWN * COMPUTE_S / STEP_S
    goodput_q = f'job_id:flopwatch_goodput:ratio{{job_id="{JOB_ID}"}}'
    badput_q = f'job_id:flopwatch_badput:ratio{{job_id="{JOB_ID}"}}'

    def figures() -> tuple[float, dict[str, float]] | None:
        goodput, badput = client.query(goodput_q), client.query(badput_q)
        if not goodput or not badput:
            return None
        return goodput[0].value, {s.labels["cause"]: s.value for s in badput}

    def settled() -> bool:
        found = figures()
        if found is None or found[1].get("straggler", 0) <= 0:
            return False
        goodput, badput = found
        return abs(badput["straggler"] / (goodput + badput["straggler"]) - expected) < 0.025

    wait_for(settled, DEADLINE_S, f"the straggler's share of stepping time near {expected:.3f}")
    goodput, badput = figures()
    assert goodput + sum(badput.values()) == pytest.approx(1.0, abs=0.02)
    assert badput["data"] == badput["checkpoint"] == 0


def test_straggler_page_names_node_gpu_rank_and_the_dcgm_cause(mixed) -> None:
    client = mixed
    query = f'ALERTS{{alertname="FlopWatchStraggler", alertstate="firing", job_id="{JOB_ID}"}}'
    wait_for(lambda: client.query(query), DEADLINE_S, "FlopWatchStraggler")
    pages = [sample.labels for sample in client.query(query)]
    assert [(p["node"], p["gpu"], p["rank"], p["cause"], p["severity"]) for p in pages] == [
        (NODE, str(SLOW_RANK), str(SLOW_RANK), "thermal", "page")]

"""Faults injected around a running agent: Prometheus and Alertmanager crash and come back, the
agent itself restarts, a training process is killed mid-step, thousands of ranks come and go.
Each test asserts that nothing else breaks and that no data is lost that could have been kept.

Real parts: the `flopwatch agent` console script (subprocess), Debian's `prometheus` and
`prometheus-alertmanager`, FlopWatch's alert rules from alerts/, the training client
(`flopwatch.train.StepMonitor`, in threads and in a child process) over the real Unix socket.
Only the GPUs are simulated (`--backend sim`: no GPU here); the thousands of ranks are datagrams
in the client's own wire format (flopwatch.train.wire) sent from one socket, because thousands of
training processes do not fit on this machine.
"""

from __future__ import annotations

import os
import random
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import yaml
from helpers import wait_for

from flopwatch.promql import PromClient
from flopwatch.stack import AgentProcess, Alertmanager, Prometheus
from flopwatch.stack.servers import scrape_job
from flopwatch.stack.webhook import WebhookReceiver
from flopwatch.train import wire
from integration.fleets import RankThreads

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
RULE_FILES = sorted((ROOT / "alerts").glob("flopwatch-*.yml"))
EXPIRY_S = 10  # the smallest train.expiry allowed


# -- helpers ---------------------------------------------------------------------------------------
def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, ""


def values(exposition: str, name: str, **labels: str) -> list[float]:
    """Values of the samples of `name` whose labels include `labels`."""
    found = []
    for line in exposition.splitlines():
        if not line.startswith(name + "{"):
            continue
        head, _, value = line.rpartition(" ")
        pairs = dict(re.findall(r'(\w+)="([^"]*)"', head))
        if all(pairs.get(key) == wanted for key, wanted in labels.items()):
            found.append(float(value))
    return found



def scraped_since(client: PromClient, since: float) -> bool:
    """A successful scrape of the agent newer than `since` (unix time) is in Prometheus."""
    return bool(client.query(f'up{{job="flopwatch"}} == 1 and timestamp(up{{job="flopwatch"}}) > {since}'))


def agent_config(directory: Path, **sections: dict) -> Path:
    path = directory / "agent.yml"
    path.write_text(yaml.safe_dump(sections))
    return path


# -- Prometheus and Alertmanager outages -------------------------------------------------------------
def test_prometheus_and_alertmanager_crash_and_come_back_while_the_agent_keeps_serving(tmp_path: Path) -> None:
    rules = tmp_path / "rules.yml"
    seen = {"alert": "AgentSeen", "expr": "max by (node) (flopwatch_build_info) > 0"}
    rules.write_text(yaml.safe_dump({"groups": [{"name": "outage", "interval": "1s", "rules": [seen]}]}))
    am_config = {
        "route": {"receiver": "hook", "group_by": ["alertname"], "group_wait": "0s", "group_interval": "1s",
                  "repeat_interval": "1h"},
        "receivers": [{"name": "hook", "webhook_configs": [{"url": "", "send_resolved": False}]}],
    }
    with WebhookReceiver() as hook, AgentProcess(node="outage-node", gpus=2) as agent:
        am_config["receivers"][0]["webhook_configs"][0]["url"] = hook.url
        with Alertmanager(am_config) as alertmanager, Prometheus(
                [scrape_job("flopwatch", [f"127.0.0.1:{agent.port}"])], rule_files=[rules],
                alertmanagers=[alertmanager.url]) as prometheus:
            client = PromClient(prometheus.url)
            started = time.time()
            assert hook.wait_for(lambda a: a["labels"]["alertname"] == "AgentSeen", 30), "first page never came"
            wait_for(lambda: (client.scalar('count_over_time(up{job="flopwatch"}[1m])') or 0) >= 3, 20,
                       "three scrapes")

            # Prometheus crashes (SIGKILL): the agent does not notice and keeps collecting.
            prometheus.kill()
            killed = time.time()
            _, first = get(agent.url + "/metrics")
            time.sleep(2.5)
            status, second = get(agent.url + "/metrics")
            assert status == 200 and get(agent.url + "/healthz")[0] == 200
            assert values(second, "flopwatch_gpu_energy_joules_total", gpu="0")[0] > \
                values(first, "flopwatch_gpu_energy_joules_total", gpu="0")[0]

            # Back on the same data directory: what was scraped before the crash is still there
            # (the WAL is replayed) and scraping resumes.
            prometheus.restart()
            restarted = time.time()
            window = f"{int(killed - started) + 1}s"
            kept = client.query(f'count_over_time(up{{job="flopwatch"}}[{window}])', at=killed)
            assert kept and kept[0].value >= 3, f"samples from before the crash were lost: {kept}"
            # (Prometheus hands new targets to its scrapers every 5 s, so the first scrape waits.)
            wait_for(lambda: scraped_since(client, restarted), 20, "scrapes after the restart")

            # Alertmanager crashes; an alert that starts firing meanwhile is paged once it is back.
            alertmanager.kill()
            am_killed = time.time()
            late = {"alert": "LateAlert", "expr": "max by (node) (flopwatch_build_info) > 0"}
            rules.write_text(yaml.safe_dump({"groups": [{"name": "outage", "interval": "1s", "rules": [seen, late]}]}))
            prometheus.reload()
            wait_for(lambda: client.query('ALERTS{alertname="LateAlert",alertstate="firing"}'), 20,
                       "LateAlert firing in Prometheus")
            time.sleep(2)  # Prometheus tries to send it to the dead Alertmanager
            assert not [a for a in hook.alerts if a["labels"]["alertname"] == "LateAlert"]
            assert scraped_since(client, am_killed), "scraping stopped while Alertmanager was down"
            alertmanager.restart()
            assert hook.wait_for(lambda a: a["labels"]["alertname"] == "LateAlert", 30), \
                "the alert that fired during the Alertmanager outage was never paged"
            assert agent.running()


# -- the agent restarting ------------------------------------------------------------------------------
def alerting_rules() -> list[dict]:
    rules = []
    for path in RULE_FILES:
        for group in yaml.safe_load(path.read_text())["groups"]:
            rules += [rule for rule in group["rules"] if "alert" in rule]
    return rules


def test_agent_restart_counters_restart_cleanly_and_the_rules_stay_quiet(tmp_path: Path) -> None:
    """SIGKILL the agent mid-run and start it again on the same port and socket, under a real
    Prometheus loaded with every rule file in alerts/ and two training ranks that keep stepping."""
    mapping = tmp_path / "gpu-jobs"
    mapping.mkdir()
    for gpu in (0, 1):
        (mapping / str(gpu)).write_text("restart-job\n")
    socket_path = tmp_path / "run" / "steps.sock"
    config = agent_config(tmp_path, collectors={"train": True, "nic": False, "host": False},
                          attribution={"mapping_dir": str(mapping), "procfs_root": None},
                          train={"socket": str(socket_path)})
    agent = AgentProcess(node="restart-node", gpus=2, extra=["--config", str(config)])
    with agent, Prometheus([scrape_job("flopwatch", [f"127.0.0.1:{agent.port}"])],
                           rule_files=RULE_FILES) as prometheus, \
            RankThreads(socket_path, "restart-job", ranks=2) as trainers:
        client = PromClient(prometheus.url)
        started = time.time()
        wait_for(lambda: len(client.query('flopwatch_train_steps_total{job_id="restart-job"}')) == 2, 20,
                   "both ranks in Prometheus")
        # MFU comes through three rule groups (GPU records, peaks, MFU); the peaks are recorded once a
        # minute, and Prometheus first runs a group anywhere within its interval, so the first value
        # can take 75 s and more on a loaded machine: the restart waits for it.
        wait_for(lambda: client.query('job_id:flopwatch_mfu:ratio{job_id="restart-job"}'), 150, "MFU recorded")
        mfu_from = max(time.time(), started + 15)
        time.sleep(6)
        agent.kill()
        killed = time.time()
        time.sleep(3)
        agent.restart()
        back = time.time()
        wait_for(lambda: scraped_since(client, back), 20, "scrapes of the restarted agent")
        resumed = time.time()
        time.sleep(8)
        ended = time.time()
        window = f"{int(ended - started) + 2}s"
        true_steps_per_s = sum(m.steps for m in trainers.monitors) / (time.monotonic() - trainers.started)

        # The agent's own counters start again from zero: Prometheus sees one reset per GPU, and
        # rate() over it stays within what the GPUs can draw (no spike from the restart).
        resets = client.query(f'resets(flopwatch_gpu_energy_joules_total[{window}])')
        assert sorted(s.value for s in resets) == [1, 1], resets
        limit = client.scalar("max(flopwatch_gpu_power_limit_watts)")
        assert limit is not None
        for sample in client.query(f"max_over_time(rate(flopwatch_gpu_energy_joules_total[3s])[{window}:1s])"):
            assert 0 < sample.value <= 1.05 * limit, sample
        assert client.scalar(f"min(min_over_time(rate(flopwatch_gpu_energy_joules_total[3s])[{window}:1s]))") >= 0

        # Training counters are the client's running totals: they carry on across the agent's
        # restart with no reset, and the first value after it includes every step made meanwhile.
        assert [s.value for s in client.query(f'resets(flopwatch_train_steps_total[{window}])')] == [0, 0]
        for series in client.query_range('flopwatch_train_steps_total{job_id="restart-job"}', started, ended, 1):
            steps = [float(v) for _, v in series["values"]]
            assert steps == sorted(steps), f"rank {series['metric']['rank']} went backwards"
        before = client.query('flopwatch_train_steps_total{job_id="restart-job"}', at=killed - 1)
        after = client.query('flopwatch_train_steps_total{job_id="restart-job"}', at=back + 3)
        gap_steps = sum(a.value for a in after) - sum(b.value for b in before)
        assert gap_steps >= 0.7 * true_steps_per_s * (back + 3 - (killed - 1)), "steps during the gap were lost"

        # The recording rules: MFU stays at the job's true MFU through the restart, never above.
        peak = client.scalar('max(flopwatch_gpu_peak_dense_flops{dtype="bf16"})')
        true_mfu = true_steps_per_s * trainers.flops_per_step / (2 * peak)
        mfu = client.query_range('job_id:flopwatch_mfu:ratio{job_id="restart-job"}', mfu_from, ended, 1)
        assert mfu, "no MFU recorded"
        recorded = [float(v) for _, v in mfu[0]["values"]]
        assert max(recorded) <= 1.3 * true_mfu and min(recorded) >= 0, (true_mfu, min(recorded), max(recorded))
        assert [v for t, v in mfu[0]["values"] if t > resumed + 1], "MFU not recorded after the restart"

        # No alert expression of alerts/ holds at any second of the window, except AgentDown's
        # while the agent was really down (its `for: 2m` keeps it from firing on a restart).
        for rule in alerting_rules():
            result = client.query_range(rule["expr"], started, ended, 1)
            if rule["alert"] == "FlopWatchAgentDown":
                times = [t for series in result for t, _ in series["values"]]
                assert all(killed - 1 <= t <= back + 5 for t in times), times
            else:
                assert result == [], f"{rule['alert']} holds across an agent restart: {result[:2]}"
        assert client.query('ALERTS{alertstate="firing"}') == []


# -- the training side ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def train_agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[AgentProcess, Path]]:
    directory = tmp_path_factory.mktemp("train")
    socket_path = directory / "run" / "steps.sock"
    config = agent_config(directory, collectors={"train": True, "nic": False, "host": False, "attribution": False},
                          train={"socket": str(socket_path), "expiry": EXPIRY_S, "max_ranks": 20_000,
                                 "max_jobs": 500})
    with AgentProcess(node="train-node", gpus=2, extra=["--config", str(config)]) as agent:
        yield agent, socket_path


CHILD = """
import sys, time
from flopwatch.train import StepMonitor
mon = StepMonitor(1e9, 100.0, job_id="killed-job", rank=0, gpu=0, socket_path=sys.argv[1], min_interval=0)
step = 0
while True:
    with mon.step():
        with mon.phase("compute"):
            if step == 20:
                print("inside step 21", flush=True)
                time.sleep(600)
            time.sleep(0.01)
    step += 1
"""


def test_a_training_process_killed_mid_step_keeps_its_totals_until_its_series_expire(train_agent) -> None:
    agent, socket_path = train_agent
    rejected_before = sum(values(get(agent.url + "/metrics")[1], "flopwatch_train_events_rejected_total"))
    with RankThreads(socket_path, "healthy-job", ranks=1, step_s=0.05):
        child = subprocess.Popen([sys.executable, "-c", CHILD, str(socket_path)], stdout=subprocess.PIPE, text=True)
        try:
            assert child.stdout is not None and child.stdout.readline().strip() == "inside step 21"
            child.send_signal(signal.SIGKILL)
            child.wait(timeout=10)
            killed = time.monotonic()
        finally:
            if child.poll() is None:
                child.kill()
        # Every step completed before the kill is counted (once the agent's next collection has
        # them); the one it died in is not.
        def counted() -> str | None:
            text = get(agent.url + "/metrics")[1]
            return text if values(text, "flopwatch_train_steps_total", job_id="killed-job") == [20.0] else None

        text = wait_for(counted, 10, "the killed rank's 20 completed steps")
        assert values(text, "flopwatch_train_step_seconds_count", job_id="killed-job") == [20.0]
        assert values(text, "flopwatch_train_phase_seconds_total", job_id="killed-job", phase="compute")[0] > 0.15
        healthy_before = values(text, "flopwatch_train_steps_total", job_id="healthy-job")[0]

        time.sleep(max(0.0, killed + EXPIRY_S - 3 - time.monotonic()))
        _, text = get(agent.url + "/metrics")
        assert values(text, "flopwatch_train_steps_total", job_id="killed-job") == [20.0], "expired too early"

        wait_for(lambda: not values(get(agent.url + "/metrics")[1], "flopwatch_train_steps_total",
                                      job_id="killed-job"), EXPIRY_S + 8, "the killed rank's series to expire")
        assert time.monotonic() - killed >= EXPIRY_S - 1
        _, text = get(agent.url + "/metrics")
        assert 'job_id="killed-job"' not in text          # its job's histogram went with its last rank
        assert values(text, "flopwatch_train_steps_total", job_id="healthy-job")[0] > healthy_before
        assert sum(values(text, "flopwatch_train_events_rejected_total")) == rejected_before
        assert get(agent.url + "/healthz")[0] == 200


def send_ranks(socket_path: Path, tag: str, jobs: int, ranks_per_job: int) -> int:
    """One datagram per rank, each a new (job, rank) with its running totals, as clients send them."""
    phases = dict.fromkeys(wire.PHASES, 0.2)
    sent = 0
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.settimeout(5)   # blocking: waits for the agent to drain its 10-datagram queue
        sock.connect(str(socket_path))
        for job in range(jobs):
            for rank in range(ranks_per_job):
                record = wire.StepRecord(job_id=f"{tag}-{job}", rank=rank, gpu=rank % 8, instance=job + 1, steps=5,
                                         tokens=5000.0, model_flops=5e12, hardware_flops=5e12, step_seconds=1.0,
                                         phases=phases)
                sock.send(wire.encode(record))
                sent += 1
    return sent


def train_series(agent: AgentProcess) -> int:
    return len(values(get(agent.url + "/metrics")[1], "flopwatch_train_steps_total"))


def test_thousands_of_ranks_come_and_go_series_expire_and_memory_returns(train_agent) -> None:
    """Rounds of 6,000 new ranks (60 jobs x 100) that each send once and go quiet until they expire.

    CPython keeps freed memory in arenas that still hold a live object, so the agent's RSS does
    not fall back to the byte: the baseline is taken after a warm-up round of the same size, and
    the test shows that every series expires, the exposition shrinks back, and most of the memory
    the round took is given back (measured: 60-95% of it; live Python objects return entirely).
    """
    agent, socket_path = train_agent
    assert agent.proc is not None
    process = psutil.Process(agent.proc.pid)
    rejected_before = sum(values(get(agent.url + "/metrics")[1], "flopwatch_train_events_rejected_total"))

    def round_of_ranks(tag: str) -> int:
        """Two waves of 3,000 ranks, shown at once, then gone: the peak RSS meanwhile."""
        assert send_ranks(socket_path, f"{tag}a", 30, 100) + send_ranks(socket_path, f"{tag}b", 30, 100) == 6000
        peak_rss = 0

        def all_shown() -> bool:
            nonlocal peak_rss
            peak_rss = max(peak_rss, process.memory_info().rss)
            return train_series(agent) >= 6000

        wait_for(all_shown, EXPIRY_S - 2, f"6,000 {tag} ranks exported at once")
        wait_for(lambda: train_series(agent) == 0, EXPIRY_S + 10, f"the {tag} ranks to expire")
        time.sleep(1.5)
        return peak_rss

    round_of_ranks("warmup")
    baseline_rss = process.memory_info().rss
    baseline_bytes = len(get(agent.url + "/metrics")[1])
    peak_rss = round_of_ranks("churn")
    text = get(agent.url + "/metrics")[1]
    rss = process.memory_info().rss
    returned = (peak_rss - rss) / (peak_rss - baseline_rss)
    print(f"agent RSS after a warm-up round {baseline_rss / 2**20:.1f} MiB; with 6,000 ranks {peak_rss / 2**20:.1f} "
          f"MiB; after they expired {rss / 2**20:.1f} MiB ({returned:.0%} of the increase given back)")
    assert sum(values(text, "flopwatch_train_events_rejected_total")) == rejected_before
    assert values(text, "flopwatch_train_events_accepted_total")[0] >= 12_000
    assert abs(len(text) - baseline_bytes) < 2000, "the exposition did not shrink back"
    assert peak_rss > baseline_rss
    assert returned >= 0.5, "most of the memory the ranks took was kept after they expired"
    assert rss <= 1.35 * baseline_rss, f"agent RSS grew {rss / baseline_rss - 1:+.1%} after the ranks expired"
    assert os.path.exists(socket_path)


def test_random_bytes_and_oversized_datagrams_on_the_socket_are_rejected_and_counted(train_agent) -> None:
    """Garbage from any local process that may write to the socket: every datagram is refused and
    counted by reason, and a real training rank sending at the same time is not disturbed."""
    agent, socket_path = train_agent
    rng = random.Random(9)
    junk = [rng.randbytes(rng.randrange(0, 2000)) for _ in range(400)]
    junk += [b"\x01" * 65_536 for _ in range(20)]                    # oversized, version byte right
    junk += [bytes([wire.VERSION]) + rng.randbytes(wire.MAX_DATAGRAM - 1) for _ in range(40)]
    before = rejected_by_reason(agent)
    with RankThreads(socket_path, "steady-job", ranks=1, step_s=0.05) as trainers:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.settimeout(5)
            sock.connect(str(socket_path))
            for datagram in junk:
                sock.send(datagram)
        time.sleep(2.5)
        text = get(agent.url + "/metrics")[1]
        steady = values(text, "flopwatch_train_steps_total", job_id="steady-job")
        assert steady and steady[0] >= trainers.monitors[0].steps - 40, "the real rank was disturbed"
    after = rejected_by_reason(agent)
    counted = {reason: after.get(reason, 0) - before.get(reason, 0) for reason in after}
    assert sum(counted.values()) == len(junk), counted
    assert counted["oversized"] >= 20
    assert get(agent.url + "/healthz")[0] == 200


def rejected_by_reason(agent: AgentProcess) -> dict[str, float]:
    text = get(agent.url + "/metrics")[1]
    reasons: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("flopwatch_train_events_rejected_total{"):
            reason = re.search(r'reason="([^"]*)"', line)
            assert reason is not None
            reasons[reason.group(1)] = float(line.rpartition(" ")[2])
    return reasons

"""A real Prometheus scrapes `flopwatch agent --web-config` over TLS with a client certificate and
basic auth; scrapers with the wrong password, without a client certificate or without TLS are
refused, counted, and never see data; no password appears in logs, errors or /metrics.

The agent is the real console script (a subprocess) on simulated GPUs (`--backend sim`: no GPU
here). The certificates and the CA are made at test time by Debian's `openssl`; Prometheus is
Debian's `prometheus`. Everything talks over 127.0.0.1.
"""

from __future__ import annotations

import http.client
import ssl
import time
from collections.abc import Iterator
from pathlib import Path

import bcrypt
import pytest
from tls_certs import Pki, basic, make_pki

from flopwatch.promql import PromClient
from flopwatch.stack import AgentProcess, Prometheus, ServerError
from flopwatch.stack.servers import scrape_job

pytestmark = pytest.mark.integration

USER = "prometheus"
PASSWORD = "tls-test-pw-4c1d9e"
WRONG = "tls-wrong-pw-77ab0f"
GPUS = 4


class SecureAgent(AgentProcess):
    """The agent behind a web config: ready when /healthz answers 200 over TLS with credentials."""

    def __init__(self, web_config: Path, context: ssl.SSLContext, authorization: str) -> None:
        super().__init__(node="tls-node", gpus=GPUS, extra=["--web-config", str(web_config), "--log-level", "debug"])
        self.context, self.authorization = context, authorization

    @property
    def url(self) -> str:
        return f"https://{self.host}:{self.port}"

    def get(self, path: str) -> tuple[int, bytes]:
        connection = http.client.HTTPSConnection(self.host, self.port, context=self.context, timeout=5)
        try:
            connection.request("GET", path, headers={"Authorization": self.authorization})
            answer = connection.getresponse()
            return answer.status, answer.read()
        finally:
            connection.close()

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise ServerError(f"flopwatch agent exited with code {self.proc.returncode}:\n{self.log_tail()}")
            try:
                if self.get(self.ready_path)[0] == 200 and self._owns_port():
                    return
            except (OSError, http.client.HTTPException):
                pass
            time.sleep(0.1)
        raise ServerError(f"flopwatch agent not ready at {self.url}/healthz after {timeout:g}s:\n{self.log_tail()}")


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def agent(pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureAgent]:
    directory = tmp_path_factory.mktemp("web")
    web_config = directory / "web.yml"
    hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(10)).decode()
    web_config.write_text(
        "tls_server_config:\n"
        f"  cert_file: {pki.server_cert}\n  key_file: {pki.server_key}\n"
        f"  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: {pki.ca}\n"
        f"basic_auth_users:\n  {USER}: '{hashed}'\n"
    )
    web_config.chmod(0o600)
    context = ssl.create_default_context(cafile=str(pki.ca))
    context.load_cert_chain(pki.client_cert, pki.client_key)
    with SecureAgent(web_config, context, basic(USER, PASSWORD)) as process:
        yield process


@pytest.fixture(scope="module")
def prometheus(agent: SecureAgent, pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[PromClient]:
    directory = tmp_path_factory.mktemp("secrets")
    (directory / "good").write_text(PASSWORD)
    (directory / "wrong").write_text(WRONG)
    target = [f"127.0.0.1:{agent.port}"]
    client_tls = {"ca_file": str(pki.ca), "cert_file": str(pki.client_cert), "key_file": str(pki.client_key)}
    good_auth = {"username": USER, "password_file": str(directory / "good")}
    jobs = [
        scrape_job("flopwatch", target, scheme="https", tls_config=client_tls, basic_auth=good_auth),
        scrape_job("wrong-password", target, scheme="https", tls_config=client_tls,
                   basic_auth={"username": USER, "password_file": str(directory / "wrong")}),
        scrape_job("no-client-cert", target, scheme="https", tls_config={"ca_file": str(pki.ca)}, basic_auth=good_auth),
        scrape_job("plain-http", target, basic_auth=good_auth),
    ]
    with Prometheus(jobs) as server:
        client = PromClient(server.url)
        counted = ('flopwatch_http_responses_total{job="flopwatch",code="401"}',
                   'flopwatch_http_tls_handshake_failures_total{job="flopwatch",reason="plain_http"}',
                   'flopwatch_http_tls_handshake_failures_total{job="flopwatch",reason="no_client_cert"}')
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # every scraper tried, and the good one saw the counts
            healths = {t["labels"]["job"]: t["health"] for t in client.targets()}
            if len(healths) == 4 and "unknown" not in healths.values() and all(client.query(q) for q in counted):
                break
            time.sleep(0.5)
        yield client


def test_prometheus_scrapes_over_tls_with_client_cert_and_basic_auth(prometheus: PromClient) -> None:
    assert prometheus.scalar('up{job="flopwatch"}') == 1
    gpus = prometheus.query('flopwatch_gpu_up{job="flopwatch"}')
    assert sorted(int(s.labels["gpu"]) for s in gpus) == list(range(GPUS))
    assert all(s.value == 1 for s in gpus)


def test_each_refused_scraper_is_down_with_the_reason_and_counted(prometheus: PromClient) -> None:
    targets = {t["labels"]["job"]: t for t in prometheus.targets()}
    for job in ("wrong-password", "no-client-cert", "plain-http"):
        assert targets[job]["health"] == "down", job
        assert prometheus.scalar(f'up{{job="{job}"}}') == 0
        assert not prometheus.query(f'flopwatch_gpu_up{{job="{job}"}}'), f"{job} got data"
    assert "401" in targets["wrong-password"]["lastError"]
    # What the agent counted, as Prometheus scraped it through the good job.
    assert (prometheus.scalar('flopwatch_http_responses_total{job="flopwatch",code="401"}') or 0) >= 1
    for reason in ("no_client_cert", "plain_http"):
        count = prometheus.scalar(f'flopwatch_http_tls_handshake_failures_total{{job="flopwatch",reason="{reason}"}}')
        assert count is not None and count >= 1, reason


def test_a_client_without_a_certificate_is_refused_before_http(agent: SecureAgent, pki: Pki) -> None:
    context = ssl.create_default_context(cafile=str(pki.ca))   # trusts the agent, offers no certificate
    connection = http.client.HTTPSConnection(agent.host, agent.port, context=context, timeout=5)
    with pytest.raises((ssl.SSLError, ConnectionError, http.client.RemoteDisconnected)):
        connection.request("GET", "/metrics", headers={"Authorization": basic(USER, PASSWORD)})
        connection.getresponse()
    connection.close()


def test_a_wrong_password_gets_401_with_a_challenge_and_no_data(agent: SecureAgent) -> None:
    connection = http.client.HTTPSConnection(agent.host, agent.port, context=agent.context, timeout=5)
    try:
        for path in ("/metrics", "/healthz", "/nowhere"):
            connection.request("GET", path, headers={"Authorization": basic(USER, WRONG)})
            answer = connection.getresponse()
            body = answer.read()
            assert answer.status == 401
            assert answer.getheader("WWW-Authenticate", "").startswith("Basic")
            assert b"flopwatch_" not in body
    finally:
        connection.close()


def test_no_password_appears_in_logs_errors_or_metrics(agent: SecureAgent, prometheus: PromClient) -> None:
    status, exposition = agent.get("/metrics")
    assert status == 200 and b"flopwatch_gpu_up" in exposition
    log = agent.log_path.read_text(errors="replace")
    assert "TLS handshake from" in log   # debug logging is on, so silence would not prove anything
    errors = " ".join(t.get("lastError", "") for t in prometheus.targets())
    for secret in (PASSWORD, WRONG, basic(USER, PASSWORD).split()[1], basic(USER, WRONG).split()[1]):
        assert secret not in log
        assert secret.encode() not in exposition
        assert secret not in errors
    hashes = [line.split("'")[1] for line in Path(agent.extra[1]).read_text().splitlines() if "$2" in line]
    assert hashes and all(h not in log and h.encode() not in exposition for h in hashes)

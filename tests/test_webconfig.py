"""The agent's web config (TLS, client certificates, basic auth) and the HTTP server behind it.

Certificates are made at test time by Debian's `openssl` (tests/tls_certs.py); every connection
is a real TLS connection over 127.0.0.1 to the agent's own HTTP server. bcrypt hashes use cost 4
to keep the tests fast; the cost is read from the hash, so nothing else changes.
"""

from __future__ import annotations

import asyncio
import hashlib
import http.client
import logging
import shutil
import socket
import ssl
import subprocess
from collections.abc import Iterator
from pathlib import Path

import bcrypt
import pytest
from helpers import wait_for
from tls_certs import Pki, basic, make_pki, renew_server_cert

from flopwatch import config as cfg
from flopwatch.cli import main as cli_main
from flopwatch.exporters import http as http_module
from flopwatch.exporters import webconfig
from flopwatch.exporters.http import HttpServer, Response
from flopwatch.exporters.webconfig import BasicAuth, WebAccess, WebConfigError, parse, parse_basic
from flopwatch.exporters.wiring import build_agent

PASSWORD = "correct-horse-7f3a"
WRONG = "wrong-battery-91c2"


def bcrypt_hash(password: str, cost: int = 4) -> str:
    return bcrypt.hashpw(password.encode(), bcrypt.gensalt(cost)).decode()


HASH = bcrypt_hash(PASSWORD)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def write_config(path: Path, pki: Pki | None, *, auth: str | None = "RequireAndVerifyClientCert",
                 users: dict[str, str] | None = None, extra_tls: str = "") -> Path:
    text = ""
    if pki is not None:
        text += f"tls_server_config:\n  cert_file: {pki.server_cert}\n  key_file: {pki.server_key}\n"
        if auth is not None:
            text += f"  client_auth_type: {auth}\n"
            if auth != "NoClientCert":
                text += f"  client_ca_file: {pki.ca}\n"
        text += extra_tls
    if users:
        text += "basic_auth_users:\n" + "".join(f"  {name}: '{hashed}'\n" for name, hashed in users.items())
    path.write_text(text)
    return path


class Clock:
    """Drives WebAccess's reload checks without waiting a second of wall time."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def tick(self) -> None:
        self.now += webconfig.RELOAD_CHECK_S + 0.1


@pytest.fixture
def serve() -> Iterator:
    started: list[tuple[HttpServer, WebAccess | None]] = []

    def start(access: WebAccess | None) -> HttpServer:
        server = HttpServer("127.0.0.1", 0, lambda path: Response(200, b"flopwatch_x 1\n"), access)
        server.start()
        started.append((server, access))
        return server

    yield start
    for server, access in started:
        server.stop()
        if access is not None:
            access.close()


def client_context(pki: Pki, cert: tuple[Path, Path] | None = None, **versions: ssl.TLSVersion) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(pki.ca))
    if cert is not None:
        context.load_cert_chain(*cert)
    for name, value in versions.items():
        setattr(context, name, value)
    return context


def https_get(server: HttpServer, context: ssl.SSLContext, auth: str | None = None,
              method: str = "GET") -> tuple[int, dict[str, str], bytes]:
    connection = http.client.HTTPSConnection("127.0.0.1", server.port, context=context, timeout=10)
    try:
        connection.request(method, "/metrics", headers={"Authorization": auth} if auth else {})
        answer = connection.getresponse()
        return answer.status, dict(answer.getheaders()), answer.read()
    finally:
        connection.close()


def refused(server: HttpServer, context: ssl.SSLContext) -> bool:
    """True when the server ends the connection instead of answering (TLS 1.3 reports a refused
    client certificate only when the client first reads)."""
    try:
        https_get(server, context, basic("prom", PASSWORD))
    except (ssl.SSLError, ConnectionError, http.client.RemoteDisconnected):
        return True
    return False



# -- validation ------------------------------------------------------------------------------------
def test_a_full_config_parses_with_paths_from_the_files_directory(tmp_path):
    config = parse({
        "tls_server_config": {"cert_file": "tls/agent.crt", "key_file": "/abs/agent.key",
                              "client_auth_type": "RequireAndVerifyClientCert", "client_ca_file": "tls/ca.crt",
                              "min_version": "TLS13"},
        "basic_auth_users": {"prometheus": HASH},
        "http_server_config": {"http2": True},
    }, tmp_path)
    assert config.tls is not None
    assert config.tls.cert_file == tmp_path / "tls/agent.crt"
    assert config.tls.key_file == Path("/abs/agent.key")
    assert config.tls.client_ca_file == tmp_path / "tls/ca.crt"
    assert (config.tls.min_version, config.tls.max_version) == ("TLS13", "TLS13")
    assert config.users == {"prometheus": HASH.encode()}
    assert HASH not in repr(config)
    empty = parse(None, tmp_path)
    assert empty.tls is None and empty.users == {}


@pytest.mark.parametrize(
    ("data", "names"),
    [
        ([1, 2], ["expected a mapping"]),
        ({"tls_config": {}}, ["unknown key 'tls_config'", "tls_server_config"]),
        ({"rate_limit": {"interval": "1s"}}, ["rate_limit", "not supported"]),
        ({"tls_server_config": {"cert_file": "a", "key_file": "b", "cipher_suites": ["X"]}},
         ["tls_server_config.cipher_suites", "not supported"]),
        ({"tls_server_config": {"cert_file": "a", "key_file": "b", "certfile": "c"}},
         ["unknown key 'tls_server_config.certfile'"]),
        ({"tls_server_config": {"key_file": "b"}}, ["tls_server_config.cert_file is missing"]),
        ({"tls_server_config": {"cert_file": "a"}}, ["tls_server_config.key_file is missing"]),
        ({"tls_server_config": {"cert_file": 5, "key_file": "b"}}, ["tls_server_config.cert_file", "file path"]),
        ({"tls_server_config": "yes"}, ["tls_server_config", "mapping"]),
        ({"tls_server_config": {"cert_file": "a", "key_file": "b", "client_auth_type": "Sometimes"}},
         ["tls_server_config.client_auth_type", "'Sometimes'", "RequireAndVerifyClientCert"]),
        ({"tls_server_config": {"cert_file": "a", "key_file": "b", "client_auth_type": "RequireAnyClientCert",
                                "client_ca_file": "c"}},
         ["client_auth_type", "without verifying", "RequireAndVerifyClientCert"]),
        ({"tls_server_config": {"cert_file": "a", "key_file": "b", "client_ca_file": "c"}},
         ["client_ca_file", "NoClientCert"]),
        ({"tls_server_config": {"cert_file": "a", "key_file": "b", "client_auth_type": "RequireAndVerifyClientCert"}},
         ["RequireAndVerifyClientCert", "needs client_ca_file"]),
        ({"tls_server_config": {"cert_file": "a", "key_file": "b", "min_version": "TLS14"}},
         ["tls_server_config.min_version", "TLS12"]),
        ({"tls_server_config": {"cert_file": "a", "key_file": "b", "min_version": "TLS13", "max_version": "TLS12"}},
         ["min_version TLS13", "max_version TLS12"]),
        ({"basic_auth_users": ["prom"]}, ["basic_auth_users", "mapping"]),
        ({"basic_auth_users": {"pro:m": HASH}}, ["basic_auth_users", "'pro:m'", "no ':'"]),
        ({"basic_auth_users": {"": HASH}}, ["basic_auth_users", "not usable"]),
        ({"http_server_config": {"http2": "maybe"}}, ["http_server_config.http2", "true or false"]),
        ({"http_server_config": {"headers": {"X-Frame-Options": "deny"}}},
         ["http_server_config.headers", "not supported"]),
    ],
)
def test_bad_values_are_one_line_errors_naming_the_key(tmp_path, data, names):
    with pytest.raises(WebConfigError) as caught:
        parse(data, tmp_path, "web.yml")
    message = str(caught.value)
    assert "\n" not in message and message.startswith("web.yml: ")
    for name in names:
        assert name in message


@pytest.mark.parametrize("value", [PASSWORD, "$2b$10$tooshort", HASH[:-1], HASH.replace("$2b$", "$2x$"), 12345],
                         ids=["password", "too-short", "cut-short", "unknown-prefix", "number"])   # HASH is salted anew
def test_a_password_where_a_hash_belongs_is_refused_without_showing_it(tmp_path, value):
    with pytest.raises(WebConfigError) as caught:
        parse({"basic_auth_users": {"prom": value}}, tmp_path)
    message = str(caught.value)
    assert "basic_auth_users.prom: not a bcrypt hash" in message and "htpasswd -nBC 10" in message
    assert str(value) not in message


def test_htpasswd_style_2y_hashes_are_accepted(tmp_path):
    hashed = HASH.replace("$2b$", "$2y$")
    assert parse({"basic_auth_users": {"prom": hashed}}, tmp_path).users == {"prom": hashed.encode()}


def test_unreadable_and_broken_files(tmp_path):
    with pytest.raises(WebConfigError, match=r"web config .*missing.yml: cannot read it \(No such file"):
        webconfig.load(tmp_path / "missing.yml")
    broken = tmp_path / "broken.yml"
    broken.write_text(f"basic_auth_users:\n  prom: '{HASH}'\n  [oops\n")
    with pytest.raises(WebConfigError) as caught:
        webconfig.load(broken)
    assert "not valid YAML at line" in str(caught.value)
    assert HASH not in str(caught.value)


def test_tls_files_are_checked_with_clear_errors(tmp_path, pki, caplog):
    def error_of(**changes: object) -> str:
        settings = webconfig.TlsSettings(pki.server_cert, pki.server_key, "RequireAndVerifyClientCert", pki.ca)
        settings = webconfig.TlsSettings(**{**settings.__dict__, **changes})
        with pytest.raises(WebConfigError) as caught:
            webconfig.server_context(settings)
        assert "\n" not in str(caught.value)
        return str(caught.value)

    assert "tls_server_config.cert_file" in error_of(cert_file=tmp_path / "nope.crt")
    assert "cannot read it" in error_of(cert_file=tmp_path / "nope.crt")
    (tmp_path / "text.crt").write_text("hello\n")
    assert "cert_file" in error_of(cert_file=tmp_path / "text.crt") and "no PEM certificate" in error_of(
        cert_file=tmp_path / "text.crt")
    assert "no PEM private key" in error_of(key_file=pki.ca)
    assert "does not belong to the certificate" in error_of(key_file=pki.client_key)
    encrypted = tmp_path / "encrypted.key"
    subprocess.run(["openssl", "pkey", "-in", str(pki.server_key), "-aes256", "-passout", "pass:x", "-out",
                    str(encrypted)], check=True, capture_output=True)
    assert "the key is encrypted" in error_of(key_file=encrypted)
    assert "client_ca_file" in error_of(client_ca_file=tmp_path / "text.crt")
    # A key everyone may read works, with a warning that says what to do.
    loose = tmp_path / "loose.key"
    shutil.copy(pki.server_key, loose)
    loose.chmod(0o644)
    with caplog.at_level(logging.WARNING):
        webconfig.server_context(webconfig.TlsSettings(pki.server_cert, loose))
    assert "readable by every user" in caplog.text and "chmod 600" in caplog.text


# -- basic auth ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("header", "expected"),
    [
        (basic("prom", "pw"), ("prom", b"pw")),
        (basic("prom", "p:w:x"), ("prom", b"p:w:x")),
        ("basic " + basic("a", "b").split()[1], ("a", b"b")),
        (None, None), ("", None), ("Bearer abc", None), ("Basic !!!notbase64", None),
        ("Basic " + "bm9jb2xvbg==", None),  # "nocolon"
        ("Basic /w==", None),               # not UTF-8 as a user name
    ],
)
def test_parse_basic(header, expected):
    assert parse_basic(header) == expected


def run(coroutine):
    return asyncio.run(coroutine)


def test_outcomes_are_cached_so_a_scraper_pays_bcrypt_once():
    auth = BasicAuth({"prom": HASH.encode()}, webconfig.ThreadPoolExecutor(1))

    async def scenario() -> list[int]:
        return [await auth.authorize(header) for header in (
            basic("prom", PASSWORD), basic("prom", PASSWORD), basic("prom", WRONG), basic("prom", WRONG),
            basic("nobody", PASSWORD), None, basic("prom", "x" * 100), basic("prom", PASSWORD))]

    assert run(scenario()) == [200, 200, 401, 401, 401, 401, 401, 200]
    # right, wrong, unknown user (checked against a decoy hash: same cost), too long
    assert auth.checks == 4


def test_a_flood_of_guesses_queues_a_bounded_number_of_checks_and_the_rest_get_429():
    auth = BasicAuth({"prom": HASH.encode()}, webconfig.ThreadPoolExecutor(1))

    async def flood() -> list[int]:
        return await asyncio.gather(*(auth.authorize(basic("prom", f"guess{i}")) for i in range(20)))

    answers = run(flood())
    assert answers.count(401) == webconfig.MAX_PENDING_CHECKS
    assert answers.count(429) == 20 - webconfig.MAX_PENDING_CHECKS
    assert auth.checks == webconfig.MAX_PENDING_CHECKS


# -- the server with a web config --------------------------------------------------------------------
def test_tls_with_client_certificates_and_basic_auth(tmp_path, pki, serve, caplog):
    access = WebAccess(write_config(tmp_path / "web.yml", pki, users={"prom": HASH}))
    server = serve(access)
    good = client_context(pki, (pki.client_cert, pki.client_key))
    with caplog.at_level(logging.DEBUG):
        status, headers, body = https_get(server, good, basic("prom", PASSWORD))
        assert (status, body) == (200, b"flopwatch_x 1\n")
        for auth in (basic("prom", WRONG), None, basic("stranger", PASSWORD)):
            status, headers, body = https_get(server, good, auth)
            assert status == 401
            assert headers["WWW-Authenticate"].startswith("Basic realm=")
            assert b"user and password" in body
        status, headers, body = https_get(server, good, basic("prom", WRONG), method="HEAD")
        assert status == 401 and body == b""
        assert server.responses == {200: 1, 401: 4}

        assert refused(server, client_context(pki))                                        # no client cert
        assert refused(server, client_context(pki, (pki.stranger_cert, pki.stranger_key)))  # untrusted CA
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as plain:      # plain HTTP
            plain.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            assert plain.recv(100) == b""
        assert wait_for(lambda: sum(server.tls_failures.values()) == 3)
        assert server.tls_failures == {"no_client_cert": 1, "bad_client_cert": 1, "plain_http": 1}
        assert https_get(server, good, basic("prom", PASSWORD))[0] == 200   # still serving
    assert WRONG not in caplog.text and PASSWORD not in caplog.text
    assert basic("prom", WRONG).split()[1] not in caplog.text
    assert server.responses[401] == 4  # the refused handshakes never reached HTTP


def test_client_certificate_if_given_and_tls13_only(tmp_path, pki, serve):
    access = WebAccess(write_config(tmp_path / "web.yml", pki, auth="VerifyClientCertIfGiven",
                                    extra_tls="  min_version: TLS13\n"))
    server = serve(access)
    assert https_get(server, client_context(pki))[0] == 200           # no certificate: fine, no users
    assert https_get(server, client_context(pki, (pki.client_cert, pki.client_key)))[0] == 200
    assert refused(server, client_context(pki, (pki.stranger_cert, pki.stranger_key)))
    assert refused(server, client_context(pki, maximum_version=ssl.TLSVersion.TLSv1_2))
    assert wait_for(lambda: server.tls_failures == {"bad_client_cert": 1, "protocol": 1})


def test_basic_auth_without_tls(tmp_path, serve):
    server = serve(WebAccess(write_config(tmp_path / "web.yml", None, users={"prom": HASH})))
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
    for auth, status in ((basic("prom", WRONG), 401), (basic("prom", PASSWORD), 200), (None, 401)):
        connection.request("GET", "/metrics", headers={"Authorization": auth} if auth else {})
        answer = connection.getresponse()
        answer.read()
        assert answer.status == status
    connection.close()
    assert server.responses == {401: 2, 200: 1}


TOKEN = "fw-" + "3b9e" * 16  # not itself 64 hex digits


def test_bearer_tokens_with_and_beside_basic_auth(tmp_path, serve):
    """Alertmanager's webhook and Prometheus's `authorization` send `Bearer <token>`; either kind admits."""
    path = write_config(tmp_path / "web.yml", None, users={"prom": HASH})
    digest = hashlib.sha256(TOKEN.encode()).hexdigest()
    path.write_text(path.read_text() + f"bearer_tokens:\n  alertmanager: {digest}\n")
    access = WebAccess(path)
    assert access.config.authenticates and list(access.config.tokens) == ["alertmanager"]
    server = serve(access)
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
    cases = ((f"Bearer {TOKEN}", 200), (f"bearer  {TOKEN} ", 200), (f"Bearer {TOKEN[:-1]}", 401),
             (f"Bearer {PASSWORD}", 401), ("Bearer ", 401), ("Bearer " + "a" * 5000, 401),
             (basic("prom", PASSWORD), 200), (basic("prom", WRONG), 401), (None, 401))
    for auth, status in cases:
        connection.request("GET", "/metrics", headers={"Authorization": auth} if auth else {})
        answer = connection.getresponse()
        answer.read()
        assert answer.status == status, auth
    connection.close()
    assert server.responses == {200: 3, 401: 6}


def test_tokens_alone_refuse_basic_auth(tmp_path):
    digest = hashlib.sha256(TOKEN.encode()).hexdigest()
    access = WebAccess(_tokens_only(tmp_path, digest))
    answers = [asyncio.run(access.authorize(header)) for header in (f"Bearer {TOKEN}", basic("prom", PASSWORD), None)]
    access.close()
    assert answers == [200, 401, 401]


def _tokens_only(tmp_path: Path, digest: str) -> Path:
    path = tmp_path / "tokens.yml"
    path.write_text(f"bearer_tokens:\n  alertmanager: {digest.upper()}\n")
    return path


@pytest.mark.parametrize("value", [TOKEN, "ab" * 31, "zz" * 32, 12345, None])
def test_a_token_where_a_digest_belongs_is_refused_without_showing_it(tmp_path, value):
    with pytest.raises(WebConfigError, match=r"bearer_tokens\.alertmanager: not a SHA-256 digest") as error:
        parse({"bearer_tokens": {"alertmanager": value}}, tmp_path)
    assert TOKEN not in str(error.value) and "\n" not in str(error.value)


def test_a_handshake_that_never_comes_is_cut_off_and_counted(tmp_path, pki, serve, monkeypatch):
    monkeypatch.setattr(http_module, "TLS_HANDSHAKE_TIMEOUT_S", 0.3)
    server = serve(WebAccess(write_config(tmp_path / "web.yml", pki, auth=None)))
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as idle:
        assert idle.recv(100) == b""  # closed by the server after the handshake timeout
    assert wait_for(lambda: server.tls_failures == {"timeout": 1})


def test_rotated_certificate_and_passwords_reach_new_connections_without_a_restart(tmp_path, pki, serve, caplog):
    tls_dir = tmp_path / "tls"
    tls_dir.mkdir()
    cert, key = tls_dir / "agent.crt", tls_dir / "agent.key"
    shutil.copy(pki.server_cert, cert)
    shutil.copy(pki.server_key, key)
    path = tmp_path / "web.yml"

    def write(password_hash: str) -> None:
        path.write_text(f"tls_server_config:\n  cert_file: tls/agent.crt\n  key_file: tls/agent.key\n"
                        f"basic_auth_users:\n  prom: '{password_hash}'\n")

    write(HASH)
    clock = Clock()
    access = WebAccess(path, clock=clock)
    server = serve(access)
    context = client_context(pki)

    def served_cert() -> bytes:
        with socket.create_connection(("127.0.0.1", server.port)) as raw, \
                context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            return tls.getpeercert(binary_form=True)

    def der(pem: Path) -> bytes:
        return ssl.PEM_cert_to_DER_cert(pem.read_text())

    assert served_cert() == der(pki.server_cert)
    new_cert, new_key = renew_server_cert(pki)
    shutil.copy(new_cert, cert)
    assert served_cert() == der(pki.server_cert)   # not looked at again within RELOAD_CHECK_S
    clock.tick()
    with caplog.at_level(logging.WARNING):
        assert served_cert() == der(pki.server_cert)   # half-rotated (new cert, old key): old kept
    assert "cannot be used" in caplog.text and "does not belong" in caplog.text
    shutil.copy(new_key, key)
    clock.tick()
    assert served_cert() == der(new_cert)
    assert access.reloads == 1

    write(bcrypt_hash("rotated-password"))
    clock.tick()
    assert https_get(server, context, basic("prom", PASSWORD))[0] == 401
    assert https_get(server, context, basic("prom", "rotated-password"))[0] == 200

    caplog.clear()
    path.write_text(f"basic_auth_users:\n  prom: '{HASH}'\n")   # TLS off: needs a restart
    clock.tick()
    with caplog.at_level(logging.WARNING):
        assert https_get(server, context, basic("prom", "rotated-password"))[0] == 200
    assert "needs a restart" in caplog.text


# -- the agent command ---------------------------------------------------------------------------------
def test_web_config_setting_and_flag(tmp_path):
    assert "web_config" in cfg.FIELDS
    assert cfg.load(environ={}).web_config is None
    assert cfg.load(environ={"FLOPWATCH_WEB_CONFIG": "/etc/flopwatch/web.yml"}).web_config == "/etc/flopwatch/web.yml"
    assert cfg.load(overrides={"web_config": "w.yml"}, environ={}).values["web_config"] == "w.yml"


def test_a_bad_web_config_stops_the_agent_with_one_line_and_no_secret(tmp_path, capsys):
    path = tmp_path / "web.yml"
    path.write_text(f"basic_auth_users:\n  prom: {PASSWORD}\n")
    code = cli_main(["agent", "--backend", "sim", "--once", "--web-config", str(path)])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert err.startswith("flopwatch agent: web config error: ") and "\n" not in err
    assert "basic_auth_users.prom: not a bcrypt hash" in err and PASSWORD not in err


def test_the_agent_exports_refused_handshakes_and_401s(tmp_path, pki, sim_config):
    access = WebAccess(write_config(tmp_path / "web.yml", pki, users={"prom": HASH}))
    agent = build_agent(sim_config)
    try:
        agent.serve("127.0.0.1", 0, access)
        assert refused(agent.http, client_context(pki, (pki.stranger_cert, pki.stranger_key)))
        assert https_get(agent.http, client_context(pki, (pki.client_cert, pki.client_key)), None)[0] == 401
        assert wait_for(lambda: agent.http.tls_failures)
        agent.collect_once()
        text = agent.exposition().decode()
        assert 'flopwatch_http_tls_handshake_failures_total{node="test-node",reason="bad_client_cert"} 1.0' in text
        assert 'flopwatch_http_responses_total{node="test-node",code="401"} 1.0' in text
        assert PASSWORD not in text and HASH not in text
    finally:
        agent.http.stop()
        access.close()
        agent.close()


"""Certificates made at test time with Debian's `openssl`: a CA, a server certificate for
127.0.0.1/localhost, a client certificate from the same CA, and a client certificate from a CA the
agent does not trust. Shared by tests/test_webconfig.py and tests/integration/test_agent_tls.py."""

from __future__ import annotations

import base64
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Pki:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    stranger_cert: Path   # a client certificate from another CA
    stranger_key: Path


def _openssl(*args: str, cwd: Path) -> None:
    binary = shutil.which("openssl")
    if binary is None:
        raise AssertionError("openssl not found: install the Debian package 'openssl' (apt-get install openssl)")
    done = subprocess.run([binary, *args], cwd=cwd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise AssertionError(f"openssl {' '.join(args)} failed: {done.stderr.strip()}")


def _key(name: str, cwd: Path) -> None:
    _openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", f"{name}.key", cwd=cwd)
    (cwd / f"{name}.key").chmod(0o600)


def _ca(name: str, cwd: Path) -> None:
    _key(name, cwd)
    _openssl("req", "-x509", "-new", "-key", f"{name}.key", "-out", f"{name}.crt", "-days", "2",
             "-subj", f"/CN=FlopWatch test {name}", cwd=cwd)


def _signed(name: str, ca: str, cwd: Path, extensions: str) -> None:
    _key(name, cwd)
    _openssl("req", "-new", "-key", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN=flopwatch-{name}", cwd=cwd)
    (cwd / f"{name}.ext").write_text(extensions)
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.crt", "-CAkey", f"{ca}.key", "-CAcreateserial",
             "-out", f"{name}.crt", "-days", "2", "-extfile", f"{name}.ext", cwd=cwd)


SERVER_EXT = "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n"
CLIENT_EXT = "extendedKeyUsage=clientAuth\n"


def make_pki(directory: Path) -> Pki:
    directory.mkdir(parents=True, exist_ok=True)
    _ca("ca", directory)
    _ca("other-ca", directory)
    _signed("server", "ca", directory, SERVER_EXT)
    _signed("client", "ca", directory, CLIENT_EXT)
    _signed("stranger", "other-ca", directory, CLIENT_EXT)
    d = directory
    return Pki(d / "ca.crt", d / "server.crt", d / "server.key", d / "client.crt", d / "client.key",
               d / "stranger.crt", d / "stranger.key")


def renew_server_cert(pki: Pki, name: str = "server2") -> tuple[Path, Path]:
    """A second server certificate from the same CA (for rotation tests)."""
    _signed(name, "ca", pki.ca.parent, SERVER_EXT)
    return pki.ca.parent / f"{name}.crt", pki.ca.parent / f"{name}.key"


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()

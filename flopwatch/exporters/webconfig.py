"""Access control for the agent's endpoint: the web config file Prometheus exporters share.

The format is exporter-toolkit's (node_exporter's `--web.config.file`), so one file and one set of
habits serve every exporter on a node (`flopwatch agent --web-config FILE`):

    tls_server_config:
      cert_file: /etc/flopwatch/tls/agent.crt
      key_file: /etc/flopwatch/tls/agent.key
      client_auth_type: RequireAndVerifyClientCert   # NoClientCert (default) | VerifyClientCertIfGiven
      client_ca_file: /etc/flopwatch/tls/ca.crt
      min_version: TLS12                             # default TLS12; max_version default TLS13
    basic_auth_users:
      prometheus: $2y$10$X0h1gDsPszWURQaxFh.zoubFi6DXncSjhoQNJgRrnGs7EsimhC7zG
    bearer_tokens:                                   # FlopWatch's own key: exporter-toolkit has none
      alertmanager: 3f1c...64 hex digits             # SHA-256 of the token: printf %s "$TOKEN" | sha256sum

`bearer_tokens` is for clients that send `Authorization: Bearer <token>` (Alertmanager's webhook
`http_config.authorization`, Prometheus's scrape `authorization`). A token is a random secret
(`openssl rand -hex 32`), so its SHA-256 is stored rather than a slow hash: guessing it is as hard as
guessing the token. Basic auth and bearer tokens may both be set; either one admits a request.

Relative paths are taken from the file's own directory. A wrong value is a one-line
WebConfigError naming the key; a hash or a password never appears in one, nor in a log line.
The files are watched: a changed certificate, key, client CA or user list reaches new connections
without a restart (the previous settings stay, with a warning, while the new ones are invalid);
turning TLS on or off needs a restart, as with exporter-toolkit.

Passwords are checked with bcrypt (about 70 ms at cost 10) on one worker thread, never on the
event loop; outcomes are cached under a SHA-256 of user and password, so a scraper pays the cost
once, and a flood of guesses queues at most MAX_PENDING_CHECKS checks before it is answered 429.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import hmac
import logging
import re
import ssl
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flopwatch import yamlfile
from flopwatch.config import ConfigError, read_text_file

log = logging.getLogger(__name__)

RELOAD_CHECK_S = 1.0          # files are looked at (stat) at most this often
MAX_PENDING_CHECKS = 8        # bcrypt checks queued at once; more are answered 429
CACHE_SIZE = 256              # remembered (user, password) outcomes
BCRYPT_MAX_PASSWORD = 72      # bcrypt ignores (newer versions refuse) longer passwords
MAX_BEARER_TOKEN = 4096       # longer headers are refused before hashing

TLS_VERSIONS = {
    "TLS10": ssl.TLSVersion.TLSv1, "TLS11": ssl.TLSVersion.TLSv1_1,
    "TLS12": ssl.TLSVersion.TLSv1_2, "TLS13": ssl.TLSVersion.TLSv1_3,
}
CLIENT_AUTH = {
    "NoClientCert": ssl.CERT_NONE,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}
#: exporter-toolkit's policies that accept a client certificate without verifying it: Python's
#: TLS cannot, and they authenticate nobody anyway.
UNVERIFIED_CLIENT_AUTH = ("RequestClientCert", "RequireAnyClientCert", "RequireClientCert")
TLS_KEYS = ("cert_file", "key_file", "client_auth_type", "client_ca_file", "min_version", "max_version")
#: exporter-toolkit keys FlopWatch does not implement, and what to do instead.
UNSUPPORTED = {
    "tls_server_config.cert": "write the certificate to a file and give cert_file",
    "tls_server_config.key": "write the key to a file readable only by the agent and give key_file",
    "tls_server_config.client_ca": "write the CA to a file and give client_ca_file",
    "tls_server_config.client_allowed_sans": "issue client certificates from a CA used only for scrapers",
    "tls_server_config.cipher_suites": "remove it: OpenSSL's defaults apply (set min_version: TLS13 to narrow them)",
    "tls_server_config.curve_preferences": "remove it: OpenSSL's defaults apply",
    "tls_server_config.prefer_server_cipher_suites": "remove it: OpenSSL's defaults apply",
    "http_server_config.headers": "remove it: the agent serves metrics, not pages",
    "rate_limit": "remove it: scrapes are cheap and each connection is bounded in size and time",
}
_BCRYPT = re.compile(r"\$2[aby]\$(0[4-9]|[12]\d|3[01])\$[./A-Za-z0-9]{53}")
HASH_HINT = "generate one with: htpasswd -nBC 10 \"\" | tr -d ':\\n'"
_SHA256 = re.compile(r"[0-9a-f]{64}")
TOKEN_HINT = "write the SHA-256 of the token, never the token: printf %s \"$TOKEN\" | sha256sum"


class WebConfigError(ValueError):
    """The web config is wrong; the message names the key and what is expected (never a secret)."""


@dataclass(frozen=True)
class TlsSettings:
    cert_file: Path
    key_file: Path
    client_auth_type: str = "NoClientCert"
    client_ca_file: Path | None = None
    min_version: str = "TLS12"
    max_version: str = "TLS13"

    @property
    def files(self) -> tuple[Path, ...]:
        return (self.cert_file, self.key_file) + ((self.client_ca_file,) if self.client_ca_file else ())


@dataclass(frozen=True)
class WebConfig:
    tls: TlsSettings | None = None
    users: Mapping[str, bytes] = field(default_factory=dict, repr=False)  # name -> bcrypt hash
    tokens: Mapping[str, bytes] = field(default_factory=dict, repr=False)  # name -> SHA-256 of a bearer token

    @property
    def authenticates(self) -> bool:
        return bool(self.users or self.tokens)


# -- reading and validating ------------------------------------------------------------------------
def load(path: str | Path) -> WebConfig:
    """Read and validate a web config file; raises WebConfigError."""
    path = Path(path)
    try:
        data = yamlfile.load(path, "web config")
    except yamlfile.YamlFileError as error:  # the line number, never the line: it may hold a hash
        raise WebConfigError(str(error)) from None
    return parse(data, path.parent, str(path))


def parse(data: Any, base: Path, source: str = "web config") -> WebConfig:
    """Validate the decoded YAML of a web config; relative paths are taken from `base`."""
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise WebConfigError(f"{source}: expected a mapping with tls_server_config, basic_auth_users "
                             "and/or bearer_tokens")
    known = ("tls_server_config", "basic_auth_users", "bearer_tokens", "http_server_config")
    for key in data:
        if key in UNSUPPORTED:
            raise WebConfigError(f"{source}: {key} is not supported by FlopWatch; {UNSUPPORTED[key]}")
        if key not in known:
            raise WebConfigError(f"{source}: unknown key {key!r} (known: {', '.join(known)})")
    _check_http_server_config(data.get("http_server_config"), source)
    tls = _parse_tls(data.get("tls_server_config"), base, source)
    users = _parse_users(data.get("basic_auth_users"), source)
    tokens = _parse_tokens(data.get("bearer_tokens"), source)
    return WebConfig(tls, users, tokens)


def _check_http_server_config(section: Any, source: str) -> None:
    """Accepted for compatibility with existing files: only `http2`, which changes nothing here
    (the agent speaks HTTP/1.1, which every Prometheus scrapes)."""
    if section is None:
        return
    if not isinstance(section, Mapping):
        raise WebConfigError(f"{source}: http_server_config: expected a mapping")
    for key, value in section.items():
        dotted = f"http_server_config.{key}"
        if dotted in UNSUPPORTED:
            raise WebConfigError(f"{source}: {dotted} is not supported by FlopWatch; {UNSUPPORTED[dotted]}")
        if key != "http2":
            raise WebConfigError(f"{source}: unknown key {dotted!r} (known: http_server_config.http2)")
        if not isinstance(value, bool):
            raise WebConfigError(f"{source}: {dotted}: expected true or false")


def _parse_tls(section: Any, base: Path, source: str) -> TlsSettings | None:
    if section is None:
        return None
    if not isinstance(section, Mapping):
        raise WebConfigError(f"{source}: tls_server_config: expected a mapping with cert_file and key_file")
    for key in section:
        dotted = f"tls_server_config.{key}"
        if dotted in UNSUPPORTED:
            raise WebConfigError(f"{source}: {dotted} is not supported by FlopWatch; {UNSUPPORTED[dotted]}")
        if key not in TLS_KEYS:
            raise WebConfigError(f"{source}: unknown key {dotted!r} (known: {', '.join(TLS_KEYS)})")

    def path_of(key: str, required: bool) -> Path | None:
        value = section.get(key)
        if value is None or value == "":
            if required:
                raise WebConfigError(f"{source}: tls_server_config.{key} is missing; give the path of a PEM file")
            return None
        if not isinstance(value, str):
            raise WebConfigError(f"{source}: tls_server_config.{key}: expected a file path")
        path = Path(value).expanduser()
        return path if path.is_absolute() else base / path

    def choice(key: str, default: str, allowed: Mapping[str, Any]) -> str:
        value = section.get(key)
        if value is None or value == "":
            return default
        if value not in allowed:
            raise WebConfigError(f"{source}: tls_server_config.{key} = {value!r}: expected one of "
                                 f"{', '.join(allowed)}")
        return str(value)

    auth = section.get("client_auth_type")
    if auth in UNVERIFIED_CLIENT_AUTH:
        raise WebConfigError(f"{source}: tls_server_config.client_auth_type = {auth!r} accepts certificates "
                             "without verifying them; use RequireAndVerifyClientCert with client_ca_file")
    settings = TlsSettings(
        cert_file=path_of("cert_file", True),  # type: ignore[arg-type]
        key_file=path_of("key_file", True),  # type: ignore[arg-type]
        client_auth_type=choice("client_auth_type", "NoClientCert", CLIENT_AUTH),
        client_ca_file=path_of("client_ca_file", False),
        min_version=choice("min_version", "TLS12", TLS_VERSIONS),
        max_version=choice("max_version", "TLS13", TLS_VERSIONS),
    )
    if settings.client_ca_file is not None and settings.client_auth_type == "NoClientCert":
        raise WebConfigError(f"{source}: tls_server_config.client_ca_file is set but client_auth_type is "
                             "NoClientCert; set client_auth_type: RequireAndVerifyClientCert (or drop the CA)")
    if settings.client_ca_file is None and settings.client_auth_type != "NoClientCert":
        raise WebConfigError(f"{source}: tls_server_config.client_auth_type {settings.client_auth_type} needs "
                             "client_ca_file, the CA that signs the scrapers' certificates")
    if TLS_VERSIONS[settings.min_version] > TLS_VERSIONS[settings.max_version]:
        raise WebConfigError(f"{source}: tls_server_config.min_version {settings.min_version} is above "
                             f"max_version {settings.max_version}")
    return settings


def _parse_users(section: Any, source: str) -> dict[str, bytes]:
    if section is None:
        return {}
    if not isinstance(section, Mapping):
        raise WebConfigError(f"{source}: basic_auth_users: expected a mapping of user names to bcrypt hashes")
    users: dict[str, bytes] = {}
    for name, hashed in section.items():
        if not isinstance(name, str) or not name or ":" in name or not name.isprintable():
            raise WebConfigError(f"{source}: basic_auth_users: user name {str(name)[:64]!r} is not usable "
                                 "(printable, not empty, no ':')")
        if not isinstance(hashed, str) or not _BCRYPT.fullmatch(hashed):
            raise WebConfigError(f"{source}: basic_auth_users.{name}: not a bcrypt hash (the value is not "
                                 f"shown); write the hash, never the password: {HASH_HINT}")
        users[name] = hashed.encode("ascii")
    return users


def _parse_tokens(section: Any, source: str) -> dict[str, bytes]:
    if section is None:
        return {}
    if not isinstance(section, Mapping):
        raise WebConfigError(f"{source}: bearer_tokens: expected a mapping of client names to SHA-256 digests")
    tokens: dict[str, bytes] = {}
    for name, digest in section.items():
        if not isinstance(name, str) or not name or not name.isprintable():
            raise WebConfigError(f"{source}: bearer_tokens: client name {str(name)[:64]!r} is not usable "
                                 "(printable, not empty)")
        if not isinstance(digest, str) or not _SHA256.fullmatch(digest.strip().lower()):
            raise WebConfigError(f"{source}: bearer_tokens.{name}: not a SHA-256 digest of 64 hex digits (the "
                                 f"value is not shown); {TOKEN_HINT}")
        tokens[name] = bytes.fromhex(digest.strip())
    return tokens


# -- TLS ---------------------------------------------------------------------------------------------
def server_context(tls: TlsSettings) -> ssl.SSLContext:
    """An SSLContext serving `tls`'s certificate and checking client certificates as it says."""
    cert_text = _read_pem(tls.cert_file, "cert_file")
    key_text = _read_pem(tls.key_file, "key_file")
    if "-----BEGIN CERTIFICATE-----" not in cert_text:
        raise WebConfigError(f"tls_server_config.cert_file {tls.cert_file}: no PEM certificate in it")
    if "PRIVATE KEY-----" not in key_text:
        raise WebConfigError(f"tls_server_config.key_file {tls.key_file}: no PEM private key in it")
    if "ENCRYPTED" in key_text:
        raise WebConfigError(f"tls_server_config.key_file {tls.key_file}: the key is encrypted; give an "
                             "unencrypted key in a file only the agent's user can read")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.minimum_version = TLS_VERSIONS[tls.min_version]
        context.maximum_version = TLS_VERSIONS[tls.max_version]
    except (ValueError, ssl.SSLError):
        raise WebConfigError(f"tls_server_config.min_version {tls.min_version}: not allowed by this "
                             "system's OpenSSL; use TLS12 or TLS13") from None
    try:
        context.load_cert_chain(tls.cert_file, tls.key_file, password=_refuse_password)
    except WebConfigError:
        raise WebConfigError(f"tls_server_config.key_file {tls.key_file}: the key is encrypted; give an "
                             "unencrypted key in a file only the agent's user can read") from None
    except ssl.SSLError as error:
        if "KEY_VALUES_MISMATCH" in str(error):
            raise WebConfigError(f"tls_server_config.key_file {tls.key_file}: does not belong to the "
                                 f"certificate in {tls.cert_file}") from None
        raise WebConfigError(f"tls_server_config.cert_file {tls.cert_file} / key_file {tls.key_file}: not a "
                             f"usable PEM certificate and key ({error.reason or 'unreadable'})") from None
    context.verify_mode = CLIENT_AUTH[tls.client_auth_type]
    if tls.client_ca_file is not None:
        ca_text = _read_pem(tls.client_ca_file, "client_ca_file")
        if "-----BEGIN CERTIFICATE-----" not in ca_text:
            raise WebConfigError(f"tls_server_config.client_ca_file {tls.client_ca_file}: no PEM certificate in it")
        try:
            context.load_verify_locations(cafile=tls.client_ca_file)
        except ssl.SSLError as error:
            raise WebConfigError(f"tls_server_config.client_ca_file {tls.client_ca_file}: not a usable PEM "
                                 f"CA certificate ({error.reason or 'unreadable'})") from None
    if tls.key_file.stat().st_mode & 0o004:
        log.warning("TLS key %s is readable by every user on this host; chmod 600 it (or 640 with the "
                    "agent's group)", tls.key_file)
    return context


def _read_pem(path: Path, key: str) -> str:
    try:
        return read_text_file(path, f"tls_server_config.{key}")
    except ConfigError as error:
        raise WebConfigError(str(error)) from None


def _refuse_password() -> bytes:
    """Never let OpenSSL prompt on the terminal for a key's passphrase."""
    raise WebConfigError("the TLS key is encrypted")


# -- basic auth ------------------------------------------------------------------------------------
def parse_basic(header: str | None) -> tuple[str, bytes] | None:
    """`Authorization: Basic base64(user:password)` -> (user, password); None when absent or malformed."""
    if not header:
        return None
    scheme, _, token = header.strip().partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        raw = base64.b64decode(token.strip(), validate=True)
        user, sep, password = raw.partition(b":")
        return (user.decode("utf-8"), password) if sep else None
    except (binascii.Error, ValueError):
        return None


def parse_bearer(header: str | None) -> bytes | None:
    """`Authorization: Bearer <token>` -> the token's bytes; None when absent, malformed or too long."""
    if not header or len(header) > MAX_BEARER_TOKEN:
        return None
    scheme, _, token = header.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token or not token.isprintable():
        return None
    return token.encode("utf-8")


class BearerAuth:
    """Checks a bearer token against SHA-256 digests, in constant time per digest."""

    def __init__(self, tokens: Mapping[str, bytes]) -> None:
        self._digests = tuple(tokens.values())

    def authorize(self, header: str | None) -> int:
        token = parse_bearer(header)
        if token is None:
            return 401
        digest = hashlib.sha256(token).digest()
        matched = False
        for known in self._digests:  # every digest compared: timing does not tell which one matched
            matched |= hmac.compare_digest(digest, known)
        return 200 if matched else 401


class BasicAuth:
    """Checks credentials against bcrypt hashes off the event loop, remembering outcomes."""

    def __init__(self, users: Mapping[str, bytes], executor: ThreadPoolExecutor) -> None:
        import bcrypt  # a dependency of flopwatch; imported only when basic auth is on

        self._bcrypt = bcrypt
        self._users = dict(users)
        self._executor = executor
        self._cache: dict[bytes, bool] = {}
        self._pending = 0
        self._decoy: bytes | None = None
        self.checks = 0  # bcrypt computations done (cache misses)

    async def authorize(self, header: str | None) -> int:
        """200 when the credentials match, 401 when not, 429 when too many checks are queued."""
        credentials = parse_basic(header)
        if credentials is None:
            return 401
        user, password = credentials
        key = hashlib.sha256(user.encode() + b"\0" + password).digest()
        known = self._cache.get(key)
        if known is not None:
            return 200 if known else 401
        if self._pending >= MAX_PENDING_CHECKS:
            return 429
        self._pending += 1
        try:
            ok = await asyncio.get_running_loop().run_in_executor(self._executor, self._check, user, password)
        finally:
            self._pending -= 1
        if len(self._cache) >= CACHE_SIZE:
            self._cache.pop(next(iter(self._cache)))
        self._cache[key] = ok
        return 200 if ok else 401

    def _check(self, user: str, password: bytes) -> bool:
        """bcrypt even for an unknown user (against a decoy hash), so timing does not tell names."""
        self.checks += 1
        hashed = self._users.get(user)
        if hashed is None:
            if self._decoy is None:
                cost = max((int(h[4:6]) for h in self._users.values()), default=10)
                self._decoy = self._bcrypt.hashpw(b"decoy", self._bcrypt.gensalt(cost))
            hashed = self._decoy
        try:
            ok = len(password) <= BCRYPT_MAX_PASSWORD and self._bcrypt.checkpw(password, hashed)
        except ValueError:
            ok = False
        return ok and user in self._users


# -- what the HTTP server asks ----------------------------------------------------------------------
class WebAccess:
    """TLS context and credential checks for HttpServer, following the files as they change.

    Everything runs on the server's event loop thread; only bcrypt runs on its own worker.
    """

    def __init__(self, path: str | Path, clock: Callable[[], float] = time.monotonic) -> None:
        self.path = Path(path)
        self._clock = clock
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="bcrypt")
        self.config = load(self.path)
        self._context, self._auth, self._bearer = self._build(self.config)
        self._stamps = self._stat(self.config)
        self._checked = clock()
        self.reloads = 0
        if self.config.tls is None and not self.config.authenticates:
            log.warning("web config %s enables neither TLS nor basic auth nor bearer tokens", self.path)

    @property
    def tls(self) -> bool:
        return self._context is not None

    def tls_context(self) -> ssl.SSLContext | None:
        self._maybe_reload()
        return self._context

    async def authorize(self, authorization: str | None) -> int:
        self._maybe_reload()
        if self._auth is None and self._bearer is None:
            return 200
        if self._bearer is not None and parse_bearer(authorization) is not None:
            return self._bearer.authorize(authorization)
        if self._auth is None:
            return 401
        return await self._auth.authorize(authorization)

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)

    def _build(self, config: WebConfig) -> tuple[ssl.SSLContext | None, BasicAuth | None, BearerAuth | None]:
        context = server_context(config.tls) if config.tls is not None else None
        auth = BasicAuth(config.users, self._executor) if config.users else None
        bearer = BearerAuth(config.tokens) if config.tokens else None
        return context, auth, bearer

    def _stat(self, config: WebConfig) -> tuple[tuple[int, int, int] | None, ...]:
        paths = (self.path, *(config.tls.files if config.tls else ()))
        stamps = []
        for path in paths:
            try:
                info = path.stat()
                stamps.append((info.st_mtime_ns, info.st_size, info.st_ino))
            except OSError:
                stamps.append(None)
        return tuple(stamps)

    def _maybe_reload(self) -> None:
        now = self._clock()
        if now - self._checked < RELOAD_CHECK_S:
            return
        self._checked = now
        stamps = self._stat(self.config)
        if stamps == self._stamps:
            return
        self._stamps = stamps  # a failed reload is tried again only when a file changes again
        try:
            config = load(self.path)
            if (config.tls is None) != (self.config.tls is None):
                raise WebConfigError("turning TLS on or off needs a restart of the agent")
            context, auth, bearer = self._build(config)
        except WebConfigError as error:
            log.warning("web config %s changed but cannot be used: %s; keeping the previous settings",
                        self.path, error)
            return
        self.config, self._context, self._auth, self._bearer = config, context, auth, bearer
        self._stamps = self._stat(config)
        self.reloads += 1
        log.info("web config %s reloaded (TLS %s, %d basic-auth user(s), %d bearer token(s))", self.path,
                 "on" if context else "off", len(config.users), len(config.tokens))

"""Uploading the dashboards to a running Grafana through its HTTP API (grafana-client), idempotently.

Two documented endpoints, nothing else:

- the folder, by uid: ``GET /api/folders/<uid>``, and ``POST /api/folders`` {title, uid} when it
  does not exist yet;
- each dashboard: ``POST /api/dashboards/db`` {dashboard (id null, stable uid), folderUid,
  overwrite: true, message}, so pushing again replaces the same dashboards (a new version each).

The token goes in the Authorization header only: every message here is built from the URL (with any
user:password removed) and Grafana's status, and scrubbed of the token, so it never reaches a log.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import niquests
from grafana_client import GrafanaApi
from grafana_client.client import GrafanaClientError, GrafanaException, GrafanaTimeoutError

from flopwatch import __version__

log = logging.getLogger(__name__)

DEFAULT_FOLDER = "FlopWatch"
_UID_CHARS = re.compile(r"[^a-z0-9_-]+")


class PushError(Exception):
    """Grafana could not be reached or refused: one line, without the token."""


class BadTarget(ValueError):
    """The URL or folder name cannot be used: one line saying what to pass instead."""


@dataclass(frozen=True)
class Pushed:
    uid: str
    title: str
    version: int | None
    url: str


def folder_uid(name: str) -> str:
    """A stable folder uid from its name ("FlopWatch" -> "flopwatch"), so re-pushes find it."""
    uid = _UID_CHARS.sub("-", name.strip().lower()).strip("-")[:40]
    if not uid:
        raise BadTarget(f"--folder {name!r}: use a name with letters or digits, e.g. FlopWatch")
    return uid


def display_url(url: str) -> str:
    """The URL without user:password, for messages."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = host + (f":{parts.port}" if parts.port else "")
    return f"{parts.scheme}://{netloc}{parts.path.rstrip('/')}"


def check_url(url: str) -> tuple[str, str, int | None, str, tuple[str, str] | None]:
    """(scheme, host, port, path prefix, URL credentials) of http[s]://[user:pass@]host[:port][/prefix]."""
    shown = re.sub(r"^([^/]*//)?[^/@]*@", r"\1", url)
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        parts, port = None, None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
        raise BadTarget(f"--url {shown!r}: expected http(s)://HOST[:PORT][/PATH], e.g. http://localhost:3000")
    credentials = (parts.username, parts.password) if parts.username and parts.password else None
    return parts.scheme, parts.hostname, port, parts.path.strip("/"), credentials


def connect(url: str, token: str | None, timeout: float) -> GrafanaApi:
    """A client for `url`; the token as Bearer, else basic auth from the URL, else none."""
    scheme, host, port, prefix, credentials = check_url(url)
    credential: Any = token or credentials
    return GrafanaApi(credential, host=host, port=port, protocol=scheme,
                      url_path_prefix=f"{prefix}/" if prefix else "", timeout=timeout,
                      user_agent=f"flopwatch/{__version__}")


def _reason(error: BaseException) -> str:
    """The operating system's reason inside a connection error, e.g. 'Connection refused'."""
    text = str(error)
    match = re.search(r"\[Errno -?\d+\] ([^'\")\]]+)", text)
    if match:
        return match.group(1).strip()
    if "timed out" in text.lower():
        return "timed out"
    return type(error).__name__


@contextmanager
def _talking_to(url: str, token: str | None, doing: str) -> Iterator[None]:
    """Turns every failure of one request into a PushError that names the URL, never the token."""
    where = display_url(url)

    def scrub(text: str) -> str:
        return text.replace(token, "***") if token else text

    try:
        yield
    except GrafanaTimeoutError:
        raise PushError(f"Grafana at {where} did not answer in time while {doing}; "
                        "check that it is up (or raise --timeout)") from None
    except GrafanaClientError as error:
        if error.status_code == 401:
            raise PushError(f"Grafana at {where} rejected the credentials (HTTP 401) while {doing}: "
                            "check GRAFANA_TOKEN or --token-file (a service-account token)") from None
        if error.status_code == 403:
            raise PushError(f"Grafana at {where} refused (HTTP 403) while {doing}: the token's service "
                            "account needs the Editor role (or folder permission)") from None
        raise PushError(scrub(f"Grafana at {where} answered HTTP {error.status_code} while {doing}: "
                              f"{_message(error)}")) from None
    except GrafanaException as error:
        status = f"HTTP {error.status_code}" if error.status_code else "an error"
        raise PushError(scrub(f"Grafana at {where} answered {status} while {doing}: {_message(error)}")) from None
    except niquests.exceptions.JSONDecodeError:
        raise PushError(f"{where} does not answer like Grafana's HTTP API while {doing}; check --url") from None
    except niquests.exceptions.RequestException as error:
        raise PushError(f"cannot reach Grafana at {where} ({_reason(error)}) while {doing}; "
                        "check --url and that Grafana is running") from None
    except ValueError:  # a 2xx answer that is not JSON: not a Grafana API
        raise PushError(f"{where} does not answer like Grafana's HTTP API while {doing}; check --url") from None


def _message(error: GrafanaException) -> str:
    response = error.response
    if isinstance(response, dict) and response.get("message"):
        return str(response["message"])[:200]
    return str(error.message).splitlines()[0][:200] if error.message else "no detail"


def ensure_folder(api: GrafanaApi, url: str, token: str | None, name: str) -> str:
    """The folder's uid, creating the folder when Grafana has none with that uid."""
    uid = folder_uid(name)
    with _talking_to(url, token, f"looking up folder {uid!r}"):
        try:
            folder = api.folder.get_folder(uid)
        except GrafanaClientError as error:
            if error.status_code != 404:
                raise
        else:
            if not isinstance(folder, dict):
                raise PushError(f"{display_url(url)} does not answer like Grafana's HTTP API; check --url")
            return uid
    with _talking_to(url, token, f"creating folder {name!r} (uid {uid})"):
        try:
            api.folder.create_folder(name, uid=uid)
        except GrafanaClientError as error:
            if error.status_code not in (409, 412):
                raise
            raise PushError(f"Grafana at {display_url(url)} already has a folder named {name!r} with "
                            f"another uid than {uid!r}: rename that folder or pass another --folder") from None
    log.info("created folder %r (uid %s)", name, uid)
    return uid


def push(url: str, token: str | None, dashboards: Mapping[str, dict[str, Any]], *,
         folder: str = DEFAULT_FOLDER, timeout: float = 10.0) -> list[Pushed]:
    """Uploads every dashboard into `folder`, overwriting earlier versions with the same uid."""
    api = connect(url, token, timeout)
    uid_of_folder = ensure_folder(api, url, token, folder)
    pushed = []
    for uid, dashboard in dashboards.items():
        body = {
            "dashboard": {**dashboard, "id": None, "uid": uid},
            "folderUid": uid_of_folder,
            "overwrite": True,
            "message": f"flopwatch dashboards push (flopwatch {__version__})",
        }
        with _talking_to(url, token, f"uploading dashboard {uid}"):
            answer = api.dashboard.update_dashboard(body)
        if not isinstance(answer, dict):
            raise PushError(f"{display_url(url)} does not answer like Grafana's HTTP API; check --url")
        result = Pushed(uid, dashboard.get("title", uid), answer.get("version"), str(answer.get("url", "")))
        log.info("pushed %s (%s) version %s: %s%s", uid, result.title, result.version, display_url(url),
                 result.url)
        pushed.append(result)
    return pushed

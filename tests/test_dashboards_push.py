"""`flopwatch dashboards push` against a local server speaking the two Grafana HTTP API endpoints it
uses (no Grafana server can be installed here, so this fake stands in for it at the HTTP seam):

- ``GET /api/folders/<uid>`` (404 when missing) and ``POST /api/folders`` {title, uid};
- ``POST /api/dashboards/db`` {dashboard, folderUid, overwrite, message}.

It checks Bearer tokens like Grafana (401 otherwise) and records every request, so the tests assert
the payloads, idempotent re-pushes, one-line errors with exit 1, and that the token never shows.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from flopwatch import dashboards
from flopwatch.cli import main
from flopwatch.commands.dashboards import read_token
from flopwatch.dashboards import push
from flopwatch.stack import free_port

TOKEN = "glsa_SeCrEt-token-0123456789abcdef"
UIDS = list(dashboards.BUILDERS)


class FakeGrafana(ThreadingHTTPServer):
    """Folders and dashboards in memory, Grafana's status codes and bodies for these endpoints."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.requests: list[dict[str, Any]] = []
        self.folders: dict[str, dict[str, Any]] = {}
        self.dashboards: dict[str, dict[str, Any]] = {}
        self.token = TOKEN
        self.basic: str | None = None     # "Basic ..." accepted instead of the token
        self.fail_dashboards: int | None = None
        self.delay = 0.0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def handle_error(self, request: object, client_address: object) -> None:
        pass  # a client that gave up (the timeout test) closes the socket under the handler

    def calls(self) -> list[tuple[str, str]]:
        return [(r["method"], r["path"]) for r in self.requests]


class Handler(BaseHTTPRequestHandler):
    server: FakeGrafana

    def log_message(self, *args: object) -> None:
        pass

    def _send(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _request(self, method: str) -> dict[str, Any] | None:
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length)) if length else None
        self.server.requests.append({"method": method, "path": self.path, "body": body,
                                     "auth": self.headers.get("Authorization")})
        time.sleep(self.server.delay)
        auth = self.headers.get("Authorization")
        if auth not in (f"Bearer {self.server.token}", self.server.basic):
            self._send(401, {"message": "invalid API key"})
            return None
        return body or {}

    def do_GET(self) -> None:
        if self._request("GET") is None:
            return
        uid = self.path.removeprefix("/api/folders/")
        if self.path.startswith("/api/folders/") and uid in self.server.folders:
            self._send(200, self.server.folders[uid])
        else:
            self._send(404, {"message": "folder not found", "status": "not-found"})

    def do_POST(self) -> None:
        body = self._request("POST")
        if body is None:
            return
        if self.path == "/api/folders":
            if any(f["title"] == body["title"] and f["uid"] != body.get("uid")
                   for f in self.server.folders.values()):
                self._send(409, {"message": "a folder with the same name already exists"})
                return
            folder = {"id": len(self.server.folders) + 1, "uid": body["uid"], "title": body["title"]}
            self.server.folders[body["uid"]] = folder
            self._send(200, folder)
        elif self.path == "/api/dashboards/db":
            if self.server.fail_dashboards:
                self._send(self.server.fail_dashboards, {"message": "database is locked"})
                return
            dashboard = body["dashboard"]
            uid = dashboard["uid"]
            if body.get("folderUid") not in self.server.folders:
                self._send(400, {"message": "folder not found"})
                return
            if uid in self.server.dashboards and not body.get("overwrite"):
                self._send(412, {"message": "A dashboard with the same uid already exists", "status":
                                 "name-exists"})
                return
            version = self.server.dashboards.get(uid, {}).get("version", 0) + 1
            self.server.dashboards[uid] = {"version": version, "body": body}
            self._send(200, {"id": 7, "uid": uid, "url": f"/d/{uid}/x", "status": "success",
                             "version": version, "slug": "x"})
        else:
            self._send(404, {"message": "Not found"})


@pytest.fixture
def grafana() -> Iterator[FakeGrafana]:
    server = FakeGrafana()
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def run(capsys, *args: str) -> tuple[int, str]:
    """`flopwatch dashboards push ARGS` in-process; (exit code, stdout + stderr)."""
    code = main(["dashboards", "push", *args])
    out, err = capsys.readouterr()
    return code, out + err


# --- payloads --------------------------------------------------------------------------------------
def test_push_creates_the_folder_and_uploads_every_dashboard(grafana: FakeGrafana, monkeypatch, capsys) -> None:
    monkeypatch.setenv("GRAFANA_TOKEN", TOKEN)
    code, output = run(capsys, "--url", grafana.url)
    assert code == 0, output
    assert grafana.calls() == [("GET", "/api/folders/flopwatch"), ("POST", "/api/folders")] + [
        ("POST", "/api/dashboards/db")] * len(UIDS)
    assert grafana.requests[1]["body"] == {"title": "FlopWatch", "uid": "flopwatch"}
    built = dashboards.build_all()
    for request, uid in zip(grafana.requests[2:], UIDS, strict=True):
        body = request["body"]
        assert body["overwrite"] is True and body["folderUid"] == "flopwatch"
        assert body["message"].startswith("flopwatch dashboards push")
        assert body["dashboard"]["id"] is None and body["dashboard"]["uid"] == uid
        assert {k: v for k, v in body["dashboard"].items() if k != "id"} == built[uid]
    assert all(r["auth"] == f"Bearer {TOKEN}" for r in grafana.requests)
    assert f"pushed {len(UIDS)} dashboards" in output and TOKEN not in output


def test_push_again_is_idempotent(grafana: FakeGrafana, monkeypatch, capsys) -> None:
    monkeypatch.setenv("GRAFANA_TOKEN", TOKEN)
    assert run(capsys, "--url", grafana.url)[0] == 0
    first = len(grafana.requests)
    code, output = run(capsys, "--url", grafana.url, "--log-level", "debug")
    assert code == 0 and TOKEN not in output
    second = grafana.calls()[first:]
    assert second == [("GET", "/api/folders/flopwatch")] + [("POST", "/api/dashboards/db")] * len(UIDS)
    assert sorted(grafana.dashboards) == sorted(UIDS)
    assert {d["version"] for d in grafana.dashboards.values()} == {2}
    assert len(grafana.folders) == 1
    # same content both times: only Grafana's version moves
    firsts = [r["body"] for r in grafana.requests[2:first]]
    assert firsts == [r["body"] for r in grafana.requests[first + 1:]]


def test_folder_name_gives_a_stable_uid(grafana: FakeGrafana, capsys, tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    code, output = run(capsys, "--url", grafana.url + "/", "--token-file", str(token_file),
                       "--folder", "Team GPU / Dashboards")
    assert code == 0, output
    assert grafana.folders == {"team-gpu-dashboards": {"id": 1, "uid": "team-gpu-dashboards",
                                                       "title": "Team GPU / Dashboards"}}
    assert {r["body"]["folderUid"] for r in grafana.requests[2:]} == {"team-gpu-dashboards"}
    assert push.folder_uid("FlopWatch") == "flopwatch"
    assert len(push.folder_uid("x" * 80)) == 40


def test_docs_url_reaches_the_pushed_runbook_links(grafana: FakeGrafana, monkeypatch, capsys) -> None:
    monkeypatch.setenv("GRAFANA_TOKEN", TOKEN)
    assert run(capsys, "--url", grafana.url, "--docs-url", "https://wiki.example/fw")[0] == 0
    text = json.dumps([d["body"]["dashboard"] for d in grafana.dashboards.values()])
    assert "https://wiki.example/fw/runbooks.md#flopwatchstraggler" in text


def test_credentials_in_the_url_use_basic_auth_and_stay_out_of_messages(grafana: FakeGrafana, capsys,
                                                                        monkeypatch) -> None:
    monkeypatch.delenv("GRAFANA_TOKEN", raising=False)
    grafana.basic = "Basic YWRtaW46aHVudGVyMg=="   # admin:hunter2
    url = grafana.url.replace("http://", "http://admin:hunter2@")
    code, output = run(capsys, "--url", url)
    assert code == 0, output
    assert "hunter2" not in output
    grafana.basic = None
    code, output = run(capsys, "--url", url)
    assert code == 1 and "hunter2" not in output and "rejected the credentials (HTTP 401)" in output


# --- failures: one line, exit 1 (2 for bad input), never the token ---------------------------------
def one_line(output: str) -> str:
    lines = [line for line in output.splitlines() if line.startswith("flopwatch dashboards: ")]
    assert len(lines) == 1, output
    assert "Traceback" not in output
    return lines[0]


def test_rejected_token_is_one_line_exit_1_and_never_logged(grafana: FakeGrafana, capsys, caplog,
                                                             monkeypatch) -> None:
    monkeypatch.setenv("GRAFANA_TOKEN", TOKEN)
    grafana.token = "another-token"
    with caplog.at_level(logging.DEBUG):
        code, output = run(capsys, "--url", grafana.url, "--log-level", "debug")
    assert code == 1
    assert one_line(output) == (
        f"flopwatch dashboards: Grafana at {grafana.url} rejected the credentials (HTTP 401) while looking up "
        "folder 'flopwatch': check GRAFANA_TOKEN or --token-file (a service-account token)")
    assert TOKEN not in output and TOKEN not in caplog.text
    assert grafana.calls() == [("GET", "/api/folders/flopwatch")]


def test_unreachable_grafana_is_one_line_exit_1(capsys, monkeypatch) -> None:
    monkeypatch.setenv("GRAFANA_TOKEN", TOKEN)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    attempts, connect = [], socket.socket.connect

    def counted(sock: socket.socket, address: object) -> None:
        attempts.append(address)
        connect(sock, address)

    monkeypatch.setattr(socket.socket, "connect", counted)
    code, output = run(capsys, "--url", url)
    assert code == 1
    assert attempts == [("127.0.0.1", port)]        # one try, then the answer: no retries to wait out
    line = one_line(output)
    assert line.startswith(f"flopwatch dashboards: cannot reach Grafana at {url} (")
    assert line.endswith("while looking up folder 'flopwatch'; check --url and that Grafana is running")
    assert "refused" in line.lower() and TOKEN not in output


def test_slow_grafana_times_out_with_one_line(grafana: FakeGrafana, capsys, monkeypatch) -> None:
    monkeypatch.setenv("GRAFANA_TOKEN", TOKEN)
    grafana.delay = 2.0
    code, output = run(capsys, "--url", grafana.url, "--timeout", "0.3")
    assert code == 1
    assert "did not answer in time while looking up folder" in one_line(output)


def test_server_error_on_upload_names_the_dashboard(grafana: FakeGrafana, capsys, monkeypatch) -> None:
    monkeypatch.setenv("GRAFANA_TOKEN", TOKEN)
    grafana.fail_dashboards = 500
    code, output = run(capsys, "--url", grafana.url)
    assert code == 1
    assert one_line(output) == (f"flopwatch dashboards: Grafana at {grafana.url} answered HTTP 500 while "
                                "uploading dashboard flopwatch-fleet: database is locked")


def test_forbidden_says_which_role(grafana: FakeGrafana, capsys, monkeypatch) -> None:
    monkeypatch.setenv("GRAFANA_TOKEN", TOKEN)
    grafana.fail_dashboards = 403
    code, output = run(capsys, "--url", grafana.url)
    assert code == 1 and "needs the Editor role" in one_line(output)


def test_folder_title_taken_by_another_uid(grafana: FakeGrafana, capsys, monkeypatch) -> None:
    monkeypatch.setenv("GRAFANA_TOKEN", TOKEN)
    grafana.folders["legacy"] = {"id": 1, "uid": "legacy", "title": "FlopWatch"}
    code, output = run(capsys, "--url", grafana.url)
    assert code == 1
    assert "already has a folder named 'FlopWatch' with another uid than 'flopwatch'" in one_line(output)


def test_not_grafana_at_that_url(capsys, monkeypatch) -> None:
    """A web server that answers 200 with HTML (wrong port, a proxy login page)."""

    class Html(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", "6")
            self.end_headers()
            self.wfile.write(b"<html>")

    server = ThreadingHTTPServer(("127.0.0.1", 0), Html)
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    try:
        monkeypatch.setenv("GRAFANA_TOKEN", TOKEN)
        code, output = run(capsys, "--url", f"http://127.0.0.1:{server.server_address[1]}")
    finally:
        server.shutdown()
        server.server_close()
    assert code == 1 and "does not answer like Grafana's HTTP API" in one_line(output)


@pytest.mark.parametrize(("args", "message"), [
    (["--url", "grafana:3000"], "--url 'grafana:3000': expected http(s)://HOST[:PORT][/PATH]"),
    (["--url", "http://localhost:3000", "--token-file", "/nonexistent/token"],
     "--token-file /nonexistent/token: No such file or directory"),
    (["--url", "http://localhost:3000", "--folder", "///"], "--folder '///': use a name with letters or digits"),
    (["--url", "http://localhost:3000", "--timeout", "0"], "--timeout: must be more than 0 seconds"),
])
def test_bad_input_is_one_line_exit_2(args: list[str], message: str, capsys) -> None:
    code, output = run(capsys, *args)
    assert code == 2
    assert one_line(output).startswith(f"flopwatch dashboards: {message}")


def test_token_sources(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.write_text("\n")
    with pytest.raises(Exception, match="the file is empty"):
        read_token(str(empty), {})
    token = tmp_path / "token"
    token.write_text(f"  {TOKEN}\n")
    assert read_token(str(token), {"GRAFANA_TOKEN": "env"}) == TOKEN   # the file wins
    assert read_token(None, {"GRAFANA_TOKEN": " env \n"}) == "env"
    assert read_token(None, {}) is None


def test_display_url_drops_credentials() -> None:
    assert push.display_url("https://u:p@grafana.example:3000/sub/") == "https://grafana.example:3000/sub"
    assert push.display_url("http://[::1]:3000") == "http://[::1]:3000"

"""report.html opened in real headless Chromium (Debian package `chromium`): the charts render
(non-blank image regions where each chart's box is), the console stays free of errors, and
report.pdf prints.

Faked: only the fleet (a simulated day of 32 GPUs loaded into a real Prometheus). Chromium is
driven over its DevTools protocol on a pipe (--remote-debugging-pipe: JSON messages ending in NUL
on file descriptors 3 and 4), so the test needs no WebSocket library and no network port.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import io
import json
import os
import select
import subprocess
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from flopwatch.report import ReportSettings, build, write
from flopwatch.report.pdf import PACKAGE, find_chromium, headless_command
from flopwatch.report.window import Window
from flopwatch.sim.fleet import Fleet
from flopwatch.sim.scenario import parse
from flopwatch.stack import Prometheus

from .test_report_week import LLAMA_8B, load_history

pytestmark = pytest.mark.integration

DAY = {
    "name": "report-day", "seed": 5, "duration": "1d", "scrape_interval": "300s",
    "fleet": {"nodes": 4, "gpus_per_node": 8, "gpu_model": "H100-SXM", "nics_per_node": 1},
    "jobs": [{"id": "llm-8b", "nodes": "0-2", "user": "alice", "tokens_per_step": 1048576, "target_mfu": 0.4,
              "start": "2h", "model": LLAMA_8B}],
    "faults": [{"kind": "thermal_throttle", "node": 1, "gpu": 3, "start": "8h", "duration": "2h", "slowdown": 0.1},
               {"kind": "xid", "node": 2, "gpu": 0, "xid": 31, "start": "12h", "duration": "1m"}],
}


def chromium() -> str:
    binary = find_chromium()
    if binary is None:
        pytest.fail(f"chromium not found: install the Debian package '{PACKAGE}' (scripts/setup.sh does)")
    return binary


class DevTools:
    """A headless Chromium and a DevTools session with its one page, over the debugging pipe."""

    def __init__(self, binary: str, profile: Path) -> None:
        to_chrome_r, self.to_chrome = os.pipe()
        self.from_chrome, from_chrome_w = os.pipe()

        def wire_pipes() -> None:  # in the child: fd 3 reads commands, fd 4 writes answers
            read_end = fcntl.fcntl(to_chrome_r, fcntl.F_DUPFD, 10)
            write_end = fcntl.fcntl(from_chrome_w, fcntl.F_DUPFD, 10)
            os.dup2(read_end, 3)
            os.dup2(write_end, 4)

        command = headless_command(binary, profile, "--remote-debugging-pipe", "about:blank")
        self.proc = subprocess.Popen(command, pass_fds=(3, 4), preexec_fn=wire_pipes,  # noqa: PLW1509
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, start_new_session=True)
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        self.buffer = b""
        self.next_id = 0
        self.events: list[dict[str, Any]] = []
        self.session = ""

    def send(self, method: str, params: dict[str, Any] | None = None, timeout: float = 30.0,
             session: bool = True) -> dict[str, Any]:
        self.next_id += 1
        message: dict[str, Any] = {"id": self.next_id, "method": method, "params": params or {}}
        if session and self.session:
            message["sessionId"] = self.session
        os.write(self.to_chrome, json.dumps(message).encode() + b"\0")
        answer = self._wait(lambda m: m.get("id") == self.next_id, timeout)
        if "error" in answer:
            raise RuntimeError(f"{method}: {answer['error']}")
        return answer.get("result", {})

    def wait_event(self, method: str, timeout: float = 30.0) -> dict[str, Any]:
        for event in self.events:
            if event.get("method") == method:
                return event
        return self._wait(lambda m: m.get("method") == method, timeout)

    def _wait(self, match: Any, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            while b"\0" in self.buffer:
                raw, self.buffer = self.buffer.split(b"\0", 1)
                message = json.loads(raw)
                if "method" in message:
                    self.events.append(message)
                if match(message):
                    return message
            left = deadline - time.monotonic()
            if left <= 0 or self.proc.poll() is not None:
                raise TimeoutError("chromium did not answer over the debugging pipe")
            ready, _, _ = select.select([self.from_chrome], [], [], left)
            if ready:
                chunk = os.read(self.from_chrome, 1 << 20)
                if not chunk:
                    raise TimeoutError("chromium closed the debugging pipe")
                self.buffer += chunk

    def attach(self) -> None:
        targets = self.send("Target.getTargets", session=False)["targetInfos"]
        page = next(t for t in targets if t["type"] == "page")
        self.session = self.send("Target.attachToTarget", {"targetId": page["targetId"], "flatten": True},
                                 session=False)["sessionId"]
        for domain in ("Page", "Runtime", "Log"):
            self.send(f"{domain}.enable")

    def problems(self) -> list[str]:
        """Console errors and warnings, uncaught exceptions and failed loads seen so far."""
        found = []
        for event in self.events:
            params = event.get("params", {})
            if event.get("method") == "Runtime.consoleAPICalled" and params.get("type") in ("error", "warning",
                                                                                            "assert"):
                found.append(" ".join(str(a.get("value", a.get("description", ""))) for a in params["args"]))
            elif event.get("method") == "Runtime.exceptionThrown":
                found.append(params["exceptionDetails"].get("text", "exception"))
            elif event.get("method") == "Log.entryAdded" and params["entry"]["level"] in ("error", "warning"):
                found.append(params["entry"]["text"])
        return found

    def close(self) -> None:
        with contextlib.suppress(TimeoutError, RuntimeError, OSError):
            self.send("Browser.close", session=False, timeout=5)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self.to_chrome)
        os.close(self.from_chrome)


@pytest.fixture(scope="module")
def report_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("report")
    start = float(int(time.time() // 300 * 300 - 86400))
    fleet = Fleet(parse(DAY), start_unix=start)
    with Prometheus(remote_write_receiver=True, out_of_order_window="30d") as prom:
        load_history(fleet, prom.url, 86400.0, 300.0)
        report = build(prom.url, Window(start, fleet.now_unix), ReportSettings(price_kwh=0.1, price_gpu_hour=2.0))
    written = write(report, out, pdf=True)
    assert written.pdf_error is None, written.pdf_error
    return out


def test_report_prints_to_pdf(report_dir):
    chromium()
    pdf = (report_dir / "report.pdf").read_bytes()
    assert pdf.startswith(b"%PDF-")
    assert len(pdf) > 20_000
    assert pdf.count(b"/Type /Page") - pdf.count(b"/Type /Pages") >= 3  # several pages of sections


def test_charts_render_in_headless_chromium_without_console_errors(report_dir, tmp_path):
    browser = DevTools(chromium(), tmp_path / "profile")
    try:
        browser.attach()
        browser.send("Emulation.setDeviceMetricsOverride",
                     {"width": 1000, "height": 1200, "deviceScaleFactor": 1, "mobile": False})
        browser.send("Page.navigate", {"url": (report_dir / "report.html").resolve().as_uri()})
        browser.wait_event("Page.loadEventFired")
        layout = browser.send("Runtime.evaluate", {"returnByValue": True, "expression": """JSON.stringify({
            height: document.documentElement.scrollHeight,
            charts: [...document.querySelectorAll('svg.chart')].map(e => {
                const r = e.getBoundingClientRect();
                return {name: e.dataset.chart, empty: e.classList.contains('chart-empty'),
                        x: r.left + scrollX, y: r.top + scrollY, w: r.width, h: r.height}; }),
            external: [...document.querySelectorAll('[src],link,script')].length})"""})
        page = json.loads(layout["result"]["value"])
        browser.send("Emulation.setDeviceMetricsOverride",
                     {"width": 1000, "height": page["height"], "deviceScaleFactor": 1, "mobile": False})
        shot = browser.send("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True}, timeout=60)
        problems = browser.problems()
    finally:
        browser.close()
    image = Image.open(io.BytesIO(base64.b64decode(shot["data"]))).convert("RGB")
    image.save(tmp_path / "report.png")
    assert problems == []
    assert page["external"] == 0
    names = {chart["name"] for chart in page["charts"]}
    assert {"gpu_states", "mfu_trend", "badput_by_cause", "power", "xids_by_code"} <= names
    for chart in page["charts"]:
        assert not chart["empty"], chart["name"]
        assert chart["w"] > 400 and chart["h"] > 40, chart
        box = np.asarray(image.crop((int(chart["x"]), int(chart["y"]), int(chart["x"] + chart["w"]),
                                     int(chart["y"] + chart["h"]))), dtype=int).reshape(-1, 3)
        inked = float((box.sum(axis=1) < 700).mean())
        saturated = box[box.max(axis=1) - box.min(axis=1) > 60]  # drawn data, not the grey axes and text
        assert inked > 0.01, (chart["name"], inked)
        assert len(saturated) > 200, (chart["name"], len(saturated))

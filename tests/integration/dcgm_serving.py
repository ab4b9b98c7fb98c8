"""dcgm-exporter fixtures served over loopback for a real Prometheus to scrape: one path per node,
`/<name>/metrics`, each scrape rendered afresh (counters advance, a fault switched on shows at once).

Faked, because no GPU or DCGM runs in the tests: dcgm-exporter itself. The bodies come from
tests/fixtures/dcgm_exporter/make.py, written from dcgm-exporter's source (README there).
"""

from __future__ import annotations

import importlib.util
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def _fixtures() -> ModuleType:
    spec = importlib.util.spec_from_file_location("dcgm_fixtures", ROOT / "tests/fixtures/dcgm_exporter/make.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


#: tests/fixtures/dcgm_exporter/make.py (Node, render, telemetry_mfu).
FIX = _fixtures()


@contextmanager
def serve(nodes: dict) -> Iterator[list[dict]]:
    """Serves `nodes` (name -> make.Node) and yields one Prometheus scrape config per node
    (job `dcgm-<name>`), as a cluster scrapes one dcgm-exporter per node."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            node = nodes.get(self.path.strip("/").split("/")[0])
            if node is None:
                self.send_error(404)
                return
            node.tick += 1
            body = FIX.render(node).encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    try:
        yield [{"job_name": f"dcgm-{name}", "metrics_path": f"/{name}/metrics",
                "static_configs": [{"targets": [f"127.0.0.1:{port}"]}]} for name in nodes]
    finally:
        server.shutdown()
        server.server_close()

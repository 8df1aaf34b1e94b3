"""`meshrl ui RUN_ROOT`: a small HTTP server with one live page per run under RUN_ROOT. The page
(page.html) polls /api/runs/<name> every second; the state comes from liveview.state, which reads
the run folder the job is writing. Standard-library HTTP only; bind 127.0.0.1 unless told otherwise.
The page has no login: bound to loopback it answers only requests whose Host names a loopback address (a web
page elsewhere cannot read it through DNS rebinding), and a run name is one folder directly under RUN_ROOT.
"""

from __future__ import annotations

import ipaddress
import json
import re
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from pathlib import Path
from urllib.parse import urlsplit

from meshrl.scheduler.liveview.state import list_runs, run_state

RUN_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")


def run_folder(root: Path, name: str) -> Path | None:
    """The run folder `name` names: one folder directly under `root` (not `..`, not a link out of it)."""
    if not RUN_NAME.match(name) or name in (".", ".."):
        return None
    folder = (root / name).resolve()
    return folder if folder.parent == root and folder.is_dir() else None


def loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _page() -> bytes:
    return resources.files("meshrl.scheduler.liveview").joinpath("page.html").read_bytes()


class _Handler(BaseHTTPRequestHandler):
    root: Path

    def log_message(self, format, *args) -> None:  # noqa: A002 - the base class's name
        pass

    def _send(self, status: HTTPStatus, body: bytes, kind: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(body)

    def _json(self, value, status: HTTPStatus = HTTPStatus.OK) -> None:
        self._send(status, json.dumps(value).encode(), "application/json")

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        asked = urlsplit("//" + (self.headers.get("Host") or "")).hostname or ""
        if loopback(self.server.server_address[0]) and not loopback(asked):
            return self._json({"error": f"Host {asked!r} is not this loopback server"}, HTTPStatus.MISDIRECTED_REQUEST)
        path = self.path.split("?", 1)[0].rstrip("/") or "/"
        if path in ("/", "/index.html") or path.startswith("/run/"):
            return self._send(HTTPStatus.OK, _page(), "text/html; charset=utf-8")
        if path == "/api/runs":
            return self._json({"runs": list_runs(self.root)})
        if path.startswith("/api/runs/"):
            name = path.removeprefix("/api/runs/")
            folder = run_folder(self.root, name)
            if folder is None:
                return self._json({"error": f"no run named {name!r} under {self.root}"}, HTTPStatus.NOT_FOUND)
            return self._json(run_state(folder))
        return self._json({"error": f"no page {path}"}, HTTPStatus.NOT_FOUND)


class LiveView:
    """The server, started in a background thread (`start`) or in the foreground (`serve_forever`)."""

    def __init__(self, root: str | Path, host: str = "127.0.0.1", port: int = 8270) -> None:
        handler = type("Handler", (_Handler,), {"root": Path(root).resolve()})
        self.httpd = ThreadingHTTPServer((host, port), handler)
        self.thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> LiveView:
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="liveview", daemon=True)
        self.thread.start()
        return self

    def serve_forever(self) -> None:
        self.httpd.serve_forever()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

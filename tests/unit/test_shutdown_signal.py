"""The no-op extension that makes Lambda send SIGTERM, against a stand-in of the Extensions API."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from breakwater.aws.shutdown_signal import EXTENSION_NAME, RUNTIME_API_ENV, register_for_shutdown_signal
from tests.polling import wait_for


class ExtensionsApi(BaseHTTPRequestHandler):
    """Registers an extension and holds every ask for its next event open, as Lambda does until shutdown."""

    registrations: list[tuple[str | None, Any]] = []
    asks: list[str | None] = []
    release = threading.Event()

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.registrations.append((self.headers.get("Lambda-Extension-Name"), body))
        self.send_response(200)
        self.send_header("Lambda-Extension-Identifier", "ext-1")
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def do_GET(self) -> None:
        assert self.path == "/2020-01-01/extension/event/next"
        self.asks.append(self.headers.get("Lambda-Extension-Identifier"))
        self.release.wait(10)
        self.send_response(500)
        self.end_headers()

    def log_message(self, *_: Any) -> None:
        return None


def test_outside_lambda_nothing_is_registered() -> None:
    assert register_for_shutdown_signal({}) is None


def test_the_extension_registers_for_no_event_and_waits_for_its_next() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), ExtensionsApi)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        api = f"127.0.0.1:{server.server_address[1]}"
        assert register_for_shutdown_signal({RUNTIME_API_ENV: api}) == "ext-1"
        assert ExtensionsApi.registrations == [(EXTENSION_NAME, {"events": []})]
        assert wait_for(lambda: ExtensionsApi.asks == ["ext-1"])
    finally:
        ExtensionsApi.release.set()
        server.shutdown()


def test_a_refused_registration_leaves_the_timer_only() -> None:
    assert register_for_shutdown_signal({RUNTIME_API_ENV: "127.0.0.1:9"}) is None  # nothing listens

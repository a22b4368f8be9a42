"""The demo's clients in their own process: every answer reaches the parent's observations."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from local.scenarios.load_client import ClientProcess
from local.scenarios.noisy_neighbour import Scenario
from local.scenarios.observations import Observations

KEYS = {f"tenant-{i:02d}": f"key-{i:02d}" for i in range(1, 4)}


class _Api(ThreadingHTTPServer):
    """Answers 429 to every third message of tenant-01 and 202 to everything else; counts what it saw."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.seen: Counter[tuple[str, str, int]] = Counter()  # (path, api key, status)
        self.noisy = 0
        self.lock = threading.Lock()


class _Handler(BaseHTTPRequestHandler):
    server: _Api

    def log_message(self, format: str, *args: object) -> None:
        return

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        key = self.headers["Authorization"].removeprefix("Bearer ")
        status = 202
        with self.server.lock:
            if self.path.endswith("/v1/messages") and key == KEYS["tenant-01"]:
                self.server.noisy += 1
                status = 429 if self.server.noisy % 3 == 0 else 202
            self.server.seen[(self.path, key, status)] += 1
        self.send_response(status)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")


@pytest.fixture
def api() -> Iterator[_Api]:
    server = _Api()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def test_every_answer_of_the_child_reaches_the_observations(api: _Api) -> None:
    scenario = Scenario(
        tenants=3, quiet_rate=4.0, noisy_rate=4.0, burst_rate=20.0, baseline_s=0.5, burst_s=1.0, after_s=0.5,
        senders=2,
    )  # fmt: skip
    observations = Observations()
    clients = ClientProcess(f"http://127.0.0.1:{api.server_address[1]}/prod/", KEYS, scenario, observations)
    ticks: list[float] = []
    observations.started = time.time()
    clients.run(on_tick=ticks.append)

    by_key = {key: tenant for tenant, key in KEYS.items()}
    answered: Counter[tuple[str, int]] = Counter()
    for (path, key, status), count in api.seen.items():
        if path.endswith("/v1/messages"):
            answered[(by_key[key], status)] += count
    assert dict(observations.accepted) == {t: n for (t, s), n in answered.items() if s == 202}
    assert dict(observations.throttled) == {t: n for (t, s), n in answered.items() if s == 429}
    assert observations.throttled["tenant-01"] > 0
    assert not observations.rejected
    assert len(observations.accepted_at) == sum(observations.accepted.values())
    assert all(0 <= t < scenario.duration_s + 1 for t, _ in observations.accepted_at)
    events = clients.events.summary()
    assert events["sent"] == sum(n for (path, _, _), n in api.seen.items() if path.endswith("/v1/events"))
    assert events["sent"] > 0
    assert ticks  # the progress display is called while the child sends


def test_a_child_that_cannot_start_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("local.emulator.child_process.READY", "never said")  # what the parent waits for
    with pytest.raises(RuntimeError, match="did not start"):
        ClientProcess("http://127.0.0.1:9/prod/", KEYS, Scenario(tenants=3), Observations())

"""The chaos run's clients: a bounded open-loop load of uniquely keyed messages, every request logged.

Each message has an ``Idempotency-Key`` of its own (``<seed>-<tenant>-<n>``), and the client keeps
its key across every retry of it, as a careful client does. A message is sent on its schedule
whatever happened to earlier ones (open loop); what happens to its requests:

- 202: acknowledged, with the message id the API gave. At ``drop_rate`` the client acts as if the
  answer was lost on the way (it is logged as ``dropped``) and sends the same request again after a
  short delay: the retry must get a 202 with the same id, ``Idempotent-Replayed: true``;
- 409 (the key's first attempt still pending), 429, 5xx, or no answer at all: refused (or, with no
  answer, indeterminate: the message may or may not be stored), retried with the same key after a
  backoff, up to ``max_attempts``;
- any other status: refused for good (the request itself is wrong; the checker reports it).

Every attempt is one JSON line in the request log (:class:`Attempt`), written by the child process
(:class:`ChaosClient` starts it at a lower CPU priority, as ``load_client.py`` does for the demo).
The checker (``local.scenarios.chaos_check``) reads that log, never the client's memory.
"""

from __future__ import annotations

import heapq
import http.client
import json
import queue
import random
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO
from urllib.parse import urlsplit

from local.emulator.child_process import read_request, start_ready_child

CLIENT_NICE = 10
IDEMPOTENCY_HEADER = "Idempotency-Key"
REPLAYED_HEADER = "Idempotent-Replayed"
RETRIED_STATUSES = frozenset({0, 409, 429, 500, 502, 503, 504})


@dataclass(frozen=True)
class LoadPlan:
    """What the client sends: ``messages`` messages over ``tenants`` at ``rate`` per second in all."""

    api_url: str
    keys: dict[str, str]  # tenant -> API key
    messages: int
    rate: float
    seed: int
    drop_rate: float = 0.0  # share of 202 answers the client acts as if it never got
    senders: int = 8
    max_attempts: int = 8
    retry_delay_s: float = 0.2  # after a dropped 202, and the first backoff after a refusal
    max_backoff_s: float = 2.0
    timeout_s: float = 30.0

    def message(self, n: int) -> tuple[str, str]:
        """The ``n``-th message's tenant and key: tenants in turn, a key no other message has."""
        tenants = sorted(self.keys)
        tenant = tenants[n % len(tenants)]
        return tenant, f"{self.seed}-{tenant}-{n}"


@dataclass(frozen=True)
class Attempt:
    """One request and its answer, as the request log holds it."""

    t: float  # seconds after the start of the load, when the answer came
    tenant: str
    key: str
    attempt: int  # 1 for the first request of this key
    status: int  # 0: no answer (connection error or timeout)
    message_id: str | None = None
    replayed: bool = False
    dropped: bool = False  # a 202 the client acted as if it never got
    error: str | None = None


def read_attempts(path: Path) -> list[Attempt]:
    if not path.exists():
        return []
    return [
        Attempt(**json.loads(line)) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()
    ]


class KeyedLoad:
    """The senders: one schedule for every message, retries scheduled beside it, one log line per try."""

    def __init__(self, plan: LoadPlan, log: IO[str], started: float) -> None:
        self.plan = plan
        self.url = urlsplit(plan.api_url)
        self.path = self.url.path.rstrip("/") + "/v1/messages"
        self.started = started
        self._log = log
        self._log_lock = threading.Lock()
        # (due time, message number, attempt): first sends and retries, earliest first
        self._due: list[tuple[float, int, int]] = []
        self._due_lock = threading.Lock()
        self._work: queue.Queue[tuple[int, int] | None] = queue.Queue()
        self._open = 0  # messages not finished yet (sent or not)
        self._open_lock = threading.Condition()
        self._draw = random.Random(plan.seed)  # the client's drops: a load schedule, not a secret
        self._draw_lock = threading.Lock()
        self.answered = 0
        self.acknowledged = 0

    def _schedule(self, at: float, n: int, attempt: int) -> None:
        with self._due_lock:
            heapq.heappush(self._due, (at, n, attempt))

    def _finished(self) -> None:
        with self._open_lock:
            self._open -= 1
            self._open_lock.notify_all()

    def _drop(self) -> bool:
        with self._draw_lock:
            return self._draw.random() < self.plan.drop_rate

    def _send(self, connection: http.client.HTTPConnection, n: int, attempt: int) -> Attempt:
        tenant, key = self.plan.message(n)
        body = json.dumps({"type": "chaos", "payload": {"tenant": tenant, "n": n}})
        headers = {
            "Authorization": f"Bearer {self.plan.keys[tenant]}",
            "Content-Type": "application/json",
            IDEMPOTENCY_HEADER: key,
        }
        status, message_id, replayed, error = 0, None, False, None
        try:
            connection.request("POST", self.path, body=body, headers=headers)
            response = connection.getresponse()
            payload = response.read()
            status = response.status
            replayed = (response.getheader(REPLAYED_HEADER) or "").lower() == "true"
            if status == 202:
                message_id = str(json.loads(payload)["id"])
        except (OSError, http.client.HTTPException, ValueError, KeyError) as exc:
            connection.close()
            error = f"{type(exc).__name__}: {exc}"[:200]
            status = 0 if status in (0, 202) else status
        dropped = status == 202 and attempt < self.plan.max_attempts and self._drop()
        return Attempt(
            t=round(time.time() - self.started, 4),
            tenant=tenant,
            key=key,
            attempt=attempt,
            status=status,
            message_id=message_id,
            replayed=replayed,
            dropped=dropped,
            error=error,
        )

    def _sender(self) -> None:
        connection = http.client.HTTPConnection(self.url.hostname or "127.0.0.1", self.url.port, timeout=30)
        connection.timeout = self.plan.timeout_s
        while True:
            item = self._work.get()
            if item is None:
                return
            n, attempt = item
            answer = self._send(connection, n, attempt)
            with self._log_lock:
                self._log.write(json.dumps(asdict(answer)) + "\n")
                self.answered += 1
                self.acknowledged += answer.status == 202 and not answer.dropped
            retry = answer.dropped or (answer.status in RETRIED_STATUSES and attempt < self.plan.max_attempts)
            if retry:
                delay = self.plan.retry_delay_s
                if not answer.dropped:
                    delay = min(self.plan.max_backoff_s, self.plan.retry_delay_s * 2 ** (attempt - 1))
                self._schedule(time.time() + delay, n, attempt + 1)
            else:
                self._finished()

    def run(self, on_tick: Callable[[float], None] | None = None) -> None:
        plan = self.plan
        self._open = plan.messages
        for n in range(plan.messages):
            self._schedule(self.started + n / plan.rate, n, 1)
        senders = [threading.Thread(target=self._sender, daemon=True) for _ in range(plan.senders)]
        for thread in senders:
            thread.start()
        last_tick = 0.0
        while True:
            with self._open_lock:
                if self._open == 0:
                    break
            now = time.time()
            with self._due_lock:
                while self._due and self._due[0][0] <= now:
                    _, n, attempt = heapq.heappop(self._due)
                    self._work.put((n, attempt))
            if on_tick is not None and now - last_tick >= 1.0:
                last_tick = now
                on_tick(now - self.started)
            time.sleep(0.005)
        for _ in senders:
            self._work.put(None)
        for thread in senders:
            thread.join(plan.timeout_s)


class ChaosClient:
    """:class:`KeyedLoad` in a child process at a lower CPU priority; the request log is its file."""

    def __init__(self, plan: LoadPlan, log_path: Path, *, nice: int = CLIENT_NICE) -> None:
        self.plan = plan
        self.log_path = log_path
        self.progress: dict[str, float] = {"answered": 0, "acknowledged": 0}
        log_path.unlink(missing_ok=True)
        self._request = {"plan": asdict(plan), "log": str(log_path), "nice": nice}
        self._child = start_ready_child("local.scenarios.chaos_client", "the chaos client's process")

    def run(self, started: float, on_tick: Callable[[float], None] | None = None) -> list[Attempt]:
        """Start the load at ``started``; return the request log once every message is finished."""
        child = self._child
        assert child.stdin is not None and child.stdout is not None
        child.stdin.write(json.dumps({**self._request, "started": started}) + "\n")
        child.stdin.close()
        for line in child.stdout:
            self.progress = json.loads(line)
            if on_tick is not None:
                on_tick(time.time() - started)
        if child.wait() != 0:
            raise RuntimeError(f"the chaos client's process failed (exit status {child.returncode})")
        return read_attempts(self.log_path)


def main() -> int:
    request = read_request()
    plan = LoadPlan(**request["plan"])
    with Path(request["log"]).open("w", encoding="utf-8", buffering=1) as log:
        load = KeyedLoad(plan, log, float(request["started"]))

        def tick(_t: float) -> None:
            sys.stdout.write(
                json.dumps({"answered": load.answered, "acknowledged": load.acknowledged}) + "\n"
            )
            sys.stdout.flush()

        load.run(on_tick=tick)
    return 0


if __name__ == "__main__":
    sys.exit(main())

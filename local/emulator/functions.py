"""Run the deployed functions: each one's real handler, its resolved environment, and its timeout.

Why one child process per execution environment (``container.py``) rather than threads in
this process: a handler reads its settings and builds its clients at import, from ``os.environ``,
which is process-wide; and Powertools keeps per-invocation state in module globals (the metrics
buffer, the logger's keys). Two functions, or two concurrent invocations of one, cannot share a
process without mixing them. A container per concurrent invocation is what Lambda does too: the
pool starts containers on demand (cold starts), reuses idle ones (warm), and kills one whose
invocation overruns the function's timeout.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Protocol

from local.pricing.cost import aws_call_latency_ms
from local.pricing.usage import LAMBDA_PLATFORM_LOG_BYTES, add_to, gb_seconds, modelled_duration_ms

CONTAINER_SCRIPT = Path(__file__).resolve().parent / "container.py"

LogSink = Callable[[str, str], None]  # (function logical id, one stdout/stderr line)


@dataclass(frozen=True)
class FunctionSpec:
    """A function as CloudFormation created it (``GetFunctionConfiguration``); its code unpacked locally."""

    logical_id: str
    name: str
    arn: str
    handler: str
    timeout_s: int
    memory_mb: int
    environment: dict[str, str]
    code_dir: Path
    # The function's layers, extracted: each one's ``python/`` goes on the path after the code, as
    # Lambda mounts layers under /opt (the runtime library's layer among them).
    layer_dirs: tuple[Path, ...] = ()


@dataclass
class Invocation:
    """One invocation's outcome, as the Lambda service would report it."""

    function: str
    request_id: str
    result: Any = None
    error: dict[str, Any] | None = None
    duration_ms: float = 0.0
    cold_start_ms: float | None = None
    requests: dict[str, int] = field(default_factory=dict)
    usage: dict[str, float] = field(default_factory=dict)  # billed units of its AWS requests (local.pricing)

    @property
    def ok(self) -> bool:
        return self.error is None


class FunctionInvoker(Protocol):
    """What a mapping needs of a function: which it is, and an invocation (:class:`FunctionPool`)."""

    @property
    def spec(self) -> FunctionSpec: ...

    def invoke(self, event: Any, *, trace_id: str | None = None, source: str | None = None) -> Invocation: ...


class FunctionError(RuntimeError):
    def __init__(self, invocation: Invocation) -> None:
        error = invocation.error or {}
        super().__init__(f"{invocation.function}: {error.get('errorType')}: {error.get('errorMessage')}")
        self.invocation = invocation


class _Container:
    def __init__(self, spec: FunctionSpec, runtime_env: dict[str, str], log_sink: LogSink) -> None:
        self.spec = spec
        request_read, self._request_write = os.pipe()
        self._answer_read, answer_write = os.pipe()
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "LANG": "C.UTF-8",
            "PYTHONUNBUFFERED": "1",
            "PYTHONDONTWRITEBYTECODE": "1",
            **runtime_env,
            **spec.environment,
            "BREAKWATER_LOCAL_FDS": f"{request_read},{answer_write}",
            "BREAKWATER_LOCAL_FUNCTION_ARN": spec.arn,
            "BREAKWATER_LOCAL_LAYERS": os.pathsep.join(str(layer / "python") for layer in spec.layer_dirs),
        }
        self.process = subprocess.Popen(  # noqa: S603 - this interpreter, our container script
            [sys.executable, "-u", str(CONTAINER_SCRIPT), str(spec.code_dir), spec.handler],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            pass_fds=(request_read, answer_write),
            text=True,
        )
        os.close(request_read)
        os.close(answer_write)
        self._requests: IO[str] = os.fdopen(self._request_write, "w", encoding="utf-8")
        self._answers: IO[str] = os.fdopen(self._answer_read, "r", encoding="utf-8")
        self._log_thread = threading.Thread(
            target=self._pump_logs, args=(log_sink,), name=f"logs-{spec.logical_id}", daemon=True
        )
        self._log_thread.start()
        self.cold_start_ms: float | None = None
        self.init_requests: dict[str, int] = {}
        self.init_usage: dict[str, float] = {}
        self.init_error: dict[str, Any] | None = None

    def _pump_logs(self, log_sink: LogSink) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            log_sink(self.spec.logical_id, line.rstrip("\n"))

    def _read_answer(self, timeout_s: float) -> dict[str, Any] | None:
        """The next answer, or None if none came within ``timeout_s`` or the process is gone.

        The answer pipe ends (an empty read) only when the process died: it is reaped here, so
        :attr:`alive` says so at once and the caller reports the runtime's exit, not a timeout.
        """
        box: list[str] = []
        reader = threading.Thread(target=lambda: box.append(self._answers.readline()), daemon=True)
        reader.start()
        reader.join(timeout_s)
        if reader.is_alive() or not box:
            return None
        if not box[0]:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(5)
            return None
        return dict(json.loads(box[0]))

    def start(self, timeout_s: float) -> None:
        ready = self._read_answer(timeout_s)
        if ready is None:
            self.kill()
            self.init_error = {"errorType": "Runtime.InitTimeout", "errorMessage": "init did not finish"}
        elif "init_error" in ready:
            self.kill()
            self.init_error = ready["init_error"]
        else:
            self.cold_start_ms = float(ready["init_ms"])
            self.init_requests = dict(ready.get("requests", {}))
            self.init_usage = dict(ready.get("usage", {}))

    def invoke(self, event: Any, request_id: str, trace_id: str | None) -> Invocation:
        deadline_ms = int(time.time() * 1000) + self.spec.timeout_s * 1000
        message = {"event": event, "request_id": request_id, "deadline_ms": deadline_ms, "trace_id": trace_id}
        self._requests.write(json.dumps(message) + "\n")
        self._requests.flush()
        answer = self._read_answer(self.spec.timeout_s + 1.0)
        invocation = Invocation(function=self.spec.logical_id, request_id=request_id)
        if answer is None and not self.alive:
            # As Lambda reports an environment that died mid-invocation (a crash, SIGKILL, out of memory).
            signal_name = _signal_name(self.process.returncode)
            invocation.error = {
                "errorType": "Runtime.ExitError",
                "errorMessage": f"RequestId: {request_id} Error: Runtime exited with error: {signal_name}",
            }
            return invocation
        if answer is None:
            self.kill()
            invocation.error = {
                "errorType": "Sandbox.Timedout",
                "errorMessage": f"Task timed out after {self.spec.timeout_s:.2f} seconds",
            }
            invocation.duration_ms = self.spec.timeout_s * 1000.0
            return invocation
        invocation.result = answer.get("result")
        invocation.error = answer.get("error")
        invocation.duration_ms = float(answer.get("duration_ms", 0.0))
        invocation.requests = dict(answer.get("requests", {}))
        invocation.usage = dict(answer.get("usage", {}))
        return invocation

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(5)

    def stop(self) -> dict[str, Any] | None:
        """Shut the environment down: its shutdown phase's answer (the AWS requests its SIGTERM handler
        made), or None if it gave none."""
        with contextlib.suppress(OSError):
            self._requests.close()
        answer = self._read_answer(5.0) if self.alive else None
        try:
            self.process.wait(2)
        except subprocess.TimeoutExpired:
            self.kill()
        with contextlib.suppress(OSError):
            self._answers.close()
        return answer


def _signal_name(returncode: int | None) -> str:
    """How Lambda words a runtime's end: ``signal: killed``, ``exit status 1``."""
    if returncode is not None and returncode < 0:
        with contextlib.suppress(ValueError):
            return f"signal: {(signal.strsignal(-returncode) or str(-returncode)).lower()}"
    return f"exit status {returncode}"


class FairSlots:
    """``size`` slots; when all are taken, a freed one goes to the waiting source that holds the fewest.

    The cap on a function's containers is the emulator's, not Lambda's: Lambda gives each SQS event
    source mapping its own concurrency (up to its ``MaximumConcurrency``), so one busy queue never
    waits behind another's invocations. A first-come semaphore lets a queue that always has messages
    (a bursting tenant's shard) keep most of the containers, and the other queues' batches wait
    behind it. Handing a freed slot to the source with the fewest slots
    held (first come among equals) keeps the cap, and shares it the way separate concurrency would.
    """

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError(f"size must be at least 1, not {size}")
        self._free = size
        self._held: Counter[str | None] = Counter()
        self._waiting: list[tuple[str | None, int]] = []  # (source, ticket), in arrival order
        self._tickets = 0
        self._changed = threading.Condition()

    def _next(self) -> int:
        return min(self._waiting, key=lambda waiter: (self._held[waiter[0]], waiter[1]))[1]

    def acquire(self, source: str | None = None) -> None:
        with self._changed:
            self._tickets += 1
            waiter = (source, self._tickets)
            self._waiting.append(waiter)
            while not (self._free and self._next() == waiter[1]):
                self._changed.wait()
            self._waiting.remove(waiter)
            self._free -= 1
            self._held[source] += 1
            self._changed.notify_all()  # a slot may still be free for the next in line

    def release(self, source: str | None = None) -> None:
        with self._changed:
            if self._held[source] < 1:
                raise ValueError(f"source {source!r} holds no slot")
            self._held[source] -= 1
            self._free += 1
            self._changed.notify_all()

    def waiting(self) -> list[str | None]:
        """The sources waiting for a slot, in arrival order."""
        with self._changed:
            return [source for source, _ticket in self._waiting]

    @contextlib.contextmanager
    def held(self, source: str | None = None) -> Iterator[None]:
        self.acquire(source)
        try:
            yield
        finally:
            self.release(source)


class FunctionPool:
    """The execution environments of one function: up to ``max_containers`` at once."""

    def __init__(
        self, spec: FunctionSpec, runtime_env: dict[str, str], log_sink: LogSink, max_containers: int
    ) -> None:
        self.spec = spec
        self._runtime_env = runtime_env
        self._idle: list[_Container] = []
        self._all: list[_Container] = []
        self._lock = threading.Lock()
        self._slots = FairSlots(max_containers)
        self.max_containers = max_containers
        self.cold_starts_ms: list[float] = []
        self.requests: Counter[str] = Counter()
        # What AWS would bill this function for (keys of local/pricing/prices.json, GB-seconds under
        # ``lambda.gb_seconds`` whatever the architecture): its invocations, their duration (with AWS's
        # round trips in place of the emulator's; as measured under ``measured.lambda_gb_seconds``), its
        # log lines and the billed units of its AWS requests.
        self.usage: dict[str, float] = {}
        self._log_sink = self._metered_logs(log_sink)
        self.invocations = 0
        self.errors = 0
        self.crashes = 0  # containers that died in an invocation (crashed, killed, timed out)

    def _container(self) -> tuple[_Container, float | None]:
        with self._lock:
            while self._idle:
                container = self._idle.pop()
                if container.alive:
                    return container, None
        container = _Container(self.spec, self._runtime_env, self._log_sink)
        container.start(timeout_s=max(30.0, float(self.spec.timeout_s)))
        with self._lock:
            self._all.append(container)
            if container.cold_start_ms is not None:
                self.cold_starts_ms.append(container.cold_start_ms)
            self.requests.update(container.init_requests)
            add_to(self.usage, container.init_usage)
            if container.cold_start_ms is not None:  # Lambda bills the INIT phase as duration
                add_to(self.usage, self._duration(container.cold_start_ms, container.init_usage))
        return container, container.cold_start_ms

    def _duration(self, measured_ms: float, usage: dict[str, float]) -> dict[str, float]:
        """GB-seconds as billed, with AWS's round trips in place of the emulator's, and as measured."""
        billed_ms = modelled_duration_ms(measured_ms, usage, aws_call_latency_ms())
        return {
            "lambda.gb_seconds": gb_seconds(billed_ms, self.spec.memory_mb),
            "measured.lambda_gb_seconds": gb_seconds(measured_ms, self.spec.memory_mb),
        }

    def _metered_logs(self, log_sink: LogSink) -> LogSink:
        """``log_sink``, counting the bytes of each line as CloudWatch Logs would ingest them."""

        def sink(function: str, line: str) -> None:
            with self._lock:
                add_to(self.usage, {"logs.ingested_bytes": len(line.encode("utf-8", errors="replace"))})
            log_sink(function, line)

        return sink

    def invoke(self, event: Any, *, trace_id: str | None = None, source: str | None = None) -> Invocation:
        """Run the handler once in an idle (or new) container; blocks while all containers are busy.

        ``source`` (an event source mapping's queue or stream ARN; None for direct calls) decides who
        gets a container first when they are all busy (:class:`FairSlots`).
        """
        request_id = str(uuid.uuid4())
        with self._slots.held(source):
            container, cold_ms = self._container()
            if container.init_error is not None:
                invocation = Invocation(self.spec.logical_id, request_id, error=container.init_error)
            else:
                invocation = container.invoke(event, request_id, trace_id)
                invocation.cold_start_ms = cold_ms
            with self._lock:
                self.invocations += 1
                self.errors += 0 if invocation.ok else 1
                self.requests.update(invocation.requests)
                add_to(self.usage, invocation.usage)
                add_to(self.usage, self._duration(invocation.duration_ms, invocation.usage))
                add_to(self.usage, {"lambda.requests": 1, "logs.ingested_bytes": LAMBDA_PLATFORM_LOG_BYTES})
                dead = None
                if container.alive and container.init_error is None:
                    self._idle.append(container)
                elif container.init_error is None:  # died or killed: the next invocation starts another
                    self.crashes += 1
                    dead = container
                    if container in self._all:
                        self._all.remove(container)
            if dead is not None:
                dead.stop()  # its pipes
        return invocation

    def warm(self, count: int = 1) -> None:
        """Start ``count`` containers now, so the first invocations are not cold."""
        started = [self._container()[0] for _ in range(min(count, self.max_containers))]
        with self._lock:
            self._idle.extend(c for c in started if c.alive and c.init_error is None)

    def stop(self) -> None:
        """Shut every environment down; what their shutdown phases asked of AWS is billed (not their
        duration: Lambda bills the shutdown of a function without external extensions as nothing)."""
        with self._lock:
            containers, self._all, self._idle = list(self._all), [], []
        for container in containers:
            answer = container.stop()
            if answer is not None:
                with self._lock:
                    self.requests.update(answer.get("requests", {}))
                    add_to(self.usage, answer.get("usage", {}))

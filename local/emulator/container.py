"""One execution environment of a function: a process that imports the handler once, then serves invocations.

Like a Lambda container, it holds one function's environment (set when the process starts, so
settings read at import see it), handles one invocation at a time, and keeps module state between
invocations (warm starts). The parent sends requests on one pipe and reads answers on another;
the handler's stdout (logs, EMF metrics) goes to the parent's log reader untouched.

Run by :class:`local.emulator.functions.FunctionPool`; not meant to be started by hand.

A chaos run (``local.scenarios.chaos``) sets two more variables, never set otherwise:

- ``BREAKWATER_LOCAL_AWS_FAULTS``: a share of the handler's AWS requests is answered with a throttling
  error or a 500 before it leaves the process (botocore ``before-send`` on the default session, which
  every client the handler makes copies): botocore's retries see them as they would AWS's answers,
  and what they do not absorb reaches the handler (:class:`AwsFaults`);
- ``BREAKWATER_LOCAL_KILLS``: a share of the invocations of the functions whose handler starts with a
  given prefix ends with SIGKILL a random moment into the invocation, as a crashed or OOM-killed
  Lambda ends (:class:`Kills`); the pool sees the runtime exit and starts another container.

Each fault injected is one line in ``BREAKWATER_LOCAL_FAULT_LOG``.
"""

from __future__ import annotations

import importlib
import importlib.util
import io
import json
import os
import random
import signal
import sys
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

REQUEST_ID_ENV = "BREAKWATER_LOCAL_REQUEST_ID"  # processor_hooks.REQUEST_ID_ENV
AWS_FAULTS_ENV = "BREAKWATER_LOCAL_AWS_FAULTS"
KILLS_ENV = "BREAKWATER_LOCAL_KILLS"
FAULT_LOG_ENV = "BREAKWATER_LOCAL_FAULT_LOG"  # processor_hooks.FAULT_LOG_ENV


class LambdaContext:
    """The context object the Python runtime passes; the deadline honours the function's timeout."""

    def __init__(self, request_id: str, deadline_ms: int) -> None:
        self.function_name = os.environ.get("AWS_LAMBDA_FUNCTION_NAME", "local")
        self.function_version = os.environ.get("AWS_LAMBDA_FUNCTION_VERSION", "$LATEST")
        self.memory_limit_in_mb = int(os.environ.get("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "128"))
        self.invoked_function_arn = os.environ.get("BREAKWATER_LOCAL_FUNCTION_ARN", "")
        self.log_group_name = os.environ.get("AWS_LAMBDA_LOG_GROUP_NAME", "")
        self.log_stream_name = os.environ.get("AWS_LAMBDA_LOG_STREAM_NAME", "")
        self.aws_request_id = request_id
        self.identity = None
        self.client_context = None
        self._deadline_ms = deadline_ms

    def get_remaining_time_in_millis(self) -> int:
        return max(0, self._deadline_ms - int(time.time() * 1000))


class _Requests:
    """AWS API requests the handler made (botocore ``before-call`` on the default session), per operation."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()

    def __call__(self, model: Any = None, **_: Any) -> None:
        if model is not None:
            self.counts[f"{model.service_model.service_name}.{model.name}"] += 1

    def take(self) -> dict[str, int]:
        taken = dict(self.counts)
        self.counts.clear()
        return taken


class FaultLog:
    """One JSON line per injected fault, appended (lines from several processes never interleave)."""

    def __init__(self, path: str | None, function: str) -> None:
        self._file = Path(path).open("a", encoding="utf-8", buffering=1) if path else None  # noqa: SIM115
        self._function = function
        self._lock = threading.Lock()

    def __call__(self, kind: str, **detail: Any) -> None:
        if self._file is None:
            return
        line = json.dumps(
            {
                "kind": kind,
                "at": time.time(),
                "function": self._function,
                "request_id": os.environ.get(REQUEST_ID_ENV),
                **detail,
            }
        )
        with self._lock:
            self._file.write(line + "\n")


class _Body(io.BytesIO):
    """A raw HTTP body as botocore reads an answer's (``stream()``)."""

    def stream(self, **_: Any) -> Any:
        yield self.getvalue()


def _text(value: str | bytes) -> str:
    return value.decode("latin-1") if isinstance(value, bytes) else str(value)


def error_response(request: Any, service: str, throttled: bool) -> Any:
    """The answer AWS gives a throttled request (``throttled``) or one it failed (a bare 500).

    Shaped for the request's protocol, so botocore's parser reads the error code as it would AWS's:
    JSON protocols name it in ``x-amzn-ErrorType``, S3 and the query protocol in an XML body; a
    protocol this does not know (CBOR) gets a 503 without a body, which botocore retries the same way.
    """
    from botocore.awsrequest import AWSResponse
    from botocore.compat import HTTPHeaders

    def answer(status: int, headers: dict[str, str], body: bytes) -> AWSResponse:
        return AWSResponse(request.url, status, HTTPHeaders.from_dict(headers), _Body(body))

    if not throttled:
        return answer(500, {}, b"")
    headers = {_text(k).lower(): _text(v) for k, v in request.headers.items()}
    content_type = headers.get("content-type", "")
    message = "Rate exceeded (injected by a local chaos run)"
    if "smithy-protocol" in headers:
        return answer(503, {}, b"")
    if service == "s3":
        xml = f"<Error><Code>SlowDown</Code><Message>{message}</Message></Error>"
        return answer(503, {"Content-Type": "application/xml"}, xml.encode())
    if content_type.startswith("application/x-www-form-urlencoded"):
        error = f"<Error><Code>Throttling</Code><Message>{message}</Message></Error>"
        xml = f"<ErrorResponse>{error}</ErrorResponse>"
        return answer(400, {"Content-Type": "text/xml"}, xml.encode())
    body = json.dumps({"__type": "ThrottlingException", "message": message}).encode()
    json_headers = {"Content-Type": "application/x-amz-json-1.0", "x-amzn-ErrorType": "ThrottlingException"}
    return answer(400, json_headers, body)


class AwsFaults:
    """botocore ``before-send``: a share of requests answered with a throttle (or a 500) instead of sent.

    Inert until :attr:`armed` (the chaos is about the invocations, not a container's start).
    """

    def __init__(self, throttle: float, server_error: float, seed: int, log: FaultLog) -> None:
        self.throttle = throttle
        self.server_error = server_error
        self.armed = False
        self._draw = random.Random(f"{seed}-{os.getpid()}")  # a fault schedule, not a secret
        self._log = log

    def __call__(self, request: Any = None, event_name: str = "", **_: Any) -> Any:
        if not self.armed or request is None:
            return None
        draw = self._draw.random()
        if draw >= self.throttle + self.server_error:
            return None
        throttled = draw < self.throttle
        _event, service, operation = [*event_name.split("."), "", ""][:3]
        self._log("aws_throttle" if throttled else "aws_server_error", operation=f"{service}.{operation}")
        return error_response(request, service, throttled)


class Kills:
    """SIGKILL a share (``rate``) of the invocations, a moment drawn in ``[0, within_s)`` into each.

    An invocation that ends first is not killed (its kill is disarmed): only kills that happened are
    written down, as ``kind``.
    """

    def __init__(self, rate: float, within_s: float, kind: str, seed: int, log: FaultLog) -> None:
        self.rate = rate
        self.within_s = within_s
        self.kind = kind
        self._draw = random.Random(f"{seed}-{os.getpid()}-kill")  # a fault schedule, not a secret
        self._log = log

    def arm(self) -> Callable[[], None]:
        """Maybe schedule this invocation's kill; returns what disarms it when the invocation ends."""
        if self._draw.random() >= self.rate:
            return lambda: None
        delay = self._draw.uniform(0.0, self.within_s)
        ended = threading.Event()
        lock = threading.Lock()

        def kill() -> None:
            with lock:  # an invocation that is ending waits for this: it never answers after a kill
                if ended.is_set():
                    return
                self._log(self.kind, after_s=round(delay, 3))
                os.kill(os.getpid(), signal.SIGKILL)

        timer = threading.Timer(delay, kill)
        timer.daemon = True
        timer.start()

        def disarm() -> None:
            with lock:
                ended.set()
            timer.cancel()

        return disarm


def _chaos(handler_spec: str) -> tuple[AwsFaults | None, Kills | None]:
    """The chaos run's faults for this function, from the environment (None and None outside one)."""
    log = FaultLog(os.environ.get(FAULT_LOG_ENV), handler_spec)
    faults = None
    if os.environ.get(AWS_FAULTS_ENV):
        settings = json.loads(os.environ[AWS_FAULTS_ENV])
        faults = AwsFaults(
            float(settings.get("throttle", 0)),
            float(settings.get("server_error", 0)),
            int(settings["seed"]),
            log,
        )
    kills = None
    for prefix, kill in json.loads(os.environ.get(KILLS_ENV) or "{}").items():
        if handler_spec.startswith(prefix) and float(kill.get("rate", 0)) > 0:
            kills = Kills(
                float(kill["rate"]), float(kill["within_s"]), str(kill["kind"]), int(kill["seed"]), log
            )
    return faults, kills


def _load(handler_spec: str) -> Any:
    module_path, _, function_name = handler_spec.rpartition(".")
    module = importlib.import_module(module_path.replace("/", "."))
    return getattr(module, function_name)


def _processor_hooks() -> Any:
    """``processor_hooks.py`` beside this script (the function's code, not ``local``, is on the path)."""
    path = Path(__file__).resolve().parent / "processor_hooks.py"
    spec = importlib.util.spec_from_file_location("breakwater_local_processor_hooks", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # where its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _usage_meter() -> Any:
    """The billed units of the handler's AWS requests (``local/pricing/usage.py``, loaded by its path:
    the function's code, not this repository, is on the path)."""
    path = Path(__file__).resolve().parents[1] / "pricing" / "usage.py"
    spec = importlib.util.spec_from_file_location("breakwater_local_usage", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module.UsageMeter()


def main() -> None:
    code_dir, handler_spec = sys.argv[1], sys.argv[2]
    request_fd, answer_fd = (int(fd) for fd in os.environ.pop("BREAKWATER_LOCAL_FDS").split(","))
    sys.path[0] = (
        code_dir  # in place of this script's directory: the function's code comes first, as in Lambda
    )
    layers = os.environ.pop("BREAKWATER_LOCAL_LAYERS", "")
    sys.path[1:1] = [path for path in layers.split(os.pathsep) if path]  # then its layers, as /opt/python
    os.chdir(code_dir)
    requests_in = os.fdopen(request_fd, "r", encoding="utf-8")
    answers = os.fdopen(answer_fd, "w", encoding="utf-8")

    def answer(message: dict[str, Any]) -> None:
        sys.stdout.flush()
        answers.write(json.dumps(message, default=str) + "\n")
        answers.flush()

    import boto3

    counter = _Requests()
    boto3.setup_default_session()
    boto3.DEFAULT_SESSION.events.register("before-call.*.*", counter)  # type: ignore[union-attr]
    usage = _usage_meter()
    usage.attach(boto3.DEFAULT_SESSION.events)  # type: ignore[union-attr]
    aws_faults, kills = _chaos(handler_spec)
    if aws_faults is not None:  # before the handler's import: the clients it makes copy the session's
        boto3.DEFAULT_SESSION.events.register("before-send.*.*", aws_faults)  # type: ignore[union-attr]
    # Lambda sends SIGTERM at shutdown and the process then ends (below); a handler the function installs
    # runs, and whatever it chains to is this, which returns
    signal.signal(signal.SIGTERM, lambda _signum, _frame: None)
    started = time.perf_counter()
    try:
        handler = _load(handler_spec)
    except Exception as exc:
        answer(
            {
                "init_error": {
                    "errorType": type(exc).__name__,
                    "errorMessage": str(exc),
                    "stackTrace": traceback.format_exc(),
                }
            }
        )
        return
    if "breakwater.processor" in sys.modules:  # a worker: the scenario's hooks, if it set any
        _processor_hooks().install()
    answer(
        {
            "ready": True,
            "init_ms": (time.perf_counter() - started) * 1000,
            "requests": counter.take(),
            "usage": usage.take(),
        }
    )
    if aws_faults is not None:
        aws_faults.armed = True

    for line in requests_in:
        request = json.loads(line)
        context = LambdaContext(request["request_id"], int(request["deadline_ms"]))
        os.environ["_X_AMZN_TRACE_ID"] = request.get("trace_id") or ""
        os.environ[REQUEST_ID_ENV] = request["request_id"]  # for the hooks' records of what ran where
        began = time.perf_counter()
        disarm = kills.arm() if kills is not None else None
        try:
            result = handler(request["event"], context)
            if disarm is not None:
                disarm()
            answer(
                {
                    "result": result,
                    "duration_ms": (time.perf_counter() - began) * 1000,
                    "requests": counter.take(),
                    "usage": usage.take(),
                }
            )
        except Exception as exc:
            if disarm is not None:
                disarm()
            answer(
                {
                    "error": {
                        "errorType": type(exc).__name__,
                        "errorMessage": str(exc),
                        "stackTrace": traceback.format_exc().splitlines(),
                    },
                    "duration_ms": (time.perf_counter() - began) * 1000,
                    "requests": counter.take(),
                    "usage": usage.take(),
                }
            )
    # The environment is shut down (the parent closed the requests): as Lambda does for a function that
    # registered an extension, SIGTERM, whose handler (if the function installed one) flushes what it
    # kept; the AWS requests it made are answered, to be billed.
    signal.raise_signal(signal.SIGTERM)
    answer({"shutdown": True, "requests": counter.take(), "usage": usage.take()})


if __name__ == "__main__":
    main()

"""One execution environment of a function: a process that imports the handler once, then serves invocations.

Like a Lambda container, it holds one function's environment (set when the process starts, so
settings read at import see it), handles one invocation at a time, and keeps module state between
invocations (warm starts). The parent sends requests on one pipe and reads answers on another;
the handler's stdout (logs, EMF metrics) goes to the parent's log reader untouched.

Run by :class:`local.emulator.functions.FunctionPool`; not meant to be started by hand.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import sys
import time
import traceback
from collections import Counter
from pathlib import Path
from typing import Any

REQUEST_ID_ENV = "BREAKWATER_LOCAL_REQUEST_ID"  # processor_hooks.REQUEST_ID_ENV


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


def main() -> None:
    code_dir, handler_spec = sys.argv[1], sys.argv[2]
    request_fd, answer_fd = (int(fd) for fd in os.environ.pop("BREAKWATER_LOCAL_FDS").split(","))
    sys.path[0] = (
        code_dir  # in place of this script's directory: the function's code comes first, as in Lambda
    )
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
    answer({"ready": True, "init_ms": (time.perf_counter() - started) * 1000, "requests": counter.take()})

    for line in requests_in:
        request = json.loads(line)
        context = LambdaContext(request["request_id"], int(request["deadline_ms"]))
        os.environ["_X_AMZN_TRACE_ID"] = request.get("trace_id") or ""
        os.environ[REQUEST_ID_ENV] = request["request_id"]  # for the hooks' records of what ran where
        began = time.perf_counter()
        try:
            result = handler(request["event"], context)
            answer(
                {
                    "result": result,
                    "duration_ms": (time.perf_counter() - began) * 1000,
                    "requests": counter.take(),
                }
            )
        except Exception as exc:
            answer(
                {
                    "error": {
                        "errorType": type(exc).__name__,
                        "errorMessage": str(exc),
                        "stackTrace": traceback.format_exc().splitlines(),
                    },
                    "duration_ms": (time.perf_counter() - began) * 1000,
                    "requests": counter.take(),
                }
            )


if __name__ == "__main__":
    main()

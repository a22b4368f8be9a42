"""Worker overhead per message with AWS stubbed (botocore Stubber), and the handler's import time.

    .venv/bin/python bench/worker.py

Prints one figure per line. Every AWS call is answered in memory by a Stubber that serves a
canned response per operation (so the figures are the worker's own CPU: parsing, deciding,
botocore serialisation of the calls it makes, Powertools batch/idempotency/metrics/logging).
``*_botocore_us_per_message`` is botocore's share alone: the same calls, recorded and made again
without the worker (:func:`botocore_floor_us`).
Import time compares fresh interpreters importing ``worker.handler`` with a bare handler module
that only imports boto3 and creates one client, alternately, as wall and CPU medians.
Goals: <= 100 us per message, import <= 1.3x bare.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import os
import statistics
import subprocess
import sys
import time
from collections import deque
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "functions"))
sys.path.insert(1, str(ROOT))  # the example app's processor (processor/sample.py)

ENV = {
    "AWS_ACCESS_KEY_ID": "bench",
    "AWS_SECRET_ACCESS_KEY": "bench",
    "AWS_DEFAULT_REGION": "us-east-1",
    "POWERTOOLS_SERVICE_NAME": "bench",
    "POWERTOOLS_METRICS_NAMESPACE": "Bench",
    "POWERTOOLS_TRACE_DISABLED": "true",
    "POWERTOOLS_LOG_LEVEL": "WARNING",
    "WORKER_MODE": "live",
    "TIERS": json.dumps(
        {
            "standard": {
                "rate": 1e6,
                "burst": 1e6,
                "consumer_rate": 1e6,
                "concurrency": 100,
                "concurrency_floor": 100,
            }
        }
    ),
    "DEFAULT_TIER": "standard",
    "STATE_TABLE_NAME": "state",
    "IDEMPOTENCY_TABLE_NAME": "idempotency",
    "SPILLOVER_QUEUE_URL": "https://sqs.us-east-1.amazonaws.com/123456789012/spillover",
    "BACKLOG_QUEUE_URL": "https://sqs.us-east-1.amazonaws.com/123456789012/backlog",
    "SURGE_QUEUE_URL": "https://sqs.us-east-1.amazonaws.com/123456789012/surge",
    "SIDELINE_AGE_SECONDS": "300",
    "MAX_DEFER_SECONDS": "900",
    "DEFER_BASE_SECONDS": "2",
    "HEARTBEAT_SECONDS": "30",
    "VISIBILITY_TIMEOUT_SECONDS": "360",
    "LEASE_SECONDS": "1",
    "LEASE_MAX_FRACTION": "0.25",
    "MAX_RECEIVE_COUNT": "5",
}
os.environ.update(ENV)

import boto3  # noqa: E402
from botocore import xform_name  # noqa: E402
from botocore.awsrequest import AWSResponse  # noqa: E402
from botocore.stub import Stubber  # noqa: E402

CANNED: dict[str, dict[str, Any]] = {
    "GetItem": {},
    "BatchGetItem": {"Responses": {}},
    "BatchWriteItem": {"UnprocessedItems": {}},
    "TransactWriteItems": {},
    "PutItem": {},
    "UpdateItem": {"Attributes": {}},
    "SendMessageBatch": {"Successful": [], "Failed": []},
    "ChangeMessageVisibility": {},
}


class CannedStubber(Stubber):
    """A Stubber that answers every call of an operation with the same canned response, in any order.

    With ``recorded`` it also keeps a copy of every call's parameters (for :func:`botocore_floor_us`).
    """

    def __init__(self, client: Any, recorded: list[tuple[Any, str, dict[str, Any]]] | None = None) -> None:
        super().__init__(client)
        self.calls: deque[str] = deque()
        self.recorded = recorded

    def _assert_expected_params(self, model: Any, params: Any, context: Any, **kwargs: Any) -> None:
        if self.recorded is not None:
            self.recorded.append((self.client, xform_name(model.name), copy.deepcopy(params)))

    def _get_response_handler(self, model: Any, params: Any, context: Any, **kwargs: Any) -> Any:
        self.calls.append(model.name)
        return AWSResponse(None, 200, {}, None), CANNED[model.name]  # type: ignore[arg-type]  # as Stubber does


class Context:
    function_name = "bench"
    memory_limit_in_mb = 1024
    invoked_function_arn = "arn:aws:lambda:us-east-1:123456789012:function:bench"
    aws_request_id = "bench"

    def get_remaining_time_in_millis(self) -> int:
        return 600_000


def event(batch: int, *, age_ms: int) -> dict[str, Any]:
    from breakwater.envelope import Envelope, new_envelope_id

    now = int(time.time() * 1000)
    records = []
    for index in range(batch):
        envelope = Envelope(
            id=new_envelope_id(now),
            tenant=f"t{index % 3}",
            type="bench",
            payload={"n": index},
            enqueued_at=now - age_ms,
        )
        records.append(
            {
                "messageId": f"m{index}",
                "receiptHandle": f"r{index}",
                "body": envelope.to_json(),
                "attributes": {
                    "ApproximateReceiveCount": "1",
                    "SentTimestamp": str(now),
                    "SenderId": "AIDA",
                    "ApproximateFirstReceiveTimestamp": str(now),
                },
                "messageAttributes": {},
                "md5OfBody": "x",
                "eventSource": "aws:sqs",
                "eventSourceARN": "arn:aws:sqs:us-east-1:123456789012:live-0",
                "awsRegion": "us-east-1",
            }
        )
    return {"Records": records}


def _stubbed_clients(
    recorded: list[tuple[Any, str, dict[str, Any]]] | None = None,
) -> tuple[Any, Any, list[CannedStubber]]:
    """(dynamodb, sqs, their active stubs): clients with the worker's own config, answered in memory."""
    from breakwater.aws.worker_ports import client_config

    ddb, sqs = boto3.client("dynamodb", config=client_config()), boto3.client("sqs", config=client_config())
    stubs = [CannedStubber(ddb, recorded), CannedStubber(sqs, recorded)]
    for stub in stubs:
        stub.activate()
    return ddb, sqs, stubs


def _stubbed_handler(
    kind: str, recorded: list[tuple[Any, str, dict[str, Any]]] | None = None
) -> tuple[Any, list[CannedStubber]]:
    """The worker's decorated handler over stubbed clients (the worker's own client config)."""
    from breakwater.aws.worker_ports import build_worker_ports
    from breakwater.observability import logger, metrics
    from breakwater.settings import WorkerSettings
    from breakwater.worker import Worker, WorkerOptions
    from processor.sample import process

    settings = WorkerSettings.from_env()
    ddb, sqs, stubs = _stubbed_clients(recorded)
    worker = Worker(
        WorkerOptions.from_settings(settings),
        build_worker_ports(settings, process, dynamodb=ddb, sqs=sqs),
    )
    return logger.inject_lambda_context(metrics.log_metrics(worker.handle)), stubs


def _events(kind: str, batches: int, batch: int) -> list[dict[str, Any]]:
    age = 600_000 if kind == "sideline" else 0
    return [event(batch, age_ms=age) for _ in range(batches)]


def per_message_us(kind: str, batches: int = 300, batch: int = 10) -> tuple[float, float]:
    """(microseconds per message, AWS calls per message) through the decorated handler."""
    handler, stubs = _stubbed_handler(kind)
    events = _events(kind, batches + 20, batch)
    with contextlib.redirect_stdout(io.StringIO()):
        for warm in events[:20]:
            handler(warm, Context())
        for stub in stubs:
            stub.calls.clear()
        started = time.process_time()
        for each in events[20:]:
            handler(each, Context())
        elapsed = time.process_time() - started
    messages = batches * batch
    calls = sum(len(stub.calls) for stub in stubs)
    return elapsed / messages * 1e6, calls / messages


def botocore_floor_us(kind: str, batches: int = 300, batch: int = 10) -> tuple[float, dict[str, float]]:
    """The botocore CPU alone of the calls the worker makes: (us per message, us per message by operation).

    The worker's calls of ``batches`` batches are recorded (parameters as the worker passed them),
    then made again, timed, on other stubbed clients with the same config: serialisation,
    endpoint resolution and the event hooks, no worker code. What the worker can spend of its own
    is the per-message figure minus this.
    """
    recorded: list[tuple[Any, str, dict[str, Any]]] = []
    handler, _ = _stubbed_handler(kind, recorded)
    events = _events(kind, 20 + batches, batch)
    with contextlib.redirect_stdout(io.StringIO()):
        for warm in events[:20]:
            handler(warm, Context())
        recorded.clear()
        for each in events[20:]:
            handler(each, Context())
    ddb, sqs, _ = _stubbed_clients()  # other clients than the handler's, same config
    clients = {"dynamodb": ddb, "sqs": sqs}
    calls = [
        (getattr(clients[client.meta.service_model.service_name], operation), params)
        for client, operation, params in recorded
    ]
    for method, params in calls[:20]:  # warm the clients' caches
        method(**copy.deepcopy(params))
    by_operation: dict[str, float] = {}
    total = 0.0
    for method, params in calls:
        started = time.process_time()
        method(**params)
        elapsed = time.process_time() - started
        by_operation[method.__name__] = by_operation.get(method.__name__, 0.0) + elapsed
        total += elapsed
    messages = batches * batch
    return total / messages * 1e6, {name: value / messages * 1e6 for name, value in by_operation.items()}


def import_times(snippets: dict[str, str], pairs: int = 9) -> dict[str, tuple[float, float]]:
    """Per snippet: (median wall seconds, median CPU seconds) of the import in fresh interpreters.

    The snippets run alternately (one of each per round), so a change in the machine's load hits
    all of them alike; each child reports its own ``perf_counter`` and ``process_time`` around the
    import. The CPU figure is the steadier one on a shared machine: wall time also counts the
    time the child waited for a core.
    """
    env = {**os.environ, "PYTHONPATH": str(ROOT / "functions"), "PYTHONDONTWRITEBYTECODE": "0"}
    commands = {
        name: [
            sys.executable,
            "-c",
            "import time\nt, c = time.perf_counter(), time.process_time()\n"
            f"{snippet}\nprint(time.perf_counter() - t, time.process_time() - c)",
        ]
        for name, snippet in snippets.items()
    }  # our own interpreter and snippets, never user input
    for command in commands.values():  # warms the .pyc files
        subprocess.run(command, env=env, check=True, capture_output=True)  # noqa: S603
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in commands}
    for _ in range(pairs):
        for name, command in commands.items():
            done = subprocess.run(command, env=env, check=True, capture_output=True, text=True)  # noqa: S603
            wall, cpu = (float(value) for value in done.stdout.split())
            samples[name].append((wall, cpu))
    return {
        name: (statistics.median(w for w, _ in values), statistics.median(c for _, c in values))
        for name, values in samples.items()
    }


def main() -> None:
    for kind in ("process", "sideline"):
        micros, calls = per_message_us(kind)
        print(f"worker_{kind}_us_per_message {micros:.1f}")
        print(f"worker_{kind}_aws_calls_per_message {calls:.2f}")
        floor, by_operation = botocore_floor_us(kind)
        print(f"worker_{kind}_botocore_us_per_message {floor:.1f}")
        for operation, micros in sorted(by_operation.items(), key=lambda item: -item[1]):
            print(f"worker_{kind}_botocore_us_per_message[{operation}] {micros:.1f}")
    times = import_times(
        {"bare": "import boto3\nclient = boto3.client('sqs')", "worker": "import worker.handler"}
    )
    (bare_wall, bare_cpu), (ours_wall, ours_cpu) = times["bare"], times["worker"]
    print(f"bare_boto3_handler_import_ms {bare_wall * 1000:.0f}")
    print(f"worker_handler_import_ms {ours_wall * 1000:.0f}")
    print(f"worker_import_ratio {ours_wall / bare_wall:.2f}")
    print(f"bare_boto3_handler_import_cpu_ms {bare_cpu * 1000:.0f}")
    print(f"worker_handler_import_cpu_ms {ours_cpu * 1000:.0f}")
    print(f"worker_import_cpu_ratio {ours_cpu / bare_cpu:.2f}")


if __name__ == "__main__":
    main()

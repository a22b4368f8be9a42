"""Worker overhead per message with AWS stubbed (botocore Stubber), and the handler's import time.

    .venv/bin/python bench/worker.py

Prints one figure per line. Every AWS call is answered in memory by a Stubber that serves a
canned response per operation (so the figures are the worker's own CPU: parsing, deciding,
botocore serialisation of the calls it makes, Powertools batch/idempotency/metrics/logging).
Import time compares fresh interpreters importing ``worker.handler`` with a bare handler module
that only imports boto3 and creates one client. Goals: <= 100 us per message, import <= 1.3x bare.
"""

from __future__ import annotations

import contextlib
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
    "SIMULATED_WORK_MS": "0",
}
os.environ.update(ENV)

import boto3  # noqa: E402
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
    """A Stubber that answers every call of an operation with the same canned response, in any order."""

    def __init__(self, client: Any) -> None:
        super().__init__(client)
        self.calls: deque[str] = deque()

    def _assert_expected_params(self, model: Any, params: Any, context: Any, **kwargs: Any) -> None:
        return None

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


def per_message_us(kind: str, batches: int = 300, batch: int = 10) -> tuple[float, float]:
    """(microseconds per message, AWS calls per message) through the decorated handler."""
    from breakwater import processor
    from breakwater.aws.worker_ports import build_worker_ports, client_config
    from breakwater.observability import logger, metrics
    from breakwater.settings import WorkerSettings
    from breakwater.worker import Worker, WorkerConfig

    settings = WorkerSettings.from_env()
    ddb, sqs = boto3.client("dynamodb", config=client_config()), boto3.client("sqs", config=client_config())
    stubs = [CannedStubber(ddb), CannedStubber(sqs)]
    for stub in stubs:
        stub.activate()
    worker = Worker(
        WorkerConfig.from_settings(settings),
        build_worker_ports(settings, processor.process, dynamodb=ddb, sqs=sqs),
    )
    handler = logger.inject_lambda_context(metrics.log_metrics(worker.handle))
    age = 600_000 if kind == "sideline" else 0
    events = [event(batch, age_ms=age) for _ in range(batches + 20)]
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


def import_seconds(snippet: str, runs: int = 7) -> float:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "functions"), "PYTHONDONTWRITEBYTECODE": "0"}
    code = f"import time\nt = time.perf_counter()\n{snippet}\nprint(time.perf_counter() - t)"
    command = [sys.executable, "-c", code]  # our own interpreter and snippet, never user input
    subprocess.run(command, env=env, check=True, capture_output=True)  # noqa: S603  (warms the .pyc)
    samples = []
    for _ in range(runs):
        done = subprocess.run(command, env=env, check=True, capture_output=True, text=True)  # noqa: S603
        samples.append(float(done.stdout))
    return statistics.median(samples)


def main() -> None:
    for kind in ("process", "sideline"):
        micros, calls = per_message_us(kind)
        print(f"worker_{kind}_us_per_message {micros:.1f}")
        print(f"worker_{kind}_aws_calls_per_message {calls:.2f}")
    bare = import_seconds("import boto3\nclient = boto3.client('sqs')")
    ours = import_seconds("import worker.handler")
    print(f"bare_boto3_handler_import_ms {bare * 1000:.0f}")
    print(f"worker_handler_import_ms {ours * 1000:.0f}")
    print(f"worker_import_ratio {ours / bare:.2f}")


if __name__ == "__main__":
    main()

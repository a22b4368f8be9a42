"""Ingest cost and overhead: 10,000 requests from 50 tenants through the authorizer and ingest handlers.

    .venv/bin/python bench/ingest.py [--requests 10000] [--tenants 50] [--seconds 10] [--seed 7]

Runs against moto in-process (``mock_aws``) with the queue set, tiers and ingest settings of
cdk.json. A simulated clock spreads the requests evenly over ``--seconds``: five noisy tenants
send half of the traffic (about twice their rate), the others stay under theirs. AWS API requests
are counted on the client side (botocore ``before-send``, i.e. every HTTP request including
retries). Prints one figure per line.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import random
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# Run as a script, bench/ comes first on sys.path and this file would shadow the ``ingest`` handler package.
_OTHERS = [entry for entry in sys.path if Path(entry or ".").resolve() != ROOT / "bench"]
sys.path[:] = [str(ROOT / "functions"), str(ROOT), *_OTHERS]
START = 1_700_000_000.0
API_ARN = "arn:aws:execute-api:us-east-1:123456789012:bench01/prod"


@dataclass
class SimulatedClock:
    now: float = START

    def __call__(self) -> float:
        return self.now


@dataclass
class LambdaContext:
    function_name: str = "bench"
    memory_limit_in_mb: int = 256
    invoked_function_arn: str = "arn:aws:lambda:us-east-1:123456789012:function:bench"
    aws_request_id: str = "bench"


class RequestCounter:
    """Counts HTTP requests to AWS (``before-send``) and the CPU spent inside them (moto runs in-process)."""

    def __init__(self) -> None:
        self.by_operation: Counter[str] = Counter()
        self.aws_cpu = 0.0
        self._started: float | None = None
        self._operation = ""

    def before_call(self, event_name: str, **_: Any) -> None:
        self._operation = event_name.split(".", 1)[1]

    def before_send(self, **_: Any) -> None:
        self.by_operation[self._operation] += 1
        self._started = time.process_time()

    def after_call(self, **_: Any) -> None:
        if self._started is not None:
            self.aws_cpu += time.process_time() - self._started
            self._started = None

    @property
    def total(self) -> int:
        return sum(self.by_operation.values())

    def reset(self) -> None:
        self.by_operation.clear()
        self.aws_cpu = 0.0


def blueprint() -> dict[str, Any]:
    context: dict[str, Any] = json.loads((ROOT / "cdk.json").read_text())["context"]["breakwater"]
    return context


def set_environment(config: dict[str, Any], tenants_table: str, state_table: str, urls: list[str]) -> None:
    ingest = config["ingest"]
    os.environ.update(
        {
            "POWERTOOLS_SERVICE_NAME": "breakwater-bench",
            "POWERTOOLS_METRICS_NAMESPACE": "BreakwaterBench",
            "POWERTOOLS_TRACE_DISABLED": "true",
            "POWERTOOLS_LOG_LEVEL": "INFO",
            "TENANTS_TABLE_NAME": tenants_table,
            "CACHE_SECONDS": str(config["api"]["authorizer_cache_seconds"]),
            "STATE_TABLE_NAME": state_table,
            "LIVE_QUEUE_URLS": ",".join(urls),
            "SHARD_SIZE": str(config["queue_set"]["shard_size"]),
            "FAIR_QUEUES": str(config["queue_set"]["fair_queues"]).lower(),
            "MAX_PAYLOAD_BYTES": str(ingest["max_payload_bytes"]),
            "MAX_TTL_SECONDS": str(ingest["max_ttl_seconds"]),
            "LEASE_SECONDS": str(ingest["lease_seconds"]),
            "LEASE_MAX_FRACTION": str(ingest["lease_max_fraction"]),
            "DEPTH_REFRESH_SECONDS": str(ingest["depth_refresh_seconds"]),
            "THROTTLING_ENABLED": "true",
            "TIERS": json.dumps(config["tiers"]),
            "DEFAULT_TIER": config["default_tier"],
        }
    )


def create_resources(queue_count: int) -> tuple[str, str, list[str]]:
    import boto3

    from bench.tables import create_pk_sk_table

    dynamodb = boto3.client("dynamodb")
    dynamodb.create_table(
        TableName="tenants",
        AttributeDefinitions=[{"AttributeName": "tenant_id", "AttributeType": "S"}],
        KeySchema=[{"AttributeName": "tenant_id", "KeyType": "HASH"}],
        BillingMode="PAY_PER_REQUEST",
    )
    create_pk_sk_table(dynamodb, "state")
    sqs = boto3.client("sqs")
    urls = [sqs.create_queue(QueueName=f"live-{index}")["QueueUrl"] for index in range(queue_count)]
    return "tenants", "state", urls


def authorizer_event(key: str, request_id: str) -> dict[str, Any]:
    return {
        "type": "REQUEST",
        "methodArn": f"{API_ARN}/POST/v1/messages",
        "resource": "/v1/messages",
        "path": "/v1/messages",
        "httpMethod": "POST",
        "headers": {"Authorization": f"Bearer {key}"},
        "requestContext": {"requestId": request_id, "stage": "prod"},
    }


def ingest_event(context: dict[str, Any], principal: str, body: str, request_id: str) -> dict[str, Any]:
    return {
        "resource": "/v1/messages",
        "path": "/v1/messages",
        "httpMethod": "POST",
        "headers": {"Content-Type": "application/json"},
        "multiValueHeaders": {},
        "requestContext": {
            "requestId": request_id,
            "stage": "prod",
            "resourcePath": "/v1/messages",
            "httpMethod": "POST",
            "authorizer": {**{k: str(v) for k, v in context.items()}, "principalId": principal},
        },
        "body": body,
        "isBase64Encoded": False,
    }


def run(requests: int, tenant_count: int, seconds: float, seed: int) -> list[str]:
    import importlib

    import boto3
    from moto import mock_aws

    config = blueprint()
    rng = random.Random(seed)
    # Fake credentials: this bench never talks to a real account.
    fake = dict(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing", AWS_DEFAULT_REGION="us-east-1")
    os.environ.update(fake)
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN"):
        os.environ.pop(name, None)
    with mock_aws():
        counter = RequestCounter()
        # Clients copy the session's handlers when created: register before the handlers build theirs.
        events = boto3._get_default_session().events
        events.register("before-call.*.*", counter.before_call)
        events.register("before-send.*", counter.before_send)
        events.register("after-call.*.*", counter.after_call)
        tenants_table, state_table, urls = create_resources(int(config["queue_set"]["size"]))
        set_environment(config, tenants_table, state_table, urls)

        from breakwater.aws.tenants import TenantTable

        table = TenantTable(tenants_table)
        tenants = [f"tenant-{index:02d}" for index in range(tenant_count)]
        keys = {tenant: table.create(tenant, config["default_tier"], now=START) for tenant in tenants}
        noisy = tenants[:5]
        # Five noisy tenants send half of all requests; the rest share the other half.
        quiet_share = 0.5 / (tenant_count - len(noisy))
        weights = [0.5 / len(noisy) if tenant in noisy else quiet_share for tenant in tenants]

        clock = SimulatedClock()
        authorizer: Any = importlib.import_module("authorizer.handler")
        ingest: Any = importlib.import_module("ingest.handler")
        from breakwater.aws.front_door import build_authorizer, build_ingest
        from breakwater.settings import AuthorizerSettings, IngestSettings

        authorizer.AUTHORIZER = build_authorizer(AuthorizerSettings.from_env(), clock)
        ingest.SERVICE = build_ingest(IngestSettings.from_env(), clock)
        counter.reset()

        statuses: Counter[int] = Counter()
        ingest_cpu = 0.0
        ingest_aws_cpu = 0.0
        warm = 0
        context = LambdaContext()
        for index in range(requests):
            clock.now = START + seconds * index / requests
            tenant = rng.choices(tenants, weights)[0]
            request_id = f"r{index}"
            policy = authorizer.handler(authorizer_event(keys[tenant], request_id), context)
            body = json.dumps({"type": "bench", "payload": {"n": index}})
            event = ingest_event(policy["context"], policy["principalId"], body, request_id)
            aws_before = counter.aws_cpu
            started = time.process_time()
            response = ingest.handler(event, context)
            elapsed = time.process_time() - started
            if index > 0:  # the first request pays for lazy imports and connection set-up
                warm += 1
                ingest_cpu += elapsed
                ingest_aws_cpu += counter.aws_cpu - aws_before
            statuses[int(response["statusCode"])] += 1
        # The container's last tallies (a live container flushes them on its next request past the
        # interval): count that write too, so the figure includes the controller's counters.
        ingest.SERVICE.flush_counters()

    accepted = statuses[202]
    own_cpu_ms = (ingest_cpu - ingest_aws_cpu) / warm * 1000
    lines = [
        f"requests: {requests} from {tenant_count} tenants over {seconds:g} simulated seconds",
        f"accepted: {accepted}",
        f"throttled: {statuses[429]}",
        f"other statuses: {sum(count for status, count in statuses.items() if status not in (202, 429))}",
        f"AWS API requests: {counter.total}",
        f"AWS API requests per accepted message: {counter.total / max(1, accepted):.3f}",
        "AWS API requests by operation: "
        + ", ".join(f"{name}={count}" for name, count in sorted(counter.by_operation.items())),
        f"ingest warm CPU per request, with moto in-process: {ingest_cpu / warm * 1000:.3f} ms",
        f"ingest warm CPU per request, excluding the AWS calls: {own_cpu_ms:.3f} ms",
    ]
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--tenants", type=int, default=50)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    # Handler logs and EMF metrics go to stdout in Lambda; here they go nowhere, so the figures stand alone.
    with contextlib.redirect_stdout(io.StringIO()) as sink:
        lines = run(args.requests, args.tenants, args.seconds, args.seed)
    del sink
    for line in lines:
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())

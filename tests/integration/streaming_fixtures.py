"""Fixtures for the ordered (FIFO) and streaming (Kinesis) workloads on moto, and their event source mappings.

A FIFO mapping is played here in the simplest faithful way: it receives a batch, invokes the
handler, deletes what succeeded and makes the failures visible again (as if their visibility
timeout ran out). A Kinesis mapping is the emulator's own (``local.emulator.kinesis_mapping``), run
in this process against moto's mock with the handler imported here (:class:`StreamConsumer`).
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import boto3

from local.emulator.discovery import MappingSpec
from local.emulator.functions import FunctionSpec, Invocation
from local.emulator.kinesis_mapping import KinesisMapping

REGION = "us-east-1"
ACCOUNT = "123456789012"
WRITE_AHEAD_TABLE = "breakwater-write-ahead"
ORDERED_STATE_TABLE = "breakwater-state"


def fifo_worker_environment(**extra: str) -> dict[str, str]:
    """The FIFO worker's environment on the write-ahead and state tables, with ``extra`` on top."""
    return {
        "WRITE_AHEAD_TABLE_NAME": WRITE_AHEAD_TABLE,
        "WRITE_AHEAD_LEASE_SECONDS": "90",
        "WRITE_AHEAD_RETENTION_SECONDS": str(14 * 86_400),
        "STATE_TABLE_NAME": ORDERED_STATE_TABLE,
        **extra,
    }


@dataclass
class FakeLambdaContext:
    function_name: str = "breakwater-test"
    memory_limit_in_mb: int = 256
    invoked_function_arn: str = f"arn:aws:lambda:{REGION}:{ACCOUNT}:function:breakwater-test"
    aws_request_id: str = "00000000-0000-0000-0000-000000000000"


def create_fifo_queue(
    name: str, *, max_receive_count: int = 5, visibility_timeout: int = 30
) -> tuple[str, str]:
    """A FIFO queue in high-throughput mode with its FIFO DLQ; returns (queue url, dlq url)."""
    sqs = boto3.client("sqs", region_name=REGION)
    dlq_url = sqs.create_queue(QueueName=f"{name}-dlq.fifo", Attributes={"FifoQueue": "true"})["QueueUrl"]
    dlq_arn = sqs.get_queue_attributes(QueueUrl=dlq_url, AttributeNames=["QueueArn"])["Attributes"][
        "QueueArn"
    ]
    url = sqs.create_queue(
        QueueName=f"{name}.fifo",
        Attributes={
            "FifoQueue": "true",
            "DeduplicationScope": "messageGroup",
            "FifoThroughputLimit": "perMessageGroupId",
            "VisibilityTimeout": str(visibility_timeout),
            "RedrivePolicy": json.dumps(
                {"deadLetterTargetArn": dlq_arn, "maxReceiveCount": max_receive_count}
            ),
        },
    )["QueueUrl"]
    return url, dlq_url


def create_stream(name: str, shard_count: int = 1) -> str:
    kinesis = boto3.client("kinesis", region_name=REGION)
    kinesis.create_stream(StreamName=name, ShardCount=shard_count)
    return kinesis.describe_stream_summary(StreamName=name)["StreamDescriptionSummary"]["StreamARN"]


def api_event(path: str, body: Any, tenant: str = "acme", request_id: str = "req-1") -> dict[str, Any]:
    """An API Gateway REST proxy event behind the REQUEST authorizer (context values are strings)."""
    return {
        "resource": path,
        "path": path,
        "httpMethod": "POST",
        "headers": {"Content-Type": "application/json"},
        "multiValueHeaders": {},
        "queryStringParameters": None,
        "pathParameters": None,
        "body": body if isinstance(body, str) else json.dumps(body),
        "isBase64Encoded": False,
        "requestContext": {
            "resourcePath": path,
            "httpMethod": "POST",
            "path": f"/prod{path}",
            "stage": "prod",
            "requestId": request_id,
            "authorizer": {"tenant": tenant, "tier": "standard", "rate": "100", "burst": "100"},
        },
    }


# -- SQS FIFO mapping --------------------------------------------------------------------------


@dataclass
class FifoMapping:
    """One poller of a FIFO queue: receive up to ``batch_size``, invoke, delete the successes."""

    queue_url: str
    handler: Callable[[dict[str, Any], Any], Any]
    batch_size: int = 10
    invocations: list[list[str]] = field(default_factory=list)  # message ids per batch

    def poll_once(self) -> int:
        sqs = boto3.client("sqs", region_name=REGION)
        messages = sqs.receive_message(
            QueueUrl=self.queue_url,
            MaxNumberOfMessages=self.batch_size,
            MessageSystemAttributeNames=["All"],
        ).get("Messages", [])
        if not messages:
            return 0
        self.invocations.append([m["MessageId"] for m in messages])
        event = {"Records": [_sqs_record(m, self.queue_url) for m in messages]}
        failed = _failures(self.handler, event, [m["MessageId"] for m in messages])
        for message in messages:
            if message["MessageId"] in failed:
                # Lambda leaves it in flight until the visibility timeout; the test fast-forwards that.
                sqs.change_message_visibility(
                    QueueUrl=self.queue_url, ReceiptHandle=message["ReceiptHandle"], VisibilityTimeout=0
                )
            else:
                sqs.delete_message(QueueUrl=self.queue_url, ReceiptHandle=message["ReceiptHandle"])
        return len(messages)

    def drain(self, max_polls: int = 100) -> None:
        for _ in range(max_polls):
            if not self.poll_once():
                return


def _failures(
    handler: Callable[[dict[str, Any], Any], Any], event: dict[str, Any], ids: list[str]
) -> set[str]:
    """The reported batch item failures; a raised error (Powertools raises when every record failed)
    fails the whole batch, as Lambda treats a function error."""
    try:
        response = handler(event, FakeLambdaContext())
    except Exception:
        return set(ids)
    return {item["itemIdentifier"] for item in (response or {}).get("batchItemFailures", [])}


def _sqs_record(message: Any, queue_url: str) -> dict[str, Any]:
    name = queue_url.rsplit("/", 1)[-1]
    return {
        "messageId": message["MessageId"],
        "receiptHandle": message["ReceiptHandle"],
        "body": message["Body"],
        "attributes": message.get("Attributes", {}),
        "messageAttributes": {},
        "md5OfBody": message["MD5OfBody"],
        "eventSource": "aws:sqs",
        "eventSourceARN": f"arn:aws:sqs:{REGION}:{ACCOUNT}:{name}",
        "awsRegion": REGION,
    }


def send_fifo(queue_url: str, body: str, group_id: str, dedup_id: str) -> str:
    sqs = boto3.client("sqs", region_name=REGION)
    return sqs.send_message(
        QueueUrl=queue_url, MessageBody=body, MessageGroupId=group_id, MessageDeduplicationId=dedup_id
    )["MessageId"]


# -- Kinesis mapping: the emulator's, in this process ----------------------------------------------

# The emulator's patches these tests need of moto: no inline delivery to Lambda (the mapping reads the
# shards), resharding as AWS does it. Installed around each test (``moto_patches.installed``).
KINESIS_PATCHES = ("kinesis.no_inline_delivery", "kinesis.resharding_as_aws")
CONSUMER = "stream-consumer"
HANDLER = "stream_consumer/handler.handler"
FUNCTIONS = Path(__file__).resolve().parents[2] / "functions"  # the handlers' code, imported in this process


class MockedAws:
    """The embedded AWS's client factory (``EmbeddedAws.client``), served by moto's mock in this process."""

    def client(self, service: str, *, counted: bool = True) -> Any:
        return boto3.client(service, region_name=REGION)  # type: ignore[call-overload]


class InProcessFunction:
    """A function's containers (``FunctionPool``) reduced to a handler imported in this process,
    running one invocation at a time as one execution environment does."""

    def __init__(self, spec: FunctionSpec, handler: Callable[[dict[str, Any], Any], Any]) -> None:
        self.spec = spec
        self._handler = handler
        self._lock = threading.Lock()

    def invoke(self, event: Any, *, trace_id: str | None = None, source: str | None = None) -> Invocation:
        invocation = Invocation(function=self.spec.logical_id, request_id=str(uuid.uuid4()))
        with self._lock:
            try:
                invocation.result = self._handler(event, FakeLambdaContext())
            except Exception as exc:  # a function error, as Lambda reports it
                invocation.error = {"errorType": type(exc).__name__, "errorMessage": str(exc)}
        return invocation


class StreamConsumer:
    """``handler`` as the function of a Kinesis event source mapping created in moto, read by the
    emulator's mapping: shards in lineage order (a child only after its parents are finished), a
    batch retried from its lowest reported failure, given up on after ``retry_attempts`` retries."""

    def __init__(
        self,
        stream_arn: str,
        handler: Callable[[dict[str, Any], Any], Any],
        *,
        batch_size: int = 100,
        retry_attempts: int = 2,
    ) -> None:
        iam, lam = boto3.client("iam", region_name=REGION), boto3.client("lambda", region_name=REGION)
        role = iam.create_role(RoleName=f"{CONSUMER}-{uuid.uuid4().hex[:8]}", AssumeRolePolicyDocument="{}")
        function = lam.create_function(
            FunctionName=CONSUMER,
            Runtime="python3.12",
            Role=role["Role"]["Arn"],
            Handler=HANDLER,
            Code={"ZipFile": b"PK\x05\x06" + b"\0" * 18},
        )
        self.settings = {
            "StartingPosition": "TRIM_HORIZON",
            "BatchSize": batch_size,
            "MaximumRetryAttempts": retry_attempts,
            "FunctionResponseTypes": ["ReportBatchItemFailures"],
        }
        mapping = lam.create_event_source_mapping(
            EventSourceArn=stream_arn, FunctionName=CONSUMER, **self.settings
        )
        self.role = role["Role"]["Arn"]
        self.spec = MappingSpec(mapping["UUID"], "StreamConsumer", stream_arn, None)
        self.function = InProcessFunction(
            FunctionSpec(
                "StreamConsumer", CONSUMER, function["FunctionArn"], HANDLER, 30, 256, {}, FUNCTIONS
            ),
            handler,
        )

    def mapping(self) -> KinesisMapping:
        """A mapping as the emulator starts one: no checkpoints, every shard from its starting position."""
        return KinesisMapping(self.spec, self.function, MockedAws(), template_properties=self.settings)

    def run(self, mapping: KinesisMapping | None = None, timeout: float = 30.0) -> KinesisMapping:
        """Start ``mapping`` (a new one if None), wait until every shard is read to its end, stop it."""
        mapping = mapping or self.mapping()
        mapping.start()
        try:
            assert mapping.wait_caught_up(timeout), "the mapping did not read the stream to its end"
        finally:
            mapping.stop()
        return mapping


def read_shard(stream_arn: str, shard_id: str) -> list[Any]:
    """Every record of the shard, from ``GetRecords``."""
    kinesis = boto3.client("kinesis", region_name=REGION)
    iterator = kinesis.get_shard_iterator(
        StreamARN=stream_arn, ShardId=shard_id, ShardIteratorType="TRIM_HORIZON"
    )["ShardIterator"]
    records: list[Any] = []
    while True:
        page = kinesis.get_records(StreamARN=stream_arn, ShardIterator=iterator, Limit=10_000)
        records.extend(page["Records"])
        if not page["Records"]:
            return records
        iterator = page["NextShardIterator"]

"""Fixtures and mapping emulation for the ordered (FIFO) and streaming (Kinesis) workloads on moto.

The emulators play Lambda's event source mappings in the simplest faithful way, for these tests only
(the local runtime's mappings are ``local/``'s): a FIFO mapping receives a batch, invokes the
handler, deletes what succeeded and makes the failures visible again (as if their visibility
timeout ran out); a Kinesis mapping reads shards in lineage order (parents finished before their
children start), retries from the lowest reported failure, and stops a shard after ``retry_attempts``.
"""

from __future__ import annotations

import importlib
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import boto3
import pytest
from moto.kinesis import models as kinesis_models

from breakwater.sequencing import ShardLineage, ready_shards
from local.emulator.kinesis_mapping import kinesis_record
from local.emulator.moto_patches.kinesis import open_shard_routing

REGION = "us-east-1"
ACCOUNT = "123456789012"


@dataclass
class FakeLambdaContext:
    function_name: str = "breakwater-test"
    memory_limit_in_mb: int = 256
    invoked_function_arn: str = f"arn:aws:lambda:{REGION}:{ACCOUNT}:function:breakwater-test"
    aws_request_id: str = "00000000-0000-0000-0000-000000000000"


def load_handler(monkeypatch: pytest.MonkeyPatch, module: str, environment: dict[str, str]) -> ModuleType:
    """Import (or re-import) a handler module after the mock started and its environment is set."""
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    if module in sys.modules:
        return importlib.reload(sys.modules[module])
    return importlib.import_module(module)


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


# -- Kinesis mapping ---------------------------------------------------------------------------


def split_shard_as_aws(monkeypatch: pytest.MonkeyPatch, stream_arn: str, shard_id: str) -> None:
    """Split a shard in two at the middle of its hash range, and make moto route later puts as AWS does.

    moto 5.2.5's ``split_shard`` closes the parent and re-puts its records, but its routing
    (``Stream.get_shard_for_key``) does not skip closed shards, so the records, and every put after
    the split, still land in the parent. After the split the records rightly stay in the closed
    parent; this patch then sends new puts to the open child that owns the hash, as AWS does.
    """
    kinesis = boto3.client("kinesis", region_name=REGION)
    kinesis.split_shard(StreamARN=stream_arn, ShardToSplit=shard_id, NewStartingHashKey=str(2**127))
    routing = open_shard_routing(kinesis_models.Stream.get_shard_for_key)
    monkeypatch.setattr(kinesis_models.Stream, "get_shard_for_key", routing)


@dataclass
class KinesisMapping:
    """Reads every shard of a stream in lineage order and feeds the consumer, like Lambda's mapping:
    a child shard starts only after its parents are closed and fully processed
    (:func:`breakwater.sequencing.ready_shards`); a batch is retried from its lowest reported failure,
    and after ``retry_attempts`` goes to the "on-failure destination" (``failed_batches``)."""

    stream_arn: str
    handler: Callable[[dict[str, Any], Any], Any]
    batch_size: int = 100
    retry_attempts: int = 2
    shard_order: list[str] = field(default_factory=list)  # shard of each invocation
    failed_batches: list[tuple[str, str]] = field(default_factory=list)  # (shard, first failed seq)
    _positions: dict[str, str] = field(default_factory=dict)  # last checkpointed sequence per shard
    _finished: set[str] = field(default_factory=set)

    def _shards(self) -> list[Any]:
        kinesis = boto3.client("kinesis", region_name=REGION)
        return list(kinesis.list_shards(StreamARN=self.stream_arn)["Shards"])

    def lineage(self) -> list[ShardLineage]:
        return [
            ShardLineage(s["ShardId"], s.get("ParentShardId"), s.get("AdjacentParentShardId"))
            for s in self._shards()
        ]

    def read_all(self, shard_id: str) -> list[Any]:
        kinesis = boto3.client("kinesis", region_name=REGION)
        iterator = kinesis.get_shard_iterator(
            StreamARN=self.stream_arn, ShardId=shard_id, ShardIteratorType="TRIM_HORIZON"
        )["ShardIterator"]
        records: list[Any] = []
        while True:
            page = kinesis.get_records(StreamARN=self.stream_arn, ShardIterator=iterator, Limit=10_000)
            records.extend(page["Records"])
            if not page["Records"]:
                return records
            iterator = page["NextShardIterator"]

    def run(self) -> None:
        """Process until no shard has new records; closed shards finish before their children start."""
        progressed = True
        while progressed:
            progressed = False
            closed = {
                s["ShardId"] for s in self._shards() if "EndingSequenceNumber" in s["SequenceNumberRange"]
            }
            for shard_id in ready_shards(self.lineage(), self._finished):
                if self._run_shard(shard_id):
                    progressed = True
                elif shard_id in closed:  # a closed shard with nothing left: its children may start
                    self._finished.add(shard_id)
                    progressed = True

    def _run_shard(self, shard_id: str) -> bool:
        after = self._positions.get(shard_id, "0")
        pending = [r for r in self.read_all(shard_id) if int(r["SequenceNumber"]) > int(after)]
        if not pending:
            return False
        batch, attempts = pending[: self.batch_size], 0
        while batch:
            self.shard_order.append(shard_id)
            event = {"Records": [_kinesis_record(shard_id, r, self.stream_arn) for r in batch]}
            failures = sorted(_failures(self.handler, event, [r["SequenceNumber"] for r in batch]), key=int)
            if not failures:
                self._positions[shard_id] = batch[-1]["SequenceNumber"]
                return True
            lowest = failures[0]
            done = [r for r in batch if int(r["SequenceNumber"]) < int(lowest)]
            if done:
                self._positions[shard_id] = done[-1]["SequenceNumber"]
            attempts += 1
            if attempts > self.retry_attempts:  # to the on-failure destination; the shard moves on
                self.failed_batches.append((shard_id, lowest))
                self._positions[shard_id] = batch[-1]["SequenceNumber"]
                return True
            batch = [r for r in batch if int(r["SequenceNumber"]) >= int(lowest)]
        return True


def _kinesis_record(shard_id: str, record: dict[str, Any], stream_arn: str) -> dict[str, Any]:
    return kinesis_record(shard_id, record, stream_arn, f"arn:aws:iam::{ACCOUNT}:role/consumer")

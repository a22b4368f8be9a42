"""The emulator's Kinesis mapping (``local/emulator/kinesis_mapping.py``) against moto's server.

The stream, table, failure queue, function and mapping are made through the AWS APIs here, with the
settings the stack gives its consumer mapping (bisect, bounded retries, record age, SQS on-failure
destination, ReportBatchItemFailures); the functions are the real stream consumer and a probe whose
record data says what to do. Synthesizing the stack is not needed to test the emulator (the
runtime's discovery hands it the same MappingSpec).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from breakwater.events import StreamEvent
from local.emulator import kinesis_mapping as kinesis_module
from local.emulator.discovery import MappingSpec
from local.emulator.embedded_aws import EmbeddedAws
from local.emulator.functions import FunctionPool, FunctionSpec
from local.emulator.kinesis_mapping import KinesisMapping
from tests.local.helpers import wait_for

ROOT = Path(__file__).resolve().parents[2]
PROBE = ROOT / "tests" / "local" / "handlers"
ACCOUNT = "123456789012"

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def fast_refresh(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kinesis_module, "REFRESH_SECONDS", 0.2)


def _role(aws: EmbeddedAws) -> str:
    iam = aws.client("iam")
    try:
        return str(iam.create_role(RoleName="consumer", AssumeRolePolicyDocument="{}")["Role"]["Arn"])
    except iam.exceptions.EntityAlreadyExistsException:
        return str(iam.get_role(RoleName="consumer")["Role"]["Arn"])


class Setup:
    """A stream, a failure queue and a function (real code from ``code_dir``) with a mapping."""

    def __init__(
        self, aws: EmbeddedAws, name: str, handler: str, code_dir: Path, env: dict[str, str]
    ) -> None:
        kinesis, sqs, lam = aws.client("kinesis"), aws.client("sqs"), aws.client("lambda")
        kinesis.create_stream(StreamName=name, ShardCount=1)
        self.stream_arn = kinesis.describe_stream_summary(StreamName=name)["StreamDescriptionSummary"][
            "StreamARN"
        ]
        self.failures_url = sqs.create_queue(QueueName=f"{name}-failures")["QueueUrl"]
        failures_arn = sqs.get_queue_attributes(QueueUrl=self.failures_url, AttributeNames=["QueueArn"])[
            "Attributes"
        ]["QueueArn"]
        function = lam.create_function(
            FunctionName=name,
            Runtime="python3.12",
            Role=_role(aws),
            Handler=handler,
            Code={"ZipFile": b"PK\x05\x06" + b"\0" * 18},
        )
        self.uuid = lam.create_event_source_mapping(
            EventSourceArn=self.stream_arn,
            FunctionName=name,
            StartingPosition="TRIM_HORIZON",
            BatchSize=10,
            BisectBatchOnFunctionError=True,
            MaximumRetryAttempts=2,
            MaximumRecordAgeInSeconds=3600,
            FunctionResponseTypes=["ReportBatchItemFailures"],
            DestinationConfig={"OnFailure": {"Destination": failures_arn}},
        )["UUID"]
        spec = FunctionSpec(name, name, function["FunctionArn"], handler, 30, 256, env, code_dir)
        self.lines: list[str] = []
        runtime_env = {
            **aws.environment(),
            "AWS_LAMBDA_FUNCTION_NAME": name,
            "POWERTOOLS_TRACE_DISABLED": "true",
        }
        self.pool = FunctionPool(
            spec, runtime_env, lambda _fn, line: self.lines.append(line), max_containers=1
        )
        self.mapping = KinesisMapping(MappingSpec(self.uuid, name, self.stream_arn, None), self.pool, aws)
        self.aws = aws
        self.table = ""

    def put(self, data: bytes, key: str = "acme") -> str:
        kinesis = self.aws.client("kinesis")
        return str(
            kinesis.put_record(StreamARN=self.stream_arn, Data=data, PartitionKey=key)["SequenceNumber"]
        )

    def on_failure_records(self) -> list[dict[str, Any]]:
        sqs = self.aws.client("sqs")
        messages = sqs.receive_message(QueueUrl=self.failures_url, MaxNumberOfMessages=10).get("Messages", [])
        return [json.loads(m["Body"]) for m in messages]

    def close(self) -> None:
        self.mapping.stop()
        self.pool.stop()


def event(value: float, tenant: str = "acme", index: int = 0) -> bytes:
    return StreamEvent(
        id=f"{index:026d}", tenant=tenant, type="clicks", value=value, received_at=int(time.time() * 1000)
    ).to_bytes()


@pytest.fixture
def consumer(aws: EmbeddedAws, request: pytest.FixtureRequest) -> Iterator[Setup]:
    table = f"aggregates-{request.node.name[-20:]}".replace("_", "-")
    aws.client("dynamodb").create_table(
        TableName=table,
        AttributeDefinitions=[
            {"AttributeName": "pk", "AttributeType": "S"},
            {"AttributeName": "sk", "AttributeType": "S"},
        ],
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}, {"AttributeName": "sk", "KeyType": "RANGE"}],
        BillingMode="PAY_PER_REQUEST",
    )
    env = {
        "AGGREGATES_TABLE_NAME": table,
        "MAX_CAS_ATTEMPTS": "3",
        "POWERTOOLS_SERVICE_NAME": "breakwater",
        "POWERTOOLS_METRICS_NAMESPACE": "Breakwater",
    }
    setup = Setup(
        aws,
        f"consumer-{request.node.name[-12:]}".replace("_", "-"),
        "stream_consumer/handler.handler",
        ROOT / "functions",
        env,
    )
    setup.table = table
    yield setup
    setup.close()


def aggregate(aws: EmbeddedAws, table: str, tenant: str = "acme") -> dict[str, Any]:
    item = aws.client("dynamodb").get_item(TableName=table, Key={"pk": {"S": tenant}, "sk": {"S": "clicks"}})
    return dict(item.get("Item", {}))


def test_the_consumer_runs_children_only_after_their_parent(aws: EmbeddedAws, consumer: Setup) -> None:
    before = [consumer.put(event(1.0, index=i)) for i in range(5)]
    parent = "shardId-000000000000"
    # Split at the middle of the hash range; the moto process reshards as AWS does (its patches).
    aws.client("kinesis").split_shard(
        StreamARN=consumer.stream_arn, ShardToSplit=parent, NewStartingHashKey=str(2**127)
    )
    for i in range(5, 12):
        consumer.put(event(2.0, index=i))
    consumer.mapping.start()  # after the split: the closed parent still holds its five records
    assert consumer.mapping.wait_caught_up(30)
    order = consumer.mapping.stats.shard_order
    assert order[0] == parent and parent in consumer.mapping.stats.finished_shards
    first_child = next(i for i, shard in enumerate(order) if shard != parent)
    assert all(shard == parent for shard in order[:first_child])
    assert all(shard != parent for shard in order[first_child:])  # never back to the parent
    item = aggregate(aws, consumer.table)
    assert int(item["count"]["N"]) == 12 and float(item["total"]["N"]) == 5 * 1.0 + 7 * 2.0
    assert item[f"seq#{parent}"]["S"].endswith(before[-1])
    assert float(item["last_value"]["N"]) == 2.0  # the child's latest, applied after the parent's
    assert consumer.on_failure_records() == []


def test_a_poison_record_goes_to_the_destination_and_the_shard_moves_on(
    aws: EmbeddedAws, consumer: Setup
) -> None:
    consumer.mapping.start()
    consumer.put(event(1.0, index=1))
    poison = consumer.put(b"not a stream event")
    assert wait_for(lambda: consumer.mapping.stats.gave_up_batches == 1, timeout=20.0)
    for i in range(2, 5):
        consumer.put(event(1.0, index=i))
    assert consumer.mapping.wait_caught_up(30)
    (record,) = consumer.on_failure_records()
    assert record["requestContext"]["condition"] == "RetryAttemptsExhausted"
    assert record["requestContext"]["approximateInvokeCount"] == 3  # the first attempt and two retries
    info = record["KinesisBatchInfo"]
    assert info["shardId"] == "shardId-000000000000" and info["streamArn"] == consumer.stream_arn
    assert info["startSequenceNumber"] == poison and info["batchSize"] >= 1
    assert int(aggregate(aws, consumer.table)["count"]["N"]) == 4


def test_bisection_isolates_a_function_error(aws: EmbeddedAws) -> None:
    probe = Setup(aws, "probe-kinesis", "probe/kinesis.handler", PROBE, {})
    try:
        sequences = [probe.put(b"ok") for _ in range(5)]
        poison = probe.put(b"crash")
        sequences += [probe.put(b"ok") for _ in range(4)]
        probe.mapping.start()
        assert probe.mapping.wait_caught_up(30)
        (record,) = probe.on_failure_records()
    finally:
        probe.close()
    info = record["KinesisBatchInfo"]
    assert (info["startSequenceNumber"], info["endSequenceNumber"], info["batchSize"]) == (poison, poison, 1)
    assert record["responseContext"]["functionError"] == "Unhandled"
    stats = probe.mapping.stats
    assert stats.bisections >= 3  # 10 -> 5 + 5 -> ... -> the poison alone
    delivered = {
        event_id.split(":")[1]
        for line in probe.lines
        if line.startswith('{"delivered"')
        for event_id in json.loads(line)["delivered"]
    }
    assert delivered == set(sequences)  # every other record was processed

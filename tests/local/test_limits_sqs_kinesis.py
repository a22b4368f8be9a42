"""SQS's batch and size limits and Kinesis's shard rates in the embedded AWS, as AWS answers them."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import boto3
import botocore.config
import pytest
from botocore.exceptions import ClientError
from moto import mock_aws

from local.aws_limits import AwsLimits
from local.emulator import moto_patches
from local.emulator.moto_patches.limits import Enforcement, limits_enforced

CONFIG = botocore.config.Config(retries={"total_max_attempts": 1})


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def enforced(clock: Clock) -> Iterator[Enforcement]:
    # the Kinesis patches route records to shards as AWS does (by the partition key's hash)
    with (
        mock_aws(),
        moto_patches.installed(names={"kinesis.resharding_as_aws"}),
        limits_enforced(AwsLimits(scale=100), clock=clock) as enforcement,
    ):
        yield enforcement


def error_of(call: Any) -> dict[str, Any]:
    with pytest.raises(ClientError) as caught:
        call()
    return dict(caught.value.response["Error"])


def test_sqs_batches_of_more_than_ten_entries_are_refused(enforced: Enforcement) -> None:
    sqs: Any = boto3.client("sqs", region_name="us-east-1", config=CONFIG)
    url = sqs.create_queue(QueueName="q")["QueueUrl"]
    sqs.send_message_batch(QueueUrl=url, Entries=[{"Id": str(i), "MessageBody": "m"} for i in range(10)])
    received = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10)["Messages"]
    handles = [m["ReceiptHandle"] for m in received] + ["extra"]
    too_many = [{"Id": str(i), "ReceiptHandle": handle} for i, handle in enumerate(handles)]
    for call in (
        lambda: sqs.send_message_batch(
            QueueUrl=url, Entries=[{"Id": str(i), "MessageBody": "m"} for i in range(11)]
        ),
        lambda: sqs.delete_message_batch(QueueUrl=url, Entries=too_many),
        lambda: sqs.change_message_visibility_batch(
            QueueUrl=url, Entries=[{**entry, "VisibilityTimeout": 0} for entry in too_many]
        ),
    ):
        error = error_of(call)
        assert error["Code"] == "AWS.SimpleQueueService.TooManyEntriesInBatchRequest"
        assert error["Message"] == "Maximum number of entries per request are 10. You have sent 11."
    assert sqs.delete_message_batch(QueueUrl=url, Entries=too_many[:10])["Successful"]


def test_sqs_sizes_a_batch_over_1_mib_in_total_and_a_message_over_1_mib(enforced: Enforcement) -> None:
    sqs: Any = boto3.client("sqs", region_name="us-east-1", config=CONFIG)
    url = sqs.create_queue(QueueName="q")["QueueUrl"]
    entries = [{"Id": str(i), "MessageBody": "x" * 200_000} for i in range(6)]  # each fits, the sum does not
    error = error_of(lambda: sqs.send_message_batch(QueueUrl=url, Entries=entries))
    assert error["Code"] == "AWS.SimpleQueueService.BatchRequestTooLong"
    error = error_of(lambda: sqs.send_message(QueueUrl=url, MessageBody="x" * (1024 * 1024 + 1)))
    assert error["Code"] == "InvalidParameterValue"
    sqs.send_message_batch(QueueUrl=url, Entries=entries[:5])  # a megabyte exactly: accepted


def stream(kinesis: Any) -> str:
    kinesis.create_stream(StreamName="events", ShardCount=1)
    return str(kinesis.describe_stream(StreamName="events")["StreamDescription"]["StreamARN"])


def test_a_shard_past_its_record_rate_refuses_put_record_until_the_rate_falls(
    enforced: Enforcement, clock: Clock
) -> None:
    kinesis: Any = boto3.client("kinesis", region_name="us-east-1", config=CONFIG)
    arn = stream(kinesis)
    for i in range(10):  # 1,000 records/s divided by 100
        kinesis.put_record(StreamARN=arn, PartitionKey=f"k{i}", Data=b"d")
    error = error_of(lambda: kinesis.put_record(StreamARN=arn, PartitionKey="k", Data=b"d"))
    assert error["Code"] == "ProvisionedThroughputExceededException"
    assert error["Message"] == (
        "Rate exceeded for shard shardId-000000000000 in stream events under account 123456789012."
    )
    for _ in range(10):
        clock.now += 0.2
        kinesis.put_record(StreamARN=arn, PartitionKey="k", Data=b"d")


def test_put_records_answers_each_throttled_record_in_its_place(enforced: Enforcement, clock: Clock) -> None:
    kinesis: Any = boto3.client("kinesis", region_name="us-east-1", config=CONFIG)
    arn = stream(kinesis)
    records: list[Any] = [{"PartitionKey": f"k{i}", "Data": f"r{i}".encode()} for i in range(12)]
    answer = kinesis.put_records(StreamARN=arn, Records=records)
    assert answer["FailedRecordCount"] == 2
    assert [("ErrorCode" in r) for r in answer["Records"]] == [False] * 10 + [True] * 2
    assert answer["Records"][10]["ErrorCode"] == "ProvisionedThroughputExceededException"
    assert answer["Records"][10]["ErrorMessage"].startswith("Rate exceeded for shard shardId-000000000000")
    shard = kinesis.get_shard_iterator(
        StreamARN=arn, ShardId="shardId-000000000000", ShardIteratorType="TRIM_HORIZON"
    )["ShardIterator"]
    written = kinesis.get_records(StreamARN=arn, ShardIterator=shard)["Records"]
    assert [r["Data"] for r in written] == [f"r{i}".encode() for i in range(10)]
    clock.now += 1
    assert kinesis.put_records(StreamARN=arn, Records=records[10:])["FailedRecordCount"] == 0


def test_a_shard_past_its_byte_rate_is_throttled(enforced: Enforcement, clock: Clock) -> None:
    kinesis: Any = boto3.client("kinesis", region_name="us-east-1", config=CONFIG)
    arn = stream(kinesis)
    kinesis.put_record(StreamARN=arn, PartitionKey="k", Data=b"x" * 10_000)  # ~1 MiB/s / 100
    error = error_of(lambda: kinesis.put_record(StreamARN=arn, PartitionKey="k", Data=b"x" * 1_000))
    assert error["Code"] == "ProvisionedThroughputExceededException"
    clock.now += 1
    kinesis.put_record(StreamARN=arn, PartitionKey="k", Data=b"x" * 1_000)
    assert enforced.report()["kinesis_throttled_records"] == 1

"""The emulator's usage counting against moto: what each request costs, as AWS bills it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from local.emulator.embedded_aws import EmbeddedAws
from local.pricing.usage import UsageMeter


@pytest.fixture
def metered(aws: EmbeddedAws) -> Iterator[UsageMeter]:
    """The embedded AWS's meter, emptied before the test (the module's tests share the server)."""
    aws.usage.take()
    yield aws.usage


def test_sqs_requests_are_counted_per_64_kb_chunk_and_a_batch_is_one(
    aws: EmbeddedAws, metered: UsageMeter
) -> None:
    sqs = aws.client("sqs")
    url = sqs.create_queue(QueueName="pricing-standard")["QueueUrl"]
    fifo = sqs.create_queue(QueueName="pricing.fifo", Attributes={"FifoQueue": "true"})["QueueUrl"]
    metered.take()
    entries = [{"Id": str(i), "MessageBody": json.dumps({"n": i})} for i in range(10)]
    sqs.send_message_batch(QueueUrl=url, Entries=entries)
    sqs.send_message(QueueUrl=url, MessageBody="x" * 100_000)  # two chunks
    received = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10)["Messages"]
    sqs.delete_message_batch(
        QueueUrl=url,
        Entries=[{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(received)],
    )
    sqs.send_message(QueueUrl=fifo, MessageBody="ordered", MessageGroupId="g", MessageDeduplicationId="d")
    counted = metered.take()
    received_bytes = sum(len(m["Body"].encode()) for m in received)
    receive_chunks = max(1, -(-received_bytes // 65_536))
    assert counted["sqs.standard_requests"] == 1 + 2 + receive_chunks + 1
    assert counted["sqs.fifo_requests"] == 1


def test_the_meter_times_the_calls_it_counts(aws: EmbeddedAws, metered: UsageMeter) -> None:
    sqs = aws.client("sqs")
    url = sqs.create_queue(QueueName="pricing-timed")["QueueUrl"]
    metered.take()
    for _ in range(3):
        sqs.send_message(QueueUrl=url, MessageBody="x")
    with pytest.raises(sqs.exceptions.QueueDoesNotExist):  # an error answer is waited for too
        sqs.get_queue_url(QueueName="pricing-absent")
    counted = metered.take()
    assert counted["measured.aws_calls.sqs"] == 4
    assert counted["measured.aws_call_ms"] > 0


def _priced(counted: dict[str, float]) -> dict[str, float]:
    """The billed units of a count, without the calls' timings."""
    return {unit: quantity for unit, quantity in counted.items() if not unit.startswith("measured.")}


def _table(aws: EmbeddedAws, name: str) -> Any:
    dynamodb = aws.client("dynamodb", counted=False)
    dynamodb.create_table(
        TableName=name,
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    return aws.client("dynamodb")


def test_dynamodb_request_units_come_from_item_sizes_and_transactions_count_double(
    aws: EmbeddedAws, metered: UsageMeter
) -> None:
    dynamodb = _table(aws, "pricing-units")
    big = {"pk": {"S": "big"}, "blob": {"S": "x" * 3000}}  # 3 KB: three write units
    dynamodb.put_item(TableName="pricing-units", Item=big)
    dynamodb.update_item(
        TableName="pricing-units",
        Key={"pk": {"S": "small"}},
        UpdateExpression="ADD n :one",
        ExpressionAttributeValues={":one": {"N": "1"}},
    )
    dynamodb.transact_write_items(
        TransactItems=[
            {"Put": {"TableName": "pricing-units", "Item": {"pk": {"S": "a"}}}},
            {"Put": {"TableName": "pricing-units", "Item": {"pk": {"S": "b"}}}},
        ]
    )
    dynamodb.batch_write_item(
        RequestItems={"pricing-units": [{"PutRequest": {"Item": {"pk": {"S": f"c{i}"}}}} for i in range(3)]}
    )
    writes = metered.take()
    assert writes["dynamodb.write_request_units"] == 3 + 1 + 2 * 2 + 3

    dynamodb.get_item(TableName="pricing-units", Key={"pk": {"S": "big"}})  # eventually consistent
    dynamodb.get_item(TableName="pricing-units", Key={"pk": {"S": "big"}}, ConsistentRead=True)
    reads = metered.take()
    assert reads["dynamodb.read_request_units"] == 0.5 + 1.0


def test_a_condition_that_fails_still_consumes_write_units_a_throttle_nothing(
    aws: EmbeddedAws, metered: UsageMeter
) -> None:
    dynamodb = _table(aws, "pricing-conditions")
    dynamodb.put_item(TableName="pricing-conditions", Item={"pk": {"S": "k"}})
    metered.take()
    with pytest.raises(dynamodb.exceptions.ConditionalCheckFailedException):
        dynamodb.put_item(
            TableName="pricing-conditions",
            Item={"pk": {"S": "k"}},
            ConditionExpression="attribute_not_exists(pk)",
        )
    assert _priced(metered.take()) == {"dynamodb.write_request_units": 1}


def test_moto_reports_a_constant_consumed_capacity_so_the_emulator_computes_units(aws: EmbeddedAws) -> None:
    """Why the emulator's meter does not take moto's ConsumedCapacity: a 3 KB put reports 1 unit, a
    write half of one. If moto ever reports sizes, ``reported_capacity=True`` can take its figures."""
    dynamodb = _table(aws, "pricing-reported")
    answer = dynamodb.put_item(
        TableName="pricing-reported",
        Item={"pk": {"S": "big"}, "blob": {"S": "x" * 3000}},
        ReturnConsumedCapacity="TOTAL",
    )
    assert answer["ConsumedCapacity"]["CapacityUnits"] == 1.0
    update = dynamodb.update_item(
        TableName="pricing-reported",
        Key={"pk": {"S": "big"}},
        UpdateExpression="SET n = :one",
        ExpressionAttributeValues={":one": {"N": "1"}},
        ReturnConsumedCapacity="TOTAL",
    )
    assert update["ConsumedCapacity"]["CapacityUnits"] == 0.5  # a write is at least one unit in AWS


def test_a_meter_against_aws_asks_for_consumed_capacity_and_takes_it(aws: EmbeddedAws) -> None:
    meter = UsageMeter(reported_capacity=True)
    dynamodb = aws.client("dynamodb", counted=False)
    meter.attach(dynamodb.meta.events)
    _table(aws, "pricing-asked")
    dynamodb.put_item(TableName="pricing-asked", Item={"pk": {"S": "big"}, "blob": {"S": "x" * 3000}})
    counted = meter.take()
    assert counted["dynamodb.reported_capacity_units"] == 1.0  # it asked, moto answered
    assert counted["dynamodb.write_request_units"] == 1.0  # and AWS's figure is the one priced


def test_kinesis_s3_and_unbilled_calls(aws: EmbeddedAws, metered: UsageMeter) -> None:
    kinesis, s3 = aws.client("kinesis"), aws.client("s3")
    kinesis.create_stream(StreamName="pricing-stream", ShardCount=1)
    s3.create_bucket(Bucket="pricing-bucket")
    metered.take()
    kinesis.put_records(
        StreamName="pricing-stream",
        Records=[{"Data": b"x" * 100, "PartitionKey": "t"}, {"Data": b"y" * 30_000, "PartitionKey": "t"}],
    )
    s3.put_object(Bucket="pricing-bucket", Key="k", Body=b"data")
    s3.get_object(Bucket="pricing-bucket", Key="k")["Body"].read()
    s3.delete_object(Bucket="pricing-bucket", Key="k")
    counted = metered.take()
    assert counted["kinesis.put_payload_units"] == 1 + 2
    assert counted["kinesis.ingested_kb"] == 1 + 30
    assert counted["s3.put_requests"] == 1 and counted["s3.get_requests"] == 1

"""Kinesis patches: resharding leaves records where AWS leaves them; no inline delivery to Lambda."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from moto import mock_aws

from local.emulator import moto_patches

STREAM = "events"
PARENT = "shardId-000000000000"
MIDDLE = 2**127  # the split point: the children own the lower and the upper half of the hash keys


def key_in_half(upper: bool) -> str:
    """A partition key whose hash key (MD5, as Kinesis maps it) is in the upper (or lower) half."""
    for n in range(1000):
        key = f"tenant-{n}"
        if (int(hashlib.md5(key.encode()).hexdigest(), 16) >= MIDDLE) == upper:  # noqa: S324 - Kinesis' hash
            return key
    raise AssertionError("no key found")


@pytest.fixture
def kinesis() -> Iterator[Any]:
    with mock_aws():
        client = boto3.client("kinesis", region_name="us-east-1")
        client.create_stream(StreamName=STREAM, ShardCount=1)
        yield client


def records(kinesis: Any, shard_id: str) -> list[tuple[str, str]]:
    """(sequence number, partition key) of every record of the shard."""
    iterator = kinesis.get_shard_iterator(
        StreamName=STREAM, ShardId=shard_id, ShardIteratorType="TRIM_HORIZON"
    )["ShardIterator"]
    found = kinesis.get_records(ShardIterator=iterator, Limit=10_000)["Records"]
    return [(r["SequenceNumber"], r["PartitionKey"]) for r in found]


def put(kinesis: Any, key: str) -> str:
    return str(kinesis.put_record(StreamName=STREAM, Data=b"{}", PartitionKey=key)["ShardId"])


def test_a_split_keeps_the_parents_records_and_routes_puts_to_the_open_child(kinesis: Any) -> None:
    lower, upper = key_in_half(False), key_in_half(True)
    with moto_patches.installed(names={"kinesis.resharding_as_aws"}):
        for key in (lower, upper, lower):
            put(kinesis, key)
        before = records(kinesis, PARENT)
        kinesis.split_shard(StreamName=STREAM, ShardToSplit=PARENT, NewStartingHashKey=str(MIDDLE))
        assert records(kinesis, PARENT) == before  # readable in the closed parent, numbers unchanged
        assert put(kinesis, lower) == "shardId-000000000001"
        assert put(kinesis, upper) == "shardId-000000000002"
        assert records(kinesis, PARENT) == before
        kinesis.merge_shards(
            StreamName=STREAM,
            ShardToMerge="shardId-000000000001",
            AdjacentShardToMerge="shardId-000000000002",
        )
        assert [key for _, key in records(kinesis, "shardId-000000000001")] == [lower]  # kept, not copied
        assert records(kinesis, "shardId-000000000003") == []
        assert put(kinesis, upper) == "shardId-000000000003"


def test_moto_as_released_puts_into_the_closed_parent(kinesis: Any) -> None:
    with moto_patches.removed(names={"kinesis.resharding_as_aws"}):
        put(kinesis, key_in_half(True))
        kinesis.split_shard(StreamName=STREAM, ShardToSplit=PARENT, NewStartingHashKey=str(MIDDLE))
        assert put(kinesis, key_in_half(True)) == PARENT  # what the patch corrects


def test_inline_delivery_is_disabled(kinesis: Any) -> None:
    """moto would invoke the function (in Docker) inside PutRecord; the emulator reads the shards."""
    with moto_patches.installed(names={"kinesis.no_inline_delivery"}):
        iam = boto3.client("iam", region_name="us-east-1")
        lam = boto3.client("lambda", region_name="us-east-1")
        role = iam.create_role(RoleName="r", AssumeRolePolicyDocument="{}")["Role"]["Arn"]
        lam.create_function(
            FunctionName="consumer",
            Runtime="python3.12",
            Role=role,
            Handler="h.h",
            Code={"ZipFile": b"PK\x05\x06" + b"\0" * 18},
        )
        arn = kinesis.describe_stream_summary(StreamName=STREAM)["StreamDescriptionSummary"]["StreamARN"]
        mapping = lam.create_event_source_mapping(
            EventSourceArn=arn, FunctionName="consumer", StartingPosition="TRIM_HORIZON", BatchSize=7
        )
        put(kinesis, "acme")
        assert [key for _, key in records(kinesis, PARENT)] == ["acme"]
        assert lam.get_event_source_mapping(UUID=mapping["UUID"])["BatchSize"] == 7

"""Kinesis's shard limits in moto: 1,000 records and 1 MiB per second per shard, on PutRecord(s).

Each shard a record hashes to (its partition key, or explicit hash key) has two budgets
(:class:`local.aws_limits.ItemThroughput`): records and bytes (data and partition key). A PutRecord past
either is refused with ``ProvisionedThroughputExceededException`` ("Rate exceeded for shard ... in
stream ... under account ..."); in a PutRecords, each refused record gets that code and message in
its place of the answer, the others are written in order, and ``FailedRecordCount`` counts the refused.
"""

from __future__ import annotations

import functools
from base64 import b64decode
from typing import Any

from moto.core.exceptions import JsonRESTError
from moto.kinesis.models import KinesisBackend

from local.emulator.moto_patches import limits as limits_state
from local.emulator.moto_patches.patch import Kind, Patch, Replacement

THROTTLED = "ProvisionedThroughputExceededException"
MAX_RECORDS, MAX_BYTES = 500, 5 * 1024 * 1024  # a PutRecords' own bounds: moto's validation answers past them


def rate_exceeded(shard_id: str, stream: Any) -> str:
    name, account = stream.stream_name, stream.account_id
    return f"Rate exceeded for shard {shard_id} in stream {name} under account {account}."


class ShardThroughputExceededError(JsonRESTError):
    def __init__(self, message: str) -> None:
        super().__init__(THROTTLED, message)


def _record_bytes(partition_key: str | None, data: Any) -> int:
    try:
        size = len(b64decode(data or ""))
    except (ValueError, TypeError):
        size = len(str(data or ""))
    return size + len(partition_key or "")


def _admit(
    enforcement: Any, stream: Any, partition_key: str, explicit_hash_key: str | None, data: Any
) -> str | None:
    """None when the shard takes the record now, else the refusal's message."""
    shard = stream.get_shard_for_key(partition_key, explicit_hash_key)
    if shard is None:
        return None  # moto's own answer
    item = (stream.stream_name, shard.shard_id)
    size = _record_bytes(partition_key, data)
    with enforcement.lock:
        now = enforcement.clock()
        fits = enforcement.kinesis_bytes.within(
            item, now, write_units=size
        ) and enforcement.kinesis_records.within(item, now, write_units=1)
        if fits:
            enforcement.kinesis_records.consume(item, now, write_units=1, kind="kinesis_shard")
            enforcement.kinesis_bytes.consume(item, now, write_units=size, kind="kinesis_shard")
            return None
        enforcement.kinesis_records.stats.setdefault(item, _stats("kinesis_shard")).throttled += 1
        enforcement.refused[THROTTLED] += 1
    return rate_exceeded(shard.shard_id, stream)


def _stats(kind: str) -> Any:
    from local.aws_limits import ItemStats

    return ItemStats(kind)


def _put_record(original: Any) -> Any:
    @functools.wraps(original)
    def put_record(
        self: Any, stream_arn: str, stream_name: str, partition_key: str, explicit_hash_key: str, data: str
    ) -> Any:
        enforcement = limits_state.active()
        if enforcement is not None:
            stream = self.describe_stream(stream_arn=stream_arn, stream_name=stream_name)
            refusal = _admit(enforcement, stream, partition_key, explicit_hash_key, data)
            if refusal is not None:
                raise ShardThroughputExceededError(refusal)
        return original(self, stream_arn, stream_name, partition_key, explicit_hash_key, data)

    return put_record


def _put_records(original: Any) -> Any:
    @functools.wraps(original)
    def put_records(self: Any, stream_arn: str, stream_name: str, records: list[dict[str, Any]]) -> Any:
        enforcement = limits_state.active()
        too_many = len(records) > MAX_RECORDS
        if (
            enforcement is None
            or too_many
            or sum(_record_bytes(r.get("PartitionKey"), r.get("Data")) for r in records) > MAX_BYTES
        ):
            return original(self, stream_arn, stream_name, records)
        stream = self.describe_stream(stream_arn=stream_arn, stream_name=stream_name)
        refusals = [
            _admit(enforcement, stream, r.get("PartitionKey", ""), r.get("ExplicitHashKey"), r.get("Data"))
            for r in records
        ]
        admitted = [r for r, refusal in zip(records, refusals, strict=True) if refusal is None]
        written = iter(original(self, stream_arn, stream_name, admitted)["Records"] if admitted else [])
        answer = [
            next(written) if refusal is None else {"ErrorCode": THROTTLED, "ErrorMessage": refusal}
            for refusal in refusals
        ]
        return {"FailedRecordCount": sum(r is not None for r in refusals), "Records": answer}

    return put_records


PATCHES = (
    Patch(
        name="kinesis_limits.shard_throughput",
        kind=Kind.LIMITS,
        corrects="moto writes any number of records per second to a shard; a shard takes 1,000 records "
        "and 1 MiB per second, and refuses the rest with ProvisionedThroughputExceededException.",
        replaces=(
            Replacement(KinesisBackend, "put_record", _put_record),
            Replacement(KinesisBackend, "put_records", _put_records),
        ),
    ),
)

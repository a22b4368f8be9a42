"""The streaming workload on moto: POST /v1/events, PutRecords' failed subset, CAS consumer, resharding."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

import boto3
import pytest
from moto import mock_aws

from breakwater.aws.aggregates import DynamoAggregateStore
from breakwater.aws.kinesis import THROTTLED, put_records
from breakwater.envelope import new_envelope_id
from breakwater.events import KinesisRecord, PartitionKeyMode, StreamEvent, to_record
from local.emulator import kinesis_mapping as kinesis_module
from local.emulator import moto_patches
from local.emulator.kinesis_mapping import kinesis_record
from tests.integration.conftest import create_table
from tests.integration.handlers import load_handler
from tests.integration.streaming_fixtures import (
    KINESIS_PATCHES,
    REGION,
    FakeLambdaContext,
    StreamConsumer,
    api_event,
    create_stream,
    read_shard,
)

STREAM = "breakwater-events"
AGGREGATES_TABLE = "breakwater-aggregates"


@pytest.fixture
def aws() -> Iterator[None]:
    with moto_patches.installed(names=KINESIS_PATCHES), mock_aws():
        yield


@pytest.fixture(autouse=True)
def fast_refresh(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kinesis_module, "REFRESH_SECONDS", 0.2)  # the mapping notices new shards sooner


@pytest.fixture
def stream_arn(aws: None) -> str:
    return create_stream(STREAM)


@pytest.fixture
def events_api(stream_arn: str, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    return load_handler(
        monkeypatch,
        "events.handler",
        {
            "STREAM_ARN": stream_arn,
            "MAX_EVENT_BYTES": "4096",
            "PUT_ATTEMPTS": "3",
            "PARTITION_KEY_MODE": "tenant",
        },
    )


@pytest.fixture
def consumer(aws: None, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    create_table(AGGREGATES_TABLE)
    return load_handler(monkeypatch, "stream_consumer.handler", {"AGGREGATES_TABLE_NAME": AGGREGATES_TABLE})


def _store() -> DynamoAggregateStore:
    return DynamoAggregateStore(boto3.client("dynamodb", region_name=REGION), AGGREGATES_TABLE)


def _put(stream_arn: str, tenant: str, values: list[float], type_: str = "click") -> list[str]:
    records = [
        to_record(
            StreamEvent(id=new_envelope_id(), tenant=tenant, type=type_, value=v, received_at=1),
            PartitionKeyMode.TENANT,
        )
        for v in values
    ]
    outcome = put_records(boto3.client("kinesis", region_name=REGION), stream_arn, records)
    assert not outcome.failed
    return [outcome.written[i].sequence_number for i in range(len(records))]


def _post(module: ModuleType, body: Any, tenant: str = "acme") -> tuple[int, dict[str, Any]]:
    response = module.handler(api_event("/v1/events", body, tenant=tenant), FakeLambdaContext())
    return response["statusCode"], json.loads(response["body"])


def test_post_events_then_consume_one_event_and_a_batch(
    events_api: ModuleType, consumer: ModuleType, stream_arn: str
) -> None:
    status, body = _post(events_api, {"type": "click", "value": 2})
    assert status == 202 and body["written"] == 1
    status, body = _post(events_api, {"events": [{"type": "click", "value": 3}, {"type": "view"}]})
    assert status == 202 and [r["status"] for r in body["results"]] == ["written", "written"]
    assert _post(events_api, {"events": [{"type": "t"}] * 501})[0] == 400
    assert _post(events_api, {"type": "t", "tenant": "evil"})[0] == 400

    StreamConsumer(stream_arn, consumer.handler).run()
    clicks = _store().read("acme", "click")
    assert (clicks["count"], clicks["total"], clicks["last_value"]) == (2, 5.0, 3.0)
    assert _store().read("acme", "view")["count"] == 1


class FlakyKinesis:
    """Fails the entries ``fails(call, index, entry)`` picks in its first ``flaky_calls`` PutRecords calls,
    as a hot shard would; writes the rest to moto."""

    def __init__(self, fails: Callable[[int, int, Any], bool], flaky_calls: int = 1) -> None:
        self._real = boto3.client("kinesis", region_name=REGION)
        self._fails = fails
        self._flaky_calls = flaky_calls
        self.calls: list[int] = []

    def put_records(self, **kwargs: Any) -> dict[str, Any]:
        entries = kwargs["Records"]
        call = len(self.calls)
        self.calls.append(len(entries))
        failing = {i for i, e in enumerate(entries) if call < self._flaky_calls and self._fails(call, i, e)}
        kept = [e for i, e in enumerate(entries) if i not in failing]
        written: Iterator[Any] = iter(
            self._real.put_records(StreamARN=kwargs["StreamARN"], Records=kept)["Records"] if kept else []
        )
        results = [
            {"ErrorCode": THROTTLED, "ErrorMessage": "Rate exceeded for shard"}
            if i in failing
            else next(written)
            for i in range(len(entries))
        ]
        return {"FailedRecordCount": len(failing), "Records": results}


def _stream_count(stream_arn: str) -> int:
    kinesis = boto3.client("kinesis", region_name=REGION)
    total = 0
    for shard in kinesis.list_shards(StreamARN=stream_arn)["Shards"]:
        iterator = kinesis.get_shard_iterator(
            StreamARN=stream_arn, ShardId=shard["ShardId"], ShardIteratorType="TRIM_HORIZON"
        )["ShardIterator"]
        total += len(kinesis.get_records(StreamARN=stream_arn, ShardIterator=iterator)["Records"])
    return total


def test_put_records_retries_only_the_failed_subset(stream_arn: str) -> None:
    records = [KinesisRecord(data=json.dumps({"n": i}).encode(), partition_key="acme") for i in range(5)]
    flaky = FlakyKinesis(lambda call, index, entry: index in {1, 3})
    outcome = put_records(flaky, stream_arn, records, sleep=lambda _: None)  # type: ignore[arg-type]
    assert flaky.calls == [5, 2]  # the retry carried only the two that failed
    assert sorted(outcome.written) == [0, 1, 2, 3, 4] and not outcome.failed
    assert _stream_count(stream_arn) == 5  # each record written exactly once


def test_an_unwritten_event_is_never_reported_as_written(
    events_api: ModuleType, stream_arn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    fail_b = FlakyKinesis(lambda call, index, entry: b'"type":"b"' in entry["Data"], flaky_calls=99)
    monkeypatch.setattr(events_api.SERVICE.writer, "client", fail_b)
    monkeypatch.setattr("breakwater.aws.kinesis.time.sleep", lambda _: None)
    status, body = _post(events_api, {"events": [{"type": "a"}, {"type": "b"}, {"type": "c"}]})
    assert status == 207
    assert [r["status"] for r in body["results"]] == ["written", "failed", "written"]
    assert body["results"][1]["error"] == THROTTLED
    assert _stream_count(stream_arn) == 2

    monkeypatch.setattr(
        events_api.SERVICE.writer, "client", FlakyKinesis(lambda c, i, e: True, flaky_calls=99)
    )
    status, body = _post(events_api, {"type": "a"})
    assert status == 429 and body["written"] == 0


def test_a_redelivered_batch_changes_nothing(consumer: ModuleType, stream_arn: str) -> None:
    _put(stream_arn, "acme", [1, 2, 3])
    _put(stream_arn, "beta", [10])
    stream = StreamConsumer(stream_arn, consumer.handler)
    stream.run()
    before = (_store().read("acme", "click"), _store().read("beta", "click"))
    stream.run()  # a fresh mapping re-reads from TRIM_HORIZON
    assert (_store().read("acme", "click"), _store().read("beta", "click")) == before
    assert before[0]["count"] == 3 and before[0]["total"] == 6


def test_a_failed_key_is_reported_by_sequence_number_and_the_retry_counts_once(
    consumer: ModuleType, stream_arn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    seqs = _put(stream_arn, "acme", [1])
    seqs += _put(stream_arn, "beta", [5])
    seqs += _put(stream_arn, "acme", [2])
    real = consumer.STORE
    failures = {"beta": 1}

    class FailingOnce:
        def apply_if_newer(self, aggregate: Any) -> str | None:
            if failures.get(aggregate.key.partition_key, 0) > 0:
                failures[aggregate.key.partition_key] -= 1
                raise RuntimeError("ProvisionedThroughputExceededException")
            return real.apply_if_newer(aggregate)

        def apply_if_unchanged(self, aggregate: Any, stored: str) -> str | None:
            return real.apply_if_unchanged(aggregate, stored)

    monkeypatch.setattr(consumer, "STORE", FailingOnce())
    stream = StreamConsumer(stream_arn, consumer.handler)
    records = read_shard(stream_arn, "shardId-000000000000")
    event = {"Records": [kinesis_record("shardId-000000000000", r, stream_arn, stream.role) for r in records]}
    response = consumer.handler(event, FakeLambdaContext())
    assert response == {"batchItemFailures": [{"itemIdentifier": seqs[1]}]}
    failures["beta"] = 1
    stream.run()  # the retry starts at beta's record; acme's later record was already applied
    assert _store().read("acme", "click")["count"] == 2
    assert _store().read("beta", "click")["count"] == 1


def test_a_record_that_is_not_a_stream_event_is_reported_and_the_others_are_written(
    consumer: ModuleType, stream_arn: str
) -> None:
    _put(stream_arn, "acme", [1])
    kinesis = boto3.client("kinesis", region_name=REGION)
    bad = kinesis.put_record(StreamARN=stream_arn, Data=b"not an event", PartitionKey="acme")
    _put(stream_arn, "acme", [2])
    stream = StreamConsumer(stream_arn, consumer.handler)
    records = read_shard(stream_arn, "shardId-000000000000")
    event = {"Records": [kinesis_record("shardId-000000000000", r, stream_arn, stream.role) for r in records]}

    response = consumer.handler(event, FakeLambdaContext())

    assert response == {"batchItemFailures": [{"itemIdentifier": bad["SequenceNumber"]}]}
    assert _store().read("acme", "click")["count"] == 2


def _tenant_in_half(upper: bool, prefix: str) -> str:
    """A tenant whose partition key hashes into the upper (or lower) half of the key space."""
    for i in range(1000):
        name = f"{prefix}{i}"
        if (int(hashlib.md5(name.encode()).hexdigest(), 16) >= 2**127) == upper:  # noqa: S324 - Kinesis' hash
            return name
    raise AssertionError("no tenant found")


def test_after_a_split_children_are_processed_only_after_their_parent(
    consumer: ModuleType, stream_arn: str
) -> None:
    acme, other = _tenant_in_half(False, "acme"), _tenant_in_half(True, "other")
    _put(stream_arn, other, [1] * 7)  # parent sequence numbers 1..7
    parent_seqs = _put(stream_arn, acme, [1, 2, 3])  # 8..10
    stream = StreamConsumer(stream_arn, consumer.handler, batch_size=4)
    # In two at the middle of the hash range: the parent keeps its records, later puts go to the open
    # child that owns their hash key (moto as the emulator patches it, KINESIS_PATCHES).
    boto3.client("kinesis", region_name=REGION).split_shard(
        StreamARN=stream_arn, ShardToSplit="shardId-000000000000", NewStartingHashKey=str(2**127)
    )
    child_seqs = _put(stream_arn, acme, [4, 5])
    mapping = stream.run()

    parent, children = "shardId-000000000000", {"shardId-000000000001", "shardId-000000000002"}
    shard_order = mapping.stats.shard_order
    first_child = next(i for i, shard in enumerate(shard_order) if shard in children)
    assert set(shard_order[:first_child]) == {parent}
    assert parent not in shard_order[first_child:]

    item = _store().read(acme, "click")
    assert (item["count"], item["total"], item["last_value"]) == (5, 15.0, 5.0)  # last value: the child's
    # moto numbers each shard from 1, so the child's numbers are *lower* than the parent's: compared
    # across shards they would look already applied. The CAS key holds one number per shard.
    assert int(child_seqs[-1]) < int(parent_seqs[-1])
    assert item["seq#shardId-000000000000"] == parent_seqs[-1]
    assert _store().read(other, "click")["count"] == 7


def _events_service(stream_arn: str, now: list[float]):
    from breakwater.aws.buckets import LeasedTokenBucket
    from breakwater.aws.kinesis import StreamWriter
    from breakwater.events_ingest import EventsService
    from breakwater.requests import RequestLimits

    create_table("breakwater-state")
    return EventsService(
        writer=StreamWriter(boto3.client("kinesis", region_name=REGION), stream_arn),
        gate=LeasedTokenBucket("breakwater-state", "events", lambda: now[0], 1.0, 0.25),
        clock=lambda: now[0],
        limits=RequestLimits(max_payload_bytes=1024, max_events=500),
        partition_key_mode=PartitionKeyMode.TENANT,
        rate_multiplier=2.0,
    )


def test_events_are_admitted_per_tenant_so_one_tenant_cannot_take_the_shard(stream_arn: str) -> None:
    from breakwater.ingest import TenantContext

    now = [1_700_000_000.0]
    service = _events_service(stream_arn, now)
    noisy = TenantContext(tenant="noisy", tier="standard", rate=2, burst=4)  # 4/s, burst 8 of events
    quiet = TenantContext(tenant="quiet", tier="standard", rate=2, burst=4)
    batch = json.dumps({"events": [{"type": "t"}] * 12}).encode()

    first = service.accept(batch, noisy, request_id="r1", trace_id="1-abc-def")
    assert first.status == 207
    statuses = [r["status"] for r in first.body["results"]]
    assert statuses.count("written") == 8 and statuses[8:] == ["throttled"] * 4  # the burst, in order
    again = service.accept(batch, noisy, request_id="r2", trace_id=None)
    assert again.status == 429 and int(again.headers["Retry-After"]) >= 1 and again.body["written"] == 0

    assert service.accept(b'{"type": "t"}', quiet, request_id="r3", trace_id=None).status == 202
    assert _stream_count(stream_arn) == 9  # nothing refused reached the stream
    now[0] += 1.0  # a second of the noisy tenant's rate
    assert service.accept(batch, noisy, request_id="r4", trace_id=None).body["written"] >= 2


def test_events_carry_the_request_and_trace_ids(stream_arn: str) -> None:
    from breakwater.ingest import TenantContext

    service = _events_service(stream_arn, [1_700_000_000.0])
    tenant = TenantContext(tenant="acme", tier="standard", rate=2, burst=4)
    assert service.accept(b'{"type": "t"}', tenant, request_id="r1", trace_id="1-abc-def").status == 202
    kinesis = boto3.client("kinesis", region_name=REGION)
    shard = kinesis.list_shards(StreamARN=stream_arn)["Shards"][0]["ShardId"]
    iterator = kinesis.get_shard_iterator(
        StreamARN=stream_arn, ShardId=shard, ShardIteratorType="TRIM_HORIZON"
    )
    (record,) = kinesis.get_records(StreamARN=stream_arn, ShardIterator=iterator["ShardIterator"])["Records"]
    event = StreamEvent.from_bytes(record["Data"])
    assert (event.request_id, event.trace_id) == ("r1", "1-abc-def")

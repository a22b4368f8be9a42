"""POST /v1/events bodies, partition keys and PutRecords chunking (pure)."""

from __future__ import annotations

import json

import pytest

from breakwater.errors import BadRequestError
from breakwater.events import (
    PartitionKeyMode,
    StreamEvent,
    chunk_indexes,
    partition_key,
    to_record,
)
from breakwater.requests import RequestLimits, parse_events

LIMITS = RequestLimits(max_payload_bytes=1024, max_events=500)


def parse_events_body(body: str) -> list:
    return parse_events(body.encode(), LIMITS)


def test_one_event_or_a_batch() -> None:
    assert [e.type for e in parse_events_body('{"type": "click"}')] == ["click"]
    batch = parse_events_body(json.dumps({"events": [{"type": "a", "value": 2}, {"type": "b", "key": "k"}]}))
    assert [(e.type, e.value, e.key) for e in batch] == [("a", 2.0, None), ("b", 1.0, "k")]


@pytest.mark.parametrize(
    "body",
    [
        "",
        "not json",
        "[1]",
        '{"events": []}',
        '{"type": "x", "tenant": "evil"}',
        '{"events": [{"value": 1}]}',
        '{"type": "x", "value": "NaN"}',
    ],
)
def test_bad_bodies_are_rejected_with_a_reason(body: str) -> None:
    with pytest.raises(BadRequestError):
        parse_events_body(body)


def test_at_most_500_events() -> None:
    assert len(parse_events_body(json.dumps({"events": [{"type": "t"}] * 500}))) == 500
    with pytest.raises(BadRequestError, match="at most 500"):
        parse_events_body(json.dumps({"events": [{"type": "t"}] * 501}))


def test_partition_key_is_the_tenant_or_tenant_and_key() -> None:
    assert partition_key("acme", "k1", PartitionKeyMode.TENANT) == "acme"
    assert partition_key("acme", "k1", PartitionKeyMode.TENANT_AND_KEY) == "acme:k1"
    assert partition_key("acme", None, PartitionKeyMode.TENANT_AND_KEY) == "acme"


def test_record_round_trips_and_chunks_respect_count_and_bytes() -> None:
    event = StreamEvent(id="0" * 26, tenant="acme", type="t", received_at=5)
    record = to_record(event, PartitionKeyMode.TENANT)
    assert StreamEvent.from_bytes(record.data) == event and record.partition_key == "acme"
    assert chunk_indexes([1] * 1001, max_count=500) == [list(range(500)), list(range(500, 1000)), [1000]]
    assert chunk_indexes([3, 3, 3], max_bytes=6) == [[0, 1], [2]]

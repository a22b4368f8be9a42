"""Sequence-number CAS policy, batch aggregation and shard lineage (pure)."""

from __future__ import annotations

import base64
from typing import Any

import pytest

from breakwater.events import StreamEvent
from breakwater.sequencing import (
    Aggregate,
    ShardLineage,
    StreamRecord,
    aggregate,
    compare_sequences,
    from_lambda_record,
    lineage_order,
    ready_shards,
    sortable_sequence,
    write_aggregates,
)


def test_sortable_sequence_orders_like_the_numbers() -> None:
    numbers = ["9", "10", "49590338271490256608559692538361571095921575989136588898", "100", "0"]
    assert sorted(numbers, key=sortable_sequence) == sorted(numbers, key=int)
    assert compare_sequences("99", "100") == -1 and compare_sequences("7", "7") == 0
    with pytest.raises(ValueError):
        sortable_sequence("007")


def _record(
    seq: int, key: str = "acme", type_: str = "click", value: float = 1.0, shard: str = "s-0"
) -> StreamRecord:
    return StreamRecord(shard_id=shard, sequence_number=str(seq), partition_key=key, type=type_, value=value)


def test_aggregate_folds_per_shard_key_and_type_in_sequence_order() -> None:
    records = [_record(3, value=2), _record(1, value=5), _record(2, key="beta"), _record(4, type_="view")]
    folded = {(a.key.partition_key, a.key.type): a for a in aggregate(records)}
    acme = folded[("acme", "click")]
    assert (acme.count, acme.total, acme.last_value, acme.sequence_numbers) == (2, 7.0, 2.0, ("1", "3"))
    assert len(folded) == 3


class FakeAggregateStore:
    """In-memory store with the adapter's conditions: per (key, shard) the last applied sequence number."""

    def __init__(self) -> None:
        self.items: dict[tuple[str, str], dict[str, float]] = {}
        self.sequences: dict[tuple[str, str, str], str] = {}
        self.fail_keys: set[str] = set()

    def _apply(self, agg: Aggregate) -> None:
        item = self.items.setdefault((agg.key.partition_key, agg.key.type), {"count": 0, "total": 0.0})
        item["count"] += agg.count
        item["total"] += agg.total
        self.sequences[(agg.key.partition_key, agg.key.type, agg.key.shard_id)] = agg.last_sequence

    def apply_if_newer(self, agg: Aggregate) -> str | None:
        if agg.key.partition_key in self.fail_keys:
            raise RuntimeError("throttled")
        stored = self.sequences.get((agg.key.partition_key, agg.key.type, agg.key.shard_id))
        if stored is not None and compare_sequences(stored, agg.first_sequence) >= 0:
            return stored
        self._apply(agg)
        return None

    def apply_if_unchanged(self, agg: Aggregate, stored_sequence: str) -> str | None:
        stored = self.sequences.get((agg.key.partition_key, agg.key.type, agg.key.shard_id))
        if stored != stored_sequence:
            return stored
        self._apply(agg)
        return None


def test_one_write_per_key_and_a_replayed_batch_changes_nothing() -> None:
    store = FakeAggregateStore()
    batch = [_record(i, key=f"t{i % 3}") for i in range(1, 31)]
    first = write_aggregates(batch, store)
    assert first.writes == 3 and first.applied_records == 30 and not first.failed_sequences
    snapshot = dict(store.items)
    again = write_aggregates(batch, store)
    assert again.applied_records == 0 and again.skipped_records == 30 and store.items == snapshot


def test_a_retry_overlapping_what_was_written_applies_only_the_newer_records() -> None:
    store = FakeAggregateStore()
    write_aggregates([_record(10, value=1), _record(20, value=2)], store)
    report = write_aggregates([_record(20, value=2), _record(30, value=4)], store)
    assert report.writes == 2  # the conflict, then the exact swap of just record 30
    assert store.items[("acme", "click")] == {"count": 3, "total": 7.0}


def test_a_failing_key_reports_its_sequence_numbers_and_the_others_are_written() -> None:
    store = FakeAggregateStore()
    store.fail_keys = {"bad"}
    report = write_aggregates([_record(1), _record(2, key="bad"), _record(3, key="bad"), _record(4)], store)
    assert report.failed_sequences == {"2", "3"}
    assert store.items[("acme", "click")]["count"] == 2


def test_from_lambda_record_reads_shard_sequence_and_event() -> None:
    event = StreamEvent(id="0" * 26, tenant="acme", type="click", value=2.5, received_at=1)
    raw: dict[str, Any] = {
        "eventID": "shardId-000000000001:4959",
        "kinesis": {
            "data": base64.b64encode(event.to_bytes()).decode(),
            "sequenceNumber": "4959",
            "partitionKey": "acme",
        },
    }
    assert from_lambda_record(raw) == StreamRecord("shardId-000000000001", "4959", "acme", "click", 2.5)
    raw["kinesis"]["data"] = base64.b64encode(b"not json").decode()
    with pytest.raises(ValueError):
        from_lambda_record(raw)


def test_children_wait_for_their_parents_after_split_and_merge() -> None:
    shards = [
        ShardLineage("s0"),
        ShardLineage("s1", parent_shard_id="s0"),  # split of s0
        ShardLineage("s2", parent_shard_id="s0"),
        ShardLineage("s3", parent_shard_id="s1", adjacent_parent_shard_id="s2"),  # merge
    ]
    assert ready_shards(shards, finished=set()) == ["s0"]
    assert ready_shards(shards, finished={"s0"}) == ["s1", "s2"]
    assert ready_shards(shards, finished={"s0", "s1"}) == ["s2"]
    assert lineage_order(shards) == ["s0", "s1", "s2", "s3"]


def test_an_expired_parent_does_not_block_its_children() -> None:
    assert ready_shards([ShardLineage("s1", parent_shard_id="gone")], finished=set()) == ["s1"]

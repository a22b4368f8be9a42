"""Sequence-number idempotency for the stream consumer, and shard lineage.

The consumer folds a batch into one aggregate per (shard, partition key, event type) and writes
each with a compare-and-swap on the shard's sequence number: the write applies only if the stored
sequence number *for that shard* is lower than the first record the aggregate covers. A retried or
duplicated batch then changes nothing, and a retry that starts in the middle of what was written
keeps only the records after the stored number (:meth:`Aggregate.after`).

The key includes the shard because Kinesis orders sequence numbers only within a shard: after a
split or merge, a child shard's numbers are not comparable with its parent's, so one number per
item would let a late parent record be dropped, or a child record be applied twice.

Everything here is pure; the store is injected.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from breakwater.events import StreamEvent


def sortable_sequence(sequence_number: str) -> str:
    """A string whose lexicographic order is the numeric order of Kinesis sequence numbers.

    Sequence numbers are decimal strings of up to 129 digits, beyond DynamoDB's 38-digit numbers; a
    3-digit length prefix makes string comparison (which DynamoDB conditions support) numeric.
    """
    if not sequence_number.isdigit() or (len(sequence_number) > 1 and sequence_number[0] == "0"):
        raise ValueError(f"not a Kinesis sequence number: {sequence_number!r}")
    return f"{len(sequence_number):03d}{sequence_number}"


def compare_sequences(left: str, right: str) -> int:
    """-1, 0 or 1 as ``left`` is lower than, equal to or higher than ``right`` (same shard only)."""
    a, b = sortable_sequence(left), sortable_sequence(right)
    return (a > b) - (a < b)


@dataclass(frozen=True)
class StreamRecord:
    """What the consumer needs of one Kinesis record, decoded."""

    shard_id: str
    sequence_number: str
    partition_key: str
    type: str
    value: float


def from_lambda_record(record: Mapping[str, Any]) -> StreamRecord:
    """Decode one record of a Lambda Kinesis event (``eventID`` = ``<shard id>:<sequence number>``).

    Raises ``ValueError`` (pydantic's ``ValidationError`` is one) for data that is not a stream event.
    """
    kinesis = record["kinesis"]
    shard_id = str(record["eventID"]).split(":", 1)[0]
    event = StreamEvent.from_bytes(base64.b64decode(kinesis["data"]))
    return StreamRecord(
        shard_id=shard_id,
        sequence_number=str(kinesis["sequenceNumber"]),
        partition_key=str(kinesis["partitionKey"]),
        type=event.type,
        value=event.value,
    )


@dataclass(frozen=True)
class NotAStreamEvent:
    """A record of the batch that could not be decoded: reported as a failure, with the reason."""

    sequence_number: str
    event_id: str | None
    error: str


def decode_lambda_records(
    records: Iterable[Mapping[str, Any]],
) -> tuple[list[StreamRecord], list[NotAStreamEvent]]:
    """The batch's stream events, and the records that are not stream events (with the reason)."""
    decoded: list[StreamRecord] = []
    malformed: list[NotAStreamEvent] = []
    for record in records:
        try:
            decoded.append(from_lambda_record(record))
        except (ValueError, KeyError) as exc:
            malformed.append(
                NotAStreamEvent(str(record["kinesis"]["sequenceNumber"]), record.get("eventID"), str(exc))
            )
    return decoded, malformed


@dataclass(frozen=True)
class AggregateKey:
    shard_id: str
    partition_key: str
    type: str


@dataclass(frozen=True)
class Aggregate:
    """The sum of a run of records of one key in one shard, in sequence order."""

    key: AggregateKey
    sequence_numbers: tuple[str, ...]
    count: int
    total: float
    last_value: float

    @property
    def first_sequence(self) -> str:
        return self.sequence_numbers[0]

    @property
    def last_sequence(self) -> str:
        return self.sequence_numbers[-1]

    def after(self, stored_sequence: str | None, records: Sequence[StreamRecord]) -> Aggregate | None:
        """This aggregate restricted to its records newer than ``stored_sequence`` (None if none are)."""
        members = set(self.sequence_numbers)
        newer = [
            r
            for r in records
            if r.sequence_number in members
            and (stored_sequence is None or compare_sequences(r.sequence_number, stored_sequence) > 0)
        ]
        folded = aggregate(newer)
        return folded[0] if folded else None


def aggregate(records: Iterable[StreamRecord]) -> list[Aggregate]:
    """One aggregate per (shard, partition key, type), in order of first appearance.

    Records are folded in sequence order (Lambda delivers a shard's records in order; sorting makes
    a hand-built batch behave the same), so ``last_value`` is the latest record's value.
    """
    by_key: dict[AggregateKey, list[StreamRecord]] = {}
    for record in records:
        by_key.setdefault(AggregateKey(record.shard_id, record.partition_key, record.type), []).append(record)
    result = []
    for key, members in by_key.items():
        ordered = sorted(members, key=lambda r: sortable_sequence(r.sequence_number))
        result.append(
            Aggregate(
                key=key,
                sequence_numbers=tuple(r.sequence_number for r in ordered),
                count=len(ordered),
                total=sum(r.value for r in ordered),
                last_value=ordered[-1].value,
            )
        )
    return result


class AggregateStore(Protocol):
    """Conditional writes of aggregates; each returns None when applied, else the stored sequence number."""

    def apply_if_newer(self, aggregate: Aggregate) -> str | None:
        """Apply if the stored number for the shard is absent or lower than ``aggregate.first_sequence``."""
        ...

    def apply_if_unchanged(self, aggregate: Aggregate, stored_sequence: str) -> str | None:
        """Apply if the shard's stored number is still ``stored_sequence`` (the swap after a conflict)."""
        ...


@dataclass
class WriteReport:
    """What writing a batch's aggregates did: writes issued, records applied, skipped, failed."""

    writes: int = 0
    applied_records: int = 0
    skipped_records: int = 0  # already applied by an earlier attempt: the idempotent part
    failed_sequences: set[str] = field(default_factory=set)
    errors: list[str] = field(default_factory=list)


def write_aggregates(
    records: Sequence[StreamRecord], store: AggregateStore, max_attempts: int = 3
) -> WriteReport:
    """Fold ``records`` and write each aggregate with a compare-and-swap; never raises for one key's failure.

    The usual path is one write per aggregate. After a conflict (a retried batch overlapping what an
    earlier attempt wrote) the store's answer says how far the item already is; only the newer
    records are written, with an exact swap. A key that fails (throttling, repeated conflicts) has
    its sequence numbers reported, so the caller returns them as batch item failures.
    """
    report = WriteReport()
    for agg in aggregate(records):
        pending: Aggregate | None = agg
        stored: str | None = None
        applied = 0
        attempts = 0
        while pending is not None and attempts < max_attempts:
            attempts += 1
            report.writes += 1
            try:
                if stored is None:
                    stored = store.apply_if_newer(pending)
                else:
                    stored = store.apply_if_unchanged(pending, stored)
            except Exception as exc:  # one key's failure must not fail the others
                report.errors.append(f"{agg.key}: {exc}")
                break
            if stored is None:
                applied, pending = pending.count, None
            else:
                pending = pending.after(stored, records)
        report.applied_records += applied
        if pending is None:
            report.skipped_records += agg.count - applied
        else:
            report.failed_sequences.update(pending.sequence_numbers)
    return report


# -- resharding: parents before children ---------------------------------------------------------


@dataclass(frozen=True)
class ShardLineage:
    shard_id: str
    parent_shard_id: str | None = None
    adjacent_parent_shard_id: str | None = None  # set on the child of a merge

    @property
    def parents(self) -> tuple[str, ...]:
        return tuple(p for p in (self.parent_shard_id, self.adjacent_parent_shard_id) if p)


def ready_shards(shards: Sequence[ShardLineage], finished: set[str]) -> list[str]:
    """Shards that may be read now: not finished, and every parent still listed is finished.

    Lambda's Kinesis mapping does the same: after a split or merge it starts a child only once the
    parent's records are all processed, so a partition key's records stay in order across a reshard.
    A parent no longer listed (expired past retention) does not block its children.
    """
    listed = {s.shard_id for s in shards}
    return [
        s.shard_id
        for s in sorted(shards, key=lambda s: s.shard_id)
        if s.shard_id not in finished and all(p in finished or p not in listed for p in s.parents)
    ]


def lineage_order(shards: Sequence[ShardLineage]) -> list[str]:
    """Every shard, parents before children (a topological order, ties by shard id)."""
    finished: set[str] = set()
    order: list[str] = []
    while len(finished) < len(shards):
        wave = ready_shards(shards, finished)
        if not wave:
            raise ValueError("shard lineage has a cycle")
        order.extend(wave)
        finished.update(wave)
    return order

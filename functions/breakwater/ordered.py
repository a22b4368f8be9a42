"""The ordered workload's policy (SQS FIFO): group and deduplication ids, and exactly-once processing.

- ``MessageGroupId`` = ``tenant:ordering_key``: order is kept per group, and one tenant's groups never
  block another tenant's (SQS FIFO delivers the next message of a group only when the previous one
  is deleted).
- ``MessageDeduplicationId`` = the client's ``dedup_key``, else the envelope id. The queues run in
  high-throughput mode, so SQS deduplicates per message group, for 5 minutes.
- Beyond those 5 minutes, the consumer's write-ahead record (keyed by group and deduplication id)
  makes a duplicate, or a redelivery after a lost delete, have no second effect
  (``docs/ordering-and-streams.md`` states exactly when that holds).

Everything here is pure: the write-ahead store and the side effect are injected.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from breakwater.envelope import Envelope
from breakwater.requests import GROUP_SEPARATOR, MAX_SQS_ID_LENGTH, SQS_ID_PATTERN

_SQS_ID = re.compile(SQS_ID_PATTERN)


def message_group_id(tenant: str, ordering_key: str) -> str:
    """``tenant:ordering_key``; the tenant comes first so groups of different tenants can never collide."""
    group = f"{tenant}{GROUP_SEPARATOR}{ordering_key}"
    if len(group) > MAX_SQS_ID_LENGTH or not _SQS_ID.match(group):
        raise ValueError(f"message group id {group!r} is not a valid SQS MessageGroupId")
    return group


def deduplication_id(envelope: Envelope) -> str:
    """The client's ``dedup_key`` when it gave one (its retries are then duplicates), else the envelope id."""
    return envelope.dedup_key or envelope.id


def fifo_queue_index(group_id: str, queue_count: int) -> int:
    """The FIFO queue a group lives on: a stable hash, so every message of a group goes to one queue.

    Changing the number of queues moves groups; drain the set before changing it, or order breaks
    for the groups that move.
    """
    if queue_count < 1:
        raise ValueError(f"queue_count must be >= 1, got {queue_count}")
    digest = hashlib.sha256(group_id.encode()).digest()
    return int.from_bytes(digest[:8], "big") % queue_count


# -- the release rules of a FIFO receive ---------------------------------------------------------


@dataclass(frozen=True)
class QueuedMessage:
    message_id: str
    group_id: str


def release_order(
    queued: Sequence[QueuedMessage], in_flight_groups: set[str], max_messages: int
) -> list[str]:
    """The messages one ReceiveMessage returns from a FIFO queue, by SQS's documented rules.

    ``queued`` is the visible messages, oldest first. (1) Start from the oldest message whose group
    has nothing in flight; (2) return as many messages of that group as possible, in order; (3) then
    move to the next group with nothing in flight. moto follows (1) and (3) but not (2): it returns
    eligible messages in arrival order across groups (``tests/integration/test_ordered.py`` pins both).
    """
    if max_messages < 1:
        return []
    chosen: list[str] = []
    taken: set[str] = set()
    blocked = set(in_flight_groups)
    for head in queued:
        if len(chosen) >= max_messages:
            break
        if head.group_id in blocked or head.message_id in taken:
            continue
        for message in queued:
            if message.group_id == head.group_id and message.message_id not in taken:
                chosen.append(message.message_id)
                taken.add(message.message_id)
                if len(chosen) >= max_messages:
                    break
        blocked.add(head.group_id)
    return chosen


# -- exactly-once processing: the write-ahead record ---------------------------------------------


class Claim(StrEnum):
    """What the write-ahead store answered when the consumer tried to claim a message."""

    PROCEED = "proceed"  # no record, or an abandoned attempt whose lease ran out: run the side effect
    DUPLICATE = "duplicate"  # done before: acknowledge without a second effect
    BUSY = "busy"  # another attempt holds a live lease: fail the record, so its group waits


class WriteAheadState(StrEnum):
    IN_PROGRESS = "in_progress"
    DONE = "done"


@dataclass(frozen=True)
class WriteAheadRecord:
    state: WriteAheadState
    lease_expires_at: int  # epoch ms; an in-progress attempt older than this is presumed dead


def judge_existing(record: WriteAheadRecord | None, now_ms: int) -> Claim:
    """The claim the conditional put must grant; the adapter's condition expression mirrors this."""
    if record is None:
        return Claim.PROCEED
    if record.state is WriteAheadState.DONE:
        return Claim.DUPLICATE
    return Claim.PROCEED if record.lease_expires_at <= now_ms else Claim.BUSY


class WriteAheadStore(Protocol):
    def claim(self, group_id: str, dedup_id: str, owner: str, now_ms: int) -> Claim: ...

    def complete(self, group_id: str, dedup_id: str, owner: str, now_ms: int) -> None: ...

    def release(self, group_id: str, dedup_id: str, owner: str) -> None: ...


class Outcome(StrEnum):
    PROCESSED = "processed"
    DUPLICATE = "duplicate"
    EXPIRED = "expired"


class GroupBusyError(RuntimeError):
    """Another attempt holds the message's write-ahead lease; failing keeps the rest of its group waiting."""


@dataclass(frozen=True)
class OrderedMessage:
    envelope: Envelope
    group_id: str
    dedup_id: str
    owner: (
        str  # unique per delivery attempt (the receipt handle's hash, or the SQS message id + receive count)
    )


def process_exactly_once(
    message: OrderedMessage,
    store: WriteAheadStore,
    side_effect: Callable[[Envelope], None],
    now_ms: int,
) -> Outcome:
    """Claim the write-ahead record, run the side effect, mark it done.

    An expired message is dropped without a claim (dropping is the one way to shed an ordered backlog
    that keeps the order of what remains). A failing side effect releases the claim and re-raises,
    so the record fails and SQS redelivers it in order.
    """
    if message.envelope.is_expired(now_ms):
        return Outcome.EXPIRED
    claim = store.claim(message.group_id, message.dedup_id, message.owner, now_ms)
    if claim is Claim.DUPLICATE:
        return Outcome.DUPLICATE
    if claim is Claim.BUSY:
        raise GroupBusyError(f"{message.group_id}/{message.dedup_id} is being processed by another attempt")
    try:
        side_effect(message.envelope)
    except BaseException:
        store.release(message.group_id, message.dedup_id, message.owner)
        raise
    store.complete(message.group_id, message.dedup_id, message.owner, now_ms)
    return Outcome.PROCESSED

"""The ordered workload's policy (SQS FIFO): group and deduplication ids, and exactly-once processing.

- ``MessageGroupId`` = ``tenant:ordering_key``: order is kept per group, and one tenant's groups never
  block another tenant's (SQS FIFO delivers the next message of a group only when the previous one
  is deleted).
- ``MessageDeduplicationId`` = the client's ``dedup_key``, else the envelope id. The queues run in
  high-throughput mode, so SQS deduplicates per message group, for 5 minutes.
- Beyond those 5 minutes, the consumer's write-ahead record (keyed by group and deduplication id)
  makes a duplicate, or a redelivery after a lost delete, have no second effect
  (``docs/ordering-and-streams.md`` states exactly when that holds).
- A group's backlog is bounded (:class:`GroupBound`): SQS finds deliverable groups only among the
  oldest messages of a FIFO queue, so a group deep enough to fill that scan window would starve
  every group behind it.

Everything here is pure: the write-ahead store, the group counters and the side effect are injected.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol

from breakwater.envelope import Envelope
from breakwater.requests import GROUP_SEPARATOR, MAX_SQS_ID_LENGTH, SQS_ID_PATTERN

_SQS_ID = re.compile(SQS_ID_PATTERN)


def is_sqs_id(value: str) -> bool:
    """Whether SQS takes ``value`` as a FIFO MessageGroupId or MessageDeduplicationId."""
    return len(value) <= MAX_SQS_ID_LENGTH and _SQS_ID.match(value) is not None


def message_group_id(tenant: str, ordering_key: str) -> str:
    """``tenant:ordering_key``; the tenant comes first so groups of different tenants can never collide."""
    group = f"{tenant}{GROUP_SEPARATOR}{ordering_key}"
    if not is_sqs_id(group):
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


# The side effect of an ordered message; it may hand back DynamoDB transaction entries to be written
# with the message's completion.
SideEffect = Callable[[Envelope], Sequence[dict[str, Any]] | None]


class WriteAheadStore(Protocol):
    def claim(self, group_id: str, dedup_id: str, owner: str, now_ms: int) -> Claim: ...

    def complete(self, group_id: str, dedup_id: str, owner: str, now_ms: int) -> None: ...

    def complete_with_effects(
        self, group_id: str, dedup_id: str, owner: str, now_ms: int, effects: Sequence[dict[str, Any]]
    ) -> None:
        """:meth:`complete` and the side effect's own writes at once, or nothing (then it raises)."""
        ...

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
    side_effect: SideEffect,
    now_ms: int,
) -> Outcome:
    """Claim the write-ahead record, run the side effect, mark it done.

    An expired message is dropped without a claim (dropping is the one way to shed an ordered backlog
    that keeps the order of what remains). A failing side effect releases the claim and re-raises,
    so the record fails and SQS redelivers it in order. Writes the side effect hands back (DynamoDB
    transaction entries) are made in one transaction with the record's completion: once or not at all.
    """
    if message.envelope.is_expired(now_ms):
        return Outcome.EXPIRED
    claim = store.claim(message.group_id, message.dedup_id, message.owner, now_ms)
    if claim is Claim.DUPLICATE:
        return Outcome.DUPLICATE
    if claim is Claim.BUSY:
        raise GroupBusyError(f"{message.group_id}/{message.dedup_id} is being processed by another attempt")
    try:
        effects = side_effect(message.envelope)
    except BaseException:
        store.release(message.group_id, message.dedup_id, message.owner)
        raise
    if effects:
        store.complete_with_effects(message.group_id, message.dedup_id, message.owner, now_ms, effects)
    else:
        store.complete(message.group_id, message.dedup_id, message.owner, now_ms)
    return Outcome.PROCESSED


# -- the group backlog bound: what keeps one group from filling FIFO's scan window ---------------
#
# SQS looks for groups it can deliver from only among the oldest messages of a FIFO queue (its
# scan window, the size of the queue's in-flight quota). A group whose backlog filled that window
# would hide every group behind it. So ingest admits a message only while its group has fewer than
# ``limit`` messages accepted and not yet released, and the consumer releases each message it is
# done with. The count lives in one item per group, split by generation: a message can stay in its
# queue at most one window (the queue's retention period, plus the ingest request that stamped it)
# after ``enqueued_at``, so what was admitted two generations ago has left the queue, whether its
# release ever came (a message moved to the DLQ, one that expired in the queue) or not.


@dataclass(frozen=True)
class BacklogWindow:
    """One generation of the group counters: at least the longest a message can stay in its queue
    after ingest stamped its ``enqueued_at`` (the stack sets the queue's retention period plus a
    margin for the ingest request). Ingest and consumer must use the same one."""

    window_ms: int

    def __post_init__(self) -> None:
        if self.window_ms < 1:
            raise ValueError(f"a backlog window must be at least 1 ms, got {self.window_ms}")

    def generation(self, enqueued_at_ms: int) -> int:
        """The generation a message is counted in: ingest and consumer derive it from the same stamp."""
        return enqueued_at_ms // self.window_ms

    def expires_at_s(self, generation: int) -> int:
        """When a counter item of ``generation`` counts nothing any more (its TTL, epoch seconds)."""
        return (generation + 2) * self.window_ms // 1000


@dataclass(frozen=True)
class GroupBound:
    """At most ``limit`` messages per group accepted and not yet released, counted per ``window``."""

    limit: int
    window: BacklogWindow

    def __post_init__(self) -> None:
        if self.limit < 1:
            raise ValueError(f"a group bound needs limit >= 1, got {self.limit}")


@dataclass(frozen=True)
class GroupBacklog:
    """A group's counter item: ``backlog`` messages not yet released, ``previous`` of them admitted in
    the generation before ``generation`` (the rest in ``generation`` itself)."""

    generation: int
    backlog: int
    previous: int

    @property
    def current(self) -> int:
        return self.backlog - self.previous


def backlog_at(stored: GroupBacklog | None, generation: int) -> GroupBacklog:
    """The stored counts as they stand in ``generation``.

    Counts of two generations back or more are gone (those messages have left the queue); last
    generation's current count becomes this one's ``previous``. An item already in a later
    generation (another container's clock is ahead) is taken as it is.
    """
    if stored is None or stored.generation < generation - 1:
        return GroupBacklog(generation=generation, backlog=0, previous=0)
    if stored.generation == generation - 1:
        current = max(0, stored.current)
        return GroupBacklog(generation=generation, backlog=current, previous=current)
    return stored


@dataclass(frozen=True)
class GroupAdmission:
    """``admitted``, and the group's backlog: after the admission, or the one that refused it."""

    admitted: bool
    backlog: int


def plan_admission(stored: GroupBacklog | None, generation: int, limit: int) -> tuple[bool, GroupBacklog]:
    """Whether one more message of the group is admitted, and the counts to write if it is."""
    seen = backlog_at(stored, generation)
    if seen.backlog >= limit:
        return False, seen
    return True, GroupBacklog(generation=seen.generation, backlog=seen.backlog + 1, previous=seen.previous)


class Slot(StrEnum):
    """Which count a released message comes off."""

    CURRENT = "current"  # admitted in the item's generation
    PREVIOUS = "previous"  # admitted in the generation before it


def release_slot(stored: GroupBacklog | None, generation: int) -> Slot | None:
    """The count a message of ``generation`` comes off, or None when nothing counts it any more.

    None: no item, a count already at zero (a second release, or a message admitted before the
    bound existed), or a generation the item has moved past (its count aged out).
    """
    if stored is None:
        return None
    if stored.generation == generation:
        return Slot.CURRENT if stored.current > 0 else None
    if stored.generation == generation + 1:
        return Slot.PREVIOUS if stored.previous > 0 else None
    return None


class GroupBacklogs(Protocol):
    """The per-group counters (``breakwater.aws.group_backlogs.DynamoGroupBacklogs``)."""

    def admit(self, group_id: str, generation: int, limit: int, now_ms: int) -> GroupAdmission: ...

    def release(self, group_id: str, generation: int, now_ms: int) -> bool: ...


class TenantBacklogs(GroupBacklogs, Protocol):
    """The per-tenant counts over all of a tenant's groups: the same rules, keyed by tenant, and a
    batch's releases in one write (``breakwater.aws.group_backlogs.tenant_backlogs``)."""

    def release_many(self, counted_id: str, generation: int, count: int, now_ms: int) -> int: ...

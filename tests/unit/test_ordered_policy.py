"""The ordered workload's pure policy: group and dedup ids, the FIFO release rules, the write-ahead claim,
and the group backlog bound (counters by generation, the ingest's admission, the consumer's release)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
from pydantic import ValidationError

from breakwater.envelope import Envelope, new_envelope_id
from breakwater.errors import UnavailableError
from breakwater.fifo_consumer import FifoConsumer
from breakwater.ingest import TenantContext
from breakwater.ordered import (
    BacklogWindow,
    Claim,
    GroupAdmission,
    GroupBacklog,
    GroupBound,
    GroupBusyError,
    OrderedMessage,
    Outcome,
    QueuedMessage,
    Slot,
    WriteAheadRecord,
    WriteAheadState,
    backlog_at,
    deduplication_id,
    fifo_queue_index,
    judge_existing,
    message_group_id,
    plan_admission,
    process_exactly_once,
    release_order,
    release_slot,
)
from breakwater.ordered_ingest import GroupBacklogFullError, OrderedIngestService
from breakwater.requests import MAX_ORDERING_KEY_LENGTH, OrderedMessageRequest, RequestLimits


def _envelope(**fields: object) -> Envelope:
    base: dict[str, object] = {
        "id": new_envelope_id(1_000),
        "tenant": "acme",
        "type": "t",
        "enqueued_at": 1_000,
    }
    base.update(fields)
    return Envelope.model_validate(base)


def test_group_id_is_tenant_then_ordering_key_and_always_fits_sqs() -> None:
    assert message_group_id("acme", "order-42") == "acme:order-42"
    longest = message_group_id("t" * 64, "k" * MAX_ORDERING_KEY_LENGTH)
    assert len(longest) == 128
    with pytest.raises(ValueError, match="MessageGroupId"):
        message_group_id("acme", "has space")


def test_request_rejects_ordering_keys_that_would_not_fit_or_are_missing() -> None:
    with pytest.raises(ValidationError):
        OrderedMessageRequest.model_validate(
            {"type": "t", "ordering_key": "k" * (MAX_ORDERING_KEY_LENGTH + 1)}
        )
    with pytest.raises(ValidationError):
        OrderedMessageRequest.model_validate({"type": "t"})
    assert OrderedMessageRequest.model_validate({"type": "t", "ordering_key": "a:b"}).ordering_key == "a:b"


def test_dedup_id_is_the_clients_key_else_the_envelope_id() -> None:
    assert deduplication_id(_envelope(dedup_key="client-1")) == "client-1"
    envelope = _envelope()
    assert deduplication_id(envelope) == envelope.id


def test_a_group_always_lives_on_one_queue_and_groups_spread() -> None:
    indexes = {fifo_queue_index(f"acme:{i}", 4) for i in range(200)}
    assert indexes == {0, 1, 2, 3}
    assert all(fifo_queue_index("acme:x", 4) == fifo_queue_index("acme:x", 4) for _ in range(3))


def _queue(*pairs: tuple[str, str]) -> list[QueuedMessage]:
    return [QueuedMessage(message_id=m, group_id=g) for m, g in pairs]


def test_release_rule_1_oldest_message_whose_group_has_nothing_in_flight() -> None:
    queued = _queue(("a1", "A"), ("b1", "B"), ("a2", "A"))
    assert release_order(queued, in_flight_groups={"A"}, max_messages=1) == ["b1"]


def test_release_rule_2_as_many_of_the_same_group_as_possible() -> None:
    queued = _queue(("a1", "A"), ("b1", "B"), ("a2", "A"), ("a3", "A"))
    assert release_order(queued, in_flight_groups=set(), max_messages=3) == ["a1", "a2", "a3"]


def test_release_rule_3_then_the_next_group() -> None:
    queued = _queue(("a1", "A"), ("b1", "B"), ("a2", "A"), ("c1", "C"), ("b2", "B"))
    assert release_order(queued, in_flight_groups=set(), max_messages=10) == ["a1", "a2", "b1", "b2", "c1"]
    assert release_order(queued, in_flight_groups={"B"}, max_messages=10) == ["a1", "a2", "c1"]


def test_judge_existing_record() -> None:
    assert judge_existing(None, 10) is Claim.PROCEED
    assert judge_existing(WriteAheadRecord(WriteAheadState.DONE, 0), 10) is Claim.DUPLICATE
    assert judge_existing(WriteAheadRecord(WriteAheadState.IN_PROGRESS, 20), 10) is Claim.BUSY
    assert judge_existing(WriteAheadRecord(WriteAheadState.IN_PROGRESS, 10), 10) is Claim.PROCEED


class FakeStore:
    """In-memory write-ahead store with the adapter's semantics."""

    def __init__(self, lease_ms: int = 1_000) -> None:
        self.records: dict[tuple[str, str], tuple[WriteAheadRecord, str]] = {}
        self.lease_ms = lease_ms

    def claim(self, group_id: str, dedup_id: str, owner: str, now_ms: int) -> Claim:
        existing = self.records.get((group_id, dedup_id))
        claim = judge_existing(existing[0] if existing else None, now_ms)
        if claim is Claim.PROCEED:
            self.records[(group_id, dedup_id)] = (
                WriteAheadRecord(WriteAheadState.IN_PROGRESS, now_ms + self.lease_ms),
                owner,
            )
        return claim

    def complete(self, group_id: str, dedup_id: str, owner: str, now_ms: int) -> None:
        assert self.records[(group_id, dedup_id)][1] == owner
        self.records[(group_id, dedup_id)] = (WriteAheadRecord(WriteAheadState.DONE, 0), owner)

    def complete_with_effects(
        self, group_id: str, dedup_id: str, owner: str, now_ms: int, effects: Sequence[dict[str, Any]]
    ) -> None:
        self.complete(group_id, dedup_id, owner, now_ms)

    def release(self, group_id: str, dedup_id: str, owner: str) -> None:
        if self.records.get((group_id, dedup_id), (None, None))[1] == owner:
            del self.records[(group_id, dedup_id)]


def _message(envelope: Envelope, owner: str = "m:1") -> OrderedMessage:
    return OrderedMessage(
        envelope=envelope, group_id="acme:k", dedup_id=deduplication_id(envelope), owner=owner
    )


def test_exactly_once_processes_then_treats_a_redelivery_as_duplicate() -> None:
    store, effects = FakeStore(), list[Envelope]()
    envelope = _envelope(dedup_key="d1")
    assert process_exactly_once(_message(envelope), store, effects.append, 2_000) is Outcome.PROCESSED
    assert (
        process_exactly_once(_message(envelope, "m:2"), store, effects.append, 900_000_000)
        is Outcome.DUPLICATE
    )
    assert effects == [envelope]


def test_a_failed_side_effect_releases_the_claim_so_the_retry_proceeds() -> None:
    store, effects = FakeStore(), list[Envelope]()
    envelope = _envelope()

    def boom(_: Envelope) -> None:
        raise RuntimeError("downstream down")

    with pytest.raises(RuntimeError):
        process_exactly_once(_message(envelope), store, boom, 2_000)
    assert process_exactly_once(_message(envelope, "m:2"), store, effects.append, 2_001) is Outcome.PROCESSED


def test_a_live_claim_blocks_and_an_abandoned_one_is_taken_over() -> None:
    store, effects = FakeStore(lease_ms=1_000), list[Envelope]()
    envelope = _envelope()
    store.claim("acme:k", envelope.id, "crashed:1", 2_000)  # an attempt that died after claiming
    with pytest.raises(GroupBusyError):
        process_exactly_once(_message(envelope, "m:2"), store, effects.append, 2_500)
    assert process_exactly_once(_message(envelope, "m:3"), store, effects.append, 3_000) is Outcome.PROCESSED
    assert effects == [envelope]


def test_an_expired_message_is_dropped_without_a_claim() -> None:
    store, effects = FakeStore(), list[Envelope]()
    envelope = _envelope(expires_at=1_500)
    assert process_exactly_once(_message(envelope), store, effects.append, 2_000) is Outcome.EXPIRED
    assert effects == [] and store.records == {}


# -- the group backlog bound --------------------------------------------------------------------

WINDOW = BacklogWindow(window_ms=100_000)


def test_a_message_is_counted_in_the_generation_of_its_enqueued_at() -> None:
    assert [WINDOW.generation(ms) for ms in (0, 99_999, 100_000, 250_000)] == [0, 0, 1, 2]
    # The item outlives the generation after its own: that one still reads its count as "previous".
    assert WINDOW.expires_at_s(3) == 500
    with pytest.raises(ValueError):
        BacklogWindow(0)
    with pytest.raises(ValueError):
        GroupBound(limit=0, window=WINDOW)


def test_counts_move_to_previous_for_one_generation_then_age_out() -> None:
    stored = GroupBacklog(generation=5, backlog=7, previous=3)  # 4 admitted in 5, 3 in 4
    assert backlog_at(stored, 5) == stored
    # In 6, what 4 admitted has left the queue; what 5 admitted may still be there.
    assert backlog_at(stored, 6) == GroupBacklog(generation=6, backlog=4, previous=4)
    assert backlog_at(stored, 7) == GroupBacklog(generation=7, backlog=0, previous=0)
    assert backlog_at(None, 7) == GroupBacklog(generation=7, backlog=0, previous=0)
    # An item a container with a faster clock already moved on is taken as it stands.
    assert backlog_at(stored, 4) == stored


def test_admission_stops_at_the_limit_counting_both_generations() -> None:
    assert plan_admission(None, 1, 2) == (True, GroupBacklog(1, 1, 0))
    assert plan_admission(GroupBacklog(1, 1, 0), 1, 2) == (True, GroupBacklog(1, 2, 0))
    assert plan_admission(GroupBacklog(1, 2, 0), 1, 2) == (False, GroupBacklog(1, 2, 0))
    # Last generation's two may still be queued: still full one generation on, admitted two on.
    assert plan_admission(GroupBacklog(1, 2, 0), 2, 2) == (False, GroupBacklog(2, 2, 2))
    assert plan_admission(GroupBacklog(1, 2, 0), 3, 2) == (True, GroupBacklog(3, 1, 0))


def test_a_release_comes_off_its_own_generation_or_nothing() -> None:
    stored = GroupBacklog(generation=5, backlog=3, previous=1)
    assert release_slot(stored, 5) is Slot.CURRENT
    assert release_slot(stored, 4) is Slot.PREVIOUS
    assert release_slot(stored, 3) is None  # aged out already
    assert release_slot(stored, 6) is None  # never counted in the item's generations
    assert release_slot(GroupBacklog(5, 1, 1), 5) is None  # nothing of generation 5 left to release
    assert release_slot(GroupBacklog(5, 2, 0), 4) is None
    assert release_slot(None, 5) is None


class FakeBacklogs:
    """In-memory counters with the adapter's semantics (the same pure rules decide)."""

    def __init__(self) -> None:
        self.items: dict[str, GroupBacklog] = {}
        self.released: list[tuple[str, int]] = []

    def admit(self, group_id: str, generation: int, limit: int, now_ms: int) -> GroupAdmission:
        admitted, counts = plan_admission(self.items.get(group_id), generation, limit)
        if admitted:
            self.items[group_id] = counts
        return GroupAdmission(admitted=admitted, backlog=counts.backlog)

    def release(self, group_id: str, generation: int, now_ms: int) -> bool:
        self.released.append((group_id, generation))
        stored = self.items.get(group_id)
        slot = release_slot(stored, generation)
        if stored is None or slot is None:
            return False
        previous = stored.previous - 1 if slot is Slot.PREVIOUS else stored.previous
        self.items[group_id] = GroupBacklog(stored.generation, stored.backlog - 1, previous)
        return True

    def release_many(self, group_id: str, generation: int, count: int, now_ms: int) -> int:
        return sum(self.release(group_id, generation, now_ms) for _ in range(count))

    def backlog(self, group_id: str) -> int:
        stored = self.items.get(group_id)
        return stored.backlog if stored else 0


@dataclass
class FakeSender:
    sent: list[Envelope] = field(default_factory=list)
    failing: bool = False

    def send(self, envelope: Envelope) -> str:
        if self.failing:
            raise UnavailableError("the message was not stored, please retry")
        self.sent.append(envelope)
        return f"m-{len(self.sent)}"


def _service(sender: FakeSender, backlogs: FakeBacklogs, limit: int = 2) -> OrderedIngestService:
    return OrderedIngestService(
        sender=sender,
        gate=None,
        clock=lambda: 1_000.0,
        limits=RequestLimits(max_payload_bytes=1024, max_ttl_seconds=3600),
        backlogs=backlogs,
        bound=GroupBound(limit=limit, window=WINDOW),
    )


def _post(service: OrderedIngestService, key: str, tenant: str = "acme") -> None:
    body = json.dumps({"type": "t", "ordering_key": key}).encode()
    service.accept(
        body, TenantContext(tenant=tenant, tier="standard", rate=10, burst=10), request_id=None, trace_id=None
    )


def test_ingest_refuses_a_full_group_naming_it_and_its_limit_and_admits_other_groups() -> None:
    sender, backlogs = FakeSender(), FakeBacklogs()
    service = _service(sender, backlogs, limit=2)
    _post(service, "A")
    _post(service, "A")
    with pytest.raises(GroupBacklogFullError) as refused:
        _post(service, "A")
    error = refused.value
    assert error.status == 429 and error.headers["Retry-After"] == "5"
    assert error.body() | {"detail": ""} == {
        "type": "https://breakwater.dev/problems/group_backlog_full",
        "title": "Group backlog full",
        "status": 429,
        "detail": "",
        "code": "group_backlog_full",
        "group": "acme:A",
        "limit": 2,
        "backlog": 2,
    }
    _post(service, "B")  # another group of the same tenant
    _post(service, "A", tenant="globex")  # the same ordering key of another tenant is another group
    assert [(e.tenant, e.ordering_key) for e in sender.sent] == [
        ("acme", "A"),
        ("acme", "A"),
        ("acme", "B"),
        ("globex", "A"),
    ]


def test_ingest_gives_the_slot_back_when_the_send_fails() -> None:
    sender, backlogs = FakeSender(failing=True), FakeBacklogs()
    service = _service(sender, backlogs, limit=1)
    for _ in range(3):  # never 429: each failed send released what it held
        with pytest.raises(UnavailableError):
            _post(service, "A")
    assert backlogs.backlog("acme:A") == 0 and len(backlogs.released) == 3


def test_ingest_without_counters_applies_no_group_bound() -> None:
    sender = FakeSender()
    service = OrderedIngestService(
        sender=sender,
        gate=None,
        clock=lambda: 1_000.0,
        limits=RequestLimits(max_payload_bytes=1024, max_ttl_seconds=3600),
    )
    for _ in range(5):
        _post(service, "A")
    assert len(sender.sent) == 5
    with pytest.raises(ValueError, match="both"):
        OrderedIngestService(
            sender=sender,
            gate=None,
            clock=lambda: 1_000.0,
            limits=RequestLimits(max_payload_bytes=1024, max_ttl_seconds=3600),
            backlogs=FakeBacklogs(),
        )


def test_the_consumer_releases_on_every_outcome_and_never_on_a_failure() -> None:
    backlogs, store = FakeBacklogs(), FakeStore()
    generation = WINDOW.generation(1_000)
    for _ in range(4):
        backlogs.admit("acme:k", generation, 10, 1_000)
    failing = {"on": True}

    def effect(_: Envelope) -> None:
        if failing["on"]:
            raise RuntimeError("downstream down")

    consumer = FifoConsumer(store, effect, backlogs=backlogs, window=WINDOW)
    first, expired = _envelope(dedup_key="d1"), _envelope(expires_at=1_500)
    with pytest.raises(RuntimeError):
        consumer.consume(_message(first), 2_000)
    assert backlogs.backlog("acme:k") == 4  # still in the queue: it still counts
    failing["on"] = False
    assert consumer.consume(_message(first, "m:2"), 2_000) is Outcome.PROCESSED
    assert consumer.consume(_message(first, "m:3"), 2_000) is Outcome.DUPLICATE  # a later copy, queued too
    assert consumer.consume(_message(expired), 2_000) is Outcome.EXPIRED
    assert backlogs.backlog("acme:k") == 4  # given back a batch at a time
    assert consumer.flush(2_000) == 3
    assert backlogs.backlog("acme:k") == 1
    assert {g for _, g in backlogs.released} == {generation}


def test_the_consumer_without_counters_releases_nothing() -> None:
    consumer = FifoConsumer(FakeStore(), lambda _: None)
    assert consumer.consume(_message(_envelope()), 2_000) is Outcome.PROCESSED
    with pytest.raises(ValueError, match="both"):
        FifoConsumer(FakeStore(), lambda _: None, backlogs=FakeBacklogs())


def test_a_redriven_message_keeps_the_exactly_once_key_it_was_first_processed_under() -> None:
    """A FIFO DLQ replaces the deduplication id, and the redrive sends another: the key is the envelope's."""
    from aws_lambda_powertools.utilities.data_classes.sqs_event import SQSRecord

    from breakwater.fifo_consumer import ordered_message

    envelope = _envelope(ordering_key="k", dedup_key="inv-1")
    record = SQSRecord(
        {
            "messageId": "m-2",
            "receiptHandle": "r",
            "body": envelope.to_json(),
            "attributes": {
                "ApproximateReceiveCount": "1",
                "MessageGroupId": "acme:k",
                "MessageDeduplicationId": "redrive-m-1",
            },
            "messageAttributes": {},
        }
    )
    assert ordered_message(record).dedup_id == "inv-1" == deduplication_id(envelope)


def test_recent_refusals_lapse_at_the_retry_after_and_stay_bounded() -> None:
    from breakwater.ordered_ingest import GROUP_FULL_RETRY_AFTER_SECONDS, RecentRefusals

    clock = {"now": 0.0}
    refusals = RecentRefusals(lambda: clock["now"], capacity=2)
    refusals.remember("tenant:acme", 7)
    assert refusals.backlog("tenant:acme") == 7 and refusals.backlog("tenant:globex") is None
    clock["now"] += GROUP_FULL_RETRY_AFTER_SECONDS
    assert refusals.backlog("tenant:acme") is None  # the client waited: ask the counter again
    for n in range(3):
        refusals.remember(f"group:{n}", n)
    assert [refusals.backlog(f"group:{n}") for n in range(3)] == [None, 1, 2]  # the oldest went first

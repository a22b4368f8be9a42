"""The ordered workload's pure policy: group and dedup ids, the FIFO release rules, the write-ahead claim."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from breakwater.envelope import Envelope, new_envelope_id
from breakwater.ordered import (
    Claim,
    GroupBusyError,
    OrderedMessage,
    Outcome,
    QueuedMessage,
    WriteAheadRecord,
    WriteAheadState,
    deduplication_id,
    fifo_queue_index,
    judge_existing,
    message_group_id,
    process_exactly_once,
    release_order,
)
from breakwater.requests import MAX_ORDERING_KEY_LENGTH, OrderedMessageRequest


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

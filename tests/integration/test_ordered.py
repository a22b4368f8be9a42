"""The ordered workload on moto: FIFO group blocking, order under retries, exactly-once beyond the window.

moto enforces FIFO group blocking (a group with a message in flight delivers nothing more) and
deduplicates a MessageDeduplicationId only against messages still in the queue, so "delete, then
send again" is how these tests stand in for a duplicate published after the 5-minute window.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import boto3
import pytest
from moto import mock_aws

from breakwater.envelope import Envelope, new_envelope_id
from breakwater.ordered import QueuedMessage, message_group_id, release_order
from tests.integration.conftest import create_table
from tests.integration.streaming_fixtures import (
    REGION,
    FakeLambdaContext,
    FifoMapping,
    api_event,
    create_fifo_queue,
    load_handler,
    send_fifo,
)

WRITE_AHEAD_TABLE = "breakwater-write-ahead"


@pytest.fixture
def aws() -> Iterator[None]:
    with mock_aws():
        yield


@pytest.fixture
def fifo(aws: None) -> tuple[str, str]:
    return create_fifo_queue("breakwater-ordered-0", max_receive_count=3)


class Effects:
    """The side effect: records (group, seq) and fails as planned (``fail[(group, seq)]`` = times left)."""

    def __init__(self) -> None:
        self.done: list[tuple[str, int]] = []
        self.fail: dict[tuple[str, int], int] = {}

    def __call__(self, envelope: Envelope) -> None:
        key = (str(envelope.ordering_key), int(envelope.payload["seq"]))
        if self.fail.get(key, 0) > 0:
            self.fail[key] -= 1
            raise RuntimeError(f"planned failure of {key}")
        self.done.append(key)

    def of(self, group: str) -> list[int]:
        return [seq for g, seq in self.done if g == group]


@pytest.fixture
def worker(aws: None, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[ModuleType, Effects]]:
    create_table(WRITE_AHEAD_TABLE)
    module = load_handler(
        monkeypatch,
        "fifo_worker.handler",
        {
            "WRITE_AHEAD_TABLE_NAME": WRITE_AHEAD_TABLE,
            "WRITE_AHEAD_LEASE_SECONDS": "90",
            "WRITE_AHEAD_RETENTION_SECONDS": str(14 * 86_400),
        },
    )
    effects = Effects()
    monkeypatch.setattr(module, "SIDE_EFFECT", effects)
    yield module, effects


def _send(queue_url: str, key: str, seq: int, dedup_key: str | None = None) -> str:
    envelope = Envelope(
        id=new_envelope_id(),
        tenant="acme",
        type="t",
        payload={"seq": seq},
        enqueued_at=1,
        ordering_key=key,
        dedup_key=dedup_key,
    )
    return send_fifo(queue_url, envelope.to_json(), message_group_id("acme", key), dedup_key or envelope.id)


def test_order_within_a_group_is_kept_under_retries(
    fifo: tuple[str, str], worker: tuple[ModuleType, Effects]
) -> None:
    module, effects = worker
    for seq in range(1, 6):
        _send(fifo[0], "A", seq)
    effects.fail[("A", 3)] = 2  # fails twice, then succeeds (maxReceiveCount is 3)
    FifoMapping(fifo[0], module.handler, batch_size=10).drain()
    assert effects.of("A") == [1, 2, 3, 4, 5]


def test_other_groups_progress_while_one_group_fails(
    fifo: tuple[str, str], worker: tuple[ModuleType, Effects]
) -> None:
    module, effects = worker
    for seq in range(1, 4):
        _send(fifo[0], "A", seq)
        _send(fifo[0], "B", seq)
    effects.fail[("A", 1)] = 99  # a poison message at the head of group A
    mapping = FifoMapping(fifo[0], module.handler, batch_size=10)
    mapping.poll_once()
    mapping.poll_once()
    # Group B finished while A's head kept failing; nothing of A got past its head.
    assert effects.of("B") == [1, 2, 3] and effects.of("A") == []
    mapping.drain()
    sqs = boto3.client("sqs", region_name=REGION)
    dead = sqs.receive_message(QueueUrl=fifo[1], MaxNumberOfMessages=10)["Messages"]
    # A2 and A3 rode in the same batches as the poison head and were returned unprocessed each time,
    # so their receive counts reached maxReceiveCount with it: the whole group went to the DLQ, in
    # order, and nothing of A was ever processed out of order (redrive it in order after the fix).
    assert [json.loads(m["Body"])["payload"]["seq"] for m in dead] == [1, 2, 3]
    assert effects.of("A") == []


def test_a_duplicate_after_the_window_is_not_processed_twice(
    fifo: tuple[str, str], worker: tuple[ModuleType, Effects]
) -> None:
    module, effects = worker
    mapping = FifoMapping(fifo[0], module.handler)
    _send(fifo[0], "A", 1, dedup_key="order-1")
    _send(fifo[0], "A", 1, dedup_key="order-1")  # inside the window, the message still queued: SQS drops it
    mapping.drain()
    assert effects.of("A") == [1] and len(mapping.invocations) == 1
    _send(
        fifo[0], "A", 1, dedup_key="order-1"
    )  # the original is deleted: moto, like SQS after 5 min, accepts it
    mapping.drain()
    assert len(mapping.invocations) == 2  # it was delivered again ...
    assert effects.of("A") == [1]  # ... and the write-ahead record kept it from a second effect


def test_a_redelivery_after_a_lost_delete_has_no_second_effect(
    fifo: tuple[str, str], worker: tuple[ModuleType, Effects]
) -> None:
    module, effects = worker
    _send(fifo[0], "A", 1)
    sqs = boto3.client("sqs", region_name=REGION)
    message = sqs.receive_message(QueueUrl=fifo[0], MessageSystemAttributeNames=["All"])["Messages"][0]
    from tests.integration.streaming_fixtures import _sqs_record

    module.handler({"Records": [_sqs_record(message, fifo[0])]}, FakeLambdaContext())
    # The delete is lost: the message becomes visible again and is delivered a second time.
    sqs.change_message_visibility(
        QueueUrl=fifo[0], ReceiptHandle=message["ReceiptHandle"], VisibilityTimeout=0
    )
    FifoMapping(fifo[0], module.handler).drain()
    assert effects.of("A") == [1]
    assert "Messages" not in sqs.receive_message(QueueUrl=fifo[0])


def _receive(queue_url: str, count: int) -> list[Any]:
    sqs = boto3.client("sqs", region_name=REGION)
    return sqs.receive_message(
        QueueUrl=queue_url, MaxNumberOfMessages=count, MessageSystemAttributeNames=["All"]
    ).get("Messages", [])


def _label(message: dict[str, Any]) -> str:
    body = json.loads(message["Body"])
    return f"{body['ordering_key']}{body['payload']['seq']}"


def test_fifo_release_rules_on_moto(fifo: tuple[str, str]) -> None:
    """What moto's ReceiveMessage does with the three release rules, next to what SQS documents.

    Rule 1 (oldest message whose group has nothing in flight) and rule 3 (then the next group) hold
    in moto. Rule 2 (as many of the same group as possible) does not: moto returns eligible messages
    in arrival order across groups, where SQS would fill the batch from the first group first.
    """
    arrivals = [("A", 1), ("B", 1), ("A", 2), ("C", 1), ("B", 2)]
    for key, seq in arrivals:
        _send(fifo[0], key, seq)
    queued = [QueuedMessage(f"{k}{s}", k) for k, s in arrivals]

    # Rule 1: A is in flight, so the oldest eligible message is B1, not A2.
    first = _receive(fifo[0], 1)
    assert [_label(m) for m in first] == ["A1"] == release_order(queued, set(), 1)
    second = _receive(fifo[0], 1)
    assert [_label(m) for m in second] == ["B1"] == release_order(queued[1:], {"A"}, 1)

    # Rule 3: with A and B in flight, the next group (C) is released; then nothing is eligible.
    rest = _receive(fifo[0], 10)
    assert [_label(m) for m in rest] == ["C1"] == release_order(queued[1:], {"A", "B"}, 10)
    assert _receive(fifo[0], 10) == []

    # Rule 2, on a fresh queue: SQS documents A1 A2 B1 B2 C1; moto answers in arrival order.
    fresh, _ = create_fifo_queue("breakwater-ordered-rules", max_receive_count=3)
    for key, seq in arrivals:
        _send(fresh, key, seq)
    batch = [_label(m) for m in _receive(fresh, 10)]
    assert release_order(queued, set(), 10) == ["A1", "A2", "B1", "B2", "C1"]
    assert batch == ["A1", "B1", "A2", "C1", "B2"]  # moto: arrival order, groups interleaved
    # Either way, within each group the order is the send order, which is what the consumer relies on.
    assert [b for b in batch if b[0] == "A"] == ["A1", "A2"] and [b for b in batch if b[0] == "B"] == [
        "B1",
        "B2",
    ]


def test_post_ordered_sends_to_the_fifo_queue_with_group_and_dedup_ids(
    fifo: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    module = load_handler(
        monkeypatch,
        "ordered_ingest.handler",
        {"FIFO_QUEUE_URLS": fifo[0], "MAX_PAYLOAD_BYTES": "1024", "MAX_TTL_SECONDS": "3600"},
    )
    body = {"type": "invoice", "payload": {"n": 1}, "ordering_key": "customer-7", "dedup_key": "inv-1"}
    response = module.handler(api_event("/v1/ordered", body), FakeLambdaContext())
    assert response["statusCode"] == 202
    message = _receive(fifo[0], 1)[0]
    assert message["Attributes"]["MessageGroupId"] == "acme:customer-7"
    assert message["Attributes"]["MessageDeduplicationId"] == "inv-1"
    assert Envelope.from_json(message["Body"]).tenant == "acme"

    missing_key = module.handler(api_event("/v1/ordered", {"type": "invoice"}), FakeLambdaContext())
    assert missing_key["statusCode"] == 400
    with_tenant = module.handler(api_event("/v1/ordered", {**body, "tenant": "evil"}), FakeLambdaContext())
    assert with_tenant["statusCode"] == 400

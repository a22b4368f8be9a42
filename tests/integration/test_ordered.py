"""The ordered workload on moto: FIFO group blocking, order under retries, exactly-once beyond the window,
and the group backlog bound (admitted at ingest, released by the worker, aged out when nobody releases).

moto enforces FIFO group blocking (a group with a message in flight delivers nothing more) and
deduplicates a MessageDeduplicationId only against messages still in the queue, so "delete, then
send again" is how these tests stand in for a duplicate published after the 5-minute window.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import boto3
import pytest
from moto import mock_aws

from breakwater.aws.front_door import build_ordered
from breakwater.aws.group_backlogs import DynamoGroupBacklogs
from breakwater.envelope import Envelope, new_envelope_id
from breakwater.errors import UnavailableError
from breakwater.ingest import TenantContext
from breakwater.ordered import (
    BacklogWindow,
    GroupAdmission,
    GroupBacklog,
    QueuedMessage,
    message_group_id,
    release_order,
)
from breakwater.ordered_ingest import GROUP_FULL_RETRY_AFTER_SECONDS, GroupBacklogFullError, RecentRefusals
from breakwater.settings import OrderedIngestSettings
from tests.integration.conftest import create_table
from tests.integration.handlers import load_handler
from tests.integration.streaming_fixtures import (
    REGION,
    FakeLambdaContext,
    FifoMapping,
    api_event,
    create_fifo_queue,
    fifo_worker_environment,
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


# -- the group backlog bound -----------------------------------------------------------------------

STATE_TABLE = "breakwater-state"
LIMIT = 3
TENANT_LIMIT = 3 * LIMIT  # these tests are about the group bound: the tenant's leaves room
WINDOW_SECONDS = 4 * 86_400 + 60  # the stack's: 4 days of retention plus a minute for the request


def _bound_environment(queue_url: str) -> dict[str, str]:
    return {
        "FIFO_QUEUE_URLS": queue_url,
        "MAX_PAYLOAD_BYTES": "1024",
        "MAX_TTL_SECONDS": "3600",
        "STATE_TABLE_NAME": STATE_TABLE,
        "MAX_GROUP_BACKLOG": str(LIMIT),
        "GROUP_BACKLOG_WINDOW_SECONDS": str(WINDOW_SECONDS),
        "MAX_TENANT_BACKLOG": str(TENANT_LIMIT),
    }


@pytest.fixture
def bounded(fifo: tuple[str, str], monkeypatch: pytest.MonkeyPatch) -> tuple[ModuleType, ModuleType, Effects]:
    """POST /v1/ordered and the FIFO worker, both on the state table's group counters."""
    create_table(STATE_TABLE, ttl_attribute="ttl")
    create_table(WRITE_AHEAD_TABLE)
    ingest = load_handler(monkeypatch, "ordered_ingest.handler", _bound_environment(fifo[0]))
    worker = load_handler(
        monkeypatch,
        "fifo_worker.handler",
        fifo_worker_environment(GROUP_BACKLOG_WINDOW_SECONDS=str(WINDOW_SECONDS)),
    )
    effects = Effects()
    monkeypatch.setattr(worker, "SIDE_EFFECT", effects)
    return ingest, worker, effects


def _post(ingest: ModuleType, key: str, seq: int, tenant: str = "acme", **extra: Any) -> dict[str, Any]:
    body = {"type": "t", "payload": {"seq": seq}, "ordering_key": key, **extra}
    response: dict[str, Any] = ingest.handler(
        api_event("/v1/ordered", body, tenant=tenant), FakeLambdaContext()
    )
    return response


def _wait_retry_after(ingest: ModuleType) -> None:
    """The client waits the Retry-After it was given: the container's memory of the refusal lapses."""
    ingest.SERVICE.refusals = RecentRefusals(lambda: time.time() + GROUP_FULL_RETRY_AFTER_SECONDS)


def _counters() -> DynamoGroupBacklogs:
    return DynamoGroupBacklogs(
        boto3.client("dynamodb", region_name=REGION), STATE_TABLE, BacklogWindow(WINDOW_SECONDS * 1000)
    )


def _backlog(group_id: str) -> int:
    stored = _counters().read(group_id)
    return stored.backlog if stored else 0


def _queued(queue_url: str) -> int:
    sqs = boto3.client("sqs", region_name=REGION)
    attributes = sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["ApproximateNumberOfMessages"])
    return int(attributes["Attributes"]["ApproximateNumberOfMessages"])


def test_a_group_past_its_bound_is_refused_while_other_groups_are_admitted(
    fifo: tuple[str, str], bounded: tuple[ModuleType, ModuleType, Effects]
) -> None:
    ingest, _, _ = bounded
    assert [_post(ingest, "A", seq)["statusCode"] for seq in range(1, LIMIT + 1)] == [202] * LIMIT
    refused = _post(ingest, "A", LIMIT + 1)
    assert refused["statusCode"] == 429
    assert refused["multiValueHeaders"]["Retry-After"] == ["5"]
    problem = json.loads(refused["body"])
    assert problem["code"] == "group_backlog_full" and problem["status"] == 429
    assert (problem["group"], problem["limit"], problem["backlog"]) == ("acme:A", LIMIT, LIMIT)
    assert "acme:A" in problem["detail"] and str(LIMIT) in problem["detail"]
    # The same tenant's other groups, and another tenant's group of the same ordering key, go on.
    assert _post(ingest, "B", 1)["statusCode"] == 202
    assert _post(ingest, "A", 1, tenant="globex")["statusCode"] == 202
    assert (_backlog("acme:A"), _backlog("acme:B"), _backlog("globex:A")) == (LIMIT, 1, 1)
    assert _queued(fifo[0]) == LIMIT + 2  # the refused message was never sent


def test_processing_releases_the_group(
    fifo: tuple[str, str], bounded: tuple[ModuleType, ModuleType, Effects]
) -> None:
    ingest, worker, effects = bounded
    for seq in range(1, LIMIT + 1):
        _post(ingest, "A", seq)
    assert _post(ingest, "A", LIMIT + 1)["statusCode"] == 429
    FifoMapping(fifo[0], worker.handler).drain()
    assert effects.of("A") == [1, 2, 3] and _backlog("acme:A") == 0
    _wait_retry_after(ingest)
    assert [_post(ingest, "A", seq)["statusCode"] for seq in range(4, 4 + LIMIT)] == [202] * LIMIT


def test_a_duplicate_published_again_releases_its_slot_too(
    fifo: tuple[str, str], bounded: tuple[ModuleType, ModuleType, Effects]
) -> None:
    ingest, worker, effects = bounded
    mapping = FifoMapping(fifo[0], worker.handler)
    assert _post(ingest, "A", 1, dedup_key="order-1")["statusCode"] == 202
    mapping.drain()
    # Published again after SQS's window (moto: once the original is deleted): admitted and queued,
    # so it counts; the write-ahead record makes it a duplicate, and that outcome releases it.
    assert _post(ingest, "A", 1, dedup_key="order-1")["statusCode"] == 202
    assert _backlog("acme:A") == 1
    mapping.drain()
    assert effects.of("A") == [1] and _backlog("acme:A") == 0


def test_a_failed_send_releases_its_slot(aws: None, monkeypatch: pytest.MonkeyPatch) -> None:
    create_table(STATE_TABLE, ttl_attribute="ttl")
    gone, _ = create_fifo_queue("breakwater-ordered-gone")
    ingest = load_handler(monkeypatch, "ordered_ingest.handler", _bound_environment(gone))
    boto3.client("sqs", region_name=REGION).delete_queue(QueueUrl=gone)
    # Each send fails (503, retry) and gives back the slot it held: never a 429 from messages never stored.
    assert [_post(ingest, "A", seq)["statusCode"] for seq in range(LIMIT + 2)] == [503] * (LIMIT + 2)
    assert _backlog("acme:A") == 0


def test_a_count_nobody_releases_ages_out_two_windows_later(
    fifo: tuple[str, str], bounded: tuple[ModuleType, ModuleType, Effects]
) -> None:
    """Messages that go to the DLQ are never released; their count stops mattering once they cannot
    be in the queue any more (one window after their generation ended)."""
    _, worker, effects = bounded
    now = {"s": time.time()}
    service = build_ordered(
        OrderedIngestSettings.from_env(_bound_environment(fifo[0])), clock=lambda: now["s"]
    )
    tenant = TenantContext(tenant="acme", tier="standard", rate=100, burst=100)

    def post(seq: int) -> None:
        body = json.dumps({"type": "t", "payload": {"seq": seq}, "ordering_key": "A"}).encode()
        service.accept(body, tenant, request_id=None, trace_id=None)

    for seq in range(1, LIMIT + 1):
        post(seq)
    effects.fail[("A", 1)] = 99  # a poison head: the whole run of A goes to the DLQ, unreleased
    FifoMapping(fifo[0], worker.handler).drain()
    assert effects.of("A") == [] and _backlog("acme:A") == LIMIT
    with pytest.raises(GroupBacklogFullError):
        post(LIMIT + 1)
    now["s"] += WINDOW_SECONDS  # next generation: those messages could still be in the queue
    with pytest.raises(GroupBacklogFullError):
        post(LIMIT + 1)
    now["s"] += WINDOW_SECONDS  # two on: none of them can be, counted or not
    post(LIMIT + 1)
    assert _backlog("acme:A") == 1


def test_counters_roll_over_generations_and_releases_come_off_their_own(aws: None) -> None:
    create_table(STATE_TABLE, ttl_attribute="ttl")
    counters = _counters()
    assert counters.admit("acme:A", 10, 3, 1).admitted
    assert counters.admit("acme:A", 10, 3, 2).admitted
    # The first admission of generation 11 moves generation 10's count to "previous".
    assert counters.admit("acme:A", 11, 3, 3) == GroupAdmission(admitted=True, backlog=3)
    assert counters.read("acme:A") == GroupBacklog(generation=11, backlog=3, previous=2)
    assert not counters.admit("acme:A", 11, 3, 4).admitted
    assert counters.release("acme:A", 10, 5)  # a message of generation 10 comes off "previous"
    assert counters.read("acme:A") == GroupBacklog(generation=11, backlog=2, previous=1)
    assert counters.release("acme:A", 11, 6)
    assert not counters.release("acme:A", 11, 7)  # nothing of generation 11 is left to release
    assert not counters.release("acme:A", 9, 8)  # aged out
    assert not counters.release("acme:B", 11, 9)  # never admitted: no item is created
    assert counters.read("acme:A") == GroupBacklog(generation=11, backlog=1, previous=1)
    assert counters.read("acme:B") is None
    item = boto3.client("dynamodb", region_name=REGION).get_item(
        TableName=STATE_TABLE, Key={"pk": {"S": "group#acme:A"}, "sk": {"S": "backlog"}}
    )["Item"]
    assert int(item["ttl"]["N"]) == BacklogWindow(WINDOW_SECONDS * 1000).expires_at_s(11)


def test_admission_fails_closed_and_a_release_never_fails_the_record(aws: None) -> None:
    """No state table: the message is not admitted uncounted (503, retry), and a release that cannot be
    written leaves the count to age out rather than failing its record (which would stop its group)."""
    counters = _counters()
    with pytest.raises(UnavailableError):
        counters.admit("acme:A", 11, 3, 1)
    assert counters.release("acme:A", 11, 2) is False

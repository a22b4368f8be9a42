"""Failing processor -> retries -> DLQ -> redrive back after the fix; the fallback never duplicates.

The ordered workload's FIFO DLQs too: a redriven message keeps its group, and its new deduplication
id is stable across retries of one redrive, so the FIFO worker still processes it exactly once.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest

from breakwater import processor
from breakwater.aws.redrive import (
    REDRIVEN_ATTRIBUTE,
    MoveTaskRefusedError,
    RedriveMarkers,
    move_by_hand,
    redrive,
    redrive_deduplication_id,
)
from breakwater.envelope import Envelope, new_envelope_id
from breakwater.ordered import message_group_id
from tests.integration import worker_fixtures
from tests.integration.conftest import create_table
from tests.integration.streaming_fixtures import FifoMapping, create_fifo_queue, send_fifo
from tests.integration.worker_fixtures import STATE_TABLE, WorkerWorld, load, make_envelope

world = worker_fixtures.world  # the fixture


def test_failing_message_goes_to_the_dlq_and_is_redriven_after_the_fix(
    world: WorkerWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    broken = {"on": True}

    def sometimes_broken(envelope: Any, work: Any) -> dict[str, Any]:
        if broken["on"]:
            raise RuntimeError("bug")
        return {}

    monkeypatch.setattr(processor, "process", sometimes_broken)
    envelope = make_envelope("acme")
    world.send("live-0", envelope)
    worker = load(monkeypatch, "worker.handler", world.environment())

    for _ in range(2):  # maxReceiveCount = 2
        response, received = world.deliver(worker, "live-0", requeue_failures=True)
        assert len(received) == 1 and len(response["batchItemFailures"]) == 1
    _, received = world.deliver(worker, "live-0")  # the third receive dead-letters it
    assert received == []
    assert world.depth("live-0", dlq=True)["Visible"] == 1

    broken["on"] = False
    pairs = json.dumps({world.dlqs["live-0"]: world.urls["live-0"]})
    redrive = load(monkeypatch, "redrive.handler", {"REDRIVE_PAIRS": pairs, "STATE_TABLE_NAME": STATE_TABLE})
    result = redrive.handler({}, worker_fixtures.FakeLambdaContext())

    assert [(r["moved"], r["failed"]) for r in result["results"]] == [(1, 0)]
    assert world.depth("live-0", dlq=True)["Visible"] == 0
    # The failed receives reported the live age; the redriven message must not report any.
    world.dynamodb.delete_item(TableName=STATE_TABLE, Key={"pk": {"S": "queue#live"}, "sk": {"S": "health"}})
    response, received = world.deliver(worker, "live-0")
    assert [m["Body"] for m in received] == [envelope.to_json()]
    assert response == {"batchItemFailures": []}
    worker.worker.flush_kept_counters(force=True)  # as at shutdown: what a lapsed lease's batch kept
    counters = world.item("tenant#acme", "counters")
    assert (counters["processed"], counters["redriven"]) == (1, 1)  # back in the estimate, as redriven
    assert world.item("queue#live", "health") == {}  # and kept out of the live health


def test_a_move_task_is_refused_before_anything_moves(
    world: WorkerWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A move task's messages arrive unmarked (a new id, a receive count of 1, no attribute SQS sets
    on them): the workers would count them as live work. Every redrive moves by hand instead."""
    dlq, source = world.dlqs["live-0"], world.urls["live-0"]
    world.sqs.send_message(QueueUrl=dlq, MessageBody=make_envelope("acme").to_json())

    with pytest.raises(MoveTaskRefusedError, match="use_move_task"):
        redrive(world.sqs, dlq, source, use_move_task=True)
    pairs = json.dumps({dlq: source})
    handler = load(monkeypatch, "redrive.handler", {"REDRIVE_PAIRS": pairs, "STATE_TABLE_NAME": STATE_TABLE})
    with pytest.raises(MoveTaskRefusedError):
        handler.handler({"use_move_task": True}, worker_fixtures.FakeLambdaContext())
    assert world.depth("live-0", dlq=True)["Visible"] == 1 and world.bodies("live-0") == []

    result = redrive(world.sqs, dlq, source)  # the default: by hand, marked

    assert (result.moved, result.unmarked) == (1, 0)
    assert [set(attributes) for attributes in _attributes(world, source)] == [{REDRIVEN_ATTRIBUTE}]


class DeleteFailsOnce:
    """The SQS client, except that the first DeleteMessageBatch is lost (as if the process died)."""

    def __init__(self, sqs: Any) -> None:
        self._sqs = sqs
        self.failed = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sqs, name)

    def delete_message_batch(self, **kwargs: Any) -> Any:
        if not self.failed:
            self.failed = True
            raise ConnectionError("lost")
        return self._sqs.delete_message_batch(**kwargs)


def test_a_lost_delete_does_not_send_the_message_twice(world: WorkerWorld) -> None:
    dlq, source = world.dlqs["live-0"], world.urls["live-0"]
    envelope = make_envelope("acme")
    world.sqs.send_message(QueueUrl=dlq, MessageBody=envelope.to_json())
    markers = RedriveMarkers(world.dynamodb, STATE_TABLE, dlq)
    flaky = DeleteFailsOnce(world.sqs)

    with pytest.raises(ConnectionError):
        move_by_hand(flaky, dlq, source, markers=markers, visibility_timeout=0)
    result = move_by_hand(flaky, dlq, source, markers=markers)

    assert (result.moved, result.already_moved) == (0, 1)
    assert world.depth("live-0", dlq=True)["Visible"] == 0
    assert [e.id for e in world.bodies("live-0")] == [envelope.id]


REDRIVE_TIME = 1_700_000_000.0


def _attributes(world: WorkerWorld, queue_url: str) -> list[dict[str, Any]]:
    messages = world.sqs.receive_message(
        QueueUrl=queue_url, MaxNumberOfMessages=10, MessageAttributeNames=["All"]
    ).get("Messages", [])
    return [message.get("MessageAttributes", {}) for message in messages]


def _string(value: str) -> dict[str, str]:
    return {"DataType": "String", "StringValue": value}


def test_a_message_moved_by_hand_is_marked_redriven_and_keeps_its_attributes(world: WorkerWorld) -> None:
    dlq, source = world.dlqs["live-0"], world.urls["live-0"]
    world.sqs.send_message(
        QueueUrl=dlq, MessageBody=make_envelope("acme").to_json(), MessageAttributes={"origin": _string("x")}
    )

    result = move_by_hand(world.sqs, dlq, source, clock=lambda: REDRIVE_TIME)

    assert (result.moved, result.unmarked) == (1, 0)
    assert _attributes(world, source) == [
        {
            "origin": _string("x"),
            REDRIVEN_ATTRIBUTE: {"DataType": "Number", "StringValue": str(int(REDRIVE_TIME * 1000))},
        }
    ]


def test_a_second_redrive_marks_the_message_with_its_own_time(world: WorkerWorld) -> None:
    dlq, source = world.dlqs["live-0"], world.urls["live-0"]
    earlier = {REDRIVEN_ATTRIBUTE: {"DataType": "Number", "StringValue": "1"}}
    body = make_envelope("acme").to_json()
    world.sqs.send_message(QueueUrl=dlq, MessageBody=body, MessageAttributes=earlier)

    move_by_hand(world.sqs, dlq, source, clock=lambda: REDRIVE_TIME)

    ((mark,),) = [list(attributes.values()) for attributes in _attributes(world, source)]
    assert mark["StringValue"] == str(int(REDRIVE_TIME * 1000))


def test_a_message_with_the_most_attributes_sqs_allows_is_moved_unmarked(world: WorkerWorld) -> None:
    dlq, source = world.dlqs["live-0"], world.urls["live-0"]
    full = {f"a{i}": _string(str(i)) for i in range(10)}
    world.sqs.send_message(QueueUrl=dlq, MessageBody=make_envelope("acme").to_json(), MessageAttributes=full)

    result = move_by_hand(world.sqs, dlq, source)

    assert (result.moved, result.failed, result.unmarked) == (1, 0, 1)
    assert _attributes(world, source) == [full]


def _bin_redrive() -> Any:
    path = Path(__file__).resolve().parents[2] / "bin" / "redrive"
    loader = importlib.machinery.SourceFileLoader("bin_redrive", str(path))
    spec = importlib.util.spec_from_loader("bin_redrive", loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def test_bin_redrive_moves_one_pair_from_this_machine(
    world: WorkerWorld, capsys: pytest.CaptureFixture[str]
) -> None:
    dlq, source = world.dlqs["live-0"], world.urls["live-0"]
    envelope = make_envelope("acme")
    world.sqs.send_message(QueueUrl=dlq, MessageBody=envelope.to_json())

    code = _bin_redrive().main(["--dlq-url", dlq, "--source-url", source, "--state-table", STATE_TABLE])

    assert code == 0
    assert json.loads(capsys.readouterr().out)["moved"] == 1
    assert [e.id for e in world.bodies("live-0")] == [envelope.id]


# -- FIFO DLQs (the ordered workload) ------------------------------------------------------------

WRITE_AHEAD_TABLE = "bw-write-ahead"
GROUP = message_group_id("acme", "A")


class OrderedEffects:
    """The FIFO worker's side effect: records each ``seq`` of group A; raises while the bug is in."""

    def __init__(self) -> None:
        self.broken = False
        self.done: list[int] = []

    def __call__(self, envelope: Envelope) -> None:
        if self.broken:
            raise RuntimeError("bug")
        self.done.append(int(envelope.payload["seq"]))


def _fifo_worker(monkeypatch: pytest.MonkeyPatch) -> tuple[Any, OrderedEffects]:
    create_table(WRITE_AHEAD_TABLE)
    environment = {
        "WRITE_AHEAD_TABLE_NAME": WRITE_AHEAD_TABLE,
        "WRITE_AHEAD_LEASE_SECONDS": "90",
        "WRITE_AHEAD_RETENTION_SECONDS": str(14 * 86_400),
    }
    module = load(monkeypatch, "fifo_worker.handler", environment)
    effects = OrderedEffects()
    monkeypatch.setattr(module, "SIDE_EFFECT", effects)
    return module, effects


def _ordered(seq: int) -> Envelope:
    return Envelope(
        id=new_envelope_id(), tenant="acme", type="t", payload={"seq": seq}, enqueued_at=1, ordering_key="A"
    )


def _peek(world: WorkerWorld, queue_url: str) -> list[Any]:
    """The queue's messages with their attributes, made visible again at once.

    (Not a receive with ``VisibilityTimeout=0``: moto then releases a FIFO group's messages out of order.)
    """
    messages = world.sqs.receive_message(
        QueueUrl=queue_url,
        MaxNumberOfMessages=10,
        MessageSystemAttributeNames=["All"],
        MessageAttributeNames=["All"],
    ).get("Messages", [])
    for message in messages:
        world.sqs.change_message_visibility(
            QueueUrl=queue_url, ReceiptHandle=message["ReceiptHandle"], VisibilityTimeout=0
        )
    return messages


def test_an_ordered_group_dead_lettered_by_a_bug_is_redriven_with_its_group_and_processed_once_in_order(
    world: WorkerWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    source, dlq = create_fifo_queue("bw-ordered-0", max_receive_count=2)
    worker, effects = _fifo_worker(monkeypatch)
    envelopes = [_ordered(seq) for seq in (1, 2, 3)]
    for envelope in envelopes:
        send_fifo(source, envelope.to_json(), GROUP, envelope.id)
    effects.broken = True
    FifoMapping(source, worker.handler).drain()
    dead = _peek(world, dlq)
    assert len(dead) == 3 and effects.done == []

    effects.broken = False
    pairs = json.dumps({dlq: source})
    redrive = load(monkeypatch, "redrive.handler", {"REDRIVE_PAIRS": pairs, "STATE_TABLE_NAME": STATE_TABLE})
    result = redrive.handler({}, worker_fixtures.FakeLambdaContext())

    assert [(r["moved"], r["failed"]) for r in result["results"]] == [(3, 0)]
    assert _peek(world, dlq) == []
    redriven = _peek(world, source)
    assert [m["Body"] for m in redriven] == [e.to_json() for e in envelopes]
    assert {m["Attributes"]["MessageGroupId"] for m in redriven} == {GROUP}
    dedup_ids = [m["Attributes"]["MessageDeduplicationId"] for m in redriven]
    assert dedup_ids == [redrive_deduplication_id(m["MessageId"]) for m in dead]
    assert not set(dedup_ids) & {e.id for e in envelopes}  # never the original's: SQS would drop it
    assert all(REDRIVEN_ATTRIBUTE in m["MessageAttributes"] for m in redriven)
    FifoMapping(source, worker.handler).drain()
    assert effects.done == [1, 2, 3]


def test_a_repeated_fifo_redrive_sends_the_same_deduplication_id_and_has_no_second_effect(
    world: WorkerWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    source, dlq = create_fifo_queue("bw-ordered-1", max_receive_count=2)
    worker, effects = _fifo_worker(monkeypatch)
    envelope = _ordered(1)
    send_fifo(dlq, envelope.to_json(), GROUP, envelope.id)  # as dead-lettered, never processed
    (dead,) = _peek(world, dlq)
    flaky = DeleteFailsOnce(world.sqs)

    # No markers: only the deduplication id protects the retry.
    with pytest.raises(ConnectionError):
        move_by_hand(flaky, dlq, source, visibility_timeout=0)
    result = move_by_hand(flaky, dlq, source)

    assert result.moved == 1  # sent again ...
    (queued,) = _peek(world, source)  # ... and SQS dropped the copy: same id inside the window
    assert queued["Attributes"]["MessageDeduplicationId"] == redrive_deduplication_id(dead["MessageId"])
    mapping = FifoMapping(source, worker.handler)
    mapping.drain()
    assert effects.done == [1]
    # Past the window SQS would deliver the repeat; the write-ahead record of its id stops a second effect.
    send_fifo(source, envelope.to_json(), GROUP, redrive_deduplication_id(dead["MessageId"]))
    mapping.drain()
    assert len(mapping.invocations) == 2 and effects.done == [1]

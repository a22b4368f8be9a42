"""The archiver handler against moto: sideline queue -> S3 objects, deleted from the queue only after."""

from __future__ import annotations

import json
from typing import Any

import boto3
import pytest

from breakwater.archive import decode_ndjson_gz
from breakwater.envelope import Envelope, new_envelope_id
from tests.integration.conftest import create_state_table
from tests.integration.worker_fixtures import FakeLambdaContext, load

BUCKET = "breakwater-archive"
T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z


@pytest.fixture
def world(aws: None, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    sqs, s3 = boto3.client("sqs"), boto3.client("s3")
    s3.create_bucket(Bucket=BUCKET)
    backlog = sqs.create_queue(QueueName="backlog", Attributes={"VisibilityTimeout": "60"})["QueueUrl"]
    spillover = sqs.create_queue(QueueName="spillover")["QueueUrl"]
    state_table = create_state_table()
    monkeypatch.setenv("STATE_TABLE_NAME", state_table)
    handler = load(
        monkeypatch,
        "archiver.handler",
        {
            "ARCHIVE_BUCKET_NAME": BUCKET,
            "ARCHIVE_PREFIX": "archive/",
            "SOURCE_QUEUE_URLS": f"{backlog},{spillover}",
            "MAX_MESSAGES_PER_OBJECT": "25",
        },
    )
    return {
        "sqs": sqs,
        "s3": s3,
        "backlog": backlog,
        "spillover": spillover,
        "handler": handler,
        "state_table": state_table,
    }


def _counters(state_table: str, tenant: str) -> dict[str, Any]:
    item = (
        boto3.client("dynamodb")
        .get_item(TableName=state_table, Key={"pk": {"S": f"tenant#{tenant}"}, "sk": {"S": "counters"}})
        .get("Item", {})
    )
    return {name: int(value["N"]) for name, value in item.items() if "N" in value}


def _send(sqs: Any, url: str, envelopes: list[Envelope]) -> None:
    for start in range(0, len(envelopes), 10):
        chunk = envelopes[start : start + 10]
        sqs.send_message_batch(
            QueueUrl=url, Entries=[{"Id": str(i), "MessageBody": e.to_json()} for i, e in enumerate(chunk)]
        )


def _archived(s3: Any) -> dict[str, list[str]]:
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET).get("Contents", [])]
    return {key: decode_ndjson_gz(s3.get_object(Bucket=BUCKET, Key=key)["Body"].read()) for key in keys}


def _depth(sqs: Any, url: str) -> int:
    attributes = sqs.get_queue_attributes(
        QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"]
    )["Attributes"]
    return int(attributes["ApproximateNumberOfMessages"]) + int(
        attributes["ApproximateNumberOfMessagesNotVisible"]
    )


def test_messages_move_into_partitioned_ndjson_objects(world: dict[str, Any]) -> None:
    sent = [
        Envelope(id=new_envelope_id(T0 + i), tenant="acme", type="t", enqueued_at=T0 + i) for i in range(30)
    ]
    sent += [
        Envelope(id=new_envelope_id(T0 + 3_600_000), tenant="zeta", type="t", enqueued_at=T0 + 3_600_000)
    ]
    _send(world["sqs"], world["backlog"], sent)

    result = world["handler"].handler({"queue_url": world["backlog"]}, FakeLambdaContext())

    objects = _archived(world["s3"])
    assert {key.rsplit("/", 1)[0] for key in objects} == {
        "archive/tenant=acme/dt=2026-01-01/hour=00",
        "archive/tenant=zeta/dt=2026-01-01/hour=01",
    }
    assert all(key.endswith(".ndjson.gz") for key in objects)
    lines = [line for body in objects.values() for line in body]
    assert sorted(Envelope.from_json(line).id for line in lines) == sorted(e.id for e in sent)
    assert _depth(world["sqs"], world["backlog"]) == 0
    (summary,) = result["results"]
    assert (summary["received"], summary["archived"], summary["deleted"]) == (31, 31, 31)


def test_nothing_is_deleted_when_the_object_cannot_be_written(world: dict[str, Any]) -> None:
    _send(
        world["sqs"],
        world["backlog"],
        [Envelope(id=new_envelope_id(T0), tenant="a", type="t", enqueued_at=T0)],
    )
    world["s3"].delete_bucket(Bucket=BUCKET)  # every write now fails

    result = world["handler"].handler({"queue_url": world["backlog"]}, FakeLambdaContext())

    (summary,) = result["results"]
    assert (summary["received"], summary["deleted"], summary["failed_objects"]) == (1, 0, 1)
    assert _depth(world["sqs"], world["backlog"]) == 1  # still queued: archived later, never lost


def test_delete_happens_only_after_the_write(world: dict[str, Any]) -> None:
    _send(
        world["sqs"],
        world["backlog"],
        [Envelope(id=new_envelope_id(T0), tenant="a", type="t", enqueued_at=T0)],
    )
    calls: list[str] = []
    archiver = world["handler"].archiver
    real_put, real_delete = archiver.s3.put_object, archiver.sqs.delete_message_batch

    def put(**kwargs: Any) -> Any:
        calls.append("put")
        return real_put(**kwargs)

    def delete(**kwargs: Any) -> Any:
        assert "put" in calls, "deleted before the object was written"
        calls.append("delete")
        return real_delete(**kwargs)

    archiver.s3 = type("S3", (), {"put_object": staticmethod(put)})()
    sqs_proxy = type("SQS", (), {"__getattr__": lambda _self, name: getattr(world["sqs"], name)})()
    sqs_proxy.delete_message_batch = delete
    archiver.sqs = sqs_proxy
    world["handler"].handler({}, FakeLambdaContext())
    assert calls == ["put", "delete"]


def test_unparseable_bodies_are_archived_and_the_budget_and_queue_are_respected(
    world: dict[str, Any],
) -> None:
    world["sqs"].send_message(QueueUrl=world["spillover"], MessageBody="{not an envelope")
    for i in range(5):
        world["sqs"].send_message(
            QueueUrl=world["spillover"],
            MessageBody=Envelope(
                id=new_envelope_id(T0 + i), tenant="a", type="t", enqueued_at=T0 + i
            ).to_json(),
        )

    world["handler"].handler({"max_messages": 100}, FakeLambdaContext())

    objects = _archived(world["s3"])
    assert any(
        "tenant=_unparseable/" in key and body == ["{not an envelope"] for key, body in objects.items()
    )
    assert sum(len(body) for body in objects.values()) == 6
    with pytest.raises(ValueError, match="not one of"):
        world["handler"].handler({"queue_url": "https://elsewhere"}, FakeLambdaContext())


def test_stops_before_the_lambda_timeout(world: dict[str, Any]) -> None:
    _send(
        world["sqs"],
        world["backlog"],
        [Envelope(id=new_envelope_id(T0), tenant="a", type="t", enqueued_at=T0)],
    )
    context = FakeLambdaContext()
    context.remaining_ms = 5_000  # below the 10 s safety margin
    result = world["handler"].handler({}, context)
    assert json.loads(json.dumps(result))["results"][0]["received"] == 0


def test_delayed_messages_are_waited_for_and_archived(
    world: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A drainer's deferrals sit in the sideline queue delayed: part of the backlog to park.
    handler = load(
        monkeypatch,
        "archiver.handler",
        {
            "ARCHIVE_BUCKET_NAME": BUCKET,
            "ARCHIVE_PREFIX": "archive/",
            "SOURCE_QUEUE_URLS": world["backlog"],
            "WAIT_FOR_DELAYED_SECONDS": "5",
        },
    )
    now = T0
    envelopes = [
        Envelope(id=new_envelope_id(now + i), tenant="acme", type="t", enqueued_at=now + i) for i in range(4)
    ]
    world["sqs"].send_message_batch(
        QueueUrl=world["backlog"],
        Entries=[
            {"Id": str(i), "MessageBody": e.to_json(), "DelaySeconds": 2 if i % 2 else 0}
            for i, e in enumerate(envelopes)
        ],
    )
    result = handler.handler({"queue_url": world["backlog"]}, FakeLambdaContext())
    (summary,) = result["results"]
    assert summary["archived"] == summary["deleted"] == 4
    lines = [line for body in _archived(world["s3"]).values() for line in body]
    assert sorted(Envelope.from_json(line).id for line in lines) == sorted(e.id for e in envelopes)


def test_without_a_wait_delayed_messages_stay_for_the_next_run(world: dict[str, Any]) -> None:
    envelope = Envelope(id=new_envelope_id(T0), tenant="acme", type="t", enqueued_at=T0)
    world["sqs"].send_message(QueueUrl=world["backlog"], MessageBody=envelope.to_json(), DelaySeconds=60)
    result = world["handler"].handler({"queue_url": world["backlog"]}, FakeLambdaContext())
    assert result["results"][0]["archived"] == 0
    attributes = world["sqs"].get_queue_attributes(
        QueueUrl=world["backlog"], AttributeNames=["ApproximateNumberOfMessagesDelayed"]
    )["Attributes"]
    assert attributes["ApproximateNumberOfMessagesDelayed"] == "1"


def test_archived_envelopes_leave_their_tenants_backlog_estimates(world: dict[str, Any]) -> None:
    # First archives count ``archived`` per tenant; one a replay brought back was counted already
    # (the worker gives it back as ``replayed`` when it finishes), and a body without a tenant cannot be.
    envelopes = [
        Envelope(id=new_envelope_id(T0 + i), tenant="acme", type="t", enqueued_at=T0) for i in range(3)
    ]
    envelopes.append(Envelope(id=new_envelope_id(T0), tenant="zeta", type="t", enqueued_at=T0))
    envelopes.append(
        Envelope(id=new_envelope_id(T0), tenant="acme", type="t", enqueued_at=T0, replay_run="r1")
    )
    _send(world["sqs"], world["backlog"], envelopes)
    world["sqs"].send_message(QueueUrl=world["backlog"], MessageBody="not an envelope")

    result = world["handler"].handler({"queue_url": world["backlog"]}, FakeLambdaContext())

    assert result["results"][0]["archived"] == 6
    assert result["results"][0]["counted"] == {"acme": 3, "zeta": 1}
    # Only ``archived`` is asserted: the counters item also carries the controller's bookkeeping.
    assert _counters(world["state_table"], "acme")["archived"] == 3
    assert _counters(world["state_table"], "zeta")["archived"] == 1


def test_each_batch_is_counted_as_it_is_archived_so_a_run_that_dies_keeps_its_counts(
    world: dict[str, Any],
) -> None:
    envelopes = [
        Envelope(id=new_envelope_id(T0 + i), tenant="acme", type="t", enqueued_at=T0) for i in range(60)
    ]
    _send(world["sqs"], world["backlog"], envelopes)
    batches = iter(range(2))  # the invocation is killed before its third batch (25 messages each)

    def until_killed() -> bool:
        if next(batches, None) is None:
            raise TimeoutError("Task timed out")
        return True

    with pytest.raises(TimeoutError):
        world["handler"].archiver.archive(world["backlog"], max_messages=100, keep_going=until_killed)

    assert _counters(world["state_table"], "acme")["archived"] == 50

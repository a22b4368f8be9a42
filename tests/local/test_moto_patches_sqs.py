"""SQS patches keep moto's answers: one scripted session gives the same results patched or not; the
counts of one GetQueueAttributes are taken at one instant; no inline delivery to Lambda."""

from __future__ import annotations

import json
import time
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError
from moto import mock_aws

from local.emulator import moto_patches
from local.emulator.moto_patches import sqs as sqs_patches
from tests.local.helpers import patch_names, queue_counts

VOLATILE = {"CreatedTimestamp", "LastModifiedTimestamp", "QueueArn", "Policy", "RedrivePolicy"}
SQS_PATCHES = patch_names("sqs")


def session() -> dict[str, Any]:
    """Sends, receives, deletes, visibility expiry, delays, a DLQ and FIFO dedup; what was observed."""
    seen: dict[str, Any] = {}
    with mock_aws():
        sqs = boto3.client("sqs", region_name="us-east-1")
        dlq = sqs.create_queue(QueueName="q-dlq")["QueueUrl"]
        dlq_attrs = sqs.get_queue_attributes(QueueUrl=dlq, AttributeNames=["QueueArn"])["Attributes"]
        dlq_arn = dlq_attrs["QueueArn"]
        url = sqs.create_queue(
            QueueName="q",
            Attributes={
                "VisibilityTimeout": "1",
                "RedrivePolicy": json.dumps({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": 2}),
                "KmsMasterKeyId": "alias/aws/sqs",
            },
        )["QueueUrl"]
        fifo = sqs.create_queue(
            QueueName="f.fifo", Attributes={"FifoQueue": "true", "ContentBasedDeduplication": "true"}
        )["QueueUrl"]

        for n in range(4):
            sqs.send_message(QueueUrl=url, MessageBody=f"m{n}")
        sqs.send_message(QueueUrl=url, MessageBody="late", DelaySeconds=1)
        seen["after_send"] = queue_counts(sqs, url)

        got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=3)["Messages"]
        seen["received"] = sorted(m["Body"] for m in got)
        seen["after_receive"] = queue_counts(sqs, url)
        sqs.delete_message(QueueUrl=url, ReceiptHandle=got[0]["ReceiptHandle"])
        sqs.delete_message(QueueUrl=url, ReceiptHandle=got[0]["ReceiptHandle"])  # again: still succeeds
        seen["after_delete"] = queue_counts(sqs, url)
        try:
            sqs.delete_message(QueueUrl=url, ReceiptHandle="not-a-handle")
            seen["bad_handle"] = "accepted"
        except ClientError as exc:
            seen["bad_handle"] = exc.response["Error"]["Code"]

        time.sleep(1.2)  # the two undeleted receipts time out and the delayed message arrives
        seen["after_expiry"] = queue_counts(sqs, url)
        again = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10)["Messages"]
        seen["redelivered"] = sorted(m["Body"] for m in again)
        stale = next(m for m in got[1:] if m["Body"] in seen["redelivered"])["ReceiptHandle"]
        sqs.delete_message(QueueUrl=url, ReceiptHandle=stale)  # an earlier handle of a redelivered message
        seen["after_stale_delete"] = queue_counts(sqs, url)

        time.sleep(1.2)
        third = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10).get("Messages", [])
        # The other twice-received message went to the DLQ (maxReceiveCount 2); the others come back.
        seen["third_receive"] = sorted(m["Body"] for m in third)
        seen["dlq"] = queue_counts(sqs, dlq)
        stale_body = next(m["Body"] for m in got if m["ReceiptHandle"] == stale)
        moved = next(m for m in again if m["Body"] in {g["Body"] for g in got[1:]} - {stale_body})
        try:
            sqs.delete_message(QueueUrl=url, ReceiptHandle=moved["ReceiptHandle"])
            seen["moved_delete"] = "accepted"
        except ClientError as exc:
            seen["moved_delete"] = exc.response["Error"]["Code"]
        seen["after_dlq"] = queue_counts(sqs, url)

        sqs.send_message(QueueUrl=fifo, MessageBody="same", MessageGroupId="g")
        sqs.send_message(QueueUrl=fifo, MessageBody="same", MessageGroupId="g")
        seen["fifo_dedup"] = queue_counts(sqs, fifo)

        attrs = {}
        for name, queue_url in (("q", url), ("dlq", dlq), ("fifo", fifo)):
            every = sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["All"])["Attributes"]
            attrs[name] = {k: v for k, v in every.items() if k not in VOLATILE}
            attrs[name]["keys"] = sorted(every)
        seen["attributes"] = attrs
        redrive = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["RedrivePolicy"])["Attributes"]
        seen["redrive"] = json.loads(redrive["RedrivePolicy"])["maxReceiveCount"]
    return seen


@pytest.mark.slow
def test_patched_session_matches_unpatched() -> None:
    with moto_patches.removed(names=SQS_PATCHES):
        unpatched = session()
    with moto_patches.installed(names=SQS_PATCHES):
        patched = session()
    assert patched == unpatched
    # And the answers are the right ones, not merely the same ones.
    assert patched["after_send"] == (4, 1, 0)
    assert patched["after_receive"] == (1, 1, 3)
    assert patched["after_delete"] == (1, 1, 2)
    assert patched["bad_handle"] == "ReceiptHandleIsInvalid"
    assert patched["after_expiry"] == (4, 0, 0)
    assert len(patched["redelivered"]) == 4
    assert patched["after_stale_delete"] == (0, 0, 3)
    assert patched["third_receive"] == ["late", "m3"]
    assert patched["dlq"] == (1, 0, 0)
    assert patched["moved_delete"] == "ReceiptHandleIsInvalid"
    assert patched["after_dlq"] == (0, 0, 2)
    assert patched["fifo_dedup"] == (1, 0, 0)
    assert patched["redrive"] == 2
    assert "KmsMasterKeyId" in patched["attributes"]["q"]["keys"]
    assert patched["attributes"]["fifo"]["ContentBasedDeduplication"] == "true"


def test_attributes_are_a_mapping_with_mottos_keys() -> None:
    with moto_patches.installed(names={"sqs.lazy_attributes"}), mock_aws():
        sqs = boto3.client("sqs", region_name="us-east-1")
        sqs.create_queue(QueueName="plain")
        from moto.sqs.models import sqs_backends

        queue = sqs_backends["123456789012"]["us-east-1"].queues["plain"]
        attributes = queue.attributes
        assert list(attributes) == queue.BASE_ATTRIBUTES
        assert attributes["SqsManagedSseEnabled"] == "true"
        assert attributes.get("FifoQueue") is None  # not a FIFO queue: the key is absent, as before
        # Re-creating with identical attributes is still idempotent (moto compares the mappings).
        sqs.create_queue(QueueName="plain", Attributes={"VisibilityTimeout": "30"})
        with pytest.raises(ClientError):
            sqs.create_queue(QueueName="plain", Attributes={"VisibilityTimeout": "31"})


def test_inline_delivery_is_disabled() -> None:
    """moto would invoke the function inside SendMessage; the emulator polls instead."""
    with moto_patches.installed(names={"sqs.no_inline_delivery"}), mock_aws():
        sqs = boto3.client("sqs", region_name="us-east-1")
        lam = boto3.client("lambda", region_name="us-east-1")
        iam = boto3.client("iam", region_name="us-east-1")
        role = iam.create_role(RoleName="r", AssumeRolePolicyDocument="{}")["Role"]["Arn"]
        url = sqs.create_queue(QueueName="src")["QueueUrl"]
        arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
        empty_zip = b"PK\x05\x06" + b"\0" * 18
        lam.create_function(
            FunctionName="f", Runtime="python3.12", Role=role, Handler="h.h", Code={"ZipFile": empty_zip}
        )
        mapping = lam.create_event_source_mapping(EventSourceArn=arn, FunctionName="f", BatchSize=5)
        sqs.send_message(QueueUrl=url, MessageBody="stays")
        assert queue_counts(sqs, url) == (1, 0, 0)
        assert lam.get_event_source_mapping(UUID=mapping["UUID"])["BatchSize"] == 5


class _ChangedWhileIterated(set):  # type: ignore[type-arg]
    """A pending set that another request changes while Python code iterates it."""

    def __iter__(self):  # type: ignore[no-untyped-def]
        values = iter(set.copy(self))
        first = next(values, None)
        if first is not None:
            self.add(_Grouped("added-meanwhile"))
            yield first
        yield from values
        raise RuntimeError("Set changed size during iteration")


class _Grouped:
    def __init__(self, group_id: str | None) -> None:
        self.group_id = group_id


def test_pending_message_groups_read_a_snapshot_of_the_pending_set() -> None:
    from moto.sqs import models as sqs_models

    def queue() -> object:
        pending = _ChangedWhileIterated({_Grouped("tenant-a"), _Grouped("tenant-b"), _Grouped(None)})
        return type("Queue", (), {"_pending_messages": pending})()

    with (
        moto_patches.removed(names={"sqs.pending_groups_snapshot"}),
        pytest.raises(RuntimeError, match="changed size"),
    ):
        sqs_models.Queue.pending_message_groups.fget(queue())  # moto's own: iterates the live set
    with moto_patches.installed(names={"sqs.pending_groups_snapshot"}):
        assert sqs_models.Queue.pending_message_groups.fget(queue()) == {"tenant-a", "tenant-b"}


class _SteppingClock:
    """``unix_time_millis`` that moves ``step`` ms on with every reading: a slow server, made exact."""

    def __init__(self, step: float) -> None:
        self.now = time.time() * 1000
        self.step = step

    def __call__(self, *args: Any) -> float:
        self.now += self.step
        return self.now


def _depth_readings(monkeypatch: pytest.MonkeyPatch, sqs: Any, url: str) -> list[int]:
    """The sum of the three counts, read while a clock that jumps with every reading passes the delay."""
    from moto.sqs import models as sqs_models

    clock = _SteppingClock(step=7)
    monkeypatch.setattr(sqs_models, "unix_time_millis", clock)
    monkeypatch.setattr(sqs_patches, "unix_time_millis", clock)
    sqs.send_message(QueueUrl=url, MessageBody="late", DelaySeconds=1)
    sqs.send_message(QueueUrl=url, MessageBody="now")
    sqs.receive_message(QueueUrl=url, VisibilityTimeout=1)  # "now" in flight for 1 s
    readings = [sum(queue_counts(sqs, url)) for _ in range(300)]  # the clock passes 1 s within these
    monkeypatch.undo()
    return readings


def test_the_counts_of_one_response_are_taken_at_one_instant(monkeypatch: pytest.MonkeyPatch) -> None:
    # A message is visible, delayed or in flight: at any one instant exactly one of them. Counted at
    # different instants, a delay or visibility timeout running out between two counts hid a message.
    with mock_aws():
        sqs = boto3.client("sqs", region_name="us-east-1")
        with moto_patches.removed(names=SQS_PATCHES):
            url = sqs.create_queue(QueueName="unpatched")["QueueUrl"]
            assert min(_depth_readings(monkeypatch, sqs, url)) < 2  # moto's own counts miss one
        with moto_patches.installed(names=SQS_PATCHES):
            url = sqs.create_queue(QueueName="patched")["QueueUrl"]
            assert set(_depth_readings(monkeypatch, sqs, url)) == {2}

"""The worker's parser model reads SQS records as Powertools' ``SqsRecordModel`` does.

(That importing the worker loads no Powertools parser model is tested in tests/integration/test_worker.py.)
"""

from __future__ import annotations

import json

import pytest
from aws_lambda_powertools.utilities.parser.models import SqsRecordModel
from pydantic import ValidationError

from breakwater.aws import redrive
from breakwater.envelope import REDRIVEN_ATTRIBUTE, Envelope, new_envelope_id
from breakwater.worker import EnvelopeSqsRecord


def sqs_record(body: str, **changes: object) -> dict[str, object]:
    """A record as the SQS event source mapping delivers it (every field Lambda sends)."""
    record: dict[str, object] = {
        "messageId": "059f36b4-87a3-44ab-83d2-661975830a7d",
        "receiptHandle": "AQEBwJnKyrHigUMZj6rYigCgxlaS3SLy0a",
        "body": body,
        "attributes": {
            "ApproximateReceiveCount": "2",
            "SentTimestamp": "1545082649183",
            "SenderId": "AIDAIENQZJOLO23YVJ4VO",
            "ApproximateFirstReceiveTimestamp": "1545082649185",
            "AWSTraceHeader": "Root=1-5e1b4151-5ac6c58239c1e5b4",
        },
        "messageAttributes": {
            "tenant": {
                "stringValue": "t1",
                "stringListValues": [],
                "binaryListValues": [],
                "dataType": "String",
            }
        },
        "md5OfBody": "e4e68fb7bd0e697a0ae8f1bb342846b3",
        "eventSource": "aws:sqs",
        "eventSourceARN": "arn:aws:sqs:us-east-1:123456789012:live-0",
        "awsRegion": "us-east-1",
    }
    record.update(changes)
    return record


def test_both_models_read_the_same_fields_from_a_record() -> None:
    envelope = Envelope(
        id=new_envelope_id(1_545_082_649_000),
        tenant="t1",
        type="order",
        payload={"n": 1},
        enqueued_at=1_545_082_649_000,
    )
    record = sqs_record(envelope.to_json())

    ours = EnvelopeSqsRecord.model_validate(record)
    theirs = SqsRecordModel.model_validate(record)

    assert ours.body == envelope
    assert json.loads(theirs.body) == json.loads(envelope.to_json())
    assert ours.messageId == theirs.messageId
    assert ours.receiptHandle == theirs.receiptHandle
    assert ours.eventSourceARN == theirs.eventSourceARN
    assert ours.attributes.ApproximateReceiveCount == theirs.attributes.ApproximateReceiveCount == "2"


def test_a_record_without_an_envelope_body_is_refused() -> None:
    with pytest.raises(ValidationError, match="body"):
        EnvelopeSqsRecord.model_validate(sqs_record('{"not": "an envelope"}'))
    with pytest.raises(ValidationError, match="messageId"):
        EnvelopeSqsRecord.model_validate({k: v for k, v in sqs_record("{}").items() if k != "messageId"})


def test_both_models_read_the_message_attributes_and_ours_tells_redriven_work() -> None:
    marked = {
        "stringValue": "1545082649183",
        "stringListValues": [],
        "binaryListValues": [],
        "dataType": "Number",
    }
    body = Envelope(id=new_envelope_id(1), tenant="t1", type="order", enqueued_at=1).to_json()
    record = sqs_record(body, messageAttributes={REDRIVEN_ATTRIBUTE: marked})

    ours = EnvelopeSqsRecord.model_validate(record)
    theirs = SqsRecordModel.model_validate(record)

    assert set(ours.messageAttributes) == set(theirs.messageAttributes) == {REDRIVEN_ATTRIBUTE}
    assert ours.messageAttributes[REDRIVEN_ATTRIBUTE].stringValue == "1545082649183"
    assert ours.redriven
    assert not EnvelopeSqsRecord.model_validate(sqs_record(body)).redriven  # another attribute only


def test_the_worker_reads_the_attribute_the_redrive_writes() -> None:
    assert redrive.REDRIVEN_ATTRIBUTE == REDRIVEN_ATTRIBUTE

"""The SQS record the worker reads: its parser model, and the queue URL of its source ARN."""

from __future__ import annotations

from pydantic import BaseModel, Field, Json

from breakwater.envelope import REDRIVEN_ATTRIBUTE, REDRIVEN_COPY_ATTRIBUTE, Envelope


class SqsRecordAttributes(BaseModel):
    """The system attributes of an SQS record that the worker reads (the others are ignored)."""

    ApproximateReceiveCount: str


class SqsMessageAttribute(BaseModel):
    """A message attribute of an SQS record: its type and string value (the list fields are ignored)."""

    dataType: str  # noqa: N815 - the SQS record's own field names
    stringValue: str | None = None  # noqa: N815 - the SQS record's own field names


class EnvelopeSqsRecord(BaseModel):
    """An SQS record whose body is a Breakwater envelope: the parser model of the batch processor.

    The fields of Powertools' ``SqsRecordModel`` that the worker reads, with the same names and types,
    so ``BatchProcessor`` handles it as it handles that model (it reports ``messageId``); unknown
    fields are ignored. Not a subclass of it: importing ``aws_lambda_powertools.utilities.parser.models``
    imports every parser model Powertools ships (a large share of a cold start), and
    validating the attributes the worker never reads (two timestamps as datetimes, the list fields
    of message attributes) costs per record. ``tests/unit/test_worker_record_model.py`` checks both
    models accept the same records.
    """

    messageId: str  # noqa: N815 - the SQS record's own field names
    receiptHandle: str  # noqa: N815 - the SQS record's own field names
    body: Json[Envelope]
    attributes: SqsRecordAttributes
    messageAttributes: dict[str, SqsMessageAttribute] = Field(default_factory=dict)  # noqa: N815
    eventSourceARN: str  # noqa: N815 - the SQS record's own field names

    @property
    def first_attempt(self) -> bool:
        """Whether this is the message's first delivery from its queue."""
        return self.attributes.ApproximateReceiveCount == "1"

    @property
    def redriven(self) -> bool:
        """Whether the redrive moved this message back from a dead-letter queue.

        The redrive marks what it moves back, and a worker marks the copy it sends elsewhere of such
        a message (:attr:`redrive_arrival` tells the two apart).
        """
        return (
            REDRIVEN_ATTRIBUTE in self.messageAttributes or REDRIVEN_COPY_ATTRIBUTE in self.messageAttributes
        )

    @property
    def redrive_arrival(self) -> bool:
        """Whether this is the message the redrive sent back itself (not a worker's copy of it)."""
        return REDRIVEN_ATTRIBUTE in self.messageAttributes

    @property
    def receive_count(self) -> int:
        """How many times the queue has delivered the message, this delivery included."""
        return int(self.attributes.ApproximateReceiveCount)


def queue_url_from_arn(arn: str) -> str:
    """``arn:aws:sqs:<region>:<account>:<name>`` -> the queue URL (what ChangeMessageVisibility takes)."""
    _, partition, _, region, account, name = arn.split(":", 5)
    suffix = "amazonaws.com.cn" if partition == "aws-cn" else "amazonaws.com"
    return f"https://sqs.{region}.{suffix}/{account}/{name}"

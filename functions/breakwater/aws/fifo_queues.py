"""Sending to the ordered workload's FIFO queue set."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from botocore.exceptions import BotoCoreError, ClientError

from breakwater.envelope import Envelope
from breakwater.errors import UnavailableError
from breakwater.ordered import deduplication_id, fifo_queue_index, message_group_id

if TYPE_CHECKING:
    from mypy_boto3_sqs import SQSClient


def send_ordered(client: SQSClient, queue_urls: Sequence[str], envelope: Envelope) -> str:
    """Send to the group's queue with ``MessageGroupId`` = tenant:ordering_key; returns the SQS message id.

    A resend with the same deduplication id inside SQS's 5-minute window is accepted and dropped by
    SQS (the response is the same), so a client may retry a timed-out request safely.
    """
    if not envelope.ordering_key:
        raise ValueError("an ordered message needs an ordering_key")
    group = message_group_id(envelope.tenant, envelope.ordering_key)
    queue_url = queue_urls[fifo_queue_index(group, len(queue_urls))]
    response = client.send_message(
        QueueUrl=queue_url,
        MessageBody=envelope.to_json(),
        MessageGroupId=group,
        MessageDeduplicationId=deduplication_id(envelope),
    )
    return response["MessageId"]


class FifoQueues:
    """The ordered ingest's sender port: the FIFO queue set, a 503 when a message was not stored."""

    def __init__(self, client: SQSClient, queue_urls: Sequence[str]) -> None:
        self.client = client
        self.queue_urls = list(queue_urls)

    def send(self, envelope: Envelope) -> str:
        try:
            return send_ordered(self.client, self.queue_urls, envelope)
        except (ClientError, BotoCoreError) as exc:
            raise UnavailableError(f"the message was not stored, please retry: {exc}") from exc

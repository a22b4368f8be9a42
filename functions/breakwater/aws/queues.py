"""The live queue set: depth probes and sends (``live-0`` … ``live-<N-1>``, SQS standard)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from botocore.exceptions import BotoCoreError, ClientError

from breakwater.aws import clients

if TYPE_CHECKING:
    from mypy_boto3_sqs import SQSClient


class EnqueueError(RuntimeError):
    """A send failed; the message is not stored."""


class LiveQueues:
    """Sends envelopes to live queue ``index`` and reads its approximate depth."""

    def __init__(
        self, queue_urls: Sequence[str], *, fair_queues: bool, client: SQSClient | None = None
    ) -> None:
        self.queue_urls = list(queue_urls)
        self.fair_queues = fair_queues
        self._client: SQSClient = client or clients.client("sqs")

    def __len__(self) -> int:
        return len(self.queue_urls)

    def depth(self, index: int) -> int:
        """ApproximateNumberOfMessages (visible messages waiting) of one queue."""
        response = self._client.get_queue_attributes(
            QueueUrl=self.queue_urls[index], AttributeNames=["ApproximateNumberOfMessages"]
        )
        return int(response.get("Attributes", {}).get("ApproximateNumberOfMessages", "0"))

    def send(self, index: int, body: str, group_id: str) -> str:
        """Stores ``body`` on queue ``index`` and returns the SQS message id, or raises :class:`EnqueueError`.

        ``MessageGroupId`` on a standard queue turns on SQS fair queues: a tenant flooding a shared
        queue does not raise the dwell time of the other tenants' messages.
        """
        kwargs: dict[str, Any] = {"QueueUrl": self.queue_urls[index], "MessageBody": body}
        if self.fair_queues:
            kwargs["MessageGroupId"] = group_id
        try:
            response = self._client.send_message(**kwargs)
        except (ClientError, BotoCoreError) as exc:
            raise EnqueueError(f"send to live queue {index} failed: {exc}") from exc
        return response["MessageId"]

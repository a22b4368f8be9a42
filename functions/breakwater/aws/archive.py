"""Adapter: drain a sideline queue into the S3 archive, deleting messages only once their object is written.

A crash between the write and the delete leaves the message on the queue and in the archive: a
duplicate, never a loss. The replay job drops the duplicate by envelope id.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from breakwater.archive import (
    ArchivedMessage,
    encode_ndjson_gz,
    first_archives_by_tenant,
    group_by_partition,
    object_key,
)
from breakwater.aws import clients
from breakwater.aws.counters import add_counters
from breakwater.aws.health import waiting_messages
from breakwater.observability import logger

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client
    from mypy_boto3_sqs import SQSClient

    from breakwater.settings import ArchiverSettings

_RECEIVE_BATCH = 10  # SQS maximum per ReceiveMessage / DeleteMessageBatch


@dataclass(slots=True)
class ArchiveResult:
    queue_url: str
    received: int = 0
    archived: int = 0
    deleted: int = 0
    objects: list[str] = field(default_factory=list)
    failed_objects: int = 0
    # per tenant, archived envelopes counted against its backlog estimate (first archives only)
    counted: dict[str, int] = field(default_factory=dict)


@dataclass(slots=True)
class SidelineArchiver:
    sqs: SQSClient
    s3: S3Client
    bucket: str
    prefix: str
    max_messages_per_object: int = 1000
    visibility_seconds: int = 300
    wait_for_delayed_seconds: float = 0.0
    clock_ms: Callable[[], int] = field(default=lambda: int(time.time() * 1000))
    new_object_name: Callable[[], str] = field(default=lambda: uuid.uuid4().hex)
    # ADDs ``archived`` per tenant to the counters (breakwater.aws.counters), once per batch archived
    count_archived: Callable[[Mapping[str, int]], None] | None = None

    def archive(self, queue_url: str, *, max_messages: int, keep_going: Callable[[], bool]) -> ArchiveResult:
        """Move up to ``max_messages`` from ``queue_url`` into the archive while ``keep_going()``."""
        result = ArchiveResult(queue_url=queue_url)
        empty_since: int | None = None
        while result.received < max_messages and keep_going():
            batch = self._receive_up_to(
                queue_url, min(self.max_messages_per_object, max_messages - result.received)
            )
            if not batch:
                # Nothing visible. Messages still delayed (a drainer's deferrals) are part of the backlog
                # the controller asked to park: wait for them to come due, up to the longest delay.
                now = self.clock_ms()
                empty_since = now if empty_since is None else empty_since
                waited_out = now - empty_since >= self.wait_for_delayed_seconds * 1000
                # Visible ones count too: a delay may have ended since the empty receive.
                if waited_out or not waiting_messages(self.sqs, queue_url):
                    break
                continue
            empty_since = None
            result.received += len(batch)
            self._count(self._write_then_delete(queue_url, batch, result))
        return result

    def _count(self, counted: Mapping[str, int]) -> None:
        """One ADD per tenant for each batch as soon as it is archived, so a run that dies later (its
        timeout, a crash) has counted what it archived; a failed write loses counts (estimates), never
        messages."""
        if self.count_archived is None or not counted:
            return
        try:
            self.count_archived(counted)
        except Exception:
            logger.exception("archived counts not written", extra={"counted": dict(counted)})

    def _receive_up_to(self, queue_url: str, limit: int) -> list[ArchivedMessage]:
        batch: list[ArchivedMessage] = []
        while len(batch) < limit:
            response = self.sqs.receive_message(
                QueueUrl=queue_url,
                MaxNumberOfMessages=min(_RECEIVE_BATCH, limit - len(batch)),
                # Long enough that nothing reappears between the receive and the delete.
                VisibilityTimeout=self.visibility_seconds,
                WaitTimeSeconds=1 if not batch else 0,
            )
            messages = response.get("Messages", [])
            if not messages:
                break
            batch.extend(
                ArchivedMessage(body=m["Body"], receipt_handle=m["ReceiptHandle"], message_id=m["MessageId"])
                for m in messages
            )
        return batch

    def _write_then_delete(
        self, queue_url: str, batch: list[ArchivedMessage], result: ArchiveResult
    ) -> Counter[str]:
        """Write the batch's objects, delete what was written; the batch's first archives per tenant."""
        counted: Counter[str] = Counter()
        for partition, messages in group_by_partition(batch, self.clock_ms()).items():
            key = object_key(partition, self.new_object_name(), self.prefix)
            try:
                self.s3.put_object(
                    Bucket=self.bucket,
                    Key=key,
                    Body=encode_ndjson_gz([m.body for m in messages]),
                    ContentType="application/x-ndjson",
                    ContentEncoding="gzip",
                )
            except Exception:
                # Not deleted: the messages reappear after the visibility timeout and are archived later.
                logger.exception("archive object not written; its messages stay queued", extra={"key": key})
                result.failed_objects += 1
                continue
            result.objects.append(key)
            result.archived += len(messages)
            counted.update(first_archives_by_tenant(messages))
            result.deleted += self._delete(queue_url, messages)
        result.counted = dict(Counter(result.counted) + counted)
        return counted

    def _delete(self, queue_url: str, messages: list[ArchivedMessage]) -> int:
        deleted = 0
        for start in range(0, len(messages), _RECEIVE_BATCH):
            chunk = messages[start : start + _RECEIVE_BATCH]
            response = self.sqs.delete_message_batch(
                QueueUrl=queue_url,
                Entries=[{"Id": str(i), "ReceiptHandle": m.receipt_handle} for i, m in enumerate(chunk)],
            )
            deleted += len(response.get("Successful", []))
            if response.get("Failed"):
                # Archived but still queued: the message is archived again later, the replay dedups it.
                logger.warning("archived messages not deleted", extra={"failed": response["Failed"]})
        return deleted


def build_archiver(settings: ArchiverSettings) -> SidelineArchiver:
    """The archiver of the settings' bucket: the only place its SQS, S3 and DynamoDB clients are made."""
    dynamodb = clients.client("dynamodb")

    def count_archived(per_tenant: Mapping[str, int]) -> None:
        """The archived envelopes leave their tenants' backlog estimates (one ADD per tenant)."""
        for tenant, archived in per_tenant.items():
            add_counters(dynamodb, settings.state_table_name, tenant, {"archived": archived})

    return SidelineArchiver(
        sqs=clients.client("sqs"),
        s3=clients.client("s3", read_timeout=30.0),
        count_archived=count_archived,
        bucket=settings.archive_bucket_name,
        prefix=settings.archive_prefix,
        max_messages_per_object=settings.max_messages_per_object,
        visibility_seconds=settings.receive_visibility_seconds,
        wait_for_delayed_seconds=settings.wait_for_delayed_seconds,
    )

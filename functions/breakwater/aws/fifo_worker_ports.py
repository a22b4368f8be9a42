"""The FIFO worker's consumer and batch wired to AWS: the only place its handler gets a client from."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from breakwater.aws import clients
from breakwater.aws.group_backlogs import DynamoGroupBacklogs, tenant_backlogs
from breakwater.aws.health import record_dependency_down
from breakwater.aws.write_ahead import DynamoWriteAheadStore
from breakwater.breaker import CircuitBreaker
from breakwater.fifo_batch import FifoBatchWorker, HeldMessage, OutageHolds, VisibilityPort
from breakwater.fifo_consumer import FifoConsumer
from breakwater.ordered import BacklogWindow, SideEffect
from breakwater.settings import FifoWorkerSettings

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient
    from mypy_boto3_sqs import SQSClient
    from mypy_boto3_sqs.type_defs import ChangeMessageVisibilityBatchRequestEntryTypeDef

# ChangeMessageVisibilityBatch takes at most this many entries.
_BATCH = 10


class SqsVisibility(VisibilityPort):
    """Holds in-flight messages with ``ChangeMessageVisibilityBatch``, one call per queue and ten."""

    def __init__(self, client: SQSClient) -> None:
        self._client = client

    def hold(self, messages: Sequence[HeldMessage], seconds: int) -> list[HeldMessage]:
        failed: list[HeldMessage] = []
        by_queue: dict[str, list[HeldMessage]] = {}
        for message in messages:
            by_queue.setdefault(message.queue_url, []).append(message)
        for queue_url, held in by_queue.items():
            for start in range(0, len(held), _BATCH):
                chunk = held[start : start + _BATCH]
                entries: list[ChangeMessageVisibilityBatchRequestEntryTypeDef] = [
                    {"Id": str(index), "ReceiptHandle": each.receipt_handle, "VisibilityTimeout": seconds}
                    for index, each in enumerate(chunk)
                ]
                response = self._client.change_message_visibility_batch(QueueUrl=queue_url, Entries=entries)
                failed.extend(chunk[int(entry["Id"])] for entry in response.get("Failed", []))
        return failed


def build_fifo_consumer(
    settings: FifoWorkerSettings,
    side_effect: SideEffect,
    *,
    dynamodb: DynamoDBClient | None = None,
) -> FifoConsumer:
    """The write-ahead store and, with the state table and the window set, the group and tenant counters."""
    client: DynamoDBClient = dynamodb or clients.client("dynamodb")
    store = DynamoWriteAheadStore(
        client,
        settings.write_ahead_table_name,
        lease_seconds=settings.write_ahead_lease_seconds,
        retention_seconds=settings.write_ahead_retention_seconds,
    )
    if settings.state_table_name is None or settings.group_backlog_window_seconds is None:
        return FifoConsumer(store, side_effect)
    window = BacklogWindow(settings.group_backlog_window_seconds * 1000)
    return FifoConsumer(
        store,
        side_effect,
        backlogs=DynamoGroupBacklogs(client, settings.state_table_name, window),
        tenants=tenant_backlogs(client, settings.state_table_name, window),
        window=window,
    )


def build_fifo_worker(
    settings: FifoWorkerSettings,
    side_effect: SideEffect,
    *,
    dynamodb: DynamoDBClient | None = None,
    sqs: SQSClient | None = None,
    monotonic: Callable[[], float] = time.monotonic,
    clock_ms: Callable[[], int] = lambda: int(time.time() * 1000),
) -> FifoBatchWorker:
    """The consumer, SQS's visibility for holds and the breaker; an outage is reported in the state
    table's dependency item (the one the live workers write) when the table is set."""
    ddb: DynamoDBClient = dynamodb or clients.client("dynamodb")
    consumer = build_fifo_consumer(settings, side_effect, dynamodb=ddb)
    table = settings.state_table_name

    def report_outage(until_ms: int) -> bool:
        return table is not None and record_dependency_down(ddb, table, until_ms)

    return FifoBatchWorker(
        consumer,
        visibility=SqsVisibility(sqs or clients.client("sqs")),
        monotonic=monotonic,
        clock_ms=clock_ms,
        breaker=CircuitBreaker(
            base_s=settings.outage_backoff_seconds, max_s=settings.outage_backoff_max_seconds
        ),
        holds=OutageHolds(
            base_s=settings.outage_backoff_seconds,
            max_s=settings.outage_backoff_max_seconds,
            max_receive_count=settings.max_receive_count,
            last_hold_s=settings.outage_last_hold_seconds,
        ),
        report_outage=report_outage,
    )

"""The FIFO worker's consumer wired to AWS: the only place its handler gets a client from."""

from __future__ import annotations

from typing import TYPE_CHECKING

from breakwater.aws import clients
from breakwater.aws.group_backlogs import DynamoGroupBacklogs
from breakwater.aws.write_ahead import DynamoWriteAheadStore
from breakwater.fifo_consumer import FifoConsumer
from breakwater.ordered import BacklogWindow, SideEffect
from breakwater.settings import FifoWorkerSettings

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient


def build_fifo_consumer(
    settings: FifoWorkerSettings,
    side_effect: SideEffect,
    *,
    dynamodb: DynamoDBClient | None = None,
) -> FifoConsumer:
    """The write-ahead store and, with the state table and the window set, the group counters."""
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
        window=window,
    )

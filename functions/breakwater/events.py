"""The streaming workload's ingest policy: ``POST /v1/events`` bodies, partition keys, PutRecords batches.

Events are high-volume, aggregatable data (counters, measurements), not tasks: they go to a Kinesis
stream, whose consumer folds a batch into one write per key. The partition key is the tenant, or
``tenant:key`` when the stream is configured for client keys, so a tenant's events (per key) stay on
one shard and in order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from breakwater.errors import PayloadTooLargeError
from breakwater.requests import MAX_EVENTS_PER_REQUEST

MAX_RECORD_BYTES = 1024 * 1024  # Kinesis: data + partition key of one record
MAX_PUT_RECORDS_BYTES = 5 * 1024 * 1024  # Kinesis: one PutRecords call
MAX_PARTITION_KEY_LENGTH = 256
KEY_SEPARATOR = ":"
STREAM_EVENT_VERSION: Literal[1] = 1


class PartitionKeyMode(StrEnum):
    TENANT = "tenant"  # all of a tenant's events on one shard: per-tenant order and aggregates
    TENANT_AND_KEY = "tenant_and_key"  # spread a tenant over shards by the client's key (hot tenants)


class StreamEvent(BaseModel):
    """An event as written to the stream: the client's fields plus what ingest stamps."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    v: Literal[1] = STREAM_EVENT_VERSION
    id: str = Field(min_length=26, max_length=26)
    tenant: str = Field(min_length=1, max_length=64)
    type: str = Field(min_length=1, max_length=128)
    key: str | None = None
    value: float = Field(default=1.0, allow_inf_nan=False)
    payload: Any = None
    occurred_at: int | None = None
    received_at: int = Field(ge=0, description="epoch ms, stamped by ingest")
    request_id: str | None = None
    trace_id: str | None = None

    def to_bytes(self) -> bytes:
        return self.model_dump_json().encode()

    @classmethod
    def from_bytes(cls, data: bytes | str) -> StreamEvent:
        return cls.model_validate_json(data)


def partition_key(tenant: str, key: str | None, mode: PartitionKeyMode) -> str:
    """The tenant, or ``tenant:key`` in ``TENANT_AND_KEY`` mode when the event has a key."""
    if mode is PartitionKeyMode.TENANT_AND_KEY and key:
        return f"{tenant}{KEY_SEPARATOR}{key}"[:MAX_PARTITION_KEY_LENGTH]
    return tenant[:MAX_PARTITION_KEY_LENGTH]


@dataclass(frozen=True)
class KinesisRecord:
    data: bytes
    partition_key: str

    @property
    def size(self) -> int:
        """What counts against Kinesis' record and request limits: data plus partition key."""
        return len(self.data) + len(self.partition_key.encode())


def to_record(event: StreamEvent, mode: PartitionKeyMode) -> KinesisRecord:
    record = KinesisRecord(data=event.to_bytes(), partition_key=partition_key(event.tenant, event.key, mode))
    if record.size > MAX_RECORD_BYTES:
        raise PayloadTooLargeError(
            f"event {event.id} is {record.size} bytes; a Kinesis record holds at most {MAX_RECORD_BYTES}"
        )
    return record


def chunk_indexes(
    sizes: Sequence[int], max_count: int = MAX_EVENTS_PER_REQUEST, max_bytes: int = MAX_PUT_RECORDS_BYTES
) -> list[list[int]]:
    """Split records (by size) into PutRecords calls of at most ``max_count`` records and ``max_bytes``."""
    chunks: list[list[int]] = []
    current: list[int] = []
    current_bytes = 0
    for index, size in enumerate(sizes):
        if current and (len(current) >= max_count or current_bytes + size > max_bytes):
            chunks.append(current)
            current, current_bytes = [], 0
        current.append(index)
        current_bytes += size
    if current:
        chunks.append(current)
    return chunks

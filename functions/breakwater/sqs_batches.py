"""SQS batches within both of SQS's bounds: ten entries, and the entries' sizes summed.

``SendMessageBatch`` refuses a whole call whose messages add up to more than the queue's maximum
message size (``BatchRequestTooLong``), however few entries it has: batching by count alone turns a
few large messages into a call that can never succeed, and every message in it back into a retry.
A message's size is what SQS counts: its body plus each attribute's name, data type and value.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, TypeVar

MAX_BATCH_ENTRIES = 10
MAX_BATCH_BYTES = 1024 * 1024  # the entries' sum; SQS's message size limit too (1 MiB since August 2025)

T = TypeVar("T")


def message_size(body: str, attributes: Mapping[str, Mapping[str, Any]] | None = None) -> int:
    """Bytes SQS counts for one message: the UTF-8 body plus every attribute's name, type and value."""
    size = len(body.encode("utf-8"))
    for name, attribute in (attributes or {}).items():
        size += len(name.encode("utf-8")) + len(str(attribute.get("DataType", "")).encode("utf-8"))
        if "BinaryValue" in attribute:
            size += len(attribute["BinaryValue"])
        else:
            size += len(str(attribute.get("StringValue", "")).encode("utf-8"))
    return size


def entry_size(entry: Mapping[str, Any]) -> int:
    """:func:`message_size` of a ``SendMessageBatch`` entry."""
    return message_size(entry["MessageBody"], entry.get("MessageAttributes"))


def batches(
    items: Iterable[T],
    size_of: Callable[[T], int],
    *,
    max_entries: int = MAX_BATCH_ENTRIES,
    max_bytes: int = MAX_BATCH_BYTES,
) -> Iterator[list[T]]:
    """``items`` in order, cut into batches of at most ``max_entries`` whose sizes sum to at most
    ``max_bytes``. An item larger than ``max_bytes`` on its own goes alone (SQS answers for it)."""
    batch: list[T] = []
    total = 0
    for item in items:
        size = size_of(item)
        if batch and (len(batch) == max_entries or total + size > max_bytes):
            yield batch
            batch, total = [], 0
        batch.append(item)
        total += size
    if batch:
        yield batch

"""Moving messages between queues: ``SendMessageBatch``, grouped by destination, in batches within
SQS's bounds (ten entries, and their sizes summed: :mod:`breakwater.sqs_batches`).

The original is acknowledged (left out of the batch item failures) only when its move succeeded,
so a message is never lost; a failed entry makes the original a batch item failure and SQS
delivers it again. A move is at-least-once: if the invocation dies after the send but before the
acknowledgement, the copy and the original both exist, and processing idempotency (per envelope id)
absorbs the duplicate.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from breakwater.envelope import REDRIVEN_COPY_ATTRIBUTE
from breakwater.sideline import Move
from breakwater.sqs_batches import batches, message_size

if TYPE_CHECKING:
    from mypy_boto3_sqs import SQSClient

__all__ = ["Move", "send_moves"]


def send_moves(client: SQSClient, moves: Iterable[Move]) -> set[str]:
    """Send every move; returns the keys of the moves that failed (the caller must not acknowledge those)."""
    by_queue: dict[str, list[Move]] = defaultdict(list)
    for move in moves:
        by_queue[move.queue_url].append(move)
    failed: set[str] = set()
    for queue_url, queued in by_queue.items():
        for chunk in batches(queued, _size):
            entries: list[dict[str, Any]] = []
            for index, move in enumerate(chunk):
                entry: dict[str, Any] = {"Id": str(index), "MessageBody": move.body}
                if move.delay_seconds:
                    entry["DelaySeconds"] = move.delay_seconds
                if move.group_id:
                    entry["MessageGroupId"] = move.group_id
                if move.redriven:
                    entry["MessageAttributes"] = _REDRIVEN_COPY
                entries.append(entry)
            try:
                response = client.send_message_batch(QueueUrl=queue_url, Entries=entries)  # type: ignore[arg-type]
            except Exception:  # the whole call failed: every original stays unacknowledged
                failed.update(move.key for move in chunk)
                continue
            failed.update(chunk[int(error["Id"])].key for error in response.get("Failed", []))
    return failed


_REDRIVEN_COPY = {REDRIVEN_COPY_ATTRIBUTE: {"DataType": "String", "StringValue": "1"}}


def _size(move: Move) -> int:
    return message_size(move.body, _REDRIVEN_COPY if move.redriven else None)

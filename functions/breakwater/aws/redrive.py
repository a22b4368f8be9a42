"""Moving dead-lettered messages back to their source queue after a fix.

Every message is moved by receive -> send -> mark -> delete, in batches of up to ten (each send
within SQS's batch size, :mod:`breakwater.sqs_batches`):

- send before delete, so a crash never loses a message;
- after a successful send, a dedup marker (``redrive#<dlq name>``/``<dlq message id>`` in the state
  table, with a TTL past the DLQ's retention) records that the copy exists; a message that comes
  back to the DLQ after a failed or timed-out delete is then deleted, not sent again;
- the only window for a duplicate is a crash between the send and the marker write: at most one
  extra copy of at most one batch (10 messages) per crash, which processing idempotency (per
  envelope id) absorbs. The move is at-least-once, never at-most-once.

A FIFO DLQ (the ordered workload's) is moved back the same way, to its FIFO source, keeping each
message's ``MessageGroupId``. Its ``MessageDeduplicationId`` is ``redrive-<dlq message id>``
(:func:`redrive_deduplication_id`): never the original's, which SQS would still drop as a
duplicate inside its five-minute window, and the same on every retry of one redrive, so a send
repeated after a lost delete is dropped by SQS within that window (and by the marker after it).

Every message sent back carries :data:`REDRIVEN_ATTRIBUTE` (the redrive's epoch ms): the workers
measure it apart from live work, keep it out of the live queues' ages and health, and count it
back into its tenant's backlog estimate. That is why SQS's ``StartMessageMoveTask`` is not used: it
copies messages exactly as they are, with nothing a worker could tell from a live message (a moved
message has a new id and a receive count of 1, and SQS sets no attribute on it), so its messages
would feed the live ages and health (turning the drainers off) and never come back into the
estimates. A request for one is refused (:class:`MoveTaskRefusedError`).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from breakwater.aws import clients
from breakwater.aws.counters import batch_get
from breakwater.envelope import REDRIVEN_ATTRIBUTE
from breakwater.sqs_batches import batches, entry_size

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient
    from mypy_boto3_sqs import SQSClient
    from mypy_boto3_sqs.type_defs import MessageTypeDef

    from breakwater.settings import RedriveSettings

MARKER_TTL_SECONDS = 15 * 86_400  # longer than the longest SQS retention (14 days)
# REDRIVEN_ATTRIBUTE, on every message moved back: the redrive's time, epoch ms (Number).
_MAX_MESSAGE_ATTRIBUTES = 10  # SQS refuses a message with more


@dataclass
class RedriveResult:
    dlq_url: str
    source_url: str
    moved: int = 0
    already_moved: int = 0  # found a marker: deleted from the DLQ without sending again
    failed: int = 0  # send failed: left in the DLQ
    unmarked: int = 0  # sent without REDRIVEN_ATTRIBUTE: the message already had the most SQS allows

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


class MoveTaskRefusedError(ValueError):
    """A move task was asked for: its messages would count as live work (see the module docstring)."""

    def __init__(self) -> None:
        super().__init__(
            "use_move_task: a move task sends messages back unmarked, so they would count as live work "
            "(ages, health, first-attempt age); every redrive moves by hand and marks each message"
        )


class RedriveMarkers:
    """Dedup markers of the move in the state table."""

    def __init__(self, client: DynamoDBClient, table_name: str, dlq_url: str) -> None:
        self._client = client
        self._table = table_name
        self.pk = f"redrive#{dlq_url.rstrip('/').rsplit('/', 1)[-1]}"

    def sent(self, message_ids: Sequence[str]) -> set[str]:
        found = batch_get(self._client, self._table, [(self.pk, message_id) for message_id in message_ids])
        return {sk for (_, sk) in found}

    def mark(self, message_ids: Sequence[str], now: float) -> None:
        for start in range(0, len(message_ids), 25):
            requests: list[Any] = [
                {
                    "PutRequest": {
                        "Item": {
                            "pk": {"S": self.pk},
                            "sk": {"S": message_id},
                            "ttl": {"N": str(int(now) + MARKER_TTL_SECONDS)},
                        }
                    }
                }
                for message_id in message_ids[start : start + 25]
            ]
            pending: dict[str, Any] = {self._table: requests}
            for _ in range(5):
                response = self._client.batch_write_item(RequestItems=pending)
                pending = dict(response.get("UnprocessedItems") or {})
                if not pending:
                    break


def is_fifo(queue_url: str) -> bool:
    """SQS requires a FIFO queue's name to end in ``.fifo``, and no other queue's may."""
    return queue_url.rstrip("/").endswith(".fifo")


def redrive_deduplication_id(dlq_message_id: str) -> str:
    """The deduplication id of a message moved back to a FIFO queue by hand.

    Derived from the DLQ message's id: the same on every retry of this redrive, and new when the
    redriven copy (which SQS gives a new id) fails again and is redriven once more.
    """
    return f"redrive-{dlq_message_id}"


def _send_entry(index: int, message: MessageTypeDef, *, fifo: bool, redriven_at_ms: int) -> dict[str, Any]:
    entry: dict[str, Any] = {"Id": str(index), "MessageBody": message["Body"]}
    attributes: dict[str, Any] = dict(message.get("MessageAttributes") or {})
    if REDRIVEN_ATTRIBUTE in attributes or len(attributes) < _MAX_MESSAGE_ATTRIBUTES:
        attributes[REDRIVEN_ATTRIBUTE] = {"DataType": "Number", "StringValue": str(redriven_at_ms)}
    if attributes:
        entry["MessageAttributes"] = attributes
    group = (message.get("Attributes") or {}).get("MessageGroupId")
    if group:
        entry["MessageGroupId"] = group  # the ordered group, or the tenant's fair-queue group
    if fifo:
        entry["MessageDeduplicationId"] = redrive_deduplication_id(message["MessageId"])
    return entry


def _is_marked(entry: dict[str, Any]) -> bool:
    return REDRIVEN_ATTRIBUTE in entry.get("MessageAttributes", {})


def move_by_hand(
    sqs: SQSClient,
    dlq_url: str,
    source_url: str,
    *,
    markers: RedriveMarkers | None = None,
    max_messages: int | None = None,
    visibility_timeout: int = 60,
    clock: Any = time.time,
) -> RedriveResult:
    """The receive/send/mark/delete move; stops when the DLQ looks empty or after ``max_messages``."""
    result = RedriveResult(dlq_url=dlq_url, source_url=source_url)
    fifo = is_fifo(source_url)
    empty_receives = 0
    while empty_receives < 2 and (max_messages is None or result.moved + result.already_moved < max_messages):
        wanted = (
            10
            if max_messages is None
            else max(1, min(10, max_messages - result.moved - result.already_moved))
        )
        messages = sqs.receive_message(
            QueueUrl=dlq_url,
            MaxNumberOfMessages=wanted,
            VisibilityTimeout=visibility_timeout,
            WaitTimeSeconds=0,
            MessageAttributeNames=["All"],
            MessageSystemAttributeNames=["MessageGroupId"],
        ).get("Messages", [])
        if not messages:
            empty_receives += 1
            continue
        empty_receives = 0
        ids = [message["MessageId"] for message in messages]
        already = markers.sent(ids) if markers is not None else set()
        fresh = [message for message in messages if message["MessageId"] not in already]
        sent: list[MessageTypeDef] = []
        if fresh:
            now_ms = int(clock() * 1000)
            entries = [_send_entry(i, m, fifo=fifo, redriven_at_ms=now_ms) for i, m in enumerate(fresh)]
            ok: set[int] = set()
            for batch in batches(entries, entry_size):
                response = sqs.send_message_batch(QueueUrl=source_url, Entries=batch)  # type: ignore[arg-type]
                ok.update(int(entry["Id"]) for entry in response.get("Successful", []))
            sent = [message for index, message in enumerate(fresh) if index in ok]
            result.failed += len(fresh) - len(sent)
            result.unmarked += sum(not _is_marked(entries[i]) for i in ok)
            if markers is not None and sent:
                markers.mark([message["MessageId"] for message in sent], clock())
        done = sent + [message for message in messages if message["MessageId"] in already]
        if done:
            sqs.delete_message_batch(
                QueueUrl=dlq_url,
                Entries=[{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(done)],
            )
        result.moved += len(sent)
        result.already_moved += len(done) - len(sent)
        if len(sent) < len(fresh):
            break  # the source refuses messages: stop rather than spin; the rest stay in the DLQ
    return result


def redrive(
    sqs: SQSClient,
    dlq_url: str,
    source_url: str,
    *,
    markers: RedriveMarkers | None = None,
    max_messages: int | None = None,
    use_move_task: bool = False,
) -> RedriveResult:
    """Move the DLQ's messages back to ``source_url`` by hand, each marked; a move task is refused."""
    if use_move_task:
        raise MoveTaskRefusedError()
    return move_by_hand(sqs, dlq_url, source_url, markers=markers, max_messages=max_messages)


class Redrive:
    """The DLQ -> source pairs an operator may redrive, and the clients that move them."""

    def __init__(
        self,
        sqs: SQSClient,
        pairs: Mapping[str, str],
        *,
        dynamodb: DynamoDBClient | None = None,
        state_table_name: str | None = None,
    ) -> None:
        self._sqs = sqs
        self.pairs = dict(pairs)
        self._dynamodb = dynamodb
        self._state_table = state_table_name

    def pairs_for(self, dlq_url: str | None) -> dict[str, str]:
        """Every pair, or only ``dlq_url``'s; a DLQ that is not one of the pairs is refused."""
        if dlq_url is None:
            return dict(self.pairs)
        if dlq_url not in self.pairs:
            raise ValueError(f"unknown DLQ {dlq_url!r}; known: {sorted(self.pairs)}")
        return {dlq_url: self.pairs[dlq_url]}

    def markers(self, dlq_url: str) -> RedriveMarkers | None:
        if self._dynamodb is None or not self._state_table:
            return None
        return RedriveMarkers(self._dynamodb, self._state_table, dlq_url)

    def redrive(
        self, dlq_url: str, source_url: str, *, max_messages: int | None = None, use_move_task: bool = False
    ) -> RedriveResult:
        return redrive(
            self._sqs,
            dlq_url,
            source_url,
            markers=self.markers(dlq_url),
            max_messages=max_messages,
            use_move_task=use_move_task,
        )


def build_redrive(settings: RedriveSettings) -> Redrive:
    """The redrive of the settings' pairs: the only place its SQS and DynamoDB clients are made."""
    return Redrive(
        clients.client("sqs"),
        settings.redrive_pairs,
        dynamodb=clients.client("dynamodb") if settings.state_table_name else None,
        state_table_name=settings.state_table_name,
    )

"""SQS: attributes read lazily, counts taken at one instant, deletes by an index, no inline Lambda delivery.

moto 5.2.5 computes ``Queue.attributes`` eagerly: every read builds the whole attribute dict,
``ApproximateNumberOfMessages``, ``...Delayed`` and ``...NotVisible`` included, three scans of every
message in the queue. ``SendMessage`` reads that dict once to learn one static setting
(``ContentBasedDeduplication``), and ``ReceiveMessage`` reads it three times per *returned* message
(its retention check), so a send cost O(depth) and a receive of ten thirty scans. A deep queue is
what the emulator exists to show, so the cost is removed here, and every value kept.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, overload

from moto.core.utils import camelcase_to_underscores, unix_time_millis
from moto.sqs import models as sqs_models

from local.emulator.moto_patches.patch import Kind, Patch, Replacement, no_event_source_mappings


class QueueAttributes(Mapping[str, Any]):
    """``Queue.attributes`` with the keys moto builds, in its order, each value computed when (and each
    time) it is read: ``GetQueueAttributes`` with ``All`` still counts, exactly as before, and counts
    stay exact with respect to delays and visibility timeouts (they are time-dependent, never cached)."""

    def __init__(self, queue: sqs_models.Queue) -> None:
        self._queue = queue
        names = list(queue.BASE_ATTRIBUTES)
        if queue.fifo_queue:
            names += queue.FIFO_ATTRIBUTES
        if queue.kms_master_key_id:  # type: ignore[attr-defined]
            names += queue.KMS_ATTRIBUTES
        self._names = names

    def __getitem__(self, name: str) -> Any:
        if name not in self._names:
            raise KeyError(name)
        queue = self._queue
        value = getattr(queue, camelcase_to_underscores(name))
        if name == "RedrivePolicy" and queue.redrive_policy:
            value = json.dumps(queue.redrive_policy)
        if isinstance(value, bool):
            value = str(value).lower()
        return value

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)

    def __contains__(self, name: object) -> bool:
        return name in self._names


def _lazy_attributes(self: sqs_models.Queue) -> QueueAttributes:
    return QueueAttributes(self)


# While ``GetQueueAttributes`` runs on a server thread, the instant its counts are taken at.
_instant = threading.local()


def _request_instant() -> float:
    """The instant of the ``GetQueueAttributes`` this thread is answering, else the clock (ms)."""
    now: float | None = getattr(_instant, "ms", None)
    return unix_time_millis() if now is None else now


class VisibleMessages(Sequence[sqs_models.Message]):
    """``Queue.messages`` (visible and not delayed) as a view: iterate lazily, count without building a list.

    ``ReceiveMessage`` iterates ``queue.messages`` and stops after ``MaxNumberOfMessages``; moto
    built the whole filtered list first, calling the clock twice per message. Iteration walks a
    snapshot of the queue (as the list did) and yields what is visible when reached; counting reads
    the clock once per scan (the request's instant, inside ``GetQueueAttributes``).
    """

    def __init__(self, queue: sqs_models.Queue) -> None:
        self._queue = queue

    def __iter__(self) -> Iterator[sqs_models.Message]:
        for message in list(self._queue._messages):
            if message.visible and not message.delayed:
                yield message

    def _listed(self) -> list[sqs_models.Message]:
        now = _request_instant()  # moto's Message.visible / .delayed, with one clock read per scan
        return [m for m in self._queue._messages if now > m.visible_at and not now < m.delayed_until]

    def __len__(self) -> int:
        return len(self._listed())

    def __bool__(self) -> bool:
        return next(iter(self), None) is not None

    @overload
    def __getitem__(self, index: int) -> sqs_models.Message: ...
    @overload
    def __getitem__(self, index: slice) -> list[sqs_models.Message]: ...
    def __getitem__(self, index: int | slice) -> sqs_models.Message | list[sqs_models.Message]:
        return self._listed()[index]


def _visible_messages(self: sqs_models.Queue) -> VisibleMessages:
    return VisibleMessages(self)


def _count_delayed(self: sqs_models.Queue) -> int:
    now = _request_instant()
    return sum(1 for m in self._messages if now < m.delayed_until)


def _count_not_visible(self: sqs_models.Queue) -> int:
    now = _request_instant()
    return sum(1 for m in self._messages if not now > m.visible_at)


def _at_one_instant(original: Any) -> Any:
    def get_queue_attributes(self: Any, queue_name: str, attribute_names: list[str]) -> dict[str, Any]:
        """moto's ``GetQueueAttributes``, its counts taken at the instant the request is answered.

        A message is in exactly one of visible, delayed and in flight at any one instant, so counted
        at one instant the three add up to the queue's depth. Every count read on this thread while
        the request runs uses its instant; ``All``'s lazy mapping is read here too.
        """
        _instant.ms = unix_time_millis()
        try:
            return dict(original(self, queue_name, attribute_names))
        finally:
            _instant.ms = None

    return get_queue_attributes


def _pending_message_groups(self: sqs_models.Queue) -> set[str]:
    """moto's ``Queue.pending_message_groups`` over a copy of the pending set, not the set itself.

    ``set.copy`` copies in C, holding the GIL: a consistent snapshot, whatever other requests'
    receives and deletes do to the set meanwhile.
    """
    return {message.group_id for message in set.copy(self._pending_messages) if message.group_id is not None}


# Receipt handle -> message, for every handle issued while the patch is installed. A handle not in
# here (issued before, or already deleted) takes moto's own path, so its answers never change.
_handles: dict[str, sqs_models.Message] = {}


def _mark_received(original: Any) -> Any:
    def mark_received(self: sqs_models.Message, visibility_timeout: int | None = None) -> None:
        original(self, visibility_timeout)
        if self.receipt_handle is not None:
            _handles[self.receipt_handle] = self

    return mark_received


def _delete_message(original: Any) -> Any:
    def delete_message(self: sqs_models.Queue, receipt_handle: str) -> None:
        """moto's ``Queue.delete_message`` without its two scans of every message when the handle is known."""
        message = _handles.get(receipt_handle)
        if message is None or receipt_handle in self.deleted_messages:
            original(self, receipt_handle)
            return
        try:
            self._messages.remove(message)  # identity comparison, one C-level pass at worst
        except ValueError:
            # Not in this queue (another queue's handle, purged, or moved to its DLQ): moto decides.
            original(self, receipt_handle)
            return
        self.pending_messages.discard(message)
        handles = [handle for handle in message.all_receipt_handles if handle is not None]
        self.deleted_messages.update(handles)
        for handle in handles:
            _handles.pop(handle, None)

    return delete_message


def _property(getter: Any) -> Any:
    return lambda _original: property(getter)


PATCHES = (
    Patch(
        name="sqs.lazy_attributes",
        kind=Kind.SPEED,
        corrects="Queue.attributes is built whole on every read, its three message counts included "
        "(each a scan of the queue), though SendMessage and ReceiveMessage read one static setting of it.",
        replaces=(Replacement(sqs_models.Queue, "attributes", _property(_lazy_attributes)),),
    ),
    Patch(
        name="sqs.counts_at_one_instant",
        kind=Kind.CORRECTNESS,
        corrects="GetQueueAttributes counts visible, delayed and in-flight messages each at its own "
        "clock readings, so a delay or visibility timeout that ends between two readings puts its "
        "message in neither count or in both. (The visible messages become a view read at the "
        "request's instant, which also spares ReceiveMessage building the whole list.)",
        replaces=(
            Replacement(sqs_models.Queue, "messages", _property(_visible_messages)),
            Replacement(
                sqs_models.Queue, "approximate_number_of_messages_delayed", _property(_count_delayed)
            ),
            Replacement(
                sqs_models.Queue, "approximate_number_of_messages_not_visible", _property(_count_not_visible)
            ),
            Replacement(sqs_models.SQSBackend, "get_queue_attributes", _at_one_instant),
        ),
    ),
    Patch(
        name="sqs.pending_groups_snapshot",
        kind=Kind.CORRECTNESS,
        corrects="Queue.pending_message_groups iterates the pending set in Python while another "
        "request's receive or delete changes it on another server thread: the receive fails with "
        "'Set changed size during iteration' (an HTTP 500 to ReceiveMessage).",
        replaces=(
            Replacement(sqs_models.Queue, "pending_message_groups", _property(_pending_message_groups)),
        ),
    ),
    Patch(
        name="sqs.delete_by_handle_index",
        kind=Kind.SPEED,
        corrects="DeleteMessage looks its receipt handle up in every message of the queue, twice.",
        replaces=(
            Replacement(sqs_models.Queue, "delete_message", _delete_message),
            Replacement(sqs_models.Message, "mark_received", _mark_received),
        ),
        forget=_handles.clear,
    ),
    Patch(
        name="sqs.no_inline_delivery",
        kind=Kind.CORRECTNESS,
        corrects="A queue with an event source mapping has each SendMessage receive a batch and invoke "
        "the function synchronously (in Docker), deleting the batch on success. The emulator polls the "
        "queues itself with the mapping's batch size, window, concurrency and partial batch responses, "
        "as the Lambda service does; the mapping stays in the Lambda backend, where "
        "GetEventSourceMapping and UpdateEventSourceMapping read and toggle it.",
        replaces=(Replacement(sqs_models.Queue, "lambda_event_source_mappings", no_event_source_mappings),),
    ),
)

"""SQS fair queues: a standard queue's receives put noisy message groups behind quiet ones, as AWS does.

SQS applies fair queues to every standard queue whose messages carry a ``MessageGroupId``; moto 5.2.5
accepts the id on a standard queue and ignores it, so a tenant's backlog delays everyone behind it
exactly as on a queue without groups. Here the rules of ``local.fair_queues`` (quoted there, with
AWS's pages) decide which groups are noisy, and ``ReceiveMessage`` walks the visible messages in
their order: quiet groups' (and group-less) messages first, noisy groups' after, the one with the
fewest in flight first. A queue no grouped message was sent to keeps moto's order exactly; so does a
fair queue while no group is noisy. FIFO queues are untouched (fair queues are a standard-queue
feature; FIFO orders by group already).

What feeds the model: each grouped send (its group's last send); each delete, and each receive whose
visibility ran out (a consumer's processing time, from the receive); every :data:`NOISY_REFRESH_S`
at most, one scan of the queue's messages for in-flight and visible counts by group. The model's
clock is :func:`clock` (epoch seconds; tests inject one); visibility and delays stay moto's.

Costs: while a group is noisy, a receive walks the queue's messages past that group's (a set lookup
each; the walk stops once the batch is full); re-evaluating the noisy set scans the queue once.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, overload

from moto.core.utils import unix_time_millis
from moto.sqs import models as sqs_models

from local.emulator.moto_patches.patch import Kind, Patch, Replacement
from local.fair_queues import NOISY_REFRESH_S, FairQueue, QueueSnapshot

__all__ = ["NOISY_REFRESH_S", "clock", "noisy_now", "uses_fair_queues"]

RECEIVED_AT = "_breakwater_fair_received_at"  # on a moto Message: the model's time of its last receive

_now: Callable[[], float] = time.time
_states: weakref.WeakKeyDictionary[sqs_models.Queue, FairQueue] = weakref.WeakKeyDictionary()
_states_lock = threading.Lock()
# receipt handle -> the message it was issued for, while that message lives (a delete names a handle)
_by_handle: weakref.WeakValueDictionary[str, sqs_models.Message] = weakref.WeakValueDictionary()


@contextmanager
def clock(now: Callable[[], float]) -> Iterator[None]:
    """The fair-queue model reads ``now()`` (epoch seconds) for the block instead of the wall clock."""
    global _now
    before, _now = _now, now
    try:
        yield
    finally:
        _now = before


def _group(message: sqs_models.Message) -> str | None:
    return message.group_id


def _state_for_send(queue: sqs_models.Queue) -> FairQueue:
    state = _states.get(queue)
    if state is None:
        with _states_lock:
            state = _states.get(queue)
            if state is None:
                state = _states[queue] = FairQueue()
    return state


def _finish(state: FairQueue, message: sqs_models.Message, now: float) -> None:
    """The consumer's time on ``message`` ended (deleted, or visible again): count it once."""
    received_at = message.__dict__.pop(RECEIVED_AT, None)
    if received_at is not None:
        state.finished(message.group_id, now - received_at, now)


def _refresh(queue: sqs_models.Queue, state: FairQueue, now: float) -> None:
    """Re-evaluate the noisy groups on one scan of the queue's messages (in flight and visible, by group)."""
    now_ms = unix_time_millis()
    in_flight: dict[Hashable, int] = {}
    visible: dict[Hashable, int] = {}
    total_in_flight = 0
    for message in list(queue._messages):
        group = message.group_id
        if not now_ms > message.visible_at:  # moto's Message.visible, at one instant
            total_in_flight += 1
            if group is not None:
                in_flight[group] = in_flight.get(group, 0) + 1
            continue
        _finish(state, message, now)  # received before and visible again: its visibility timeout ran out
        if group is not None and not now_ms < message.delayed_until:
            visible[group] = visible.get(group, 0) + 1
    state.refresh(now, QueueSnapshot(in_flight=in_flight, visible=visible, total_in_flight=total_in_flight))


def noisy_now(queue: sqs_models.Queue) -> frozenset[Hashable] | None:
    """The queue's noisy groups now (re-evaluated if due), or ``None`` if it does not use fair queues."""
    state = _states.get(queue)
    if state is None:
        return None
    now = _now()
    if state.due(now):
        _refresh(queue, state, now)
    return state.noisy


def uses_fair_queues(queue: sqs_models.Queue) -> bool:
    """A standard queue that was sent a message with a group id while the patch was installed."""
    return queue in _states


class FairOrder(Sequence[sqs_models.Message]):
    """``Queue.messages`` of a fair queue: iterated in receive order, counted and indexed as before.

    ``ReceiveMessage`` takes the first visible messages its iteration yields, so the order is the
    whole change; a message yielded that was received before has had its visibility run out, and
    its processing time is counted before it can be received again.
    """

    def __init__(self, queue: sqs_models.Queue, state: FairQueue, visible: Sequence[sqs_models.Message]):
        self._queue, self._state, self._visible = queue, state, visible

    def __iter__(self) -> Iterator[sqs_models.Message]:
        state = self._state
        now = _now()
        if state.due(now):
            _refresh(self._queue, state, now)
        if not state.noisy:
            messages: Iterable[sqs_models.Message] = self._visible  # moto's order, as without the patch
        else:
            # Ordered first, visibility checked after: passing over a noisy group's backlog costs a set
            # lookup a message, not moto's clock reads.
            now_ms = unix_time_millis()
            messages = (
                message
                for message in state.order(list(self._queue._messages), _group)
                if now_ms > message.visible_at and not now_ms < message.delayed_until
            )
        for message in messages:
            if RECEIVED_AT in message.__dict__:
                _finish(state, message, now)
            yield message

    def __len__(self) -> int:
        return len(self._visible)

    def __bool__(self) -> bool:
        return bool(self._visible)

    @overload
    def __getitem__(self, index: int) -> sqs_models.Message: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[sqs_models.Message]: ...
    def __getitem__(self, index: int | slice) -> sqs_models.Message | Sequence[sqs_models.Message]:
        return self._visible[index]


def _fair_messages(original: Any) -> property:
    def messages(self: sqs_models.Queue) -> Sequence[sqs_models.Message]:
        visible = original.__get__(self, type(self))
        state = _states.get(self)
        return visible if state is None else FairOrder(self, state, visible)

    return property(messages)


def _add_message(original: Any) -> Any:
    def add_message(self: sqs_models.Queue, message: sqs_models.Message) -> None:
        message.__dict__.pop(RECEIVED_AT, None)  # moved to a dead-letter queue: not in flight there
        original(self, message)
        if message.group_id is not None and not self.fifo_queue:
            _state_for_send(self).sent(message.group_id, _now())

    return add_message


def _mark_received(original: Any) -> Any:
    def mark_received(self: sqs_models.Message, visibility_timeout: int | None = None) -> None:
        original(self, visibility_timeout)
        self.__dict__[RECEIVED_AT] = _now()
        if self.receipt_handle is not None:
            _by_handle[self.receipt_handle] = self

    return mark_received


def _delete_message(original: Any) -> Any:
    def delete_message(self: sqs_models.Queue, receipt_handle: str) -> None:
        message = _by_handle.get(receipt_handle)
        original(self, receipt_handle)
        state = _states.get(self)
        if message is not None and state is not None:
            _finish(state, message, _now())

    return delete_message


def _forget() -> None:
    _states.clear()
    _by_handle.clear()


PATCHES = (
    Patch(
        name="sqs.fair_queues",
        kind=Kind.CORRECTNESS,
        corrects="moto accepts MessageGroupId on a standard queue but receives in its own order, so a "
        "tenant's backlog delays every other tenant; SQS fair queues return quiet message groups' "
        "messages before those of noisy groups (over 10% of in-flight messages with at least 30, or "
        "over 10% of recent processing time), until a noisy group's backlog is consumed or it sent "
        "nothing for 5 minutes.",
        replaces=(
            Replacement(sqs_models.Queue, "messages", _fair_messages),
            Replacement(sqs_models.Queue, "add_message", _add_message),
            Replacement(sqs_models.Queue, "delete_message", _delete_message),
            Replacement(sqs_models.Message, "mark_received", _mark_received),
        ),
        forget=_forget,
    ),
)

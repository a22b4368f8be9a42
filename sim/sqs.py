"""SQS standard queues, as AWS documents them, with fair queues for messages that carry a MessageGroupId.

Modelled (Amazon SQS Developer Guide):

- Visibility timeout: a received message stays in the queue, invisible, until it is deleted or its
  visibility timeout (from the receive) runs out; then it is visible again and its receive count grows
  with the next receive.
- Delay queues / message timers: a message sent with ``DelaySeconds`` is invisible until then.
- ReceiveMessage returns at most 10 messages; long polling returns as soon as one is there.
- Redrive policy: a receive that would take a message past ``maxReceiveCount`` moves it to the
  dead-letter queue instead of delivering it.
- Fair queues ("How Amazon SQS fair queues work"; the figures and the rule that decides the noisy
  groups are ``local.fair_queues``', shared with the embedded AWS): a message group (the tenant) is
  *noisy* when it holds more than 10 % of the queue's in-flight messages and at least 30 of them, or
  more than 10 % of the consumers' recent processing time. While noisy groups exist, receives return
  quiet groups' messages first, and noisy ones only when no quiet message waits (the noisy group with
  the fewest in-flight messages first). A noisy group is quiet again once its backlog is consumed, or
  after it sent nothing for 5 minutes. Messages without a group id are each their own group (never
  noisy; here their processing time is left out of the total too).

Not modelled: message order within a standard queue beyond "roughly first in, first out" (SQS makes
no promise either), duplicate deliveries, retention (14 days is longer than any scenario), payload
size. The queue is a set of deques and one heap: events are per receive, never per message.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable, Sequence
from typing import Protocol

import simpy

from local.fair_queues import (
    NOISY_MIN_IN_FLIGHT,
    NOISY_REFRESH_S,
    NOISY_SHARE,
    PROCESSING_WINDOW_S,
    noisy_groups,
)
from sim.messages import Message

RECEIVE_MAX = 10  # ReceiveMessage's MaxNumberOfMessages
REBASE_GROWTH = 1e100  # scaled processing times are rebased past this weight (floats reach 1e308)


class Poller(Protocol):
    """A consumer that long-polls without an event of its own (``sim.lambda_esm``'s pollers)."""

    def run(self) -> None: ...


def run_later(env: simpy.Environment, pollers: Sequence[Poller]) -> None:
    """Run ``pollers`` at the current time, after what is already due now (one event for them all)."""

    def run(_event: simpy.Event) -> None:
        for poller in pollers:
            poller.run()

    wake = env.event()
    wake.callbacks.append(run)
    wake.succeed()


class SqsQueue:
    """One standard queue (``fair``: fair-queue ordering for messages with a group id)."""

    def __init__(
        self,
        env: simpy.Environment,
        name: str,
        *,
        visibility_timeout_s: float,
        max_receive_count: int | None = None,
        dead_letter: SqsQueue | None = None,
        fair: bool = False,
    ) -> None:
        self.env = env
        self.name = name
        self.visibility_timeout_s = visibility_timeout_s
        self.max_receive_count = max_receive_count
        self.dead_letter = dead_letter
        self.fair = fair
        self._visible: deque[Message] = deque()
        self._pending: list[tuple[float, int, Message, bool]] = []  # (visible at, seq, message, in flight)
        # the load's sends, each stored at its own time later in the tick: already in time order
        self._incoming_at: deque[float] = deque()
        self._incoming: deque[Message] = deque()
        self._seq = 0
        self.visible_count = 0
        self.delayed_count = 0
        self.in_flight = 0
        self.sent = 0
        self.received = 0
        self.deleted = 0
        self.dead_lettered = 0
        self._waiters: deque[simpy.Event | Poller] = deque()
        self._alarm_at: float | None = None
        self.on_dead_letter: Callable[[Message], None] | None = None
        # fair queues
        self._held: dict[int, deque[Message]] = {}  # messages of noisy groups passed over, by group
        self._vseq: dict[int, int] = {}  # id(message) -> order it became visible (held messages only)
        self._in_flight_by_group: dict[int, int] = {}
        self._visible_by_group: dict[int, int] = {}
        self._last_sent: dict[int, float] = {}
        # Recent processing time decays exponentially; each amount is kept scaled to one reference time
        # (``_busy_origin``), so adding to it needs no decay of the others and shares compare as stored.
        self._busy: dict[int, float] = {}  # group -> processing s, scaled to the reference time
        self._busy_total = 0.0
        self._busy_origin = 0.0
        self._crowded: set[int] = set()  # groups with at least NOISY_MIN_IN_FLIGHT in flight
        self._busy_candidates: set[int] = set()
        self.noisy: set[int] = set()
        self._noisy_at = -math.inf
        self._order = 0

    # -- sizes ---------------------------------------------------------------------------------------
    @property
    def depth(self) -> int:
        """Every message the queue holds: visible, delayed and in flight."""
        return self.visible_count + self.delayed_count + self.in_flight

    def arrive(self, times: list[float], messages: list[Message]) -> None:
        """SendMessage of each of ``messages`` at its time in ``times`` (ascending, not before now).

        The load's path: one call per tick, no heap, since a tick's arrivals come in time order.
        """
        if not messages:
            return
        self.sent += len(messages)
        self.delayed_count += len(messages)
        self._incoming_at.extend(times)
        self._incoming.extend(messages)
        if self.fair:
            last = self._last_sent
            for at, message in zip(times, messages, strict=True):
                if message.group is not None:
                    last[message.group] = at
        if self._waiters:
            self._arm()

    @property
    def waiting(self) -> int:
        """ApproximateNumberOfMessages + ApproximateNumberOfMessagesDelayed (what is not being worked)."""
        return self.visible_count + self.delayed_count

    # -- send ----------------------------------------------------------------------------------------
    def send(self, message: Message, delay_s: float = 0.0) -> None:
        """SendMessage; ``delay_s`` is DelaySeconds (or, for the load, when within the tick it arrives)."""
        self.sent += 1
        message.receive_count = 0
        if self.fair and message.group is not None:
            self._last_sent[message.group] = self.env.now + max(0.0, delay_s)
        if delay_s > 0:
            self._seq += 1
            self.delayed_count += 1
            heapq.heappush(self._pending, (self.env.now + delay_s, self._seq, message, False))
            if self._waiters:
                self._arm()
            return
        self._make_visible(message)
        if self._waiters:
            self._wake_later(1)

    def _make_visible(self, message: Message) -> None:
        self._visible.append(message)
        self.visible_count += 1
        if self.fair and message.group is not None:
            group = message.group
            self._visible_by_group[group] = self._visible_by_group.get(group, 0) + 1

    # -- receive -------------------------------------------------------------------------------------
    def receive(self, count: int) -> list[Message]:
        """ReceiveMessage (at most 10): quiet groups first; a message past maxReceiveCount goes to the DLQ."""
        now = self.env.now
        if (self._pending and self._pending[0][0] <= now) or (
            self._incoming_at and self._incoming_at[0] <= now
        ):
            woke = self._release(now)
            if woke and self._waiters:
                self._wake_later(woke)
        if not self.visible_count:
            return []  # an empty receive (the usual one at low load, after every batch)
        count = min(count, RECEIVE_MAX)
        fair, limit = self.fair, self.max_receive_count
        batch: list[Message] = []
        while len(batch) < count and self.visible_count:
            if not fair:
                taken = self._take(count - len(batch))
            elif now - self._noisy_at < NOISY_REFRESH_S and not self.noisy and not self._held:
                taken = self._take_in_order(count - len(batch))  # _take_fair with nothing to pass over
            else:
                taken = self._take_fair(count - len(batch))
            before = len(batch)
            for message in taken:
                received = message.receive_count + 1
                message.receive_count = received
                if limit is not None and received > limit:
                    self._to_dead_letter(message)
                    continue
                message.received_at = now
                if fair and message.group is not None:
                    group = message.group
                    held = self._in_flight_by_group.get(group, 0) + 1
                    self._in_flight_by_group[group] = held
                    if held >= NOISY_MIN_IN_FLIGHT:
                        self._crowded.add(group)
                batch.append(message)
            self.in_flight += len(batch) - before
        self.received += len(batch)
        return batch

    def _take(self, count: int) -> list[Message]:
        visible = self._visible
        taken = [visible.popleft() for _ in range(min(count, len(visible)))]
        self.visible_count -= len(taken)
        return taken

    def _take_in_order(self, count: int) -> list[Message]:
        """A fair queue's receive while no group is noisy and none is held: the oldest first."""
        visible = self._visible
        taken = [visible.popleft() for _ in range(min(count, len(visible)))]
        self.visible_count -= len(taken)
        by_group = self._visible_by_group
        for message in taken:
            if message.group is not None:
                by_group[message.group] -= 1
        return taken

    def _take_fair(self, count: int) -> list[Message]:
        now = self.env.now
        if now - self._noisy_at >= NOISY_REFRESH_S:
            self._refresh_noisy(now)
        noisy = self.noisy
        visible = self._visible
        held = self._held
        taken: list[Message] = []
        if not noisy and not held:
            taken = [visible.popleft() for _ in range(min(count, len(visible)))]
        else:
            free = [group for group in held if group not in noisy]
            while len(taken) < count:
                while visible and visible[0].group in noisy:
                    passed = visible.popleft()
                    self._vseq[id(passed)] = self._order
                    self._order += 1
                    held.setdefault(passed.group, deque()).append(passed)  # type: ignore[arg-type]
                best: Message | None = visible[0] if visible else None
                source: int | None = None
                for group in free:
                    # a group that is quiet again is served in the order its messages arrived (held
                    # messages were passed over, so they are older than anything left in the deque)
                    head = held[group][0]
                    if source is None or self._vseq[id(head)] < self._vseq[id(best)]:
                        best, source = head, group
                if best is None:
                    break
                if source is None:
                    taken.append(visible.popleft())
                else:
                    taken.append(self._pop_held(source))
                    if source not in held:
                        free.remove(source)
            # Only noisy groups' messages are left: the one with the fewest in flight first.
            while len(taken) < count and held:
                group = min(held, key=lambda g: self._in_flight_by_group.get(g, 0))
                while len(taken) < count and group in held:
                    taken.append(self._pop_held(group))
        self.visible_count -= len(taken)
        for message in taken:
            if message.group is not None:
                self._visible_by_group[message.group] -= 1
        return taken

    def _pop_held(self, group: int) -> Message:
        queue = self._held[group]
        message = queue.popleft()
        self._vseq.pop(id(message), None)
        if not queue:
            del self._held[group]
        return message

    def _refresh_noisy(self, now: float) -> None:
        """Which groups are noisy now (see the module docstring)."""
        self._noisy_at = now
        # The candidates only (kept incrementally): groups that left the running are dropped here.
        in_flight: dict[int, int] = {}
        for group in list(self._crowded):
            held = self._in_flight_by_group.get(group, 0)
            if held < NOISY_MIN_IN_FLIGHT:
                self._crowded.discard(group)
            else:
                in_flight[group] = held
        busy_total = self._busy_total
        busy: dict[int, float] = {}
        for group in list(self._busy_candidates):
            spent = self._busy.get(group, 0.0)
            if busy_total > 0 and spent > NOISY_SHARE * busy_total:
                busy[group] = spent
            else:
                self._busy_candidates.discard(group)
        visible_by_group, last_sent = self._visible_by_group, self._last_sent
        self.noisy = noisy_groups(
            now,
            in_flight=in_flight,
            total_in_flight=self.in_flight,
            processing_s=busy,  # scaled to one reference time, as the total is: shares compare as stored
            total_processing_s=busy_total,
            previously_noisy=self.noisy,
            backlog=lambda group: visible_by_group.get(group, 0),
            last_sent=lambda group: last_sent.get(group, -math.inf),
        )

    def _growth(self, now: float) -> float:
        """What a second of processing at ``now`` weighs against one at the reference time."""
        growth = math.exp((now - self._busy_origin) / PROCESSING_WINDOW_S)
        if growth > REBASE_GROWTH:  # move the reference time up before the weights overflow
            busy = self._busy
            for group in busy:
                busy[group] /= growth
            self._busy_total /= growth
            self._busy_origin = now
            growth = 1.0
        return growth

    # -- after a receive -----------------------------------------------------------------------------
    def delete(self, messages: list[Message]) -> None:
        """DeleteMessage(Batch) of received messages (their processing time counts for fair queues)."""
        now = self.env.now
        self.in_flight -= len(messages)
        self.deleted += len(messages)
        if self.fair:
            self._leave_flight(messages, now)

    def _leave_flight(self, messages: list[Message], now: float) -> None:
        spent: dict[int, float] = {}
        in_flight = self._in_flight_by_group
        for message in messages:
            group = message.group
            if group is None:
                continue
            in_flight[group] -= 1
            spent[group] = spent.get(group, 0.0) + (now - message.received_at)
        if not spent:
            return
        growth = self._growth(now)
        total = self._busy_total + sum(spent.values()) * growth
        self._busy_total = total
        busy_of = self._busy
        for group, seconds in spent.items():
            busy = busy_of.get(group, 0.0) + seconds * growth
            busy_of[group] = busy
            if busy > NOISY_SHARE * total:
                self._busy_candidates.add(group)

    def return_after_timeout(self, messages: list[Message]) -> None:
        """Not deleted (a batch item failure): visible again when the visibility timeout runs out."""
        for message in messages:
            self._seq += 1
            heapq.heappush(
                self._pending,
                (message.received_at + self.visibility_timeout_s, self._seq, message, True),
            )
        if self._waiters:
            self._arm()

    def _to_dead_letter(self, message: Message) -> None:
        self.dead_lettered += 1
        if self.on_dead_letter is not None:
            self.on_dead_letter(message)
        self.send_to_dead_letter(message)

    def send_to_dead_letter(self, message: Message) -> None:
        """SendMessage of ``message`` to this queue's dead-letter queue by a consumer, which deletes
        its original itself (``dead_lettered`` counts SQS's redrives only)."""
        if self.dead_letter is not None:
            self.dead_letter.send(message)

    def waiting_messages(self) -> list[Message]:
        """Every visible and delayed message, without taking them (what a peek at a DLQ shows)."""
        found = list(self._visible)
        for queue in self._held.values():
            found.extend(queue)
        found.extend(entry[2] for entry in self._pending if not entry[3])
        found.extend(self._incoming)
        return found

    def unprocessed_messages(self) -> list[Message]:
        """Every message held but those a consumer has in hand: the waiting ones, and the ones whose
        processing failed until their visibility timeout runs out."""
        found = self.waiting_messages()
        found.extend(entry[2] for entry in self._pending if entry[3])
        return found

    def purge_waiting(self) -> list[Message]:
        """Take every visible and delayed message out (what the archiver parks); in-flight ones stay."""
        taken = list(self._visible)
        for queue in self._held.values():
            taken.extend(queue)
        kept: list[tuple[float, int, Message, bool]] = []
        for entry in self._pending:
            if entry[3]:
                kept.append(entry)
            else:
                taken.append(entry[2])
        taken.extend(self._incoming)
        self._incoming.clear()
        self._incoming_at.clear()
        heapq.heapify(kept)
        self._pending = kept
        self._visible.clear()
        self._held.clear()
        self._vseq.clear()
        self._visible_by_group.clear()
        self.visible_count = 0
        self.delayed_count = 0
        return taken

    # -- time ----------------------------------------------------------------------------------------
    def _release(self, now: float) -> int:
        """Delayed messages whose delay passed, and in-flight ones whose visibility timed out: how many."""
        pending = self._pending
        woke = 0
        incoming_at, incoming = self._incoming_at, self._incoming
        if incoming_at and incoming_at[0] <= now:
            # one message at a time, in one loop: a wake-up usually finds a single arrival due
            visible, fair, by_group = self._visible, self.fair, self._visible_by_group
            due = 0
            while incoming_at and incoming_at[0] <= now:
                incoming_at.popleft()
                message = incoming.popleft()
                visible.append(message)
                if fair and message.group is not None:
                    by_group[message.group] = by_group.get(message.group, 0) + 1
                due += 1
            self.visible_count += due
            self.delayed_count -= due
            woke += due
        while pending and pending[0][0] <= now:
            _, _, message, in_flight = heapq.heappop(pending)
            if in_flight:
                self.in_flight -= 1
                if self.fair and message.group is not None:
                    self._leave_flight_timeout(message, now)
            else:
                self.delayed_count -= 1
            self._make_visible(message)
            woke += 1
        return woke

    def _take_waiters(self, count: int) -> list[Poller]:
        """Up to ``count`` long polls, oldest first: events succeed now, pollers are returned to be run."""
        waiters = self._waiters
        pollers: list[Poller] = []
        while count and waiters:
            waiter = waiters.popleft()
            if isinstance(waiter, simpy.Event):
                waiter.succeed()
            else:
                pollers.append(waiter)
            count -= 1
        return pollers

    def _wake_later(self, count: int) -> None:
        """Wake up to ``count`` long polls, each after what is already due now (like an event's success)."""
        pollers = self._take_waiters(count)
        if pollers:
            run_later(self.env, pollers)

    def _leave_flight_timeout(self, message: Message, now: float) -> None:
        self._leave_flight([message], now)

    def wait(self) -> simpy.Event:
        """An event that fires when a message may be there to receive (long polling)."""
        event = self.env.event()
        self._waiters.append(event)
        self._arm()
        return event

    def wait_with(self, poller: Poller) -> None:
        """Long polling without an event of its own: ``poller.run()`` when a message may be there.

        An idle poller costs nothing while the queue is empty; the alarm that makes a message visible
        runs the pollers it wakes itself, so a message that finds an idle poller costs no extra event.
        """
        self._waiters.append(poller)
        self._arm()

    def _arm(self) -> None:
        if self._pending:
            due = self._pending[0][0]
            if self._incoming_at and self._incoming_at[0] < due:
                due = self._incoming_at[0]
        elif self._incoming_at:
            due = self._incoming_at[0]
        else:
            return
        if self._alarm_at is not None and self._alarm_at <= due:
            return
        self._alarm_at = due
        alarm = self.env.timeout(max(0.0, due - self.env.now))
        alarm.callbacks.append(self._on_alarm)

    def _on_alarm(self, _event: simpy.Event) -> None:
        now = self.env.now
        if self._alarm_at is not None and self._alarm_at <= now:
            self._alarm_at = None
        pollers = self._take_waiters(self._release(now))
        if self._waiters:
            self._arm()
        # inside the alarm's own event: nothing else is half done, so the woken pollers poll right away
        for poller in pollers:
            poller.run()

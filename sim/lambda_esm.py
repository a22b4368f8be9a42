"""Lambda's SQS event source mappings, as AWS documents them ("Using Lambda with Amazon SQS").

Modelled:

- Pollers long-poll the queue and invoke the function with a batch of up to ``BatchSize`` records;
  with ``MaximumBatchingWindowInSeconds`` they wait up to that long to fill the batch (above 10
  records a batch needs a window, as the configuration enforces).
- On-demand scaling: a mapping starts with five concurrent batches and, while messages are still
  available, adds up to 300 concurrent invocations a minute (five a second here), never above its
  ``ScalingConfig.MaximumConcurrency``; when receives come back empty it lets one go a minute. A
  message is *available* while it is visible and no poller of the mapping is free to take it: one
  that a poller finds on its way back from an invocation waited for it, however few were visible at
  any instant (at low load the busy pollers' next receives take the waiting ones one at a time, so
  the queue never shows more than a batch).
- A function's concurrency (its reserved concurrency, or the account's limit) is shared by all its
  mappings: an invocation waits for a free slot.
- Partial batch responses: the records reported failed stay in the queue and come back after their
  visibility timeout; the others are deleted when the invocation returns.
- Billing: each ReceiveMessage that returns messages is a request, and a poller waiting on an empty
  queue makes one empty long poll per :data:`LONG_POLL_S` (Lambda's pollers wait 20 seconds); each
  invocation's duration is billed rounded up to the millisecond (``billed_ms``).

A poller is callbacks on the events that concern it (not a process of its own) and an invocation is
one timeout: events are per batch, and a poller waiting on an empty queue costs none.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Generator

import simpy
from simpy.core import URGENT

from sim.billing import RECEIVE_MAX
from sim.messages import Message
from sim.sqs import SqsQueue, run_later

INITIAL_CONCURRENCY = 5  # concurrent batches a mapping starts with
SCALE_UP_PER_S = 5  # 300 more concurrent invocations a minute
SCALE_DOWN_AFTER_S = 60.0  # an idle poller is let go at most once a minute (AWS does not document the pace)
LONG_POLL_S = 20.0  # the wait of each ReceiveMessage an SQS mapping's poller makes


class Invocation:
    """What one invocation of the function did: how long it ran, and what happens when it returns.

    A handler may return a subclass that is its own ``finish`` (one object per invocation, not two).
    """

    __slots__ = ("_finish", "duration_s")

    def __init__(self, duration_s: float, finish: Callable[[], None] | None = None) -> None:
        self.duration_s = duration_s
        self._finish = finish

    def finish(self) -> None:
        if self._finish is not None:
            self._finish()

    def unsettled(self) -> list[Message]:
        """The messages of its batch it received and did not process (a handler's subclass knows)."""
        return []


Handler = Callable[[list[Message], SqsQueue, int], Invocation]


class FunctionConcurrency:
    """A function's concurrency, shared by all its mappings (None: unbounded)."""

    def __init__(self, env: simpy.Environment, limit: int | None) -> None:
        self.env = env
        self.limit = limit
        self.running = 0
        self.peak = 0
        self._waiters: deque[simpy.Event] = deque()

    def acquire(self) -> simpy.Event | None:
        """None when a slot was taken at once; else an event that fires with the slot taken."""
        if self.limit is None or self.running < self.limit:
            self.running += 1
            if self.running > self.peak:  # a test, not max(): this runs for every invocation
                self.peak = self.running
            return None
        event = self.env.event()
        self._waiters.append(event)
        return event

    def release(self) -> None:
        if self._waiters:
            self._waiters.popleft().succeed()  # the slot passes on
            return
        self.running -= 1


class EventSourceMapping:
    """One SQS event source mapping: up to ``max_concurrency`` pollers, each one batch at a time."""

    def __init__(
        self,
        env: simpy.Environment,
        queue: SqsQueue,
        handler: Handler,
        *,
        batch_size: int,
        batching_window_s: float,
        max_concurrency: int,
        function: FunctionConcurrency,
        enabled: bool = True,
    ) -> None:
        self.env = env
        self.queue = queue
        self.handler = handler
        self.batch_size = batch_size
        self.batching_window_s = batching_window_s
        self.max_concurrency = max_concurrency
        self.function = function
        self._enabled = enabled
        self.active = min(INITIAL_CONCURRENCY, max_concurrency)
        self._changed_at = 0.0
        # the last time a poller found messages that had waited for one (it was not long-polling)
        self._waited_at = -math.inf
        self._parked: deque[_Poller] = deque()
        self.busy = 0
        self.invocations = 0
        self.empty_receives = 0
        # what AWS bills: receives by the messages they returned, empty long polls, invocation milliseconds
        self.receives = [0] * (RECEIVE_MAX + 1)
        self.idle_polls = 0
        self.billed_ms = 0
        self._wanted = env.event()
        self._pollers = [_Poller(self, index) for index in range(max_concurrency)]
        for poller in self._pollers:
            # started as a process would be: an urgent event at the current time
            started = simpy.Event(env)
            started._ok = True
            started._value = None
            started.callbacks.append(poller.start)
            env.schedule(started, URGENT)
        env.process(self._scaler())

    @property
    def enabled(self) -> bool:
        return self._enabled

    @enabled.setter
    def enabled(self, value: bool) -> None:
        self._enabled = value
        if value:
            self._unpark()

    def _park(self, poller: _Poller) -> None:
        self._parked.append(poller)

    def _unpark(self) -> None:
        """The parked pollers poll again, at the current time, after what is already due now."""
        if self._parked:
            parked, self._parked = self._parked, deque()
            run_later(self.env, parked)

    def _scaler(self) -> Generator[simpy.Event, object, None]:
        """While messages are still available (visible now, or waiting for a poller in the last second),
        up to five more concurrent batches a second."""
        env, queue = self.env, self.queue
        while True:
            yield self._wanted
            self._wanted = env.event()
            # a second at the current size before each step up, as long as messages keep waiting
            while True:
                yield env.timeout(1.0)
                available = queue.visible_count or env.now - self._waited_at <= 1.0
                if not (self.active < self.max_concurrency and self._enabled and available):
                    break
                self.active = min(self.max_concurrency, self.active + SCALE_UP_PER_S)
                self._changed_at = env.now
                self._unpark()

    def _want_more(self) -> None:
        if not self._wanted.triggered and self.active < self.max_concurrency:
            self._wanted.succeed()

    def in_hand(self) -> list[Message]:
        """The messages its pollers received and did not process: a batch filling or waiting for the
        function's concurrency, and what a running invocation did not process."""
        found: list[Message] = []
        for poller in self._pollers:
            found.extend(poller._batch)
            if poller._invocation is not None:
                found.extend(poller._invocation.unsettled())
        return found

    def settle_polls(self) -> None:
        """Count the empty long polls of the pollers still waiting (at the end of a run)."""
        for poller in self._pollers:
            poller.settle_wait()


class _Poller:
    """One poller of a mapping, as callbacks on SimPy events rather than a process of its own.

    A process would cost an event per resume; a poller instead runs inside the event that concerns
    it: the queue's alarm when a message becomes visible (the queue calls :meth:`run`), the end of its
    invocation, a step of its batching window, or its slot in the function's concurrency.
    """

    __slots__ = ("_batch", "_deadline", "_invocation", "_since", "env", "index", "mapping", "queue")

    def __init__(self, mapping: EventSourceMapping, index: int) -> None:
        self.mapping = mapping
        self.env = mapping.env
        self.queue = mapping.queue
        self.index = index
        self._batch: list[Message] = []
        self._deadline = 0.0
        self._invocation: Invocation | None = None
        self._since: float | None = None  # waiting on an empty queue since (a long poll under way)

    def start(self, _event: simpy.Event) -> None:
        self.run()

    def settle_wait(self) -> None:
        """The empty long polls of the wait that ends now: one per whole :data:`LONG_POLL_S` waited.

        A wake-up that finds the message taken by another poller does not end the wait: the poll
        under way goes on, as AWS's would.
        """
        since = self._since
        if since is not None:
            self.mapping.idle_polls += int((self.env.now - since) // LONG_POLL_S)
            self._since = None

    def run(self) -> None:
        """Poll: park when not wanted, long-poll an empty queue, else take a batch to the function."""
        mapping, queue, env = self.mapping, self.queue, self.env
        while True:
            if not mapping._enabled or self.index >= mapping.active:
                self.settle_wait()
                mapping._park(self)
                return
            batch = queue.receive(mapping.batch_size)
            if batch:
                since = self._since
                if since is not None:  # the long poll that returns this batch ends a wait (settle_wait)
                    mapping.idle_polls += int((env.now - since) // LONG_POLL_S)
                    self._since = None
                else:  # back from an invocation (or a scale-up) to messages that waited for a poller
                    mapping._waited_at = env.now
                    mapping._want_more()
                mapping.receives[len(batch)] += 1
                break
            mapping.empty_receives += 1
            if (
                self.index == mapping.active - 1
                and mapping.active > min(INITIAL_CONCURRENCY, mapping.max_concurrency)
                and env.now - mapping._changed_at >= SCALE_DOWN_AFTER_S
            ):
                mapping.active -= 1  # idle pollers fall away, one at a time
                mapping._changed_at = env.now
                continue
            if self._since is None:
                self._since = env.now
            queue.wait_with(self)  # the queue calls run() when a message may be there
            return
        if len(batch) < mapping.batch_size and mapping.batching_window_s > 0:
            self._batch = batch
            self._deadline = env.now + mapping.batching_window_s
            env.timeout(min(0.1, self._deadline - env.now)).callbacks.append(self._fill)
            return
        self._invoke(batch)

    def _fill(self, _event: simpy.Event) -> None:
        mapping, env, batch = self.mapping, self.env, self._batch
        more = self.queue.receive(mapping.batch_size - len(batch))
        if more:
            mapping.receives[len(more)] += 1
            batch.extend(more)
        if len(batch) < mapping.batch_size and env.now < self._deadline:
            env.timeout(min(0.1, self._deadline - env.now)).callbacks.append(self._fill)
            return
        self._invoke(batch)

    def _invoke(self, batch: list[Message]) -> None:
        mapping = self.mapping
        if self.queue.visible_count:
            mapping._want_more()  # messages are waiting beyond this batch
        self._batch = batch
        slot = mapping.function.acquire()
        if slot is not None:
            slot.callbacks.append(self._started)
            return
        self._start(batch)

    def _started(self, _event: simpy.Event) -> None:
        self._start(self._batch)

    def _start(self, batch: list[Message]) -> None:
        mapping = self.mapping
        self._batch = []
        mapping.busy += 1
        mapping.invocations += 1
        invocation = self._invocation = mapping.handler(batch, self.queue, self.index)
        mapping.billed_ms += math.ceil(invocation.duration_s * 1000)
        self.env.timeout(invocation.duration_s).callbacks.append(self._done)

    def _done(self, _event: simpy.Event) -> None:
        mapping = self.mapping
        invocation = self._invocation
        assert invocation is not None
        self._invocation = None
        invocation.finish()
        mapping.busy -= 1
        mapping.function.release()
        self.run()

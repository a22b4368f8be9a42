"""Lambda's SQS event source mappings, as AWS documents them ("Using Lambda with Amazon SQS").

Modelled:

- Pollers long-poll the queue and invoke the function with a batch of up to ``BatchSize`` records;
  with ``MaximumBatchingWindowInSeconds`` they wait up to that long to fill the batch (above 10
  records a batch needs a window, as the configuration enforces).
- On-demand scaling: a mapping starts with five concurrent batches and, while messages wait, adds up
  to 300 concurrent invocations a minute (five a second here), never above its
  ``ScalingConfig.MaximumConcurrency``; when receives come back empty it lets one go a minute.
- A function's concurrency (its reserved concurrency, or the account's limit) is shared by all its
  mappings: an invocation waits for a free slot.
- Partial batch responses: the records reported failed stay in the queue and come back after their
  visibility timeout; the others are deleted when the invocation returns.

Each poller is one SimPy process and an invocation is one timeout: events are per batch.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Generator
from dataclasses import dataclass

import simpy

from sim.messages import Message
from sim.sqs import SqsQueue

INITIAL_CONCURRENCY = 5  # concurrent batches a mapping starts with
SCALE_UP_PER_S = 5  # 300 more concurrent invocations a minute
SCALE_DOWN_AFTER_S = 60.0  # an idle poller is let go at most once a minute (AWS does not document the pace)


@dataclass
class Invocation:
    """What one invocation of the function did: how long it ran, and what happens when it returns."""

    duration_s: float
    finish: Callable[[], None]


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
            self.peak = max(self.peak, self.running)
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
        self._parked: deque[simpy.Event] = deque()
        self.busy = 0
        self.invocations = 0
        self.empty_receives = 0
        self._wanted = env.event()
        for index in range(max_concurrency):
            env.process(self._poller(index))
        env.process(self._scaler())

    @property
    def enabled(self) -> bool:
        return self._enabled

    @enabled.setter
    def enabled(self, value: bool) -> None:
        self._enabled = value
        if value:
            self._unpark()

    def _unpark(self) -> None:
        while self._parked:
            self._parked.popleft().succeed()

    def _scaler(self) -> Generator[simpy.Event, object, None]:
        """While messages wait beyond what the pollers take, up to five more concurrent batches a second."""
        env, queue = self.env, self.queue
        while True:
            yield self._wanted
            self._wanted = env.event()
            # a second at the current size before each step up, as long as messages keep waiting
            while True:
                yield env.timeout(1.0)
                if not (self.active < self.max_concurrency and self._enabled and queue.visible_count):
                    break
                self.active = min(self.max_concurrency, self.active + SCALE_UP_PER_S)
                self._changed_at = env.now
                self._unpark()

    def _want_more(self) -> None:
        if not self._wanted.triggered and self.active < self.max_concurrency:
            self._wanted.succeed()

    def _poller(self, index: int) -> Generator[simpy.Event, object, None]:
        env, queue = self.env, self.queue
        while True:
            if not self._enabled or index >= self.active:
                parked = env.event()
                self._parked.append(parked)
                yield parked
                continue
            batch = queue.receive(self.batch_size)
            if not batch:
                self.empty_receives += 1
                if (
                    index == self.active - 1
                    and self.active > min(INITIAL_CONCURRENCY, self.max_concurrency)
                    and env.now - self._changed_at >= SCALE_DOWN_AFTER_S
                ):
                    self.active -= 1  # idle pollers fall away, one at a time
                    self._changed_at = env.now
                    continue
                yield queue.wait()
                continue
            if len(batch) < self.batch_size and self.batching_window_s > 0:
                deadline = env.now + self.batching_window_s
                while len(batch) < self.batch_size and env.now < deadline:
                    yield env.timeout(min(0.1, deadline - env.now))
                    batch.extend(queue.receive(self.batch_size - len(batch)))
            if queue.visible_count:
                self._want_more()  # messages are waiting beyond this batch
            slot = self.function.acquire()
            if slot is not None:
                yield slot
            self.busy += 1
            self.invocations += 1
            invocation = self.handler(batch, queue, index)
            yield env.timeout(invocation.duration_s)
            invocation.finish()
            self.busy -= 1
            self.function.release()

"""The simulated SQS event source mapping against what the Lambda Developer Guide documents."""

from __future__ import annotations

from collections.abc import Generator

import simpy

import sim  # noqa: F401
from sim.lambda_esm import INITIAL_CONCURRENCY, EventSourceMapping, FunctionConcurrency, Invocation
from sim.messages import Message
from sim.sqs import SqsQueue


class Recorder:
    """A handler that takes ``seconds`` per batch, fails the messages ``fail`` picks, and records."""

    def __init__(self, env: simpy.Environment, seconds: float, fail: bool = False) -> None:
        self.env = env
        self.seconds = seconds
        self.fail = fail
        self.running = 0
        self.peak = 0
        self.batches: list[tuple[float, int]] = []

    def __call__(self, batch: list[Message], queue: SqsQueue, _index: int) -> Invocation:
        self.running += 1
        self.peak = max(self.peak, self.running)
        self.batches.append((self.env.now, len(batch)))

        def finish() -> None:
            self.running -= 1
            if self.fail:
                queue.return_after_timeout(batch)
            else:
                queue.delete(batch)

        return Invocation(self.seconds, finish)


def setup(
    *,
    messages: int,
    seconds: float,
    max_concurrency: int,
    limit: int | None = None,
    fail: bool = False,
    batch_size: int = 10,
    batching_window_s: float = 0.0,
) -> tuple[simpy.Environment, SqsQueue, Recorder, EventSourceMapping]:
    env = simpy.Environment()
    queue = SqsQueue(env, "q", visibility_timeout_s=30.0, max_receive_count=2)
    for _ in range(messages):
        queue.send(Message(0, 0, None, None, 1.0, False))
    handler = Recorder(env, seconds, fail)
    mapping = EventSourceMapping(
        env,
        queue,
        handler,
        batch_size=batch_size,
        batching_window_s=batching_window_s,
        max_concurrency=max_concurrency,
        function=FunctionConcurrency(env, limit),
    )
    return env, queue, handler, mapping


def test_a_mapping_starts_with_five_concurrent_batches_and_scales_up_to_its_maximum_concurrency() -> None:
    env, _, handler, mapping = setup(messages=5000, seconds=10.0, max_concurrency=40)
    env.run(until=0.5)
    assert handler.peak == INITIAL_CONCURRENCY
    env.run(until=30)
    assert handler.peak == 40  # never above MaximumConcurrency
    assert mapping.active == 40


def test_scaling_up_adds_at_most_three_hundred_concurrent_invocations_a_minute() -> None:
    env, _, handler, _ = setup(messages=100_000, seconds=100.0, max_concurrency=1000)
    env.run(until=60)
    assert 300 <= handler.peak <= INITIAL_CONCURRENCY + 300


def test_maximum_concurrency_bounds_the_batches_in_flight() -> None:
    env, _, handler, _ = setup(messages=1000, seconds=1.0, max_concurrency=2)
    env.run(until=200)
    assert handler.peak == 2
    assert sum(size for _, size in handler.batches) == 1000
    assert max(size for _, size in handler.batches) == 10


def test_the_functions_concurrency_is_shared_by_its_mappings() -> None:
    env = simpy.Environment()
    function = FunctionConcurrency(env, 3)
    handlers = []
    for name in ("a", "b"):
        queue = SqsQueue(env, name, visibility_timeout_s=30.0)
        for _ in range(500):
            queue.send(Message(0, 0, None, None, 1.0, False))
        handler = Recorder(env, 1.0)
        handlers.append(handler)
        EventSourceMapping(
            env, queue, handler, batch_size=10, batching_window_s=0, max_concurrency=5, function=function
        )
    env.run(until=20)
    assert function.peak == 3
    assert all(handler.batches for handler in handlers)


def test_failed_records_come_back_after_the_visibility_timeout_and_then_go_to_the_dlq() -> None:
    env, queue, handler, _ = setup(messages=10, seconds=1.0, max_concurrency=2, fail=True)
    env.run(until=100)
    assert [at for at, _ in handler.batches] == [0.0, 30.0]  # received at 0, visible again 30 s later
    assert queue.dead_lettered == 10 and queue.depth == 0


def test_a_batching_window_waits_to_fill_the_batch() -> None:
    env, queue, handler, _ = setup(
        messages=0, seconds=0.1, max_concurrency=2, batch_size=50, batching_window_s=2.0
    )

    def trickle() -> Generator[simpy.Event, object, None]:
        for _ in range(50):
            queue.send(Message(0, 0, None, None, 1.0, False))
            yield env.timeout(0.02)

    env.process(trickle())
    env.run(until=10)
    # more than one receive's 10 in a batch, gathered within the window (two pollers share the trickle)
    assert max(size for _, size in handler.batches) > 10
    assert sum(size for _, size in handler.batches) == 50


def _steady(seconds: float, every_s: float, until: float) -> tuple[EventSourceMapping, Recorder]:
    """A mapping of at most 10 whose queue gets one message every ``every_s``; batches take ``seconds``."""
    env, queue, handler, mapping = setup(messages=0, seconds=seconds, max_concurrency=10)

    def arrivals() -> Generator[simpy.Event, object, None]:
        while True:
            yield env.timeout(every_s)
            queue.send(Message(0, 0, None, None, 1.0, False))

    env.process(arrivals())
    env.run(until=until)
    return mapping, handler


def test_messages_that_wait_for_a_busy_poller_scale_the_mapping_up_though_few_are_visible_at_once() -> None:
    # Five pollers busy 5.5 s each and a message a second: each poller comes back to the few that
    # waited for it and takes them all, so the queue never shows more than one receive's worth; they
    # are still "available" (Lambda Developer Guide, "Configuring scaling behavior for SQS event
    # source mappings"), and the mapping scales up.
    mapping, handler = _steady(seconds=5.5, every_s=1.0, until=60.0)
    assert mapping.active > INITIAL_CONCURRENCY
    assert handler.peak > INITIAL_CONCURRENCY


def test_messages_that_find_an_idle_poller_leave_the_mapping_at_five() -> None:
    mapping, handler = _steady(seconds=0.5, every_s=1.0, until=120.0)
    assert mapping.active == INITIAL_CONCURRENCY
    assert handler.peak == 1

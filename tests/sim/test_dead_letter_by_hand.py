"""A message that fails every time reaches a dead-letter queue after ``max_receive_count`` failed
receives in all, also when it is moved between failures (SQS counts one queue's receives only)."""

from __future__ import annotations

from dataclasses import dataclass, field

import simpy

import sim  # noqa: F401
from breakwater.envelope import Origin
from breakwater.settings import TierLimits
from breakwater.sideline import DecisionConfig
from breakwater.worker.options import concurrency_limits
from sim.gates import LeaseTable
from sim.messages import Message
from sim.sqs import SqsQueue
from sim.worker import Costs, Outcome, WorkerModel, WorkerSetup

MAX_RECEIVE_COUNT = 3
VISIBILITY_S = 5.0
ROUND_S = 10.0  # longer than the visibility timeout and any deferral's delay: one receive a round
LIMITS = TierLimits(rate=50, burst=100, consumer_rate=3, concurrency=2, concurrency_floor=1)
TENANT = 0


@dataclass
class Sink:
    """The system around one sideline worker: its queue's moves come back to it, every run fails."""

    queue: SqsQueue
    runs: int = 0
    counts: dict[str, int] = field(default_factory=dict)

    def observe(self, message: Message, role: str, now_s: float) -> None: ...

    def process(self, message: Message, at_s: float) -> tuple[Outcome, float]:
        self.runs += 1
        return "failed", 0.0

    def send_move(self, message: Message, destination: Origin, delay_s: int, after_s: float = 0.0) -> None:
        assert destination is Origin.SPILLOVER  # a sideline worker defers into its own queue
        self.queue.send(message, delay_s + after_s)

    def count(self, tenant: int, counter: str, amount: int = 1) -> None:
        self.counts[counter] = self.counts.get(counter, 0) + amount

    def report_oldest(self, role: str, age_ms: int, now_ms: int, shard: int = 0) -> None: ...
    def report_outage(self, until_ms: int) -> None: ...


def run_poison(refused_rounds: set[int], rounds: int = 12) -> tuple[Sink, SqsQueue, SqsQueue, WorkerModel]:
    """A poison message on a spillover queue, read by a sideline worker once a round; in
    ``refused_rounds`` other containers hold the tenant's concurrency, so the gate defers it."""
    env = simpy.Environment()
    dlq = SqsQueue(env, "spillover-dlq", visibility_timeout_s=VISIBILITY_S)
    queue = SqsQueue(
        env,
        "spillover",
        visibility_timeout_s=VISIBILITY_S,
        max_receive_count=MAX_RECEIVE_COUNT,
        dead_letter=dlq,
    )
    sink = Sink(queue)
    leases = LeaseTable(burst_capacity=10)
    decision = DecisionConfig(
        mode="sideline", sideline_age_ms=300_000, defer_base_seconds=1, max_defer_seconds=4
    )
    setup = WorkerSetup(decision, True, None, MAX_RECEIVE_COUNT, 60, Costs(0, 0, 0, 0, 0, 0))
    worker = WorkerModel("sideline", setup, sink, lambda _t: LIMITS, None, leases)
    queue.send(Message(TENANT, 0, None, None, 0.0, True).moved(Origin.SPILLOVER, 0))
    for round_ in range(rounds):
        env.run(until=(round_ + 1) * ROUND_S)
        now_ms = int(env.now * 1000)
        if round_ in refused_rounds:
            for other in ("other-0", "other-1"):  # the tenant's ceiling, held until just after this round
                leases.acquire_many({TENANT: concurrency_limits(LIMITS)}, other, now_ms + 1000, now_ms)
        batch = queue.receive(10)
        if batch:
            worker.handle(batch, queue, 0).finish()
    return sink, queue, dlq, worker


def test_a_poison_message_moved_between_failures_is_dead_lettered_by_the_worker() -> None:
    # each copy fails once, is deferred on its next receive, and starts its queue's count again
    sink, queue, dlq, worker = run_poison(refused_rounds={1, 3, 5, 7, 9, 11})
    assert sink.runs == MAX_RECEIVE_COUNT  # failed receives in all, across the copies
    assert sink.counts == {"failed": 3, "deferred": 2, "dead_lettered": 1}
    assert queue.depth == 0 and dlq.depth == 1
    assert queue.dead_lettered == 0  # SQS's redrive never saw it past the limit: the worker sent it
    [dead] = dlq.waiting_messages()
    assert dead.poison and dead.failed_receives is None  # redriven, it gets every receive again
    # the moves and the dead-letter copy: one SendMessageBatch entry each
    assert worker.meter.sqs_requests[1] == 3 and worker.moves_sent == 2


def test_a_copy_carries_the_receives_that_ended_unprocessed_before_its_move() -> None:
    sink, queue, _, _ = run_poison(refused_rounds={1}, rounds=2)
    [copy] = queue.waiting_messages()
    assert sink.runs == 1 and copy.failed_receives == 1 and copy.receive_count == 0 and copy.attempt == 1


def test_a_poison_message_never_moved_is_dead_lettered_by_sqs() -> None:
    sink, queue, dlq, worker = run_poison(refused_rounds=set())
    assert sink.runs == MAX_RECEIVE_COUNT
    assert sink.counts == {"failed": 3, "dead_lettered": 1}  # counted on its last failed receive
    assert queue.dead_lettered == 1 and queue.depth == 0 and dlq.depth == 1
    assert worker.moves_sent == 0 and worker.meter.sqs_requests[1] == 0

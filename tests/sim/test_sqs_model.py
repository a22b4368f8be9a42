"""The simulated SQS queue against what the SQS Developer Guide documents."""

from __future__ import annotations

from collections.abc import Generator

import simpy

import sim  # noqa: F401
from local.fair_queues import NOISY_IDLE_S
from sim.messages import Message
from sim.sqs import SqsQueue


def message(tenant: int = 0, *, group: int | None = None, at_ms: int = 0) -> Message:
    return Message(tenant, at_ms, group, None, 10.0, False)


def queue(env: simpy.Environment, **kwargs: object) -> SqsQueue:
    return SqsQueue(env, "q", visibility_timeout_s=kwargs.pop("visibility", 30.0), **kwargs)  # type: ignore[arg-type]


def run_until(env: simpy.Environment, t: float) -> None:
    env.run(until=t)


def test_a_received_message_is_invisible_until_its_visibility_timeout_then_received_again() -> None:
    env = simpy.Environment()
    q = queue(env, visibility=30.0)
    q.send(message())
    first = q.receive(10)
    assert [m.receive_count for m in first] == [1]
    q.return_after_timeout(first)  # not deleted: a batch item failure
    run_until(env, 29.9)
    assert q.receive(10) == []
    assert q.in_flight == 1
    run_until(env, 30.0)
    again = q.receive(10)
    assert again == first and again[0].receive_count == 2


def test_a_deleted_message_never_comes_back() -> None:
    env = simpy.Environment()
    q = queue(env)
    q.send(message())
    q.delete(q.receive(10))
    run_until(env, 1000)
    assert q.receive(10) == [] and q.depth == 0


def test_delay_seconds_keep_a_message_invisible_until_they_pass() -> None:
    env = simpy.Environment()
    q = queue(env)
    q.send(message(), delay_s=5.0)
    assert q.receive(10) == [] and q.delayed_count == 1
    run_until(env, 5.0)
    assert len(q.receive(10)) == 1


def test_a_receive_returns_at_most_ten_messages() -> None:
    env = simpy.Environment()
    q = queue(env)
    for _ in range(25):
        q.send(message())
    assert [len(q.receive(100)), len(q.receive(10)), len(q.receive(10)), len(q.receive(10))] == [10, 10, 5, 0]


def test_past_max_receive_count_a_message_goes_to_the_dead_letter_queue() -> None:
    env = simpy.Environment()
    dlq = SqsQueue(env, "dlq", visibility_timeout_s=30.0)
    q = queue(env, visibility=1.0, max_receive_count=3, dead_letter=dlq)
    q.send(message())
    for receive in range(1, 4):  # delivered exactly maxReceiveCount times
        batch = q.receive(10)
        assert [m.receive_count for m in batch] == [receive]
        q.return_after_timeout(batch)
        run_until(env, float(receive))
    assert q.receive(10) == []  # the fourth receive moves it instead of delivering it
    assert q.dead_lettered == 1 and dlq.depth == 1 and q.depth == 0


def test_long_polling_wakes_a_waiting_consumer_when_a_message_arrives() -> None:
    env = simpy.Environment()
    q = queue(env)
    woke: list[float] = []

    def consumer() -> Generator[simpy.Event, object, None]:
        yield q.wait()
        woke.append(env.now)

    def producer() -> Generator[simpy.Event, object, None]:
        yield env.timeout(2.5)
        q.send(message())

    env.process(consumer())
    env.process(producer())
    env.run(until=10)
    assert woke == [2.5]


def test_long_polling_wakes_when_a_delayed_message_becomes_visible() -> None:
    env = simpy.Environment()
    q = queue(env)
    woke: list[float] = []

    def consumer() -> Generator[simpy.Event, object, None]:
        yield q.wait()
        woke.append(env.now)

    q.send(message(), delay_s=4.0)
    env.process(consumer())
    env.run(until=10)
    assert woke == [4.0]


# -- fair queues ------------------------------------------------------------------------------------------


def flood(q: SqsQueue, group: int, count: int) -> None:
    for _ in range(count):
        q.send(message(group, group=group))


def test_fair_queue_a_group_over_ten_percent_and_thirty_in_flight_is_noisy_and_quiet_groups_go_first() -> (
    None
):
    env = simpy.Environment()
    q = queue(env, fair=True)
    flood(q, 0, 200)
    in_flight = [m for _ in range(4) for m in q.receive(10)]  # 40 of group 0 in flight
    assert {m.group for m in in_flight} == {0}
    flood(q, 0, 20)
    for group in range(1, 6):
        q.send(message(group, group=group))
    run_until(env, 2.0)  # the noisy set is re-evaluated
    batch = q.receive(10)
    assert 0 in q.noisy
    assert [m.group for m in batch[:5]] == [1, 2, 3, 4, 5]  # quiet groups first, though they came last
    assert {m.group for m in batch[5:]} == {0}  # then the noisy group, as no quiet message waits


def test_fair_queue_a_group_under_thirty_in_flight_is_not_noisy_by_its_share() -> None:
    env = simpy.Environment()
    q = queue(env, fair=True)
    flood(q, 0, 29)
    q.receive(10), q.receive(10), q.receive(9)  # 29 in flight: all of the queue's, but fewer than 30
    flood(q, 0, 5)
    q.send(message(1, group=1))
    run_until(env, 2.0)
    assert [m.group for m in q.receive(10)] == [0, 0, 0, 0, 0, 1]  # first in, first out
    assert q.noisy == set()


def test_fair_queue_a_group_over_ten_percent_of_recent_processing_time_is_noisy() -> None:
    env = simpy.Environment()
    q = queue(env, fair=True)
    q.send(message(0, group=0))
    for group in range(1, 4):
        q.send(message(group, group=group))
    slow = q.receive(1)  # group 0, held for a long time
    quick = q.receive(3)
    run_until(env, 0.1)
    q.delete(quick)
    run_until(env, 20.0)
    q.delete(slow)  # 20 s of processing against 0.3 s: far above 10 %
    q.send(message(0, group=0))
    q.send(message(9, group=9))
    run_until(env, 21.5)
    assert [m.group for m in q.receive(10)] == [9, 0]
    assert q.noisy == {0}


def test_fair_queue_with_several_noisy_groups_the_one_with_fewest_in_flight_goes_first() -> None:
    env = simpy.Environment()
    q = queue(env, fair=True)
    flood(q, 0, 60)
    flood(q, 1, 60)
    held = [m for _ in range(10) for m in q.receive(10)]  # 60 of group 0, 40 of group 1 in flight
    assert sum(m.group == 0 for m in held) == 60 and sum(m.group == 1 for m in held) == 40
    flood(q, 0, 10)
    run_until(env, 2.0)
    batch = q.receive(10)
    assert q.noisy == {0, 1}
    assert {m.group for m in batch} == {1}  # both noisy, no quiet message: fewest in flight first


def test_fair_queue_a_noisy_group_is_quiet_again_once_it_sent_nothing_for_five_minutes() -> None:
    env = simpy.Environment()
    q = queue(env, fair=True)
    flood(q, 0, 100)
    crowd = [m for _ in range(5) for m in q.receive(10)]
    run_until(env, 2.0)
    q.receive(1)
    assert 0 in q.noisy
    q.delete(crowd)  # the share that made it noisy is gone, but its backlog waits and it sent recently
    run_until(env, 4.0)
    q.receive(1)
    assert 0 in q.noisy
    run_until(env, NOISY_IDLE_S + 5.0)  # nothing sent for 5 minutes
    q.receive(1)
    assert 0 not in q.noisy


def test_messages_without_a_group_are_never_noisy() -> None:
    env = simpy.Environment()
    q = queue(env, fair=True)
    for _ in range(100):
        q.send(message())
    for _ in range(5):
        q.receive(10)
    run_until(env, 2.0)
    q.receive(10)
    assert q.noisy == set()

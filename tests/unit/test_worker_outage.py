"""A dependency outage: the worker's breaker opens, holds messages aside, and never spends their receives."""

from __future__ import annotations

import pytest

from breakwater.breaker import BreakerState, CircuitBreaker
from breakwater.envelope import Origin
from breakwater.sideline import DecisionConfig, Reason, SidelineDecision, hold_for_outage
from tests.unit.test_worker import (
    MAX_RECEIVE_COUNT,
    NOW,
    QUEUE_URLS,
    World,
    context,
    envelope,
    event,
    failed_ids,
)


@pytest.fixture
def world() -> World:
    return World()


def test_the_breaker_opens_doubles_while_the_outage_lasts_and_closes_on_a_probe() -> None:
    breaker = CircuitBreaker(base_s=1, max_s=4)
    assert breaker.allows(0) and breaker.state(0) is BreakerState.CLOSED
    assert breaker.record_outage(0) == 1
    assert not breaker.allows(0.5) and breaker.retry_in_s(0.5) == 1
    assert breaker.state(1) is BreakerState.HALF_OPEN and breaker.allows(1)  # a probe
    assert breaker.record_outage(1) == 3  # the probe failed: twice as long
    assert breaker.record_outage(3) == 7  # capped at max_s
    assert breaker.record_outage(7) == 11
    assert breaker.record_success() is True
    assert breaker.state(11) is BreakerState.CLOSED and breaker.record_success() is False


def test_a_breaker_rejects_windows_out_of_order() -> None:
    with pytest.raises(ValueError, match="base_s"):
        CircuitBreaker(base_s=5, max_s=1)


def test_held_live_work_is_sidelined_and_sideline_work_deferred_in_its_own_queue() -> None:
    live = DecisionConfig(max_defer_seconds=30)
    held = hold_for_outage(envelope(), 4, live)
    assert (held.action, held.reason, held.destination, held.delay_seconds) == (
        SidelineDecision.SIDELINE,
        Reason.DEPENDENCY_DOWN,
        Origin.BACKLOG,
        4,
    )
    drainer = DecisionConfig(mode="sideline", max_defer_seconds=30, defer_base_seconds=2)
    spilled = envelope(origin=Origin.SPILLOVER, attempt=3)
    held = hold_for_outage(spilled, 1, drainer)
    assert (held.action, held.destination, held.delay_seconds) == (
        SidelineDecision.DEFER,
        Origin.SPILLOVER,
        16,
    )
    assert hold_for_outage(spilled, 100, drainer).delay_seconds == 30  # never past SQS's (configured) cap


def test_an_outage_opens_the_breaker_and_the_batch_is_sidelined_not_failed(world: World) -> None:
    first, second, third = envelope("a"), envelope("b"), envelope("c")
    worker = world.worker(outage_backoff_s=2)
    world.idempotency.down = True

    response = worker.handle(event(first, second, third, receive_count=MAX_RECEIVE_COUNT), context())

    # nothing goes back to its queue, so nothing reaches the dead-letter queue on its last receive
    assert failed_ids(response) == set()
    assert world.idempotency.worked == [first.id]  # the breaker opened: the others were not tried
    assert [move.queue_url for move in world.moves] == [QUEUE_URLS[Origin.BACKLOG]] * 3
    assert {move.delay_seconds for move in world.moves} == {2}  # until the breaker's probe
    # the two not tried give back the locks the batch took for them; the failed one lost its own
    assert world.idempotency.unlocked == [[second.id, third.id]]
    assert world.outages_reported == [NOW + 2_000]
    counters = world.counters()
    assert all(counters[t] == {"sidelined": 1} for t in "abc")
    assert world.metrics.values("DependencyUnavailable", QueueRole="live") == [1]


def test_while_open_nothing_is_gated_locked_or_processed_and_a_probe_after_it_closes_it(world: World) -> None:
    worker = world.worker(outage_backoff_s=2)
    world.idempotency.down = True
    worker.handle(event(envelope()), context())
    asked, locks = len(world.leases.asked), len(world.idempotency.locked)

    world.monotonic_s += 1  # still open
    held = envelope("b")
    response = worker.handle(event(held), context())
    assert failed_ids(response) == set()
    assert world.idempotency.worked[-1] != held.id
    assert (len(world.leases.asked), len(world.idempotency.locked)) == (asked, locks)
    assert world.moves[-1].delay_seconds == 1

    world.monotonic_s += 1.5  # the window has passed; the dependency is back
    world.idempotency.down = False
    probe, after = envelope("c"), envelope("d")
    assert failed_ids(worker.handle(event(probe, after), context())) == set()
    assert world.idempotency.worked[-2:] == [probe.id, after.id]
    assert world.counters()["c"] == {"processed": 1}


def test_a_failed_probe_opens_the_breaker_for_longer(world: World) -> None:
    worker = world.worker(outage_backoff_s=2)
    world.idempotency.down = True
    worker.handle(event(envelope()), context())
    world.monotonic_s += 2
    worker.handle(event(envelope()), context())
    assert world.outages_reported == [NOW + 2_000, NOW + 4_000]
    assert world.moves[-1].delay_seconds == 4


def test_a_sideline_drainer_defers_its_work_back_into_its_own_queue(world: World) -> None:
    worker = world.worker("sideline", outage_backoff_s=2)
    world.idempotency.down = True
    spilled = envelope(origin=Origin.SPILLOVER)
    assert failed_ids(worker.handle(event(spilled), context())) == set()
    assert world.moves[-1].queue_url == QUEUE_URLS[Origin.SPILLOVER]
    assert world.counters()["acme"] == {"deferred": 1}


def test_without_a_breaker_an_outage_is_a_failure_like_any_other(world: World) -> None:
    worker = world.worker(sidelining_enabled=False)
    world.idempotency.down = True
    doomed = envelope()
    response = worker.handle(event(doomed, receive_count=MAX_RECEIVE_COUNT), context())
    assert failed_ids(response) == {"m0"}
    assert world.moves == [] and world.outages_reported == []
    assert world.counters()["acme"] == {"failed": 1, "dead_lettered": 1}

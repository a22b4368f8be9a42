"""Floor leases that lapse instead of being given back (against the fake ports of tests/unit/test_worker.py,
the clocks injected): once a container knows how long its messages take, a tenant's floor lease is
taken to end soon after the tenant's last message of the batch and no release is written; a message
that may outlast it renews it first; a lease expected to outlive the tenant by more than
``LAPSE_MS`` is given back as before."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import pytest

from breakwater.concurrency import (
    LAPSE_MS,
    TERM_MAX_MS,
    TERM_SLACK_MS,
    ConcurrencyLimits,
    Grant,
    LeaseTerms,
)
from breakwater.envelope import Envelope
from breakwater.processor import WorkContext
from breakwater.worker import Worker
from tests.unit import test_worker
from tests.unit.test_worker import NOW, FakeLeases, World, context, envelope, event

world = test_worker.world  # the fixture


class TimedLeases(FakeLeases):
    """Floor leases that remember the expiry each tenant's was taken (or renewed) to."""

    def __init__(self) -> None:
        super().__init__()
        self.until: dict[str, int | None] = {}
        self.renewed: list[tuple[str, int]] = []

    def acquire_many(
        self,
        requests: Mapping[str, ConcurrencyLimits],
        expires_at_ms: int,
        floor_until: Mapping[str, int] | None = None,
    ) -> dict[str, Grant]:
        self.until |= {tenant: (floor_until or {}).get(tenant) for tenant in requests}
        return super().acquire_many(requests, expires_at_ms, floor_until)

    def renew(self, tenant: str, limits: ConcurrencyLimits, until_ms: int) -> bool:
        self.renewed.append((tenant, until_ms))
        return True


def _timed(world: World, seconds_per_message: dict[str, float]) -> tuple[Worker, TimedLeases, list[int]]:
    """A worker whose messages take the given time each (its clocks move as they run)."""
    leases = world.leases = TimedLeases()
    worker = world.worker(lapsing=True)
    clock = [NOW]
    worker.ports.clock_ms = lambda: clock[0]
    process = worker.ports.process

    def timed(envelope: Envelope, work: WorkContext) -> dict[str, Any]:
        spent = seconds_per_message.get(envelope.tenant, 0.0)
        clock[0] += int(spent * 1000)
        world.monotonic_s += spent
        return process(envelope, work)

    worker.ports.process = timed
    return worker, leases, clock


def test_a_container_that_knows_its_message_times_leaves_the_floor_lease_to_lapse(world: World) -> None:
    worker, leases, clock = _timed(world, {"acme": 0.02, "globex": 0.02})

    worker.handle(event(envelope("acme"), envelope("globex")), context())  # nothing estimated yet
    assert leases.until == {"acme": None, "globex": None}  # the invocation's leases, given back
    assert [grants for grants, _ in world.settled] == [{"acme": Grant.FLOOR}, {"globex": Grant.FLOOR}]

    world.settled.clear()
    start = clock[0]
    worker.handle(event(envelope("acme"), envelope("globex"), envelope("acme")), context())

    # each lease lasts to its tenant's last message as expected (these never vary), and a margin
    each = worker.terms.message_ms("acme")
    assert each is not None and 15 <= each <= 25
    assert abs(leases.until["acme"] - (start + 3 * each + TERM_SLACK_MS)) <= 1
    assert abs(leases.until["globex"] - (start + 2 * each + TERM_SLACK_MS)) <= 1
    # the counters the messages would count went with the lease writes; no release, nothing after
    assert world.leases.rode == [{"acme": {"processed": 2}, "globex": {"processed": 1}}]
    assert world.settled == []
    worker.handle(event(envelope("acme")), context())
    worker.flush_kept_counters(force=True)  # nothing kept
    assert world.settled == []
    assert world.counters() == {"acme": {"processed": 3}, "globex": {"processed": 1}}  # the first cleared
    assert leases.renewed == []


def test_what_turns_out_otherwise_than_counted_ahead_is_written_at_once(world: World) -> None:
    worker, _leases, _clock = _timed(world, {"acme": 0.02})
    worker.handle(event(envelope("acme")), context())  # timed
    world.settled.clear()
    world.idempotency.failing.add((failing := envelope("acme")).id)

    worker.handle(event(envelope("acme"), failing), context())

    # two counted processed ahead; one failed: the difference goes out at once, without a release
    assert world.leases.rode[-1] == {"acme": {"processed": 2}}
    assert world.settled == [({}, {"acme": {"processed": -1, "failed": 1}})]
    assert world.counters()["acme"] == {"processed": 1, "failed": 1}  # (the first batch's cleared)


def test_a_message_that_may_outlast_the_lease_renews_it_for_the_invocation_and_gives_it_back(
    world: World,
) -> None:
    worker, leases, clock = _timed(world, {"acme": 0.01, "slow": 0.01})
    worker.handle(event(envelope("acme"), envelope("slow")), context())  # both estimated at 10 ms
    world.settled.clear()
    worker.terms.observe("slow", 0.01)

    # slow's messages now take 2 s each: the leases, taken for some 10 ms a message, would lapse
    process = worker.ports.process

    def slower(envelope: Envelope, work: WorkContext) -> dict[str, Any]:
        if envelope.tenant == "slow":
            clock[0] += 2_000
            world.monotonic_s += 2.0
        return process(envelope, work)

    worker.ports.process = slower
    start = clock[0]
    worker.handle(event(envelope("slow"), envelope("slow"), envelope("acme")), context())

    # slow's before its second message, acme's before its only one (slow's took its time): the
    # estimate was wrong, so each to the end of the invocation, and given back at the tenant's end
    # (two writes, as a lease the container cannot time costs; never one per message)
    assert [tenant for tenant, _ in leases.renewed] == ["slow", "acme"]
    invocation_end = start + context().get_remaining_time_in_millis() + 1000
    assert all(until >= invocation_end - 100 for _, until in leases.renewed)
    assert [grants for grants, _ in world.settled] == [{"slow": Grant.FLOOR}, {"acme": Grant.FLOOR}]


def test_a_lease_expected_to_outlive_its_tenant_by_more_than_the_lapse_is_given_back(world: World) -> None:
    worker, _leases, _clock = _timed(world, {})
    worker.terms.observe("acme", 0.5)  # thought slower than it turns out: a lease of over half a second
    assert (worker.terms.until_ms(NOW, ["acme"]) or 0) - NOW > LAPSE_MS

    worker.handle(event(envelope("acme")), context())  # the message takes no time at all

    assert world.leases.rode == [{"acme": {"processed": 1}}]  # counted ahead with the lease
    assert world.settled == [({"acme": Grant.FLOOR}, {})]  # then given back


def test_a_tenant_whose_messages_take_long_gets_the_invocation_s_lease(world: World) -> None:
    worker, leases, _clock = _timed(world, {})
    worker.terms.observe("slow", TERM_MAX_MS / 1000)  # its work: a release is little beside it

    worker.handle(event(envelope("slow")), context())

    assert leases.until == {"slow": None}  # no lapsing term
    assert world.leases.rode == []  # nothing counted ahead
    assert world.settled == [({"slow": Grant.FLOOR}, {"slow": {"processed": 1}})]


def test_lease_terms_add_deviations_and_give_no_term_to_a_tenant_not_timed() -> None:
    terms = LeaseTerms(weight=0.5)
    assert terms.until_ms(0, ["acme"]) is None  # nothing timed: no lapsing lease
    terms.observe("acme", 0.1)
    terms.observe("acme", 0.3)
    assert terms.message_ms("acme") == pytest.approx(200.0)  # mean 0.2 s, standard deviation 0.1 s
    assert terms.until_ms(1_000, ["acme"]) == 1_000 + 500 + TERM_SLACK_MS  # 0.2 + 3 x 0.1 s
    assert terms.message_ms("globex") is None
    assert terms.until_ms(1_000, ["acme", "globex"]) is None  # its own tenant not timed here
    # another tenant's message before it is estimated from the container's (here acme's) times
    deviation = math.sqrt(2 * 0.01)
    assert terms.until_ms(1_000, ["globex", "acme"]) == 1_000 + int((0.4 + 3 * deviation) * 1000) + 50

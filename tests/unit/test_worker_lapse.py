"""Floor leases that lapse instead of being given back (against the fake ports of tests/unit/test_worker.py,
the clocks injected): once a container knows how long its messages take, a tenant's floor lease is
taken to end soon after the tenant's last message of the batch and no release is written; a message
that may outlast it renews it first; a lease expected to outlive the tenant by more than
``LAPSE_MS`` is given back as before."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from breakwater.concurrency import (
    LAPSE_MS,
    TERM_FACTOR,
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

    # each lease lasts to its tenant's last message, twice as long as expected, and a margin
    each = worker.terms.message_ms("acme")
    assert each is not None and 15 <= each <= 25
    assert leases.until["acme"] == start + int(TERM_FACTOR * 3 * each) + TERM_SLACK_MS
    assert leases.until["globex"] == start + int(TERM_FACTOR * 2 * each) + TERM_SLACK_MS
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


def test_a_message_that_may_outlast_the_lease_renews_it_first(world: World) -> None:
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

    # slow's before its second message, acme's before its only one (slow's took its time): each to
    # the expected end of the tenant's last message from then on
    assert [tenant for tenant, _ in leases.renewed] == ["slow", "acme"]
    assert leases.renewed[0][1] > start + 2_000 and leases.renewed[1][1] > start + 4_000
    assert all(grants == {} for grants, _ in world.settled)  # and still no release


def test_a_lease_expected_to_outlive_its_tenant_by_more_than_the_lapse_is_given_back(world: World) -> None:
    worker, _leases, _clock = _timed(world, {})
    worker.terms.observe("acme", 1.0)  # thought slow: a lease of seconds
    assert (worker.terms.until_ms(NOW, ["acme"]) or 0) - NOW > LAPSE_MS

    worker.handle(event(envelope("acme")), context())  # the message takes no time at all

    assert world.leases.rode == [{"acme": {"processed": 1}}]  # counted ahead with the lease
    assert world.settled == [({"acme": Grant.FLOOR}, {})]  # then given back


def test_lease_terms_estimate_per_tenant_and_fall_back_on_the_container() -> None:
    terms = LeaseTerms(weight=0.5)
    assert terms.until_ms(0, ["acme"]) is None  # nothing timed: no lapsing lease
    terms.observe("acme", 0.1)
    terms.observe("acme", 0.3)
    assert terms.message_ms("acme") == 200.0
    assert terms.message_ms("globex") == 200.0  # a tenant not seen: the container's mean
    terms.observe("globex", 1.0)
    assert terms.until_ms(1_000, ["acme", "globex"]) == 1_000 + int(TERM_FACTOR * 1_200) + TERM_SLACK_MS

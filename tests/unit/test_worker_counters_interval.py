"""Counters that ride on no release (a sharded tenant's, a refused tenant's) go out at most once per
interval per container; a small tenant's with its release at every batch (against the fake ports of
tests/unit/test_worker.py, the clock injected). The World's containers give every lease back
(tests/unit/test_worker_lapse.py: leases that lapse)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from itertools import pairwise

from breakwater.concurrency import COUNTERS_WRITES_PER_S, Grant, counters_interval_s
from breakwater.settings import TierLimits
from breakwater.worker import Worker
from tests.unit import test_worker
from tests.unit.test_worker import LIMITS, World, context, envelope, event

BIG = TierLimits(rate=5_000, burst=10_000, consumer_rate=5_000, concurrency=1_000, concurrency_floor=100)
world = test_worker.world  # the fixture
CONTAINERS = 1_000  # worker containers that may receive a tenant's messages at once
INTERVAL_S = counters_interval_s(CONTAINERS)


def _worker(world: World) -> tuple[Worker, list[tuple[float, dict[str, Grant], dict[str, dict[str, int]]]]]:
    """A worker on which ``big`` is a sharded tenant and ``acme`` a small one; each settle with its time."""
    worker = world.worker()
    worker.config = replace(worker.config, counters_interval_s=INTERVAL_S)
    worker.ports.tenant_limits = lambda tenant: BIG if tenant == "big" else LIMITS
    writes: list[tuple[float, dict[str, Grant], dict[str, dict[str, int]]]] = []

    def settle(
        grants: Mapping[str, Grant], counters: Mapping[str, Mapping[str, int]]
    ) -> dict[str, dict[str, int]]:
        writes.append((world.monotonic_s, dict(grants), {tenant: dict(d) for tenant, d in counters.items()}))
        return world.settle(grants, counters)

    worker.ports.settle = settle
    return worker, writes


def _batch(world: World, worker: Worker, at_s: float, *tenants: str) -> None:
    world.monotonic_s = at_s
    response = worker.handle(event(*(envelope(tenant) for tenant in tenants)), context())
    assert response == {"batchItemFailures": []}


def test_a_sharded_tenant_s_counters_are_written_at_most_once_per_interval_and_none_is_lost(
    world: World,
) -> None:
    worker, writes = _worker(world)

    _batch(world, worker, 1_000.0, "big", "big", "big")  # the first: written
    _batch(world, worker, 1_001.0, "big", "big")  # within the interval: kept
    _batch(world, worker, 1_002.0, "acme")  # still within it: kept, though the batch settles acme
    _batch(world, worker, 1_000.0 + INTERVAL_S + 0.5, "acme")  # past it: written, without big in the batch
    _batch(world, worker, 1_003.5, "big")  # kept again
    _batch(world, worker, 1_003.5 + INTERVAL_S, "acme")  # its interval passed: written

    big_writes = [(at, counters["big"]) for at, _, counters in writes if "big" in counters]
    assert [at for at, _ in big_writes] == [1_000.0, 1_000.0 + INTERVAL_S + 0.5, 1_003.5 + INTERVAL_S]
    times = [at for at, _ in big_writes]
    assert all(later - earlier >= INTERVAL_S for earlier, later in pairwise(times))
    assert [counters for _, counters in big_writes] == [{"processed": 3}, {"processed": 2}, {"processed": 1}]
    assert sum(counters["processed"] for _, counters in big_writes) == 6  # every message counted once
    # its lease went back at every batch that took one, counters or not
    assert [grants for _, grants, _ in writes if "big" in grants] == [{"big": Grant.FLOOR}] * 3


def test_a_small_tenant_s_release_and_counters_go_out_together_at_every_batch(world: World) -> None:
    worker, writes = _worker(world)

    for _ in range(3):  # the clock stands still: a sharded tenant's counters would all be kept
        _batch(world, worker, 1_000.0, "acme", "big", "acme")

    acme = [(grants.get("acme"), counters.get("acme")) for _, grants, counters in writes if "acme" in grants]
    assert acme == [(Grant.FLOOR, {"processed": 2})] * 3  # one write per batch: lease and counters
    assert [counters["big"] for _, _, counters in writes if "big" in counters] == [{"processed": 1}]


def test_the_interval_bounds_the_writes_of_every_container_that_may_count_a_tenant() -> None:
    assert CONTAINERS / INTERVAL_S <= COUNTERS_WRITES_PER_S
    assert counters_interval_s(4) < 0.05  # a small fleet writes at almost every batch


def test_a_refused_small_tenant_s_counters_wait_for_the_interval(world: World) -> None:
    worker, writes = _worker(world)
    worker.ports.leases.acquire_many = lambda requests, expires_at_ms, floor_until=None: {  # type: ignore[method-assign,union-attr]
        tenant: Grant.REFUSED for tenant in requests
    }

    _batch(world, worker, 1_000.0, "acme")  # refused: its messages deferred, counted, written once
    _batch(world, worker, 1_001.0, "acme")  # within the interval: kept
    _batch(world, worker, 1_000.0 + INTERVAL_S, "acme")  # past it: written with what was kept

    acme = [counters["acme"] for _, _, counters in writes if "acme" in counters]
    assert len(acme) == 2
    assert sum(sum(deltas.values()) for deltas in acme) == 3 * sum(acme[0].values())  # none lost

"""Organic growth follows use both ways: a tenant that stops using its growth is looked at every run
(no counter write needs to mark it) and gives it back a step a run."""

from __future__ import annotations

import pytest

from bench.controller import LIMITS, MemoryStore
from breakwater.backpressure import BackpressurePolicy
from breakwater.controller import ControllerConfig, ControllerReport, run_controller

CONFIG = ControllerConfig(
    backpressure=BackpressurePolicy(
        backlog_target=100, min_multiplier=0.1, growth_step=0.1, max_multiplier=2.0
    ),
    healthy_age_s=60,
)


def run(store: MemoryStore) -> ControllerReport:
    store.now_ms += 60_000
    return run_controller(CONFIG, store.ports(), deadline_ms=store.now_ms + 45_000)


def admitted_at(store: MemoryStore, tenant: str, share: float, *, throttled: int = 0) -> None:
    """A minute of ``share`` of the tenant's current limit admitted (and processed), and ``throttled``."""
    limit = LIMITS.rate * store.buckets.get(tenant, 1.0)
    store.write(
        tenant, {"accepted": share * limit * 60, "processed": share * limit * 60, "throttled": throttled}
    )


def test_a_tenant_grown_at_its_limit_gives_the_growth_back_when_it_goes_quiet() -> None:
    store = MemoryStore()
    admitted_at(store, "busy", 0.0)
    run(store)  # first sight: nothing measured yet
    for _ in range(5):
        admitted_at(store, "busy", 1.0)
        run(store)
    assert store.buckets["busy"] == pytest.approx(1.5)

    shrunk = []
    for _ in range(5):  # no traffic at all: no counter write marks the tenant
        report = run(store)
        shrunk.append(report.changes["shrink"])
    assert shrunk == [1, 1, 1, 1, 1]
    assert store.buckets["busy"] == pytest.approx(1.0)
    assert run(store).shards.evaluated == 0  # back at 1: no longer looked at


def test_one_throttled_burst_in_a_quiet_minute_does_not_grow_the_tenant() -> None:
    store = MemoryStore()
    admitted_at(store, "bursty", 0.0)
    run(store)
    for _ in range(3):
        admitted_at(store, "bursty", 0.1, throttled=5)  # 10 % of its limit, one throttled burst
        report = run(store)
        assert report.changes["grow"] == 0
    assert store.buckets.get("bursty", 1.0) == 1.0

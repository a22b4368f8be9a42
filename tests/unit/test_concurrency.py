"""Concurrency leases: the floor is guaranteed, the ceiling holds, expired leases stop counting."""

from __future__ import annotations

import pytest

from breakwater.concurrency import ConcurrencyLimits, CrowdedFloors, Grant, Lease, grant_for, live_leases

NOW = 1_000_000
LIMITS = ConcurrencyLimits(floor=2, ceiling=4)


def leases(count: int, *, expires: int = NOW + 60_000, burst: bool = False) -> dict[str, Lease]:
    return {f"c{i}": Lease(expires_at_ms=expires, burst=burst) for i in range(count)}


def test_below_the_floor_is_always_granted_even_with_a_full_pool() -> None:
    assert grant_for("me", leases(1), LIMITS, burst_in_use=100, burst_capacity=0, now_ms=NOW) is Grant.FLOOR


def test_between_floor_and_ceiling_is_a_burst_lease_when_the_pool_has_room() -> None:
    assert grant_for("me", leases(2), LIMITS, burst_in_use=3, burst_capacity=4, now_ms=NOW) is Grant.BURST


def test_between_floor_and_ceiling_is_refused_when_the_pool_is_full() -> None:
    assert grant_for("me", leases(3), LIMITS, burst_in_use=4, burst_capacity=4, now_ms=NOW) is Grant.REFUSED


def test_unbounded_pool_leaves_only_the_ceiling() -> None:
    assert (
        grant_for("me", leases(3), LIMITS, burst_in_use=10**6, burst_capacity=None, now_ms=NOW) is Grant.BURST
    )


def test_the_ceiling_is_never_exceeded() -> None:
    assert (
        grant_for("me", leases(4), LIMITS, burst_in_use=0, burst_capacity=None, now_ms=NOW) is Grant.REFUSED
    )


def test_expired_leases_free_their_slots() -> None:
    held = {**leases(4, expires=NOW), **leases(0)}
    assert live_leases(held, NOW) == {}
    assert grant_for("me", held, LIMITS, burst_in_use=0, burst_capacity=None, now_ms=NOW) is Grant.FLOOR


def test_a_holder_renewing_its_live_lease_keeps_its_kind() -> None:
    held = {**leases(3), "me": Lease(expires_at_ms=NOW + 1, burst=True)}
    assert grant_for("me", held, LIMITS, burst_in_use=99, burst_capacity=1, now_ms=NOW) is Grant.BURST


def test_limits_must_be_ordered() -> None:
    with pytest.raises(ValueError, match="floor"):
        ConcurrencyLimits(floor=3, ceiling=2)


def test_a_tenant_whose_floor_was_found_taken_reads_first_for_a_while() -> None:
    floors = CrowdedFloors(for_ms=5_000)
    assert not floors.crowded("acme", NOW)  # never found taken: write without reading

    floors.found_taken("acme", NOW)

    assert floors.crowded("acme", NOW)
    assert floors.crowded("acme", NOW + 4_999)
    assert not floors.crowded("acme", NOW + 5_000)  # worth a write without reading again
    assert not floors.crowded("globex", NOW)  # tenants are independent


def test_finding_the_floor_taken_again_extends_the_while() -> None:
    floors = CrowdedFloors(for_ms=5_000)
    floors.found_taken("acme", NOW)
    floors.found_taken("acme", NOW + 4_000)
    assert floors.crowded("acme", NOW + 8_999)
    assert not floors.crowded("acme", NOW + 9_000)

"""Concurrency leases: the floor is guaranteed, the ceiling holds, expired leases stop counting."""

from __future__ import annotations

import pytest

from breakwater.concurrency import (
    COUNTERS_WRITES_PER_S,
    LEASE_SHARD_PLACES,
    MAX_TENANT_CONCURRENCY,
    ConcurrencyLimits,
    CrowdedFloors,
    Grant,
    Lease,
    counters_interval_s,
    grant_for,
    lease_shard_count,
    lease_shard_of,
    live_leases,
    second_lease_shard,
    shard_limits,
)

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


@pytest.mark.parametrize(
    "floor, ceiling", [(1, 1), (1, 16), (16, 16), (1, 17), (5, 100), (80, 100), (1000, 1000)]
)
def test_lease_shards_add_up_to_the_tenant_and_none_holds_more_than_its_places(
    floor: int, ceiling: int
) -> None:
    limits = ConcurrencyLimits(floor=floor, ceiling=ceiling)
    shards = [shard_limits(limits, shard) for shard in range(lease_shard_count(limits))]
    assert sum(shard.floor for shard in shards) == floor
    assert sum(shard.ceiling for shard in shards) == ceiling
    assert all(shard.ceiling <= LEASE_SHARD_PLACES for shard in shards)
    assert (len(shards) == 1) == (ceiling <= LEASE_SHARD_PLACES)


def test_a_container_leases_in_a_stable_shard_and_its_second_choice_is_another() -> None:
    holders = [f"container-{index}" for index in range(400)]
    firsts = [lease_shard_of("premium", holder, 8) for holder in holders]
    assert firsts == [lease_shard_of("premium", holder, 8) for holder in holders]
    assert set(firsts) == set(range(8))  # every shard is someone's
    seconds = [second_lease_shard("premium", holder, 8) for holder in holders]
    assert all(second != first for first, second in zip(firsts, seconds, strict=True))
    # the containers of one full shard spread over the others rather than all trying the same one
    of_shard_0 = {second for first, second in zip(firsts, seconds, strict=True) if first == 0}
    assert len(of_shard_0) >= 5
    assert second_lease_shard("premium", "container-0", 1) is None


def test_counters_that_ride_on_no_release_are_written_at_most_so_often_by_all_containers() -> None:
    for containers in (1, 17, 1_000, 8_000):
        # every container that may receive the tenant's messages writes once per interval at most
        assert containers / counters_interval_s(containers) <= COUNTERS_WRITES_PER_S


def test_a_record_beyond_the_bounds_is_clamped_not_refused() -> None:
    assert ConcurrencyLimits.clamped(floor=5000, ceiling=5000) == ConcurrencyLimits(
        floor=MAX_TENANT_CONCURRENCY, ceiling=MAX_TENANT_CONCURRENCY
    )
    assert ConcurrencyLimits.clamped(floor=10, ceiling=4) == ConcurrencyLimits(floor=4, ceiling=4)
    assert ConcurrencyLimits.clamped(floor=0, ceiling=0) == ConcurrencyLimits(floor=1, ceiling=1)

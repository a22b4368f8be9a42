"""Per-tenant concurrency: leases that expire, a guaranteed floor and a burst ceiling.

A worker container processes a batch sequentially, so the parallelism a tenant gets is the number of
containers working on it at once. Each container holds at most one lease per tenant (its id is the
container's), acquired once per batch and released after it: the cost is bounded by tenants per
batch, never by messages. Every lease carries an expiry (the end of the invocation that took it),
so a container that crashes cannot leak a slot: its lease simply stops counting.

Up to ``floor`` leases a tenant is always granted. Above the floor, up to ``ceiling``, a lease is a
*burst* lease and also needs room in the shared burst pool, so bursting tenants cannot together
occupy the whole worker fleet and starve the floors of the others.
A floor lease can be taken with one conditional write, without reading the tenant's item first;
:class:`CrowdedFloors` remembers the tenants whose floor such a write found taken, whose batches
read first for a while. Everything here is pure; ``now`` is injected.

A tenant whose ceiling is above :data:`LEASE_SHARD_PLACES` has its leases spread over shards of at most
that many places (:func:`lease_shard_count`, :func:`shard_limits`): a container leases in the shard its
id hashes to (:func:`lease_shard_of`), and in one other (:func:`second_lease_shard`) when that one is
full. No lease item grows with the tenant's concurrency, and each is written only by the containers
hashed to it. A tenant's counters that ride on no lease release (a sharded tenant's always, a refused
tenant's) are written by each container at most every :func:`counters_interval_s`.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import NamedTuple, TypeVar

K = TypeVar("K")  # how a map of leases is keyed (a holder, or a tenant and holder)

CROWDED_MS = 5_000  # after a tenant's floor was found taken, its batches read before writing this long
# The burst pool is split into items of at most this many places, so no item grows with the fleet's
# concurrency (an item holds at most 400 KB) and each shard is written only by the containers hashed to it.
POOL_SHARD_PLACES = 16
# A tenant's leases are split the same way once its ceiling is above this many.
LEASE_SHARD_PLACES = 16
# The most concurrency a tenant is given, whatever its tier or record says: the bound the synth-time
# item size and write rate checks are made at (a record above it is clamped, not refused).
MAX_TENANT_CONCURRENCY = 1000
# A tenant's counters item takes at most this many writes per second of counters alone from all the
# containers that receive its messages together (each writes them at most every ``counters_interval_s``),
# leaving the rest of a partition's write limit to releases, ingest's flushes and the controller.
COUNTERS_WRITES_PER_S = 400


def pool_shard_capacities(burst_capacity: int) -> list[int]:
    """The places of each burst pool shard: ``burst_capacity`` spread as evenly as it goes."""
    if burst_capacity < 1:
        raise ValueError(f"burst_capacity must be at least 1, got {burst_capacity}")
    return _spread(burst_capacity, -(-burst_capacity // POOL_SHARD_PLACES))


def pool_shard_of(holder: str, shards: int) -> int:
    """The pool shard a container (``holder``) takes its burst places in: stable across its batches."""
    return zlib.crc32(holder.encode()) % shards


def _spread(total: int, shards: int) -> list[int]:
    base, extra = divmod(total, shards)
    return [base + (1 if index < extra else 0) for index in range(shards)]


class Grant(StrEnum):
    FLOOR = "floor"
    BURST = "burst"
    REFUSED = "refused"


class Lease(NamedTuple):
    """A holder's lease (a named tuple: one is built for every lease read or taken)."""

    expires_at_ms: int
    burst: bool = False


def live_leases(leases: Mapping[K, Lease], now_ms: int) -> dict[K, Lease]:
    """The leases that still count; expired ones belong to finished or crashed containers."""
    return {lease_id: lease for lease_id, lease in leases.items() if lease.expires_at_ms > now_ms}


@dataclass(frozen=True)
class ConcurrencyLimits:
    """A tenant's floor and ceiling, or one lease shard's share of them (whose floor may be 0)."""

    floor: int
    ceiling: int

    def __post_init__(self) -> None:
        if self.floor < 0 or self.ceiling < max(self.floor, 1):
            raise ValueError(
                f"need 0 <= floor <= ceiling, 1 <= ceiling, got floor={self.floor} ceiling={self.ceiling}"
            )

    @classmethod
    def clamped(cls, floor: int, ceiling: int) -> ConcurrencyLimits:
        """A tenant's limits as its tier or record gives them, within what the design is sized for: the
        ceiling at most :data:`MAX_TENANT_CONCURRENCY`, the floor at least 1 and at most the ceiling."""
        ceiling = max(1, min(ceiling, MAX_TENANT_CONCURRENCY))
        return cls(floor=max(1, min(floor, ceiling)), ceiling=ceiling)


def lease_shard_count(limits: ConcurrencyLimits) -> int:
    """How many items the tenant's leases are spread over (1: its counters item holds them)."""
    return -(-limits.ceiling // LEASE_SHARD_PLACES)


def shard_limits(limits: ConcurrencyLimits, shard: int) -> ConcurrencyLimits:
    """Shard ``shard``'s share of the tenant's floor and ceiling, both spread as evenly as they go (the
    shards' floors add up to the tenant's floor, their ceilings to its ceiling)."""
    shards = lease_shard_count(limits)
    return ConcurrencyLimits(
        floor=_spread(limits.floor, shards)[shard], ceiling=_spread(limits.ceiling, shards)[shard]
    )


def lease_shard_of(tenant: str, holder: str, shards: int) -> int:
    """The shard a container (``holder``) first leases ``tenant`` in: stable across its batches."""
    return zlib.crc32(f"{tenant}#{holder}".encode()) % shards


def second_lease_shard(tenant: str, holder: str, shards: int) -> int | None:
    """The other shard a container tries when its own is full (None with a single shard): another
    hash, so the containers of a full shard spread over the others instead of all trying one."""
    if shards < 2:
        return None
    first = lease_shard_of(tenant, holder, shards)
    step = 1 + zlib.crc32(f"{holder}#{tenant}".encode()) % (shards - 1)
    return (first + step) % shards


def lease_shard_order(tenant: str, holder: str, shards: int) -> list[int]:
    """The shards a container tries to lease ``tenant`` in, in order: its own, then its other one."""
    order = [lease_shard_of(tenant, holder, shards)]
    second = second_lease_shard(tenant, holder, shards)
    if second is not None:
        order.append(second)
    return order


def counters_interval_s(containers: int) -> float:
    """How long a container keeps a tenant's counters that ride on no lease release before it writes
    them, given how many worker containers may receive the tenant's messages at once (every one of
    them may count the tenant's messages, leased or refused): together they write its counters item at
    most :data:`COUNTERS_WRITES_PER_S` times a second. Counters that ride on a release of a lease held
    on the counters item (a tenant of one lease shard) go with it, whatever the interval."""
    return max(containers, 0) / COUNTERS_WRITES_PER_S


def grant_for(
    holder: str,
    tenant_leases: Mapping[str, Lease],
    limits: ConcurrencyLimits,
    burst_in_use: int,
    burst_capacity: int | None,
    now_ms: int,
) -> Grant:
    """Whether ``holder`` may hold a lease of the tenant now, and of which kind.

    A holder renewing its own live lease keeps its kind. ``burst_capacity`` None means the pool is
    unbounded (only the tenant's ceiling applies).
    """
    # the live leases counted, not copied: this runs for every tenant of every batch
    own = tenant_leases.get(holder)
    if own is not None and own.expires_at_ms > now_ms:
        return Grant.BURST if own.burst else Grant.FLOOR
    held = 0
    for lease in tenant_leases.values():
        if lease.expires_at_ms > now_ms:
            held += 1
    if held < limits.floor:
        return Grant.FLOOR
    if held >= limits.ceiling:
        return Grant.REFUSED
    if burst_capacity is not None and burst_in_use >= burst_capacity:
        return Grant.REFUSED
    return Grant.BURST


class CrowdedFloors:
    """One container's memory of the tenants whose floor a write without reading found taken.

    That write only succeeds while the floor has room; once it failed for a tenant, the next blind
    write would most likely fail too (a wasted write before the read anyway). So for ``for_ms``
    after the failure the tenant's batches read its item first and take what :func:`grant_for`
    allows (a burst lease, or a refusal); then a write without reading is worth trying again.
    """

    def __init__(self, for_ms: int = CROWDED_MS) -> None:
        self._for_ms = for_ms
        self._until: dict[str, int] = {}  # tenant -> until when (ms) its batches read first

    def crowded(self, tenant: str, now_ms: int) -> bool:
        """Whether a batch of ``tenant`` should read before it writes."""
        return self._until.get(tenant, 0) > now_ms

    def found_taken(self, tenant: str, now_ms: int) -> None:
        """A write without reading found the tenant's floor taken at ``now_ms``."""
        self._until[tenant] = now_ms + self._for_ms

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


def pool_shard_capacities(burst_capacity: int) -> list[int]:
    """The places of each burst pool shard: ``burst_capacity`` spread as evenly as it goes."""
    if burst_capacity < 1:
        raise ValueError(f"burst_capacity must be at least 1, got {burst_capacity}")
    shards = -(-burst_capacity // POOL_SHARD_PLACES)
    base, extra = divmod(burst_capacity, shards)
    return [base + (1 if index < extra else 0) for index in range(shards)]


def pool_shard_of(holder: str, shards: int) -> int:
    """The pool shard a container (``holder``) takes its burst places in: stable across its batches."""
    return zlib.crc32(holder.encode()) % shards


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
    floor: int
    ceiling: int

    def __post_init__(self) -> None:
        if self.floor < 1 or self.ceiling < self.floor:
            raise ValueError(f"need 1 <= floor <= ceiling, got floor={self.floor} ceiling={self.ceiling}")


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

"""Per-tenant concurrency: leases that expire, a guaranteed floor and a burst ceiling.

A worker container processes a batch sequentially, so the parallelism a tenant gets is the number of
containers working on it at once. Each container holds at most one lease per tenant (its id is the
container's), acquired once per batch and given back after it or left to lapse: the cost is bounded
by tenants per batch, never by messages. Every lease carries an expiry (at the latest the end of the
invocation that took it), so a container that crashes cannot leak a slot: its lease stops counting.

Up to ``floor`` leases a tenant is always granted. Above the floor, up to ``ceiling``, a lease is a
*burst* lease and also needs room in the shared burst pool, so bursting tenants cannot together
occupy the whole worker fleet and starve the floors of the others.
A floor lease can be taken with one conditional write, without reading the tenant's item first;
:class:`CrowdedFloors` remembers the tenants whose floor such a write found taken, whose batches
read first for a while. Everything here is pure; ``now`` is injected.

A floor lease is a numbered slot (:func:`slot_key`, ``0 <= k < floor``) that names its holder, so a
slot whose lease expired is free to anyone's blind write, with no read and no clean-up first. That
lets a floor lease *lapse* instead of being given back: a container sets its floor lease to expire
when it expects to be done with the tenant (:class:`LeaseTerms`), and writes no release when that
time is close (:data:`LAPSE_MS`): one write per tenant and batch, the acquire. A burst lease (keyed by
its holder, with a place in the burst pool) is always given back.

A tenant whose ceiling is above :data:`LEASE_SHARD_PLACES` has its leases spread over shards of at most
that many places (:func:`lease_shard_count`, :func:`shard_limits`): a container leases in the shard its
id hashes to (:func:`lease_shard_of`), and in one other (:func:`second_lease_shard`) when that one is
full. No lease item grows with the tenant's concurrency, and each is written only by the containers
hashed to it. A tenant's counters that ride on no lease release (a sharded tenant's always, a refused
tenant's) are written by each container at most every :func:`counters_interval_s`.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Container, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import NamedTuple, TypeVar

K = TypeVar("K")  # how a map of leases is keyed (a holder, or a tenant and holder)
T = TypeVar("T")  # a tenant, as the caller names it (its id, or the simulator's index)

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
# A floor lease that still has at most this long to run when its tenant's last message of the batch is
# done is left to lapse (no release written); one with longer is given back. Every moment a lapsing
# lease outlives its work, the tenant's next message at another container may find its floor taken
# and be deferred, which costs more than the release saves: the term is kept tight.
LAPSE_MS = 250
# The term of a lapsing floor lease: the expected time to the tenant's last message of the batch, this
# many standard deviations of it, and this margin (a message expected to end past the lease renews it
# first, for the rest of the invocation).
TERM_DEVIATIONS = 3.0
TERM_SLACK_MS = 50
# No lapsing lease lasts longer: a tenant whose messages take longer (or whose work just slowed down)
# gets the invocation's lease, given back, since a message outlasting a short lease would free its
# slot mid-work, and a release is little beside such work.
TERM_MAX_MS = 1_000
SLOT_PREFIX = "#"  # a floor slot's key in a map of leases; a holder (a container's hex id) never starts so


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


def slot_key(slot: int) -> str:
    """The key of floor slot ``slot`` in a lease item's map of leases."""
    return f"{SLOT_PREFIX}{slot}"


def home_slot(holder: str, floor: int) -> int:
    """The floor slot a container tries first when it remembers none: containers spread over the slots."""
    return zlib.crc32(holder.encode()) % floor


def open_slots(
    entries: Mapping[str, Mapping[str, object]], holder: str, floor: int, now_ms: int
) -> list[int]:
    """The floor slots ``holder`` may write blind in a map of leases (raw entries: ``exp``, ``h``): its own
    first, then the free ones (never taken, or expired). Empty: the floor is taken by others."""
    own: list[int] = []
    free: list[int] = []
    for slot in range(floor):
        entry = entries.get(slot_key(slot))
        if entry is None or int(str(entry["exp"])) <= now_ms:
            free.append(slot)
        elif entry.get("h") == holder:
            own.append(slot)
    return own + free


class LeaseTerms:
    """One container's estimate of how long its messages take, per tenant, for the term of its floor
    leases: a lease that ends close to the tenant's last message lapses instead of being given back.

    Exponentially weighted means and variances per tenant and over all the container's messages, and
    a mean of the lead (from the batch's gates, where the lease is written, to its first message). A
    lease lasts the lead, the expected time of the messages up to its tenant's last and
    :data:`TERM_DEVIATIONS` standard deviations of it: a tenant whose times vary gets a longer
    term (given back rather than lapsed if its messages end early), so a message rarely outlasts
    its lease. Only a tenant this container has timed gets a lapsing lease, and only one of at most
    :data:`TERM_MAX_MS`; the messages of other tenants before it are estimated from the container's
    own.
    """

    def __init__(self, weight: float = 0.3) -> None:
        self._weight = weight
        self._per_tenant: dict[object, tuple[float, float]] = {}  # (mean, variance), seconds
        self._all: tuple[float, float] | None = None
        self._lead = 0.0

    def observe_lead(self, seconds: float) -> None:
        """A batch's first message started ``seconds`` after its gates were asked."""
        self._lead += self._weight * (seconds - self._lead)

    def observe(self, tenant: object, seconds: float) -> None:
        """A message of ``tenant`` took ``seconds``."""
        self._per_tenant[tenant] = self._updated(self._per_tenant.get(tenant), seconds)
        self._all = self._updated(self._all, seconds)

    def _updated(self, stats: tuple[float, float] | None, seconds: float) -> tuple[float, float]:
        if stats is None:
            return seconds, 0.0
        mean, variance = stats
        weight = self._weight
        deviation = seconds - mean
        return mean + weight * deviation, (1 - weight) * (variance + weight * deviation * deviation)

    def message_ms(self, tenant: object) -> float | None:
        """The expected time of one message of ``tenant`` (ms); None if this container has timed none."""
        stats = self._per_tenant.get(tenant)
        return None if stats is None else stats[0] * 1000

    def until_ms(self, now_ms: int, tenants: Sequence[object]) -> int | None:
        """When a floor lease taken at the gates (``now_ms``) should expire that must last through the
        lead and the messages of ``tenants`` (in the order they are processed, the lease's tenant's
        last one last); None if that tenant has not been timed here."""
        if not tenants:
            return None
        return self.ends_ms(now_ms, tenants).get(tenants[-1])

    def ends_ms(
        self, now_ms: int, order: Sequence[T], skip: Container[T] = (), before_ms: int | None = None
    ) -> dict[T, int]:
        """:meth:`until_ms` for every tenant of ``order`` (the batch's messages' tenants, in the order
        they are processed) not in ``skip``, through its last message, in one pass; a tenant without
        a term (not timed here, or its term over :data:`TERM_MAX_MS` or not before ``before_ms``) is
        left out."""
        everyone = self._all
        if everyone is None:
            return {}
        last = {tenant: index for index, tenant in enumerate(order)}
        ends: dict[T, int] = {}
        mean = variance = 0.0
        for index, tenant in enumerate(order):
            each_mean, each_variance = self._per_tenant.get(tenant, everyone)
            mean += each_mean
            variance += each_variance
            if last[tenant] != index or tenant in skip or tenant not in self._per_tenant:
                continue
            term_ms = int((self._lead + mean + TERM_DEVIATIONS * math.sqrt(variance)) * 1000) + TERM_SLACK_MS
            if term_ms <= TERM_MAX_MS and (before_ms is None or now_ms + term_ms < before_ms):
                ends[tenant] = now_ms + term_ms
        return ends


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

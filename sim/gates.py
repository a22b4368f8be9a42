"""The worker's gates in memory: the consumer buckets (:mod:`sim.buckets`) and the concurrency leases.

:class:`ConsumerBuckets` mirrors ``RateGate`` (one ask per tenant and batch), :class:`LeaseTable`
``breakwater.aws.concurrency.ConcurrencyLeases``: a tenant's leases on its counters item, or, for a
tenant whose ceiling is above ``LEASE_SHARD_PLACES``, on its lease shards (``lease_shard_count``
items of at most that many places); the burst pool spread over shard items of at most
``breakwater.concurrency.POOL_SHARD_PLACES`` places (``pool_shard_capacities``), each container
taking its burst places only in its own shard (``pool_shard_of``). With a
:class:`sim.dynamodb.StateTable`, every read and write is made against its item at its virtual time,
and a call still throttled after botocore's retries takes the path the real adapter takes: a
consumer bucket fails open; a tenant whose lease could not be read or written is acquired on its own
and, failing that, refused, so only its messages are deferred.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Sequence

from breakwater.concurrency import (
    CROWDED_MS,
    ConcurrencyLimits,
    Grant,
    Lease,
    grant_for,
    lease_shard_count,
    lease_shard_order,
    live_leases,
    pool_shard_capacities,
    pool_shard_of,
    shard_limits,
)
from sim.buckets import ConsumerBuckets, LocalRefusals
from sim.dynamodb import BURST_POOL, COUNTERS, LEASE_SHARD, STANDARD, Item, StateTable

__all__ = ["ConsumerBuckets", "LeaseTable", "LocalRefusals"]

_BURST, _FLOOR, _REFUSED = Grant.BURST, Grant.FLOOR, Grant.REFUSED
_NO_LEASES: dict[str, Lease] = {}  # a tenant nobody leased yet (read, never written)
# A lease item: a tenant (its counters item holds its leases) or (tenant, k) (its lease shard k)
LeaseKey = int | tuple[int, int]
_Choice = tuple[LeaseKey, ConcurrencyLimits]  # an item a holder may lease in, with the limits it holds
_ShardChoice = tuple[tuple[int, int], ConcurrencyLimits]
ATTEMPTS = 3  # ConcurrencyLeases.acquire: a tenant on its own, read then write, this many times
# breakwater.aws.conflicts.pause_before_retry: a lost race waits a random pause in a window that
# doubles per attempt, from this base up to this most
BASE_PAUSE_S = 0.01
MAX_PAUSE_S = 0.1


class _Shard:
    """One burst pool shard: its places by (tenant, holder), and their expiries to drop them in place."""

    __slots__ = ("capacity", "expiries", "places")

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.places: dict[tuple[int, str], Lease] = {}
        # (expiry, place); stale entries (a place renewed or given back since) are skipped
        self.expiries: list[tuple[int, tuple[int, str]]] = []

    def live(self, now_ms: int) -> int:
        """Places that still count (``live_leases``), the expired ones dropped."""
        places, expiries = self.places, self.expiries
        while expiries and expiries[0][0] <= now_ms:
            expires_at, place = heapq.heappop(expiries)
            lease = places.get(place)
            if lease is not None and lease.expires_at_ms == expires_at:
                del places[place]
        return len(places)

    def hold(self, place: tuple[int, str], expires_at_ms: int) -> None:
        self.places[place] = Lease(expires_at_ms, True)
        heapq.heappush(self.expiries, (expires_at_ms, place))


class LeaseTable:
    """Per-tenant concurrency leases and the burst pool's shards (``LeaseGate``), as the items hold them.

    A tenant's leases are on its counters item; those of a tenant of more than one lease shard
    (``lease_shard_count``) on its shard items ``lease#<k>`` instead, a container leasing in its own
    shard with that shard's share of the limits (``lease_shard_order``, ``shard_limits``) and, when that
    one refuses, in its other, the item still holding its last lease first
    until that lease's release is written, as ``breakwater.aws.lease_shards.lease_items`` orders them.
    Each lease and each place carries an expiry; a lease given back is ended at the time its release
    is written (its expiry brought forward), which is how the next batches see it gone, whenever in
    virtual time they ask.
    """

    def __init__(
        self,
        burst_capacity: int | None,
        table: StateTable | None = None,
        seed: int = 7,
        names: Sequence[str] | None = None,
    ) -> None:
        self.burst_capacity = burst_capacity
        self.table = table
        # the tenants' names, which a lease shard is hashed with (the table's, else the index)
        self._names = names if names is not None else table.names if table is not None else None
        self.shards: list[_Shard] = (
            [_Shard(places) for places in pool_shard_capacities(burst_capacity)]
            if burst_capacity is not None
            else []
        )
        self._shard_of: dict[str, int] = {}  # holder -> its shard (crc32 of the holder, once)
        self._rng = random.Random(seed)  # the pauses before a lost race is tried again
        self.waited_s = 0.0  # botocore's waits and the pauses, since the caller last took them
        self.conflicts = 0  # burst transactions cancelled (a throttle is a lost race to the adapter)
        self.refused_on_error = 0  # tenants refused because their item stayed throttled
        self.unreleased = 0  # burst places whose release write was throttled: they expire on their own
        self.second_tries = 0  # sharded tenants tried in their other shard, their own having refused
        self._maps: dict[LeaseKey, dict[str, Lease]] = {}  # each lease item's map of leases
        self._crowded: dict[tuple[str, LeaseKey], int] = {}  # (holder, item) -> read first until (ms)
        # a sharded tenant's shards in the order a holder tries them, and the limits they were made for
        self._choices: dict[tuple[int, str], tuple[ConcurrencyLimits, list[_ShardChoice]]] = {}
        # (holder, tenant) -> the shard its lease is in, until its release is written
        self._held_in: dict[tuple[str, int], int] = {}
        self._lease_shards: dict[int, int] = {}  # sharded tenant -> how many lease shards it has
        # the items' writes and reads as billed: a lease one write (refused ones too: a failed
        # condition is billed), the batch's burst leases one transaction with its shard, a consistent
        # read per item read, a shard's release one write
        self.writes = 0
        self.transact_items = 0
        self.item_reads = 0
        # the expiry of the floor leases of the call under way, per tenant (a lapsing lease's term)
        self._floor_until: dict[int, int] = {}

    def shard_of(self, holder: str) -> int | None:
        """The holder's shard of the pool (None: no pool)."""
        if not self.shards:
            return None
        shard = self._shard_of.get(holder)
        if shard is None:
            shard = self._shard_of[holder] = pool_shard_of(holder, len(self.shards))
        return shard

    def choices(self, tenant: int, limits: ConcurrencyLimits, holder: str) -> Sequence[_Choice]:
        """The lease items ``holder`` tries for ``tenant``, in order, each with the limits it holds."""
        if lease_shard_count(limits) == 1:
            return [(tenant, limits)]
        made = self._choices.get((tenant, holder))
        if made is None or made[0] != limits:
            shards = self._lease_shards[tenant] = lease_shard_count(limits)
            name = self._names[tenant] if self._names is not None else str(tenant)
            made = self._choices[(tenant, holder)] = (
                limits,
                [
                    ((tenant, shard), shard_limits(limits, shard))
                    for shard in lease_shard_order(name, holder, shards)
                ],
            )
        order_made = made[1]
        held = self._held_in.get((holder, tenant))
        if held is not None and held != order_made[0][0][1]:
            return [choice for choice in order_made if choice[0][1] == held] + [
                choice for choice in order_made if choice[0][1] != held
            ]
        return order_made

    def acquire_many(
        self,
        requests: dict[int, ConcurrencyLimits],
        holder: str,
        expires_at_ms: int,
        now_ms: int,
        riding: Sequence[int] = (),
        floor_until: dict[int, int] | None = None,
    ) -> dict[int, Grant]:
        """Mirrors ``ConcurrencyLeases.acquire_many``: each tenant's grant, burst leases in the shard.

        A lone tenant below its floor tries one conditional write without reading; otherwise one
        BatchGetItem of the tenants' first lease items and the holder's shard (a key left unprocessed
        twice: that tenant on its own; the shard: floors only), one transaction of the burst leases
        with the shard, one conditional write per floor lease. A write that did not go through (a
        lost race, a throttle) leaves its tenants to be acquired on their own (:meth:`_acquire_in`);
        a sharded tenant its first item refused is tried in its other one, read then written.

        ``riding``: tenants whose consumer bucket just wrote their counters item, where the worker's
        floor lease rides on that write (:meth:`_ride`); those it lands on are not leased again.
        ``floor_until``: a tenant's floor lease expires then (to lapse), not at ``expires_at_ms``.
        """
        self._floor_until = floor_until or {}
        rode: dict[int, Grant] = {}
        for tenant in riding:
            limits = requests.get(tenant)
            if limits is not None and self._ride(tenant, limits, holder, expires_at_ms, now_ms):
                rode[tenant] = _FLOOR
        if rode:
            requests = {tenant: limits for tenant, limits in requests.items() if tenant not in rode}
            if not requests:
                return rode
            return rode | self.acquire_many(requests, holder, expires_at_ms, now_ms, (), floor_until)
        orders = {tenant: self.choices(tenant, limits, holder) for tenant, limits in requests.items()}
        if len(requests) == 1:
            tenant, order = next(iter(orders.items()))
            key, limits = order[0]
            if self._floor_without_read(key, limits, holder, expires_at_ms, now_ms):
                return {tenant: _FLOOR}
        table = self.table
        at = now_ms / 1000 + self.waited_s
        shard_index = self.shard_of(holder)
        shard = self.shards[shard_index] if shard_index is not None else None
        lost: list[int] = []
        unread_pool = False
        self.item_reads += len(requests) + (shard is not None)
        if table is not None:
            read = self._batch_read
            lost = [tenant for tenant, order in orders.items() if not read(table, order[0][0], at)]
            if shard is not None and not self._batch_read_pool(table, shard_index, at):
                unread_pool = True
        in_use = shard.live(now_ms) if shard is not None and not unread_pool else 0
        capacity = shard.capacity if shard is not None and not unread_pool else 0
        grants: dict[int, Grant] = {}
        burst: list[int] = []
        floors: list[int] = []
        full: list[int] = []  # sharded tenants their first item refused
        maps = self._maps
        for tenant, order in orders.items():
            if lost and tenant in lost:
                continue
            key, limits = order[0]
            leases = maps.get(key) or _NO_LEASES
            grant = grant_for(holder, leases, limits, in_use, capacity if shard is not None else None, now_ms)
            grants[tenant] = grant
            if grant is _BURST:
                in_use += 1
                burst.append(tenant)
            elif grant is _FLOOR:
                floors.append(tenant)
            elif len(order) > 1:
                full.append(tenant)
        if burst and shard is not None:
            self.transact_items += len(burst) + 1
            keys = [orders[tenant][0][0] for tenant in burst]
            if table is None or self._transact(table, keys, shard_index or 0, at):
                for tenant, key in zip(burst, keys, strict=True):
                    shard.hold((tenant, holder), expires_at_ms)
                    self._take(key, holder, Lease(expires_at_ms, True), now_ms)
            else:
                lost.extend(burst)
        for tenant in floors:
            key = orders[tenant][0][0]
            if not self._make_room(key, at):
                lost.append(tenant)
                continue
            self.writes += 1
            if table is not None:
                item, kind = _item(table, key)
                units = _write_units(table, key, len(maps.get(key) or _NO_LEASES) + 1)
                written, waited = table.retried_write(item, kind, at, units)
                self.waited_s += waited
                if not written:
                    lost.append(tenant)
                    continue
            self._take(key, holder, Lease(self._floor_until.get(tenant, expires_at_ms), False), now_ms)
        for tenant in lost:
            grants[tenant] = self._acquire_in(tenant, orders[tenant], holder, expires_at_ms, now_ms)
        for tenant in full:
            self.second_tries += 1
            grants[tenant] = self._acquire_in(tenant, orders[tenant][1:], holder, expires_at_ms, now_ms)
        return grants

    def _ride(
        self, tenant: int, limits: ConcurrencyLimits, holder: str, expires_at_ms: int, now_ms: int
    ) -> bool:
        """``ConcurrencyLeases.floor_rider``: the floor lease taken in the consumer bucket's write of the
        tenant's counters item (billed there), on the blind floor write's condition; a condition that
        fails costs the bucket's write made again alone (billed here), and the item is read first for
        a while. False: lease the tenant as usual."""
        if limits.floor == 0 or lease_shard_count(limits) != 1:
            return False
        crowded = (holder, tenant)
        if self._crowded.get(crowded, 0) > now_ms:
            return False
        leases = self._maps.get(tenant)
        if _floor_open(leases, holder, limits.floor, now_ms):
            self._take(tenant, holder, Lease(self._floor_until.get(tenant, expires_at_ms), False), now_ms)
            return True
        self.writes += 1  # the joint write failed on the lease's condition: the bucket's alone
        table = self.table
        if table is not None:
            units = _write_units(table, tenant, len(leases or _NO_LEASES))
            _written, waited = table.retried_write(
                table.counters_items[tenant], COUNTERS, now_ms / 1000, units
            )
            self.waited_s += waited
        if leases is not None:
            self._crowded[crowded] = now_ms + CROWDED_MS
        return False

    def _floor_without_read(
        self, key: LeaseKey, limits: ConcurrencyLimits, holder: str, expires_at_ms: int, now_ms: int
    ) -> bool:
        """``ConcurrencyLeases._floor_without_read``: one write on condition that the item holds fewer
        leases than the floor (a failed condition is billed, and the item is read first for a while);
        none for a shard whose share of the floor is 0."""
        if limits.floor == 0:
            return False
        crowded = (holder, key)
        if self._crowded.get(crowded, 0) > now_ms:
            return False
        leases = self._maps.get(key)
        self.writes += 1
        taken = not _floor_open(leases, holder, limits.floor, now_ms)
        table = self.table
        if table is not None:
            item, kind = _item(table, key)
            units = _write_units(table, key, len(leases or _NO_LEASES) + 1)
            written, waited = table.retried_write(item, kind, now_ms / 1000, units)
            self.waited_s += waited
            if not written:
                return False  # the read path decides
        if taken:  # ConditionalCheckFailedException: a taken floor is read first for a while
            if leases is not None:
                self._crowded[crowded] = now_ms + CROWDED_MS
            return False
        # (the real write keeps the map's other entries; a given-back lease is gone from it, which here
        # is an ended one: dropped so that the item's size stays what the real one's is)
        tenant = key if type(key) is int else key[0]  # type: ignore[index]
        self._take(key, holder, Lease(self._floor_until.get(tenant, expires_at_ms), False), now_ms)
        return True

    def _acquire_in(
        self, tenant: int, order: Sequence[_Choice], holder: str, expires_at_ms: int, now_ms: int
    ) -> Grant:
        """``ConcurrencyLeases._acquire_in``: a lease in the first of the items that grants one, each
        read first; a tenant every item refused, one of them on an error, is refused on that error."""
        errored = False
        for key, limits in order:
            grant = self._acquire(tenant, key, limits, holder, expires_at_ms, now_ms)
            if grant is None:
                errored = True
            elif grant is not _REFUSED:
                return grant
        return self._refused_on_error() if errored else _REFUSED

    def _acquire(
        self,
        tenant: int,
        key: LeaseKey,
        limits: ConcurrencyLimits,
        holder: str,
        expires_at_ms: int,
        now_ms: int,
    ) -> Grant | None:
        """``ConcurrencyLeases._acquire``: read the lease item (and the shard for a burst lease), then
        write, a lost race tried again after a jittered pause; None: a call still throttled after
        botocore's retries, or every race lost (the adapter refuses the tenant, as full)."""
        table = self.table
        shard_index = self.shard_of(holder)
        shard = self.shards[shard_index] if shard_index is not None else None
        for attempt in range(ATTEMPTS):
            at = now_ms / 1000 + self.waited_s
            leases = self._maps.get(key) or _NO_LEASES
            self.item_reads += 1
            if table is not None:
                item, kind = _item(table, key)
                if not self._get(table, item, kind, _read_units(table, key, len(leases)), at):
                    return None
            grant = grant_for(holder, leases, limits, 0, None, now_ms)
            if grant is _BURST and shard is not None:
                self.item_reads += 1
                if table is not None and not self._get(
                    table,
                    table.pool_shard(shard_index or 0, len(self.shards)),
                    BURST_POOL,
                    table.pool_read_units(len(shard.places)),
                    at,
                ):
                    return None
                grant = grant_for(holder, leases, limits, shard.live(now_ms), shard.capacity, now_ms)
            if grant is _REFUSED:
                return grant
            if grant is _BURST and shard is not None:
                self.transact_items += 2
                if table is not None and not self._transact(table, [key], shard_index or 0, at):
                    if attempt + 1 < ATTEMPTS:
                        self.waited_s += self._rng.uniform(0.0, min(MAX_PAUSE_S, BASE_PAUSE_S * 2**attempt))
                    continue
                shard.hold((tenant, holder), expires_at_ms)
            else:
                if not self._make_room(key, at):
                    return None
                self.writes += 1
                if table is not None:
                    item, kind = _item(table, key)
                    units = _write_units(table, key, len(leases) + 1)
                    written, waited = table.retried_write(item, kind, at, units)
                    self.waited_s += waited
                    if not written:  # a throttle is not a lost race: the adapter refuses the item
                        return None
            expires = expires_at_ms if grant is _BURST else self._floor_until.get(tenant, expires_at_ms)
            self._take(key, holder, Lease(expires, grant is _BURST), now_ms)
            return grant
        return None  # every race lost: behave as full

    def _make_room(self, key: LeaseKey, at: float) -> bool:
        """``ConcurrencyLeases._make_room``: a lease item without a map of leases gets an empty one
        (one unconditional write) before its floor lease; False: that write stayed throttled."""
        if key in self._maps:
            return True
        self.writes += 1
        table = self.table
        if table is not None:
            item, kind = _item(table, key)
            written, waited = table.retried_write(item, kind, at, _write_units(table, key, 0))
            self.waited_s += waited
            if not written:
                return False
        self._maps[key] = {}
        return True

    def _refused_on_error(self) -> Grant:
        self.refused_on_error += 1
        return _REFUSED

    def _take(self, key: LeaseKey, holder: str, lease: Lease, now_ms: int) -> None:
        """The lease item as written: its live leases with the holder's (expired ones dropped)."""
        leases = self._maps.get(key)
        kept = live_leases(leases, now_ms) if leases else {}
        kept[holder] = lease
        self._maps[key] = kept
        if type(key) is tuple:  # the release goes where the lease is
            self._held_in[(holder, key[0])] = key[1]

    # -- the calls against the items -----------------------------------------------------------------
    # A BatchGetItem's unprocessed keys are asked once more (a second call), then left to the caller.
    def _batch_read(self, table: StateTable, key: LeaseKey, at: float) -> bool:
        """The lease item's key in the batch's BatchGetItem."""
        item, kind = _item(table, key)
        units = _read_units(table, key, len(self._maps.get(key) or _NO_LEASES))
        return table.read(item, kind, at, units) or table.read(item, kind, at, units)

    def _batch_read_pool(self, table: StateTable, shard: int | None, at: float) -> bool:
        item = table.pool_shard(shard or 0, len(self.shards))
        units = table.pool_read_units(self.shards[shard or 0].capacity)
        return table.read(item, BURST_POOL, at, units) or table.read(item, BURST_POOL, at, units)

    def _get(self, table: StateTable, item: Item, kind: str, units: float, at: float) -> bool:
        """A consistent GetItem with botocore's retries (their waits spent by the invocation)."""
        read, waited = table.retried(lambda when: table.read(item, kind, when, units), at, STANDARD)
        self.waited_s += waited
        return read

    def _transact(self, table: StateTable, keys: list[LeaseKey], shard: int, at: float) -> bool:
        """The burst leases in ``keys``' items and the shard's put in one TransactWriteItems."""
        places = len(self.shards[shard].places) + len(keys)
        items = []
        for key in keys:
            item, kind = _item(table, key)
            units = _write_units(table, key, len(self._maps.get(key) or _NO_LEASES) + 1, transactional=True)
            items.append((item, kind, units))
        items.append(
            (
                table.pool_shard(shard, len(self.shards)),
                BURST_POOL,
                table.pool_units(places, transactional=True),
            )
        )
        if table.transact(items, at):
            return True
        self.conflicts += 1
        return False

    # -- the release -----------------------------------------------------------------------------------
    def lease_key(self, holder: str, tenant: int) -> LeaseKey:
        """The item holding the holder's lease of ``tenant``: its counters item, or a lease shard."""
        shard = self._held_in.get((holder, tenant))
        return tenant if shard is None else (tenant, shard)

    def release_write(self, holder: str, tenant: int) -> tuple[Item, str, float]:
        """The item, kind and write units of the release of the holder's lease of ``tenant``: on the
        counters item (sized with its leases; the tenant's counters go in the same write) or on the
        lease shard holding it (``REMOVE leases.#h``, a write of its own)."""
        table = self.table
        assert table is not None
        key = self.lease_key(holder, tenant)
        item, kind = _item(table, key)
        return item, kind, _write_units(table, key, len(self._maps.get(key) or _NO_LEASES))

    def end(self, holder: str, tenant: int, ended_ms: int) -> None:
        """The holder's lease of ``tenant`` given back at ``ended_ms`` (its release was written): its next
        lease of a sharded tenant is tried in its own shard first again."""
        key = self.lease_key(holder, tenant)
        leases = self._maps.get(key)
        if leases is not None:
            lease = leases.get(holder)
            if lease is not None and lease.expires_at_ms > ended_ms:
                leases[holder] = Lease(ended_ms, lease.burst)
        if type(key) is tuple:
            del self._held_in[(holder, tenant)]

    def contended(self, holder: str, tenant: int, now_ms: int) -> bool:
        """``ConcurrencyLeases.contended``: a blind floor write of the holder's found the tenant's floor
        taken lately (its item read first for a while)."""
        return self._crowded.get((holder, self.lease_key(holder, tenant)), 0) > now_ms

    def renew(self, holder: str, tenant: int, limits: ConcurrencyLimits, until_ms: int, now_ms: int) -> bool:
        """``ConcurrencyLeases.renew``: the holder's floor lease of ``tenant`` moved to ``until_ms`` in one
        blind write of its slot (billed), if it still holds it or the floor has room; False: not
        renewed (it lapses)."""
        key = self.lease_key(holder, tenant)
        leases = self._maps.get(key)
        floor = limits.floor if type(key) is int else shard_limits(limits, key[1]).floor  # type: ignore[index]
        self.writes += 1
        table = self.table
        if table is not None:
            item, kind = _item(table, key)
            written, waited = table.retried_write(
                item, kind, now_ms / 1000, _write_units(table, key, len(leases or _NO_LEASES))
            )
            self.waited_s += waited
            if not written:
                return False
        if leases is None:
            return False
        own = leases.get(holder)
        if (own is None or own.expires_at_ms <= now_ms) and not _floor_open(leases, holder, floor, now_ms):
            return False
        leases[holder] = Lease(until_ms, False)
        return True

    def holds_place(self, holder: str, tenant: int) -> bool:
        shard = self.shard_of(holder)
        return shard is not None and (tenant, holder) in self.shards[shard].places

    def release_place(self, holder: str, tenant: int, at_s: float) -> bool:
        """The holder's place of ``tenant`` given back in its shard at ``at_s`` (one UpdateItem of the
        shard); False: the write stayed throttled and the place expires on its own."""
        shard_index = self.shard_of(holder)
        if shard_index is None:
            return False
        shard = self.shards[shard_index]
        place = (tenant, holder)
        lease = shard.places.get(place)
        if lease is None:
            return False
        self.writes += 1
        table = self.table
        if table is not None:
            item = table.pool_shard(shard_index, len(self.shards))
            written, _ = table.retried_write(item, BURST_POOL, at_s, table.pool_units(len(shard.places)))
            if not written:
                self.unreleased += 1
                return False
        ended_ms = int(at_s * 1000)
        if lease.expires_at_ms > ended_ms:
            shard.hold(place, ended_ms)
        return True

    def release(self, holder: str, tenants: list[int], now_s: float) -> None:
        """The holder's leases of ``tenants`` and their places given back at ``now_s`` (the pool's
        write metered; the tenants' writes are the caller's, with their counters)."""
        ended_ms = int(now_s * 1000)
        for tenant in tenants:
            if self.holds_place(holder, tenant):
                self.release_place(holder, tenant, now_s)
            self.end(holder, tenant, ended_ms)

    def held_count(self, tenant: int, shard: int | None = None) -> int:
        """Leases in the tenant's counters item (none for a sharded tenant), or in its lease shard
        ``shard`` (ended ones too, until a write drops them): the item's size."""
        return len(self._maps.get(tenant if shard is None else (tenant, shard)) or _NO_LEASES)

    def lease_shards(self, tenant: int) -> int:
        """How many lease shards the tenant's leases are spread over (1: on its counters item)."""
        return self._lease_shards.get(tenant, 1)

    def held(self, tenant: int, now_ms: int) -> int:
        """The tenant's leases that count, on whichever items they are."""
        maps = self._maps
        held = _held(maps.get(tenant) or _NO_LEASES, now_ms)
        for shard in range(self._lease_shards.get(tenant, 0)):
            held += _held(maps.get((tenant, shard)) or _NO_LEASES, now_ms)
        return held

    def places(self, shard: int, now_ms: int) -> int:
        """Places that count in ``shard`` at ``now_ms``."""
        return self.shards[shard].live(now_ms)


def _item(table: StateTable, key: LeaseKey) -> tuple[Item, str]:
    """A lease item and its kind: a tenant's counters item, or one of its lease shards."""
    if type(key) is int:
        return table.counters_items[key], COUNTERS
    tenant, shard = key  # type: ignore[misc]
    return table.lease_shard(tenant, shard), LEASE_SHARD


def _write_units(table: StateTable, key: LeaseKey, leases: int, *, transactional: bool = False) -> float:
    if type(key) is int:
        return table.counters_units(leases, transactional=transactional)
    return table.lease_shard_units(leases, transactional=transactional)


def _read_units(table: StateTable, key: LeaseKey, leases: int) -> float:
    if type(key) is int:
        return table.counters_read_units(leases)
    return table.lease_shard_read_units(leases)


def _floor_open(leases: dict[str, Lease] | None, holder: str, floor: int, now_ms: int) -> bool:
    """The blind floor write's condition: the item has a map of leases (the adapter reads one without
    it next) holding fewer than ``floor``, or the holder renews its own live lease there."""
    if leases is None:
        return False
    own = leases.get(holder)
    return (own is not None and own.expires_at_ms > now_ms) or _held(leases, now_ms) < floor


def _held(leases: dict[str, Lease], now_ms: int) -> int:
    """Leases that count: a given-back one is gone from the real item (its REMOVE), an ended one here."""
    return sum(1 for lease in leases.values() if lease.expires_at_ms > now_ms)

"""Concurrency leases in the state table (a tenant's counters item or lease shards, and the burst pool).

A tenant whose ceiling fits one lease shard keeps its leases in the ``leases`` map of its counters item
(``tenant#<id>``/``counters``, :mod:`breakwater.aws.counters`), so a batch gives its lease back in the
same write that adds its counters (:meth:`ConcurrencyLeases.release_update` merged with
:func:`~breakwater.aws.counters.counters_update`), or, for a floor lease left to lapse, adds the
counters its messages will count in the write that takes the lease (:meth:`ConcurrencyLeases.carry`):
one write per tenant and batch.
A larger tenant's leases are spread over lease shards (``tenant#<id>``/``lease#<k>``, holding only
``leases`` and ``version``; :mod:`breakwater.aws.lease_shards`): a container leases in its own shard,
with that shard's share of the floor and ceiling, and in one other when its own is full; the lease
remembers its item, and the release goes there, as its own write. That tenant's counters item then
holds no leases, and the worker writes its counters at most every
:func:`~breakwater.concurrency.counters_interval_s`, so neither item is written by every container
working on the tenant at every batch. Leases only ever touch ``leases`` and ``version``; the counters'
writers and the controller never touch those, so neither side's conditions see the other's writes.

Optimistic concurrency: read the lease item, decide with the pure policy
(:func:`breakwater.concurrency.grant_for`); a burst lease writes the map back (expired leases dropped)
on condition that ``version`` did not move. A floor lease is one conditional UpdateItem of a numbered
slot (:func:`~breakwater.concurrency.slot_key`); a burst lease also takes a place in a shard of the
burst pool in the same TransactWriteItems, so the two never disagree. The pool is split into shard items
(``pool#concurrency``/``burst#<n>``; ``burst`` when there is one) of at most
:data:`~breakwater.concurrency.POOL_SHARD_PLACES` places, and a container takes its places only in its
own shard (:func:`~breakwater.concurrency.pool_shard_of`): no item grows with the fleet, and each is
written only by the containers hashed to it. A batch acquires all its tenants with one BatchGetItem and
one conditional write per tenant (a transaction only where a burst lease needs the pool: an item in a
transaction costs twice the write units); a tenant whose write lost a race is acquired on its own. A
tenant's floor lease is first tried without reading
(:meth:`ConcurrencyLeases._floor_without_read`): one conditional write of a slot, on condition that it
is free, expired or this holder's own (a shard whose share of the floor is 0 is always read first); a
refusal's item names another open slot for one more write, and an item found with none is read first
for a while
(:class:`breakwater.concurrency.CrowdedFloors`). The worker keeps the consumer bucket of a tenant whose
leases are on its counters item on that item too, and takes the floor lease in the bucket's own
write when the bucket writes (:meth:`ConcurrencyLeases.floor_rider`): one write for both.

A lost race (a read-then-write, or a floor write after a read) is retried with a jittered pause
(:func:`breakwater.aws.conflicts.pause_before_retry`); any error while acquiring a tenant (a throttle,
the table unavailable, a race lost every time) refuses that tenant only: its messages are deferred like
a refused tenant's, and the batch's other tenants go on.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from botocore.exceptions import BotoCoreError, ClientError

from breakwater.aws.conflicts import pause_before_retry
from breakwater.aws.counters import (
    COUNTERS_SK,
    Rider,
    batch_get_some,
    counters_update,
    merged_update,
    plain,
    tenant_pk,
)
from breakwater.aws.lease_shards import LeaseItem, lease_items
from breakwater.concurrency import (
    SLOT_PREFIX,
    ConcurrencyLimits,
    CrowdedFloors,
    Grant,
    Lease,
    grant_for,
    home_slot,
    live_leases,
    open_slots,
    pool_shard_capacities,
    pool_shard_of,
    slot_key,
)
from breakwater.observability import logger

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient

CONCURRENCY_SK = COUNTERS_SK  # the leases share the tenant's counters item
POOL_PK = "pool#concurrency"
POOL_SK = "burst"  # the pool's only shard; shard n of several is ``burst#<n>``
MAX_TENANTS_PER_WRITE = 99  # TransactWriteItems takes 100 items: the tenants and the pool
_CONFLICTS = {
    "ConditionalCheckFailedException",
    "TransactionCanceledException",
    "TransactionConflictException",
}


def _leases_from(item: Mapping[str, Any], holder: str | None = None) -> dict[str, Lease]:
    """The item's leases for :func:`~breakwater.concurrency.grant_for`: a burst lease under its holder,
    a floor slot under its slot key, except ``holder``'s own, under ``holder`` (the later one if it
    has two)."""
    leases: dict[str, Lease] = {}
    for key, value in (item.get("leases") or {}).items():
        lease = Lease(expires_at_ms=int(value["exp"]), burst=bool(value.get("burst", False)))
        own = holder is not None and key.startswith(SLOT_PREFIX) and value.get("h") == holder
        name = holder if own and holder is not None else key
        other = leases.get(name)
        if other is None or other.expires_at_ms < lease.expires_at_ms:
            leases[name] = lease
    return leases


def _entry_value(key: str, value: Mapping[str, Any]) -> dict[str, Any]:
    """A read entry of a map of leases as written (a floor slot names its holder, a burst lease says so)."""
    if key.startswith(SLOT_PREFIX):
        return {"M": {"exp": {"N": str(int(value["exp"]))}, "h": {"S": str(value["h"])}}}
    return _lease_value(Lease(expires_at_ms=int(value["exp"]), burst=bool(value.get("burst", False))))


def _pool_from(item: Mapping[str, Any]) -> dict[str, Lease]:
    return {
        key: Lease(expires_at_ms=int(value), burst=True) for key, value in (item.get("leases") or {}).items()
    }


def _condition(version: int | None) -> dict[str, Any]:
    if version is None:
        return {"ConditionExpression": "attribute_not_exists(version)"}
    return {"ConditionExpression": "version = :v", "ExpressionAttributeValues": {":v": {"N": str(version)}}}


def _lease_value(lease: Lease) -> dict[str, Any]:
    return {"M": {"exp": {"N": str(lease.expires_at_ms)}, "burst": {"BOOL": lease.burst}}}


def _item_key(tenant: str, sk: str) -> str:
    """A lease item's key in a container's memory of its slots and of crowded floors."""
    return f"{tenant}/{sk}"


def _conflict(exc: ClientError) -> bool:
    return exc.response.get("Error", {}).get("Code") in _CONFLICTS


def pool_shard_key(holder: str, burst_capacity: int) -> tuple[str, int]:
    """The sort key of ``holder``'s shard of the burst pool, and that shard's places."""
    capacities = pool_shard_capacities(burst_capacity)
    shard = pool_shard_of(holder, len(capacities))
    return (POOL_SK if len(capacities) == 1 else f"{POOL_SK}#{shard}"), capacities[shard]


class ConcurrencyLeases:
    """One container's leases: ``holder`` is the container's id, so it holds at most one per tenant."""

    def __init__(
        self,
        client: DynamoDBClient,
        table_name: str,
        holder: str,
        *,
        burst_capacity: int | None = None,
        clock_ms: Callable[[], int] = lambda: int(time.time() * 1000),
        attempts: int = 3,
        pause: Callable[[int], bool] = pause_before_retry,
    ) -> None:
        self._client = client
        self._table = table_name
        self.holder = holder
        self.burst_capacity = burst_capacity
        self._clock_ms = clock_ms
        self._attempts = attempts
        self._pause = pause  # before retry number n after a lost race; False: no time left for one
        self._crowded = CrowdedFloors()  # lease items whose floor was found taken: read first
        # the floor slot this container last wrote in each lease item ("<tenant>/<sk>"): tried first
        self._slots: dict[str, int] = {}
        # the expiry of the floor leases of the call under way, per tenant (a lapsing lease's term);
        # a tenant without one takes the call's expiry
        self._floor_until: Mapping[str, int] = {}
        # counters kept for a later write that ride on the tenant's next floor write of its counters
        # item (:meth:`carry`), and the tenants whose did land
        self._carried: dict[str, dict[str, Any]] = {}
        self._landed: set[str] = set()
        # the item each tenant's lease was last taken in, until its release lands (a sharded tenant's
        # lease is in one of two shards, and the release must go where it is)
        self._held: dict[str, str] = {}
        # this container's shard of the pool, and the places in it (None: no pool)
        self._pool_sk = POOL_SK
        self._pool_places: int | None = None
        if burst_capacity is not None:
            self._pool_sk, self._pool_places = pool_shard_key(holder, burst_capacity)

    def _get(self, pk: str, sk: str) -> dict[str, Any]:
        response = self._client.get_item(
            TableName=self._table, Key={"pk": {"S": pk}, "sk": {"S": sk}}, ConsistentRead=True
        )
        return plain(response.get("Item") or {})

    def _items(self, tenant: str, limits: ConcurrencyLimits) -> list[LeaseItem]:
        return lease_items(tenant, self.holder, limits, held_sk=self._held.get(tenant))

    def _took(self, item: LeaseItem) -> None:
        self._held[item.tenant] = item.sk

    def acquire(
        self, tenant: str, limits: ConcurrencyLimits, expires_at_ms: int, floor_until: int | None = None
    ) -> Grant:
        """Take (or renew) this container's lease of ``tenant`` until ``expires_at_ms`` (a floor lease
        until ``floor_until`` if given); REFUSED if full, if every attempt lost its race, or if the
        table could not be read or written (in both of a sharded tenant's shards the container may
        lease in)."""
        self._floor_until = {} if floor_until is None else {tenant: floor_until}
        return self._acquire_in(self._items(tenant, limits), expires_at_ms)

    def renew(self, tenant: str, limits: ConcurrencyLimits, until_ms: int) -> bool:
        """Move this container's floor lease of ``tenant`` to expire at ``until_ms`` (one blind write of
        its slot); False if not renewed (its slot lapsed and was taken, the floor is full, an error)."""
        self._floor_until = {tenant: until_ms}
        return self._floor_without_read(self._items(tenant, limits)[0], until_ms, fresh=True)

    def carry(self, counters: Mapping[str, Mapping[str, int]]) -> None:
        """Counters (per tenant) to add in the tenant's next floor write of its counters item, in the
        same UpdateItem (:func:`~breakwater.aws.counters.counters_update`), until :meth:`carried_landed`."""
        self._landed = set()
        self._carried = {}
        for tenant, deltas in counters.items():
            update = counters_update(self._table, tenant, deltas)
            if update is not None:
                self._carried[tenant] = update

    def carried_landed(self) -> set[str]:
        """The tenants whose carried counters a floor write took (written); the others' are not
        written, and nothing is carried any more."""
        landed, self._landed, self._carried = self._landed, set(), {}
        return landed

    def _with_carried(self, lease_item: LeaseItem, update: dict[str, Any]) -> dict[str, Any]:
        """A floor write of the tenant's counters item with the counters it carries, if any."""
        carried = self._carried.get(lease_item.tenant) if lease_item.on_counters else None
        return update if carried is None else merged_update(update, carried, conditional=True)

    def _floor_landed(self, lease_item: LeaseItem, slot: int) -> None:
        """A floor write in ``slot`` landed (with the tenant's carried counters, if it carried any)."""
        self._slots[self._slot_key_of(lease_item)] = slot
        self._took(lease_item)
        if lease_item.on_counters and self._carried.pop(lease_item.tenant, None) is not None:
            self._landed.add(lease_item.tenant)

    def contended(self, tenant: str) -> bool:
        """Whether a blind floor write of ``tenant`` found its floor taken lately (its item is read first
        for a while): its leases are then given back, not left to lapse, so its slots turn over as
        soon as its work is done."""
        key = _item_key(tenant, self._held.get(tenant, CONCURRENCY_SK))
        return self._crowded.crowded(key, self._clock_ms())

    def _floor_expiry(self, tenant: str, expires_at_ms: int) -> int:
        return self._floor_until.get(tenant, expires_at_ms)

    def _acquire_in(self, items: list[LeaseItem], expires_at_ms: int) -> Grant:
        """A lease in the first of ``items`` that grants one, each read first; REFUSED if none does."""
        for item in items:
            try:
                grant = self._acquire(item, expires_at_ms)
            except (ClientError, BotoCoreError) as exc:
                logger.warning(
                    "concurrency lease not taken",
                    extra={"tenant": item.tenant, "sk": item.sk, "error": str(exc)},
                )
                grant = Grant.REFUSED
            if grant is not Grant.REFUSED:
                return grant
        return Grant.REFUSED

    def _acquire(self, lease_item: LeaseItem, expires_at_ms: int) -> Grant:
        for attempt in range(self._attempts):
            now = self._clock_ms()
            item = self._get(*lease_item.key)
            leases = _leases_from(item, self.holder)
            grant = grant_for(self.holder, leases, lease_item.limits, 0, None, now)
            if grant is Grant.FLOOR:
                if self._floor_in_one_write(lease_item, item, expires_at_ms, now):
                    return grant
                # the one write lost to the floor filling meanwhile: read again, after a pause that
                # parts the racers (as a lost read-then-write does)
                if attempt + 1 < self._attempts and not self._pause(attempt):
                    break
                continue
            pool: dict[str, Any] | None = None
            if grant is Grant.BURST and self._pool_places is not None:
                pool = self._get(POOL_PK, self._pool_sk)
                in_use = len(live_leases(_pool_from(pool), now))
                grant = grant_for(self.holder, leases, lease_item.limits, in_use, self._pool_places, now)
            if grant is Grant.REFUSED:
                return grant
            try:
                self._write(lease_item, item, grant, pool, expires_at_ms, now)
            except ClientError as exc:
                if not _conflict(exc):
                    raise
                # another container wrote first: read again, after a pause that parts the racers
                if attempt + 1 < self._attempts and not self._pause(attempt):
                    break
                continue
            self._took(lease_item)
            return grant
        return Grant.REFUSED  # persistent contention: behave as full, the message is deferred

    def acquire_many(
        self,
        requests: Mapping[str, ConcurrencyLimits],
        expires_at_ms: int,
        floor_until: Mapping[str, int] | None = None,
    ) -> dict[str, Grant]:
        """:meth:`acquire` for every tenant of a batch: one BatchGetItem, one conditional write per tenant.

        ``floor_until``: when a tenant's floor lease expires, where it is to lapse rather than be given
        back (others' expire at ``expires_at_ms``, as a burst lease always does).

        The burst leases and the pool go out in one TransactWriteItems (all or nothing); a write that
        loses a race (another container wrote the item) wrote nothing, and its tenants are acquired
        on their own, as :meth:`acquire` does. A tenant whose item could not be read or written is
        acquired on its own too, and refused if that fails: one tenant's trouble is never the batch's.
        A sharded tenant refused in the container's own shard is tried in its other one.
        """
        self._floor_until = dict(floor_until or {})
        choices = {tenant: self._items(tenant, limits) for tenant, limits in requests.items()}
        # First a floor lease without reading, per tenant: such writes never lose a race to each other
        # (each sets its own holder's lease, on a condition DynamoDB checks atomically), so many
        # containers taking the same tenant's floor at once all succeed at one write each.
        grants = {
            tenant: Grant.FLOOR
            for tenant, items in choices.items()
            if self._floor_without_read(items[0], expires_at_ms)
        }
        if len(grants) == len(requests):
            return grants
        return grants | self._acquire_read_first(
            {tenant: items for tenant, items in choices.items() if tenant not in grants}, expires_at_ms
        )

    def _acquire_read_first(
        self, choices: Mapping[str, list[LeaseItem]], expires_at_ms: int
    ) -> dict[str, Grant]:
        """The tenants a write without reading did not lease: their first items (and this container's
        pool shard) in one BatchGetItem, then one conditional write each."""
        if len(choices) > MAX_TENANTS_PER_WRITE:
            return self._one_by_one(choices, expires_at_ms)
        now = self._clock_ms()
        firsts = {tenant: items[0] for tenant, items in choices.items()}
        keys = [item.key for item in firsts.values()]
        if self._pool_places is not None:
            keys.append((POOL_PK, self._pool_sk))
        try:
            # a throttled item's key is asked once more, then left: that tenant is acquired on its own
            found, unread = batch_get_some(self._client, self._table, keys, consistent=True, calls=2)
        except (ClientError, BotoCoreError) as exc:
            logger.warning("concurrency leases not read", extra={"error": str(exc)})
            return self._one_by_one(choices, expires_at_ms)
        pool = found.get((POOL_PK, self._pool_sk), {}) if self._pool_places is not None else None
        if (POOL_PK, self._pool_sk) in unread:
            pool = None  # this batch takes no burst lease: floors only
        pool_leases = live_leases(_pool_from(pool), now) if pool is not None else {}
        grants: dict[str, Grant] = {}
        writes: dict[str, dict[str, Any]] = {}
        lost: list[str] = []
        full: list[str] = []
        for tenant, lease_item in firsts.items():
            if lease_item.key in unread:
                lost.append(tenant)
                continue
            item = found.get(lease_item.key, {})
            leases = _leases_from(item, self.holder)
            # no pool: unbounded; a pool whose shard could not be read: no room this batch
            places = None if self._pool_places is None else (self._pool_places if pool is not None else 0)
            grant = grant_for(self.holder, leases, lease_item.limits, len(pool_leases), places, now)
            if grant is Grant.BURST:
                pool_leases[f"{tenant}#{self.holder}"] = Lease(expires_at_ms=expires_at_ms, burst=True)
            grants[tenant] = grant
            if grant is Grant.FLOOR:
                try:
                    taken = self._floor_in_one_write(lease_item, item, expires_at_ms, now)
                except (ClientError, BotoCoreError) as exc:
                    logger.warning("lease not written", extra={"tenant": tenant, "error": str(exc)})
                    taken = False
                if not taken:
                    lost.append(tenant)
            elif grant is Grant.REFUSED:
                full.append(tenant)
            else:
                writes[tenant] = self._tenant_update(lease_item, item, grant, expires_at_ms, now)
        # the burst leases that need the pool's shard in their transaction (none without a pool: those
        # are plain writes like the floors')
        burst = [tenant for tenant in writes if grants[tenant] is Grant.BURST and pool is not None]
        if burst and pool is not None:
            try:
                items: list[Any] = [{"Update": writes[tenant]} for tenant in burst]
                items.append({"Put": self._pool_put(pool, pool_leases)})
                self._client.transact_write_items(TransactItems=items)
                for tenant in burst:
                    self._took(firsts[tenant])
            except (ClientError, BotoCoreError) as exc:
                if not isinstance(exc, ClientError) or not _conflict(exc):
                    logger.warning("burst leases not written", extra={"error": str(exc)})
                lost.extend(burst)
        for tenant, update in writes.items():
            if tenant in burst:
                continue
            try:
                self._client.update_item(**update)
                self._took(firsts[tenant])
            except (ClientError, BotoCoreError) as exc:
                if not isinstance(exc, ClientError) or not _conflict(exc):
                    logger.warning("lease not written", extra={"tenant": tenant, "error": str(exc)})
                lost.append(tenant)
        if lost:
            grants |= self._one_by_one({tenant: choices[tenant] for tenant in lost}, expires_at_ms)
        # a sharded tenant whose own shard is full: its other shard, read then written
        grants |= {tenant: self._acquire_in(choices[tenant][1:], expires_at_ms) for tenant in full}
        return grants

    def _floor_without_read(self, lease_item: LeaseItem, expires_at_ms: int, *, fresh: bool = False) -> bool:
        """A floor lease in ``lease_item`` in one write, without reading the item first.

        The write sets one floor slot (:func:`~breakwater.concurrency.slot_key`): the one this
        container last held there, else its home slot; on condition that the slot is free (never
        taken, or its lease expired) or already this holder's, so it only ever grants what
        :func:`grant_for` would grant as FLOOR. ``version`` moves, so a read-then-write of another
        container made meanwhile fails its condition, as with any write. A slot found taken is
        retried once in a slot the failed write's item shows open. False: not granted this way (the
        floor taken, the item holds no leases yet, a conflict), the caller reads. ``fresh``: the
        slot was just chosen from a read (or the map just made), try even if the item looked crowded.
        """
        if lease_item.limits.floor == 0:
            return False  # a shard without a floor of its own: every lease in it is read first
        now = self._clock_ms()
        crowded_key = self._slot_key_of(lease_item)
        if not fresh and self._crowded.crowded(crowded_key, now):
            return False
        expires = self._floor_expiry(lease_item.tenant, expires_at_ms)
        for _ in range(2):
            slot = self._slot_of(lease_item)
            try:
                self._client.update_item(
                    **self._with_carried(lease_item, self._floor_update(lease_item, slot, expires, now)),
                    ReturnValuesOnConditionCheckFailure="ALL_OLD",
                )
            except ClientError as exc:
                if exc.response.get("Error", {}).get("Code") != "ConditionalCheckFailedException":
                    return False  # a race or the item unavailable: the read path decides
                item = plain(exc.response.get("Item") or {})  # type: ignore[arg-type]
                if not self._found_taken(lease_item, item, now):
                    return False
                continue  # another slot is open: one more write there
            except BotoCoreError:
                return False
            self._floor_landed(lease_item, slot)
            return True
        return False

    def _slot_key_of(self, lease_item: LeaseItem) -> str:
        return _item_key(lease_item.tenant, lease_item.sk)

    def _slot_of(self, lease_item: LeaseItem) -> int:
        """The floor slot to write in ``lease_item``: the one this container last wrote, else its home."""
        slot = self._slots.get(self._slot_key_of(lease_item))
        floor = lease_item.limits.floor
        return slot if slot is not None and slot < floor else home_slot(self.holder, floor)

    def _choose_slot(self, lease_item: LeaseItem, item: Mapping[str, Any], now: int) -> bool:
        """Remember the first slot the read ``item`` shows open to this holder; False if none is."""
        slots = open_slots(item.get("leases") or {}, self.holder, lease_item.limits.floor, now)
        if slots:
            self._slots[self._slot_key_of(lease_item)] = slots[0]
        return bool(slots)

    def _floor_update(self, lease_item: LeaseItem, slot: int, expires_at_ms: int, now: int) -> dict[str, Any]:
        """The UpdateItem of a floor lease in ``slot`` taken without reading (:meth:`_floor_without_read`)."""
        return {
            "TableName": self._table,
            "Key": {"pk": {"S": lease_item.pk}, "sk": {"S": lease_item.sk}},
            "UpdateExpression": "SET leases.#slot = :lease ADD version :one",
            # attribute_exists first: a nested path in an item without the map is invalid
            "ConditionExpression": (
                "attribute_exists(leases) AND (attribute_not_exists(leases.#slot)"
                " OR leases.#slot.#exp <= :now_ms OR leases.#slot.#who = :me)"
            ),
            "ExpressionAttributeNames": {"#slot": slot_key(slot), "#exp": "exp", "#who": "h"},
            "ExpressionAttributeValues": {
                ":lease": {"M": {"exp": {"N": str(expires_at_ms)}, "h": {"S": self.holder}}},
                ":me": {"S": self.holder},
                ":one": {"N": "1"},
                ":now_ms": {"N": str(now)},
            },
        }

    def floor_rider(
        self, tenant: str, limits: ConcurrencyLimits, expires_at_ms: int, floor_until: int | None = None
    ) -> Rider | None:
        """The floor lease of :meth:`_floor_without_read` as a :class:`~breakwater.aws.counters.Rider`
        of another write of the tenant's counters item (its consumer bucket's lease write), for a
        tenant whose leases are on that item; None where a lease is not taken without reading (leases
        on lease shards, no floor, the item found at its floor lately). Landed, the lease is held as
        :meth:`acquire_many` would hold it; refused (the slot taken, the map not made yet), the tenant
        is leased by :meth:`acquire_many`: in a slot the refusal showed open, or read first if none."""
        lease_item = self._items(tenant, limits)[0]
        if lease_item.sk != CONCURRENCY_SK or lease_item.limits.floor == 0:
            return None
        now = self._clock_ms()
        if self._crowded.crowded(self._slot_key_of(lease_item), now):
            return None
        slot = self._slot_of(lease_item)
        holder = self.holder
        expires = expires_at_ms if floor_until is None else floor_until

        def holds(item: Mapping[str, Any]) -> bool:
            if "leases" not in item:
                return False
            return slot in open_slots(plain(item)["leases"], holder, lease_item.limits.floor, now)

        return Rider(
            update=self._with_carried(lease_item, self._floor_update(lease_item, slot, expires, now)),
            holds=holds,
            on_landed=lambda: self._floor_landed(lease_item, slot),
            on_refused=lambda item: self._refused(lease_item, item, now),
        )

    def _refused(self, lease_item: LeaseItem, item: Mapping[str, Any], now: int) -> None:
        """A floor rider refused on ``item`` (low-level, as the failed write returned it)."""
        self._found_taken(lease_item, plain(item), now)

    def _found_taken(self, lease_item: LeaseItem, item: Mapping[str, Any], now: int) -> bool:
        """A blind floor write failed its condition on ``item`` (as the write returned it): True if
        another slot is open there (remembered, for the next write); else the item is read first for
        a while if its floor is taken, not merely if it has no map of leases yet."""
        if "leases" not in item:
            return False
        if self._choose_slot(lease_item, item, now):
            return True
        self._crowded.found_taken(self._slot_key_of(lease_item), now)
        return False

    def _make_room(self, lease_item: LeaseItem) -> None:
        """Give the lease item an (empty) map of leases if it has none, so floor leases can be taken
        without reading (:meth:`_floor_without_read`). Unconditional and idempotent: containers that
        all meet a new tenant at once all succeed, where creating the item on its ``version`` would
        make all but one lose the race."""
        self._client.update_item(
            TableName=self._table,
            Key={"pk": {"S": lease_item.pk}, "sk": {"S": lease_item.sk}},
            UpdateExpression="SET leases = if_not_exists(leases, :none)",
            ExpressionAttributeValues={":none": {"M": {}}},
        )

    def _floor_in_one_write(
        self, lease_item: LeaseItem, item: Mapping[str, Any], expires_at_ms: int, now: int
    ) -> bool:
        """A floor lease the read says is free, taken in a slot the read shows open with the write that
        races no other such write (:meth:`_floor_without_read`); the map made first if the item has
        none. False: lost (or no slot open: the floor is held above what the read counted)."""
        if "leases" not in item:
            self._make_room(lease_item)
        elif not self._choose_slot(lease_item, item, now):
            return False
        return self._floor_without_read(lease_item, expires_at_ms, fresh=True)

    def _one_by_one(self, choices: Mapping[str, list[LeaseItem]], expires_at_ms: int) -> dict[str, Grant]:
        """Each tenant acquired on its own (:meth:`acquire`)."""
        return {tenant: self._acquire_in(items, expires_at_ms) for tenant, items in choices.items()}

    def _write(
        self,
        lease_item: LeaseItem,
        item: Mapping[str, Any],
        grant: Grant,
        pool: Mapping[str, Any] | None,
        expires_at_ms: int,
        now: int,
    ) -> None:
        update = self._tenant_update(lease_item, item, grant, expires_at_ms, now)
        if pool is None:
            self._client.update_item(**update)
            return
        pool_leases = live_leases(_pool_from(pool), now)
        pool_leases[f"{lease_item.tenant}#{self.holder}"] = Lease(expires_at_ms=expires_at_ms, burst=True)
        items: list[Any] = [{"Update": update}, {"Put": self._pool_put(pool, pool_leases)}]
        # (the pool's shard is this container's: ``_pool_put`` writes it)
        self._client.transact_write_items(TransactItems=items)

    def _tenant_update(
        self,
        lease_item: LeaseItem,
        item: Mapping[str, Any],
        grant: Grant,
        expires_at_ms: int,
        now: int,
    ) -> dict[str, Any]:
        """The item's live leases with this holder's, written over ``leases`` if ``version`` did not move
        (an update, not a put: the counters on a counters item stay as they are; expired entries go)."""
        kept = {
            key: _entry_value(key, value)
            for key, value in (item.get("leases") or {}).items()
            if int(value["exp"]) > now and key != self.holder
        }
        kept[self.holder] = _lease_value(Lease(expires_at_ms=expires_at_ms, burst=grant is Grant.BURST))
        version = int(item["version"]) if "version" in item else None
        condition = _condition(version)
        return {
            "TableName": self._table,
            "Key": {"pk": {"S": lease_item.pk}, "sk": {"S": lease_item.sk}},
            "UpdateExpression": "SET leases = :leases, version = :next",
            "ConditionExpression": condition["ConditionExpression"],
            "ExpressionAttributeValues": {
                ":leases": {"M": kept},
                ":next": {"N": str((version or 0) + 1)},
                **condition.get("ExpressionAttributeValues", {}),
            },
        }

    def _pool_put(self, pool: Mapping[str, Any], pool_leases: Mapping[str, Lease]) -> dict[str, Any]:
        pool_version = int(pool["version"]) if "version" in pool else None
        return {
            "TableName": self._table,
            "Item": {
                "pk": {"S": POOL_PK},
                "sk": {"S": self._pool_sk},
                "leases": {"M": {key: {"N": str(lease.expires_at_ms)} for key, lease in pool_leases.items()}},
                "version": {"N": str((pool_version or 0) + 1)},
            },
            **_condition(pool_version),
        }

    def release_update(self, tenant: str, grant: Grant) -> dict[str, Any] | None:
        """The UpdateItem that gives back the tenant's lease (None if refused), on the item the lease was
        taken in: the tenant's counters item, for the caller to merge with its counters
        (:func:`breakwater.aws.counters.merged_update`), or one of its lease shards, written alone.
        Call :meth:`released` once it is written."""
        if grant is Grant.REFUSED:
            return None
        sk = self._held.get(tenant, CONCURRENCY_SK)
        # a floor lease is this holder's slot: only given back while it still holds it (a lease taken
        # to last the invocation, or renewed), never after it lapsed to another container
        name = self.holder
        if grant is Grant.FLOOR:
            slot = self._slots.get(_item_key(tenant, sk))
            if slot is None:
                return None
            name = slot_key(slot)
        return {
            "TableName": self._table,
            "Key": {"pk": {"S": tenant_pk(tenant)}, "sk": {"S": sk}},
            "UpdateExpression": "REMOVE leases.#h ADD version :one",
            "ExpressionAttributeNames": {"#h": name},
            "ExpressionAttributeValues": {":one": {"N": "1"}},
        }

    def released(self, tenant: str) -> None:
        """The tenant's lease was given back: its next one is taken in the container's own item again
        (until then, in the item still holding it, so the container never holds two)."""
        self._held.pop(tenant, None)

    def pool_release_update(self, grants: Mapping[str, Grant]) -> dict[str, Any] | None:
        """The UpdateItem that gives back the batch's places in the burst pool (None if it holds none)."""
        burst = [tenant for tenant, grant in grants.items() if grant is Grant.BURST]
        if not burst or self._pool_places is None:
            return None
        names = {f"#k{i}": f"{tenant}#{self.holder}" for i, tenant in enumerate(burst)}
        return {
            "TableName": self._table,
            "Key": {"pk": {"S": POOL_PK}, "sk": {"S": self._pool_sk}},
            "UpdateExpression": f"REMOVE {', '.join(f'leases.{name}' for name in names)} ADD version :one",
            "ExpressionAttributeNames": names,
            "ExpressionAttributeValues": {":one": {"N": "1"}},
        }

    def release(self, tenant: str, grant: Grant) -> None:
        """Give the slot back; if this fails the lease still expires on its own."""
        for update in (self.release_update(tenant, grant), self.pool_release_update({tenant: grant})):
            if update is not None:
                self._client.update_item(**update)
        self.released(tenant)

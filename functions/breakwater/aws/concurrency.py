"""Concurrency leases in the state table (``tenant#<id>``/``concurrency``, and the shared burst pool).

Optimistic concurrency: read the item, drop expired leases, decide with the pure policy
(:func:`breakwater.concurrency.grant_for`), write it back on condition that ``version`` did not
move. A floor lease is one conditional PutItem; a burst lease also takes a place in the pool item
(``pool#concurrency``/``burst``) in the same TransactWriteItems, so the two never disagree. A
batch acquires all its tenants at once (:meth:`ConcurrencyLeases.acquire_many`: one BatchGetItem,
one TransactWriteItems) and gives them back in one write with its counters (``release_updates``),
so the cost per batch is three calls whatever the number of tenants; a lost race falls back to one
tenant at a time. A batch of one tenant first tries a *floor* lease without reading
(:meth:`ConcurrencyLeases._floor_without_read`): one conditional write, on condition that the
tenant's item holds fewer leases than its floor, expired ones included; a tenant found at its floor
is read first for a while (:class:`breakwater.concurrency.CrowdedFloors`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError

from breakwater.aws.counters import batch_get, plain, tenant_pk
from breakwater.concurrency import ConcurrencyLimits, CrowdedFloors, Grant, Lease, grant_for, live_leases

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient

CONCURRENCY_SK = "concurrency"
POOL_PK = "pool#concurrency"
POOL_SK = "burst"
MAX_TENANTS_PER_WRITE = 99  # TransactWriteItems takes 100 items: the tenants and the pool
_OK = (None, "None")  # the cancellation reason of an item that did not fail
_CONFLICTS = {
    "ConditionalCheckFailedException",
    "TransactionCanceledException",
    "TransactionConflictException",
}


def _leases_from(item: Mapping[str, Any]) -> dict[str, Lease]:
    raw = item.get("leases") or {}
    return {
        holder: Lease(expires_at_ms=int(value["exp"]), burst=bool(value.get("burst", False)))
        for holder, value in raw.items()
    }


def _pool_from(item: Mapping[str, Any]) -> dict[str, Lease]:
    return {
        key: Lease(expires_at_ms=int(value), burst=True) for key, value in (item.get("leases") or {}).items()
    }


def _condition(version: int | None) -> dict[str, Any]:
    if version is None:
        return {"ConditionExpression": "attribute_not_exists(pk)"}
    return {"ConditionExpression": "version = :v", "ExpressionAttributeValues": {":v": {"N": str(version)}}}


def _failed_riders(
    reasons: Sequence[Mapping[str, object]], leases: int, rider_keys: list[str]
) -> list[str] | None:
    """The riders to drop after a cancelled transaction of ``leases`` leases, then the riders.

    The keys of the riders that failed their conditions (possibly none), when those are the only
    failures; None when a lease failed, a rider failed otherwise, or the reasons do not match the items.
    """
    failed = [index for index, reason in enumerate(reasons) if reason.get("Code") not in _OK]
    if len(reasons) != leases + len(rider_keys) or (failed and min(failed) < leases):
        return None
    if any(reasons[index].get("Code") != "ConditionalCheckFailed" for index in failed):
        return None
    return [rider_keys[index - leases] for index in failed]


def _no_riders(_grants: Mapping[str, Grant]) -> Mapping[str, Any]:
    return {}


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
    ) -> None:
        self._client = client
        self._table = table_name
        self.holder = holder
        self.burst_capacity = burst_capacity
        self._clock_ms = clock_ms
        self._attempts = attempts
        self._crowded = CrowdedFloors()  # tenants whose floor was found taken: read first

    def _get(self, pk: str, sk: str) -> dict[str, Any]:
        response = self._client.get_item(
            TableName=self._table, Key={"pk": {"S": pk}, "sk": {"S": sk}}, ConsistentRead=True
        )
        return plain(response.get("Item") or {})

    def acquire(self, tenant: str, limits: ConcurrencyLimits, expires_at_ms: int) -> Grant:
        """Take (or renew) this container's lease of ``tenant`` until ``expires_at_ms``; REFUSED if full."""
        for _ in range(self._attempts):
            now = self._clock_ms()
            item = self._get(tenant_pk(tenant), CONCURRENCY_SK)
            leases = _leases_from(item)
            grant = grant_for(self.holder, leases, limits, 0, None, now)
            pool: dict[str, Any] | None = None
            if grant is Grant.BURST and self.burst_capacity is not None:
                pool = self._get(POOL_PK, POOL_SK)
                in_use = len(live_leases(_pool_from(pool), now))
                grant = grant_for(self.holder, leases, limits, in_use, self.burst_capacity, now)
            if grant is Grant.REFUSED:
                return grant
            try:
                self._write(tenant, item, leases, grant, pool, expires_at_ms, now)
            except ClientError as exc:
                if exc.response.get("Error", {}).get("Code") in _CONFLICTS:
                    continue  # another container wrote first: read again
                raise
            return grant
        return Grant.REFUSED  # persistent contention: behave as full, the message is deferred

    def acquire_many(self, requests: Mapping[str, ConcurrencyLimits], expires_at_ms: int) -> dict[str, Grant]:
        """:meth:`acquire` for every tenant of a batch: one BatchGetItem, one TransactWriteItems.

        If the transaction loses a race (another container wrote one of the items) nothing was
        written, and each tenant is acquired on its own, as :meth:`acquire` does.
        """
        return self.acquire_with_riders(requests, expires_at_ms)[0]

    def acquire_with_riders(
        self,
        requests: Mapping[str, ConcurrencyLimits],
        expires_at_ms: int,
        riders: Callable[[Mapping[str, Grant]], Mapping[str, Any]] | None = None,
    ) -> tuple[dict[str, Grant], list[str]]:
        """:meth:`acquire_many`, with other conditional writes riding in the leases' transaction.

        ``riders(grants)`` gives TransactWriteItems entries by key (the batch's idempotency locks
        for the tenants granted); they are written with the leases, all or nothing. A rider whose
        condition fails is dropped and the transaction made again (nothing was written); any other
        failure falls back to :meth:`acquire` per tenant without riders. Returns the grants and the
        keys of the riders written (none if the riders would not fit in one transaction).
        """
        if not requests or len(requests) > MAX_TENANTS_PER_WRITE:
            return self._one_by_one(requests, expires_at_ms), []
        if len(requests) == 1:
            tenant, limits = next(iter(requests.items()))
            unread = self._floor_without_read(tenant, limits, expires_at_ms, riders or _no_riders)
            if unread is not None:
                return unread
        now = self._clock_ms()
        keys = [(tenant_pk(tenant), CONCURRENCY_SK) for tenant in requests]
        if self.burst_capacity is not None:
            keys.append((POOL_PK, POOL_SK))
        found = batch_get(self._client, self._table, keys, consistent=True)
        pool = found.get((POOL_PK, POOL_SK), {}) if self.burst_capacity is not None else None
        pool_leases = live_leases(_pool_from(pool), now) if pool is not None else {}
        grants = {}
        items: list[Any] = []
        for tenant, limits in requests.items():
            item = found.get((tenant_pk(tenant), CONCURRENCY_SK), {})
            leases = _leases_from(item)
            grant = grant_for(self.holder, leases, limits, 0, None, now)
            if grant is Grant.BURST and pool is not None:
                grant = grant_for(self.holder, leases, limits, len(pool_leases), self.burst_capacity, now)
                if grant is Grant.BURST:
                    pool_leases[f"{tenant}#{self.holder}"] = Lease(expires_at_ms=expires_at_ms, burst=True)
            grants[tenant] = grant
            if grant is not Grant.REFUSED:
                items.append({"Put": self._tenant_put(tenant, item, leases, grant, expires_at_ms, now)})
        if pool is not None and any(grant is Grant.BURST for grant in grants.values()):
            items.append({"Put": self._pool_put(pool, pool_leases)})
        extra = dict(riders(grants)) if riders is not None and items else {}
        if len(items) + len(extra) > MAX_TENANTS_PER_WRITE + 1:
            extra = {}  # the riders are written on their own
        for _ in range(self._attempts):
            try:
                if len(items) + len(extra) == 1:
                    self._client.put_item(**items[0]["Put"])
                elif items:
                    self._client.transact_write_items(TransactItems=[*items, *extra.values()])
                return grants, list(extra)
            except ClientError as exc:
                if exc.response.get("Error", {}).get("Code") not in _CONFLICTS:
                    raise
                reasons = exc.response.get("CancellationReasons") or []
                dropped = _failed_riders(reasons, len(items), list(extra))
                if not dropped:
                    break  # a lease lost a race (or no reasons): each tenant on its own, without riders
                for key in dropped:  # only riders failed their conditions: again without them
                    del extra[key]
        return self._one_by_one(requests, expires_at_ms), []

    def _floor_without_read(
        self,
        tenant: str,
        limits: ConcurrencyLimits,
        expires_at_ms: int,
        riders: Callable[[Mapping[str, Grant]], Mapping[str, Any]],
    ) -> tuple[dict[str, Grant], list[str]] | None:
        """A floor lease of ``tenant`` with its riders in one write, without reading the item first.

        The condition ``size(leases) < floor`` counts every lease in the item, expired ones and an
        old one of this holder included, so it only ever grants what :func:`grant_for` would grant
        as FLOOR (the read path cleans expired leases up); ``version`` moves, so a read-then-write
        of another container made meanwhile fails its condition, as with any write. None: not
        granted this way (the floor is taken, the item is new, a conflict), the caller reads.
        """
        now = self._clock_ms()
        if self._crowded.crowded(tenant, now):
            return None
        grants = {tenant: Grant.FLOOR}
        extra = dict(riders(grants))
        if len(extra) > MAX_TENANTS_PER_WRITE:
            return None
        update: dict[str, Any] = {
            "TableName": self._table,
            "Key": {"pk": {"S": tenant_pk(tenant)}, "sk": {"S": CONCURRENCY_SK}},
            "UpdateExpression": "SET leases.#h = :lease, #ttl = :ttl ADD version :one",
            # attribute_exists first: a new item fails as size() of nothing does (and moto, which
            # cannot size a missing attribute, never has to)
            "ConditionExpression": "attribute_exists(leases) AND size(leases) < :floor",
            "ExpressionAttributeNames": {"#h": self.holder, "#ttl": "ttl"},
            "ExpressionAttributeValues": {
                ":lease": {"M": {"exp": {"N": str(expires_at_ms)}, "burst": {"BOOL": False}}},
                ":ttl": {"N": str(expires_at_ms // 1000 + 86_400)},
                ":floor": {"N": str(limits.floor)},
                ":one": {"N": "1"},
            },
        }
        for _ in range(self._attempts):
            try:
                if extra:
                    items: list[Any] = [{"Update": update}, *extra.values()]
                    self._client.transact_write_items(TransactItems=items)
                else:
                    self._client.update_item(**update)
                return grants, list(extra)
            except ClientError as exc:
                error = exc.response.get("Error", {}).get("Code")
                if error not in _CONFLICTS:
                    raise
                reasons = exc.response.get("CancellationReasons") or []
                lease_failed = (
                    error == "ConditionalCheckFailedException"
                    if not extra
                    else not reasons or reasons[0].get("Code") not in _OK
                )
                if lease_failed:
                    if error == "ConditionalCheckFailedException" or (
                        reasons and reasons[0].get("Code") == "ConditionalCheckFailed"
                    ):
                        self._crowded.found_taken(tenant, now)
                    return None
                dropped = _failed_riders(reasons, 1, list(extra))
                if dropped is None:
                    return None
                for key in dropped:  # locks whose record exists: again without them
                    del extra[key]
        return None

    def _one_by_one(self, requests: Mapping[str, ConcurrencyLimits], expires_at_ms: int) -> dict[str, Grant]:
        """Each tenant acquired on its own (:meth:`acquire`), without riders."""
        return {tenant: self.acquire(tenant, limits, expires_at_ms) for tenant, limits in requests.items()}

    def _write(
        self,
        tenant: str,
        item: Mapping[str, Any],
        leases: Mapping[str, Lease],
        grant: Grant,
        pool: Mapping[str, Any] | None,
        expires_at_ms: int,
        now: int,
    ) -> None:
        tenant_put = self._tenant_put(tenant, item, leases, grant, expires_at_ms, now)
        if pool is None:
            self._client.put_item(**tenant_put)
            return
        pool_leases = live_leases(_pool_from(pool), now)
        pool_leases[f"{tenant}#{self.holder}"] = Lease(expires_at_ms=expires_at_ms, burst=True)
        items: list[Any] = [{"Put": tenant_put}, {"Put": self._pool_put(pool, pool_leases)}]
        self._client.transact_write_items(TransactItems=items)

    def _tenant_put(
        self,
        tenant: str,
        item: Mapping[str, Any],
        leases: Mapping[str, Lease],
        grant: Grant,
        expires_at_ms: int,
        now: int,
    ) -> dict[str, Any]:
        kept = live_leases(leases, now)
        kept[self.holder] = Lease(expires_at_ms=expires_at_ms, burst=grant is Grant.BURST)
        version = int(item["version"]) if "version" in item else None
        return {
            "TableName": self._table,
            "Item": {
                "pk": {"S": tenant_pk(tenant)},
                "sk": {"S": CONCURRENCY_SK},
                "leases": {
                    "M": {
                        holder: {
                            "M": {"exp": {"N": str(lease.expires_at_ms)}, "burst": {"BOOL": lease.burst}}
                        }
                        for holder, lease in kept.items()
                    }
                },
                "version": {"N": str((version or 0) + 1)},
                "ttl": {"N": str(max(lease.expires_at_ms for lease in kept.values()) // 1000 + 86_400)},
            },
            **_condition(version),
        }

    def _pool_put(self, pool: Mapping[str, Any], pool_leases: Mapping[str, Lease]) -> dict[str, Any]:
        pool_version = int(pool["version"]) if "version" in pool else None
        return {
            "TableName": self._table,
            "Item": {
                "pk": {"S": POOL_PK},
                "sk": {"S": POOL_SK},
                "leases": {"M": {key: {"N": str(lease.expires_at_ms)} for key, lease in pool_leases.items()}},
                "version": {"N": str((pool_version or 0) + 1)},
            },
            **_condition(pool_version),
        }

    def release_updates(self, grants: Mapping[str, Grant]) -> list[dict[str, Any]]:
        """The UpdateItems that give back the batch's leases (one per tenant, one for the pool)."""
        updates: list[dict[str, Any]] = [
            {
                "TableName": self._table,
                "Key": {"pk": {"S": tenant_pk(tenant)}, "sk": {"S": CONCURRENCY_SK}},
                "UpdateExpression": "REMOVE leases.#h ADD version :one",
                "ExpressionAttributeNames": {"#h": self.holder},
                "ExpressionAttributeValues": {":one": {"N": "1"}},
            }
            for tenant, grant in grants.items()
            if grant is not Grant.REFUSED
        ]
        burst = [tenant for tenant, grant in grants.items() if grant is Grant.BURST]
        if burst and self.burst_capacity is not None:
            names = {f"#k{i}": f"{tenant}#{self.holder}" for i, tenant in enumerate(burst)}
            updates.append(
                {
                    "TableName": self._table,
                    "Key": {"pk": {"S": POOL_PK}, "sk": {"S": POOL_SK}},
                    "UpdateExpression": "REMOVE "
                    + ", ".join(f"leases.{name}" for name in names)
                    + " ADD version :one",
                    "ExpressionAttributeNames": names,
                    "ExpressionAttributeValues": {":one": {"N": "1"}},
                }
            )
        return updates

    def release(self, tenant: str, grant: Grant) -> None:
        """Give the slot back; if this fails the lease still expires on its own."""
        self._client.update_item(
            TableName=self._table,
            Key={"pk": {"S": tenant_pk(tenant)}, "sk": {"S": CONCURRENCY_SK}},
            UpdateExpression="REMOVE leases.#h ADD version :one",
            ExpressionAttributeNames={"#h": self.holder},
            ExpressionAttributeValues={":one": {"N": "1"}},
        )
        if grant is Grant.BURST and self.burst_capacity is not None:
            self._client.update_item(
                TableName=self._table,
                Key={"pk": {"S": POOL_PK}, "sk": {"S": POOL_SK}},
                UpdateExpression="REMOVE leases.#k ADD version :one",
                ExpressionAttributeNames={"#k": f"{tenant}#{self.holder}"},
                ExpressionAttributeValues={":one": {"N": "1"}},
            )

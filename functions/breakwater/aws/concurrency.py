"""Concurrency leases in the state table (``tenant#<id>``/``concurrency``, and the shared burst pool).

Optimistic concurrency: read the item, drop expired leases, decide with the pure policy
(:func:`breakwater.concurrency.grant_for`), write it back on condition that ``version`` did not
move. A floor lease is one conditional PutItem; a burst lease also takes a place in the pool item
(``pool#concurrency``/``burst``) in the same TransactWriteItems, so the two never disagree. Cost per
tenant per batch: one or two reads, one write to acquire, one or two to release.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError

from breakwater.aws.counters import plain, tenant_pk
from breakwater.concurrency import ConcurrencyLimits, Grant, Lease, grant_for, live_leases

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient

CONCURRENCY_SK = "concurrency"
POOL_PK = "pool#concurrency"
POOL_SK = "burst"
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
        kept = live_leases(leases, now)
        kept[self.holder] = Lease(expires_at_ms=expires_at_ms, burst=grant is Grant.BURST)
        version = int(item["version"]) if "version" in item else None
        tenant_put: dict[str, Any] = {
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
        if pool is None:
            self._client.put_item(**tenant_put)
            return
        pool_version = int(pool["version"]) if "version" in pool else None
        pool_leases = {key: lease for key, lease in live_leases(_pool_from(pool), now).items()}
        pool_leases[f"{tenant}#{self.holder}"] = Lease(expires_at_ms=expires_at_ms, burst=True)
        pool_put: dict[str, Any] = {
            "TableName": self._table,
            "Item": {
                "pk": {"S": POOL_PK},
                "sk": {"S": POOL_SK},
                "leases": {"M": {key: {"N": str(lease.expires_at_ms)} for key, lease in pool_leases.items()}},
                "version": {"N": str((pool_version or 0) + 1)},
            },
            **_condition(pool_version),
        }
        items: list[Any] = [{"Put": tenant_put}, {"Put": pool_put}]
        self._client.transact_write_items(TransactItems=items)

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

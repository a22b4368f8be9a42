"""Which item a container leases a tenant in: its counters item, or one of its lease shards.

A tenant whose ceiling fits one shard (:func:`breakwater.concurrency.lease_shard_count` is 1) keeps its
leases in the ``leases`` map of its counters item (``tenant#<id>``/``counters``), where a batch's release
and counters are one write. A larger tenant's leases are spread over ``tenant#<id>``/``lease#<k>`` items
holding only ``leases`` and ``version``, each with its share of the tenant's floor and ceiling
(:func:`breakwater.concurrency.shard_limits`): no item grows with the tenant's concurrency, and each is
written only by the containers hashed to it. A container leases in its own shard
and, when that one is full, in one other (:func:`breakwater.concurrency.lease_shard_order`).
"""

from __future__ import annotations

from dataclasses import dataclass

from breakwater.aws.counters import COUNTERS_SK, tenant_pk
from breakwater.concurrency import (
    ConcurrencyLimits,
    lease_shard_count,
    lease_shard_order,
    shard_limits,
)

LEASE_SHARD_SK = "lease"  # shard k of a tenant's leases is ``lease#<k>``


@dataclass(frozen=True)
class LeaseItem:
    """One item a container can lease ``tenant`` in, with the floor and ceiling that item holds."""

    tenant: str
    sk: str
    limits: ConcurrencyLimits

    @property
    def pk(self) -> str:
        return tenant_pk(self.tenant)

    @property
    def key(self) -> tuple[str, str]:
        return self.pk, self.sk

    @property
    def on_counters(self) -> bool:
        """Whether this is the tenant's counters item (its release merges with its counters)."""
        return self.sk == COUNTERS_SK


def lease_shard_sk(shard: int) -> str:
    return f"{LEASE_SHARD_SK}#{shard}"


def lease_items(
    tenant: str, holder: str, limits: ConcurrencyLimits, *, held_sk: str | None = None
) -> list[LeaseItem]:
    """The items ``holder`` tries to lease ``tenant`` in, in order: the counters item alone for a
    tenant of one shard; else its own shard, then the other one it falls back to.

    ``held_sk``: the item where this container's last lease of the tenant may still be (its release did
    not land): tried first, so the container renews that lease instead of holding two."""
    shards = lease_shard_count(limits)
    if shards == 1:
        return [LeaseItem(tenant, COUNTERS_SK, limits)]
    order = lease_shard_order(tenant, holder, shards)
    items = [LeaseItem(tenant, lease_shard_sk(shard), shard_limits(limits, shard)) for shard in order]
    held = [item for item in items if item.sk == held_sk]
    return held + [item for item in items if item.sk != held_sk]

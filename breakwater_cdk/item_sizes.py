"""The largest size of every item the design writes in the state table, checked at synth.

DynamoDB refuses to write an item over 400 KB, so an item that grows with the configuration must stop
well short of it at the largest configuration the config model accepts. The items that hold maps hold
at most a shard's worth, whatever the configuration: a tenant's concurrency leases (one per container
working on it) are on its counters item (``tenant#<id>``/``counters``) only while its ceiling fits one
lease shard (``LEASE_SHARD_PLACES``), and on lease shard items (``tenant#<id>``/``lease#<k>``) of at most
that many leases above it; each shard of the burst pool holds at most ``POOL_SHARD_PLACES`` places,
whatever the fleet. The others (token buckets, the queues' health reports) have a fixed shape.

Sizes follow DynamoDB's rules: an item is the sum of its attribute names and values; a string is its
UTF-8 bytes, a number one byte per two significant digits plus one, a boolean one byte, a map three
bytes plus each element and one byte per element. Every number is counted at its largest (38
significant digits) and every string at its longest, so a size here is never below the real one.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING

from breakwater.concurrency import (
    MAX_TENANT_CONCURRENCY,
    ConcurrencyLimits,
    lease_shard_count,
    pool_shard_capacities,
    shard_limits,
)

if TYPE_CHECKING:
    from breakwater_cdk.config import BlueprintConfig

ITEM_LIMIT_BYTES = 400 * 1024
NUMBER_BYTES = 38 // 2 + 1
TENANT_ID_BYTES = 64  # tenant ids match ^[A-Za-z0-9_-]{1,64}$
CONTAINER_ID_BYTES = len(uuid.UUID(int=0).hex)  # a lease holder: its container's uuid4 hex
# The counters item's own attributes beside its leases: a dozen ADD counters, the changed-tenant
# marks and the controller's bookmarks and estimate take about 3 KB; this leaves room for more.
COUNTERS_FIELDS_BYTES = 4 * 1024
ROLE_BYTES = 32  # a queue's role in its health item's key (live-<n>, spillover, ordered-<n>, ...)
BUCKET_PURPOSE_BYTES = 16  # a token bucket's purpose in its sort key (ingest, consumer, events)
BUCKET_NUMBERS = ("tokens", "updated_at", "full_at", "version", "multiplier", "ttl")
HEALTH_NUMBERS = ("oldest_age_ms", "observed_at")
# a consumer bucket kept on its tenant's counters item (its attributes prefixed ``consumer_``)
CONSUMER_BUCKET_NUMBERS = ("tokens", "updated_at", "full_at", "version", "multiplier", "backoff")


def string(name: str | int, value_bytes: int) -> int:
    """An attribute holding a string of ``value_bytes``; ``name`` is the name, or its length in bytes."""
    return _name(name) + value_bytes


def number(name: str | int) -> int:
    return _name(name) + NUMBER_BYTES


def boolean(name: str | int) -> int:
    return _name(name) + 1


def map_of(name: str | int, elements: list[int]) -> int:
    """A map attribute; ``elements`` are its elements' sizes, each with its own name."""
    return _name(name) + 3 + sum(size + 1 for size in elements)


def _name(name: str | int) -> int:
    return name if isinstance(name, int) else len(name.encode())


def _keys(pk_bytes: int, sk_bytes: int) -> int:
    return string("pk", pk_bytes) + string("sk", sk_bytes)


@dataclass(frozen=True)
class ItemSize:
    """The largest an item gets, and the configuration key its size grows with."""

    item: str
    size_bytes: int
    sized_by: str
    value: object


def _lease_bytes() -> int:
    """The larger of a burst lease (keyed by its holder) and a floor slot (``#<k>``, naming its holder)."""
    burst = map_of(CONTAINER_ID_BYTES, [number("exp"), boolean("burst")])
    slot = map_of(len(f"#{MAX_TENANT_CONCURRENCY}"), [number("exp"), string("h", CONTAINER_ID_BYTES)])
    return max(burst, slot)


def counters_item_bytes(leases: int) -> int:
    """``tenant#<id>``/``counters`` holding ``leases`` leases (:func:`_lease_bytes` each), and the
    tenant's consumer bucket beside them (its attributes prefixed ``consumer_``, and a backoff)."""
    keys = _keys(len("tenant#") + TENANT_ID_BYTES, len("counters"))
    bucket = sum(number(f"consumer_{name}") for name in CONSUMER_BUCKET_NUMBERS)
    return (
        keys
        + map_of("leases", [_lease_bytes()] * leases)
        + number("version")
        + bucket
        + COUNTERS_FIELDS_BYTES
    )


def lease_shard_item_bytes(leases: int, shards: int) -> int:
    """``tenant#<id>``/``lease#<k>`` (one of ``shards``) holding ``leases`` leases, and its version."""
    keys = _keys(len("tenant#") + TENANT_ID_BYTES, len(f"lease#{max(shards - 1, 0)}"))
    return keys + map_of("leases", [_lease_bytes()] * leases) + number("version")


def tenant_lease_items(concurrency: int) -> tuple[int, int, int]:
    """For a tenant of ``concurrency``: the most leases its counters item holds, the number of its lease
    shards (1: none, its counters item holds them) and the most leases one shard holds."""
    limits = ConcurrencyLimits.clamped(1, concurrency)
    shards = lease_shard_count(limits)
    if shards == 1:
        return limits.ceiling, 1, 0
    return 0, shards, max(shard_limits(limits, shard).ceiling for shard in range(shards))


def pool_shard_item_bytes(places: int, shards: int) -> int:
    """A burst pool shard holding ``places`` places, keyed ``<tenant>#<holder>`` (an expiry each)."""
    place = number(TENANT_ID_BYTES + len("#") + CONTAINER_ID_BYTES)
    keys = _keys(len("pool#concurrency"), len(f"burst#{max(shards - 1, 0)}"))
    return keys + map_of("leases", [place] * places) + number("version")


def bucket_item_bytes() -> int:
    keys = _keys(len("tenant#") + TENANT_ID_BYTES, len("bucket#") + BUCKET_PURPOSE_BYTES)
    return keys + sum(number(name) for name in BUCKET_NUMBERS)


def health_item_bytes(shards: int) -> int:
    keys = _keys(len("queue#") + ROLE_BYTES, len(f"health#{max(shards - 1, 0)}"))
    return keys + sum(number(name) for name in HEALTH_NUMBERS)


def largest_items(config: BlueprintConfig, *, burst_slots: int | None, health_shards: int) -> list[ItemSize]:
    """Each item's largest size under ``config``; ``burst_slots`` is the live worker's burst pool
    (None without one), ``health_shards`` the items the queues' health reports are spread over."""
    # the most leases a counters item holds: those of the largest tier that fits one lease shard (a
    # larger tier's leases are in its lease shards)
    on_counters = max(tenant_lease_items(limits.concurrency)[0] for limits in config.tiers.values())
    tier, limits = max(config.tiers.items(), key=lambda named: named[1].concurrency)
    _, shards, per_shard = tenant_lease_items(limits.concurrency)
    items = [
        ItemSize(
            "tenant#<id>/counters",
            counters_item_bytes(on_counters),
            f"tiers.{tier}.concurrency",
            limits.concurrency,
        ),
        ItemSize("tenant#<id>/bucket#<purpose>", bucket_item_bytes(), "tiers", "(fixed shape)"),
        ItemSize("queue#<role>/health#<n>", health_item_bytes(health_shards), "worker", "(fixed shape)"),
    ]
    if shards > 1:
        items.append(
            ItemSize(
                "tenant#<id>/lease#<k>",
                lease_shard_item_bytes(per_shard, shards),
                f"tiers.{tier}.concurrency",
                limits.concurrency,
            )
        )
    if burst_slots is not None:
        capacities = pool_shard_capacities(burst_slots)
        items.append(
            ItemSize(
                "pool#concurrency/burst#<n>",
                pool_shard_item_bytes(max(capacities), len(capacities)),
                "worker.burst_share",
                config.worker.burst_share,
            )
        )
    return items


def oversized(items: list[ItemSize]) -> list[str]:
    """A message for each item over DynamoDB's limit, naming the key it grows with and its value."""
    return [
        f"breakwater.{item.sized_by} = {item.value!r}: the item {item.item} would reach "
        f"{item.size_bytes:,} bytes, over DynamoDB's {ITEM_LIMIT_BYTES:,}-byte item limit"
        for item in items
        if item.size_bytes > ITEM_LIMIT_BYTES
    ]

"""Where a token bucket is stored, and what a container knows of it.

A bucket is a few attributes of an item under ``tenant#<id>``: ``tokens`` (as of ``updated_at``),
``full_at`` (when it is full again), ``version``, the controller's ``multiplier`` and the last
leaser's contention ``backoff``. Ingest's bucket has an item of its own (``bucket#ingest``). A
worker's consumer bucket is kept on the item of its tenant's concurrency leases (the counters item,
its attributes prefixed ``consumer_``) where those are on it, so a floor lease can be taken in the
bucket's own write (:class:`breakwater.aws.counters.Rider`); a tenant whose leases are on lease shards
keeps its consumer bucket on ``bucket#consumer``. Every expression names the attributes through
placeholders (:meth:`BucketItem.names`), so one code path serves both places.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from breakwater.fairness import BucketLimits, BucketState, full_at

MIN_MULTIPLIER = 0.001
"""A multiplier the controller wrote as 0 or less would mean "never admit"; clamp it to a trickle."""

# the expressions' placeholders and the attributes they stand for (before the item's prefix)
_ATTRIBUTES = {
    "#tok": "tokens",
    "#upd": "updated_at",
    "#fat": "full_at",
    "#ver": "version",
    "#mul": "multiplier",
    "#bko": "backoff",
}
_PLACEHOLDER = re.compile(r"#\w+")


@dataclass(frozen=True)
class BucketItem:
    """The item a bucket is on (``sk`` under ``tenant#<id>``) and the prefix of its attributes there."""

    sk: str
    prefix: str = ""

    def key(self, tenant: str) -> dict[str, dict[str, str]]:
        return {"pk": {"S": f"tenant#{tenant}"}, "sk": {"S": self.sk}}

    def names(self, *expressions: str) -> dict[str, str]:
        """The bucket's placeholders the ``expressions`` use, with the attributes they stand for here
        (DynamoDB refuses a placeholder no expression uses)."""
        used = {match for expression in expressions for match in _PLACEHOLDER.findall(expression)}
        return {holder: self.prefix + name for holder, name in _ATTRIBUTES.items() if holder in used}


@dataclass(frozen=True)
class StoredBucket:
    """What this container last knew of the shared item; ``version`` None means "no bucket stored yet"."""

    state: BucketState | None
    version: int | None
    multiplier: float = 1.0
    full_at: float | None = None  # as stored (None: an item written before ``full_at`` was kept)
    backoff: float = 0.0  # the contention backoff of the last container that leased from it

    def tokens_at(self, limits: BucketLimits, now: float) -> float | None:
        """The tokens the bucket holds at ``now`` by its stored ``full_at`` (None: not stored)."""
        if self.full_at is None:
            return None
        return limits.burst - max(0.0, self.full_at - now) * limits.rate


def parse_bucket_item(item: Mapping[str, Any] | None, prefix: str = "") -> StoredBucket:
    """A low-level item as what we know; missing attributes mean a full, unversioned bucket."""
    if not item:
        return StoredBucket(state=None, version=None)

    def number(name: str) -> float | None:
        value = item.get(prefix + name)
        return float(value["N"]) if value is not None else None

    multiplier = number("multiplier")
    multiplier = 1.0 if multiplier is None or not math.isfinite(multiplier) else multiplier
    multiplier = max(MIN_MULTIPLIER, multiplier)
    version, tokens, updated_at = number("version"), number("tokens"), number("updated_at")
    if version is None or tokens is None or updated_at is None:
        # e.g. the controller set a multiplier before anyone leased: treat as full, create the version.
        return StoredBucket(state=None, version=None, multiplier=multiplier)
    backoff = number("backoff") or 0.0
    return StoredBucket(
        state=BucketState(tokens=tokens, updated_at=updated_at),
        version=int(version),
        multiplier=multiplier,
        full_at=number("full_at"),
        backoff=backoff if math.isfinite(backoff) and backoff > 0 else 0.0,
    )


def state_values(state: BucketState, limits: BucketLimits) -> dict[str, Any]:
    """What every lease writes: ``:tokens``, ``:updated``, ``:full`` (when it is full again at ``limits``)."""
    return {
        ":tokens": {"N": f"{state.tokens:.6f}"},
        ":updated": {"N": f"{state.updated_at:.6f}"},
        ":full": {"N": f"{full_at(state, limits):.6f}"},
    }


def multiplier_condition(multiplier: float) -> tuple[str, dict[str, Any]]:
    """The condition that the stored multiplier is the one a lease was computed with (none stored: 1)."""
    values = {":m": {"N": str(Decimal(str(multiplier)))}}
    if multiplier == 1.0:
        return "(attribute_not_exists(#mul) OR #mul = :m)", values
    return "#mul = :m", values

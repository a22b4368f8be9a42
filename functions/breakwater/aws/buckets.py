"""Token buckets in the state table, leased in chunks (``pk=tenant#<id>``, ``sk=bucket#<purpose>``).

Shared by ingest (purpose ``ingest``) and the workers (purpose ``consumer``). One conditional
UpdateItem on ``version`` takes a lease; it returns the new item (so the next lease needs no read)
and, when another container won the race, the current item (so a lost race costs one more call,
never a read). The math is :mod:`breakwater.fairness`; this module only moves state in and out.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import boto3
from botocore.exceptions import BotoCoreError, ClientError

from breakwater.fairness import BucketLimits, BucketState, LeaseDecision, LocalLease, lease_size, take_lease
from breakwater.observability import logger

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient

MIN_MULTIPLIER = 0.001
"""A multiplier the controller wrote as 0 or less would mean "never admit"; clamp it to a trickle."""


@dataclass(frozen=True)
class StoredBucket:
    """What this container last knew of the shared item; ``version`` None means "no bucket stored yet"."""

    state: BucketState | None
    version: int | None
    multiplier: float = 1.0


def bucket_key(tenant: str, purpose: str) -> dict[str, dict[str, str]]:
    return {"pk": {"S": f"tenant#{tenant}"}, "sk": {"S": f"bucket#{purpose}"}}


def parse_bucket_item(item: Mapping[str, Any] | None) -> StoredBucket:
    """A low-level item as what we know; missing attributes mean a full, unversioned bucket."""
    if not item:
        return StoredBucket(state=None, version=None)
    multiplier = float(item["multiplier"]["N"]) if "multiplier" in item else 1.0
    if not math.isfinite(multiplier):
        multiplier = 1.0
    multiplier = max(MIN_MULTIPLIER, multiplier)
    if "version" not in item or "tokens" not in item or "updated_at" not in item:
        # e.g. the controller set a multiplier before anyone leased: treat as full, create the version.
        return StoredBucket(state=None, version=None, multiplier=multiplier)
    state = BucketState(tokens=float(item["tokens"]["N"]), updated_at=float(item["updated_at"]["N"]))
    return StoredBucket(state=state, version=int(item["version"]["N"]), multiplier=multiplier)


class LeasedTokenBucket:
    """Per-tenant token buckets of one purpose, spent locally from leases taken from DynamoDB.

    ``try_acquire`` returns ``(True, 0.0)`` or ``(False, retry_after_seconds)``. After a refused lease
    the tenant is blocked locally until ``retry_after``, so a throttled tenant costs no DynamoDB calls.
    If DynamoDB itself fails, the container leases from its own view of the bucket (fail open,
    but still bounded by rate and burst per container) rather than refuse every request.
    """

    def __init__(
        self,
        table_name: str,
        purpose: str,
        clock: Callable[[], float],
        lease_seconds: float,
        max_fraction: float,
        *,
        client: DynamoDBClient | None = None,
        max_attempts: int = 3,
    ) -> None:
        self.table_name = table_name
        self.purpose = purpose
        self.lease_seconds = lease_seconds
        self.max_fraction = max_fraction
        self.max_attempts = max_attempts
        self._clock = clock
        self._client: DynamoDBClient = client or boto3.client("dynamodb")
        self._leases: dict[str, LocalLease] = {}
        self._known: dict[str, StoredBucket] = {}

    def try_acquire(self, tenant: str, limits: BucketLimits) -> tuple[bool, float]:
        now = self._clock()
        lease = self._leases.setdefault(tenant, LocalLease())
        if lease.try_spend(now):
            return True, 0.0
        if lease.is_blocked(now):
            return False, lease.blocked_until - now
        decision = self._lease(tenant, limits, now)
        if decision.ok:
            lease.grant(decision.granted, now, self.lease_seconds)
            lease.try_spend(now)
            return True, 0.0
        lease.refuse(now, decision.retry_after)
        return False, decision.retry_after

    def multiplier(self, tenant: str) -> float:
        """The controller's multiplier as last seen by this container (1 until a lease was taken)."""
        known = self._known.get(tenant)
        return known.multiplier if known else 1.0

    def _lease(self, tenant: str, limits: BucketLimits, now: float) -> LeaseDecision:
        known = self._known.get(tenant) or StoredBucket(state=None, version=None)
        decision = self._decide(known, limits, now)
        for _ in range(self.max_attempts):
            if not decision.ok:
                # Other containers only ever take tokens, so a refusal on our view is a refusal on theirs.
                return decision
            try:
                item = self._write(tenant, known, decision, now)
            except ClientError as exc:
                if exc.response.get("Error", {}).get("Code") != "ConditionalCheckFailedException":
                    return self._fail_open(tenant, known, limits, now, exc)
                # Lost the race: the error carries the current item, recompute and try once more.
                known = parse_bucket_item(exc.response.get("Item"))  # type: ignore[arg-type]
                self._known[tenant] = known
                decision = self._decide(known, limits, now)
                continue
            except BotoCoreError as exc:
                return self._fail_open(tenant, known, limits, now, exc)
            self._known[tenant] = parse_bucket_item(item)
            return decision
        # Heavy contention on one bucket: refuse briefly rather than spin.
        current = decision.state
        return LeaseDecision(granted=0, state=current, retry_after=min(1.0, self.lease_seconds))

    def _decide(self, known: StoredBucket, limits: BucketLimits, now: float) -> LeaseDecision:
        effective = limits.scaled(known.multiplier)
        state = known.state if known.state is not None else BucketState.full(effective, now)
        # A lowered multiplier also caps what is already in the bucket.
        state = BucketState(tokens=min(state.tokens, effective.burst), updated_at=state.updated_at)
        wanted = lease_size(effective, self.lease_seconds, self.max_fraction)
        return take_lease(state, effective, now, wanted)

    def _write(self, tenant: str, known: StoredBucket, decision: LeaseDecision, now: float) -> dict[str, Any]:
        values: dict[str, Any] = {
            ":tokens": {"N": f"{decision.state.tokens:.6f}"},
            ":updated": {"N": f"{decision.state.updated_at:.6f}"},
            ":next": {"N": str((known.version or 0) + 1)},
        }
        if known.version is None:
            condition = "attribute_not_exists(version)"
        else:
            condition = "version = :version"
            values[":version"] = {"N": str(known.version)}
        response = self._client.update_item(
            TableName=self.table_name,
            Key=bucket_key(tenant, self.purpose),
            UpdateExpression="SET tokens = :tokens, updated_at = :updated, version = :next",
            ConditionExpression=condition,
            ExpressionAttributeValues=values,
            ReturnValues="ALL_NEW",
            ReturnValuesOnConditionCheckFailure="ALL_OLD",
        )
        return dict(response.get("Attributes", {}))

    def _fail_open(
        self, tenant: str, known: StoredBucket, limits: BucketLimits, now: float, exc: Exception
    ) -> LeaseDecision:
        """DynamoDB failed: lease from this container's own view of the bucket, which it then draws down.

        Admission stays bounded (a local token bucket per container) and a later write, still
        conditional on the last version seen, carries the drawn-down view back to the table.
        """
        decision = self._decide(known, limits, now)
        if decision.ok:
            self._known[tenant] = StoredBucket(decision.state, known.version, known.multiplier)
        logger.warning(
            "token bucket unavailable; leasing from the local view",
            extra={"tenant": tenant, "purpose": self.purpose, "granted": decision.granted, "error": str(exc)},
        )
        return decision

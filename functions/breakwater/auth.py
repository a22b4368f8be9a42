"""Tenant authentication: API keys, their hashes, and the decision for one request.

An API key is ``<tenant_id>.<secret>``: the authorizer reads the tenant's record by id and compares
the SHA-256 of the presented key with the stored hash in constant time. Only hashes are stored;
after a rotation the previous hash stays valid until ``previous_key_valid_until`` so clients can
roll over without downtime. Everything here is pure; the clock is injected.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from breakwater.settings import TierLimits, TierSettings

TENANT_ID_PATTERN = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
"""Tenant ids are safe in keys, queue group ids, log fields and S3 partitions (and never contain ``.``)."""

LIMIT_NAMES = ("rate", "burst", "consumer_rate", "concurrency", "concurrency_floor")


class TenantStatus(StrEnum):
    ACTIVE = "active"
    DISABLED = "disabled"


class MalformedKeyError(ValueError):
    """The Authorization header is missing or is not ``Bearer <tenant_id>.<secret>``."""


@dataclass(frozen=True)
class ApiKey:
    tenant_id: str
    raw: str


@dataclass(frozen=True)
class TenantRecord:
    """One item of the tenants table (the key itself is never stored, only its SHA-256)."""

    tenant_id: str
    key_sha256: str
    tier: str
    status: TenantStatus = TenantStatus.ACTIVE
    previous_key_sha256: str | None = None
    previous_key_valid_until: float | None = None  # epoch seconds
    limits: Mapping[str, float] = field(default_factory=dict)


def validate_tenant_id(tenant_id: str) -> str:
    if not TENANT_ID_PATTERN.match(tenant_id):
        raise ValueError(f"tenant id {tenant_id!r} must be 1-64 characters of A-Z, a-z, 0-9, '_' or '-'")
    return tenant_id


def generate_api_key(tenant_id: str) -> str:
    """A new key for ``tenant_id``: the id (so the authorizer can read one item) and 256 random bits."""
    return f"{validate_tenant_id(tenant_id)}.{secrets.token_urlsafe(32)}"


USAGE_KEY_PREFIX = "breakwater-usage"


def usage_identifier_key(rest_api_id: str, tenant_id: str) -> str:
    """The value of the tenant's API Gateway API key, which the authorizer returns as ``usageIdentifierKey``.

    The API takes keys only from its authorizer (``ApiKeySourceType.AUTHORIZER``), never from a
    client, so the value is no secret: it only names the tenant's usage plan entry (the edge
    throttle, ``breakwater.aws.usage_plans``). API key values are unique per account and region, so
    the API's id is part of it; at least 20 characters, as API Gateway requires.
    """
    return f"{USAGE_KEY_PREFIX}.{rest_api_id}.{validate_tenant_id(tenant_id)}"


def rest_api_id_of(method_arn: str) -> str:
    """``arn:aws:execute-api:<region>:<account>:<api id>/<stage>/<method>/<path>`` -> the API's id."""
    resource = method_arn.split(":", 5)[-1]
    api_id = resource.split("/", 1)[0]
    if not api_id or not method_arn.startswith("arn:"):
        raise ValueError(f"not an execute-api method ARN: {method_arn!r}")
    return api_id


def hash_key(raw_key: str) -> str:
    return hashlib.sha256(raw_key.encode()).hexdigest()


def parse_authorization(header: str | None) -> ApiKey:
    """``Bearer <tenant_id>.<secret>`` -> the key; anything else is malformed."""
    if not header:
        raise MalformedKeyError("missing Authorization header")
    scheme, _, token = header.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        raise MalformedKeyError("Authorization header must be 'Bearer <api key>'")
    tenant_id, dot, secret = token.partition(".")
    if not dot or not secret or not TENANT_ID_PATTERN.match(tenant_id):
        raise MalformedKeyError("API key must be '<tenant_id>.<secret>'")
    return ApiKey(tenant_id=tenant_id, raw=token)


def key_matches(record: TenantRecord, key: ApiKey, now: float) -> bool:
    """Constant-time comparison with the current hash, and the previous one during a rotation's overlap."""
    presented = hash_key(key.raw)
    current = hmac.compare_digest(presented, record.key_sha256)
    previous = False
    if record.previous_key_sha256 and record.previous_key_valid_until is not None:
        # Compare even when the window has closed, so timing does not reveal the rotation state.
        previous = hmac.compare_digest(presented, record.previous_key_sha256)
        previous = previous and now < record.previous_key_valid_until
    return current or previous


def effective_limits(tiers: TierSettings, record: TenantRecord) -> TierLimits:
    """The tier's limits with the tenant's own overrides applied (unknown tiers fall back to the default)."""
    base = tiers.limits_for(record.tier).model_dump()
    overrides = {name: value for name, value in record.limits.items() if name in LIMIT_NAMES}
    return TierLimits.model_validate({**base, **overrides})


class Verdict(StrEnum):
    ALLOW = "allow"
    DENY = "deny"  # known tenant, valid key, but disabled: 403
    UNAUTHORIZED = "unauthorized"  # malformed, unknown or wrong key: 401


@dataclass(frozen=True)
class AuthDecision:
    verdict: Verdict
    tenant_id: str | None = None
    tier: str | None = None
    limits: TierLimits | None = None
    reason: str = ""

    def context(self) -> dict[str, str | int | float]:
        """The authorizer context API Gateway hands to the integration (flat scalars only)."""
        if self.tenant_id is None or self.limits is None or self.tier is None:
            return {}
        return {"tenant": self.tenant_id, "tier": self.tier, **self.limits.model_dump()}


def decide(record: TenantRecord | None, key: ApiKey, tiers: TierSettings, now: float) -> AuthDecision:
    if record is None:
        return AuthDecision(Verdict.UNAUTHORIZED, reason="unknown tenant")
    if not key_matches(record, key, now):
        return AuthDecision(Verdict.UNAUTHORIZED, tenant_id=record.tenant_id, reason="key does not match")
    if record.status != TenantStatus.ACTIVE:
        return AuthDecision(Verdict.DENY, tenant_id=record.tenant_id, reason=f"tenant is {record.status}")
    tier = record.tier if record.tier in tiers.tiers else tiers.default_tier
    return AuthDecision(
        Verdict.ALLOW,
        tenant_id=record.tenant_id,
        tier=tier,
        limits=effective_limits(tiers, record),
    )


@dataclass
class _Cached:
    record: TenantRecord | None
    fetched_at: float


class TenantCache:
    """In-process TTL cache of tenant records, negative results included (for a shorter time).

    Caching keeps the authorizer at about one read per tenant per TTL; caching misses keeps a flood
    of bogus keys from turning into a flood of reads. A key that does not match a cached record
    triggers one re-read once the entry is older than ``recheck_seconds``, so a freshly rotated key
    works within seconds while wrong keys still cannot force a read per request.
    """

    def __init__(
        self,
        fetch: Callable[[str], TenantRecord | None],
        clock: Callable[[], float],
        ttl_seconds: float,
        negative_ttl_seconds: float = 5.0,
        recheck_seconds: float = 5.0,
        max_entries: int = 10_000,
    ) -> None:
        self._fetch = fetch
        self._clock = clock
        self.ttl_seconds = ttl_seconds
        self.negative_ttl_seconds = min(negative_ttl_seconds, ttl_seconds)
        self.recheck_seconds = recheck_seconds
        self.max_entries = max_entries
        self._entries: dict[str, _Cached] = {}

    def get(self, tenant_id: str) -> TenantRecord | None:
        now = self._clock()
        entry = self._entries.get(tenant_id)
        if entry is not None:
            ttl = self.ttl_seconds if entry.record is not None else self.negative_ttl_seconds
            if now - entry.fetched_at < ttl:
                return entry.record
        return self._refresh(tenant_id, now)

    def recheck(self, tenant_id: str) -> TenantRecord | None:
        """Re-read a record whose key did not match, unless it was read very recently."""
        now = self._clock()
        entry = self._entries.get(tenant_id)
        if entry is not None and now - entry.fetched_at < self.recheck_seconds:
            return entry.record
        return self._refresh(tenant_id, now)

    def _refresh(self, tenant_id: str, now: float) -> TenantRecord | None:
        record = self._fetch(tenant_id)
        if len(self._entries) >= self.max_entries and tenant_id not in self._entries:
            self._entries.clear()  # crude bound on memory; a cold cache is always correct
        self._entries[tenant_id] = _Cached(record=record, fetched_at=now)
        return record


class Authorizer:
    """Turns an Authorization header into a decision, reading tenant records through a cache."""

    def __init__(self, cache: TenantCache, tiers: TierSettings, clock: Callable[[], float]) -> None:
        self._cache = cache
        self._tiers = tiers
        self._clock = clock

    def authorize(self, header: str | None) -> AuthDecision:
        try:
            key = parse_authorization(header)
        except MalformedKeyError as exc:
            return AuthDecision(Verdict.UNAUTHORIZED, reason=str(exc))
        record = self._cache.get(key.tenant_id)
        decision = decide(record, key, self._tiers, self._clock())
        if decision.verdict == Verdict.UNAUTHORIZED and record is not None:
            decision = decide(self._cache.recheck(key.tenant_id), key, self._tiers, self._clock())
        return decision


def record_from_item(item: Mapping[str, Any]) -> TenantRecord:
    """A tenants-table item (plain Python values) as a record."""
    limits = item.get("limits") or {}
    valid_until = item.get("previous_key_valid_until")
    return TenantRecord(
        tenant_id=str(item["tenant_id"]),
        key_sha256=str(item["key_sha256"]),
        tier=str(item.get("tier") or ""),
        status=TenantStatus(str(item.get("status") or TenantStatus.ACTIVE)),
        previous_key_sha256=(str(item["previous_key_sha256"]) if item.get("previous_key_sha256") else None),
        previous_key_valid_until=float(valid_until) if valid_until is not None else None,
        limits={str(name): float(value) for name, value in limits.items()},
    )

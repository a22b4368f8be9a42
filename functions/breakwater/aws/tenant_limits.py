"""Per-tenant limits for the workers and the controller: the tier's, with the tenant's overrides, cached."""

from __future__ import annotations

import time
from collections.abc import Callable

from breakwater.auth import effective_limits
from breakwater.aws.tenants import TenantTable
from breakwater.settings import TierLimits, TierSettings

STALE_RETRY_S = 5.0  # after a failed read, the limits read before stand this long before a new read


class TenantLimitsCache:
    """Reads a tenant record at most once per ``ttl_s``; unknown tenants (or no table): the default tier."""

    def __init__(
        self,
        tiers: TierSettings,
        table: TenantTable | None,
        *,
        ttl_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._tiers = tiers
        self._table = table
        self._ttl = ttl_s
        self._clock = clock
        self._cache: dict[str, tuple[float, TierLimits]] = {}

    def get(self, tenant: str) -> TierLimits:
        """The tenant's limits; a read that fails keeps the limits read before for a while (the caller
        sees the error only for a tenant it never read: the worker then defers that tenant alone)."""
        now = self._clock()
        hit = self._cache.get(tenant)
        if hit is not None and hit[0] > now:
            return hit[1]
        try:
            record = self._table.get(tenant) if self._table is not None else None
        except Exception:
            if hit is None:
                raise
            self._cache[tenant] = (now + min(self._ttl, STALE_RETRY_S), hit[1])
            return hit[1]
        limits = effective_limits(self._tiers, record) if record is not None else self._tiers.limits_for(None)
        self._cache[tenant] = (now + self._ttl, limits)
        return limits

"""The throttles the emulated API applies before any integration runs: the stage's token bucket and
the usage plans' per-key buckets, read from the embedded API Gateway."""

from __future__ import annotations

import threading
import time
from typing import Any

# Between the reads of the plans a request for a key not yet known makes when one fails (the last
# pause is not waited: no read follows it).
READ_RETRY_PAUSES_S = (0.05, 0.2, 0.5, 0.0)


class StageThrottle:
    """The stage's token bucket (ThrottlingRateLimit / ThrottlingBurstLimit of ``/*``)."""

    def __init__(self, rate: float | None, burst: int | None) -> None:
        self.rate, self.burst = rate, float(burst or 0)
        self.tokens, self.updated = self.burst, time.monotonic()
        self._lock = threading.Lock()

    def admit(self) -> bool:
        if not self.rate:
            return True
        with self._lock:
            now = time.monotonic()
            self.tokens = min(self.burst, self.tokens + (now - self.updated) * self.rate)
            self.updated = now
            if self.tokens >= 1:
                self.tokens -= 1
                return True
            return False


class UsagePlanThrottles:
    """The usage plans of one stage: which plan a key is in, and a token bucket per key (its throttle).

    Plans and keys are read from the embedded API Gateway, one read at a time: again every
    ``refresh_seconds`` (by whichever request finds them stale, while the others go on with the last
    read), and when a request's key is not in the last read. Such a request waits for a read that
    began after it arrived (or one that found its key while it waited), so a key enrolled before its
    first request is always found; a key that is still unknown causes at most one read a second. A
    changed plan applies within ``refresh_seconds`` (API Gateway, too, applies plan changes after a
    delay).
    """

    def __init__(self, client: Any, rest_api_id: str, stage: str, refresh_seconds: float = 5.0) -> None:
        self._client = client
        self.rest_api_id, self.stage = rest_api_id, stage
        self.refresh_seconds = refresh_seconds
        self._plan_of_key: dict[str, tuple[str, float | None, int | None]] = {}  # value -> plan, rate, burst
        self._buckets: dict[tuple[str, str, float | None, int | None], StageThrottle] = {}
        self._read_started = float("-inf")  # when the last successful read began
        self._missed: dict[str, float] = {}  # unknown key -> when it last caused a read
        self._lock = threading.Lock()  # the maps above
        self._read_lock = threading.Lock()  # one read at a time

    def admit(self, key_value: str) -> bool | None:
        """True: within its plan's throttle; False: throttled; None: the key is in no plan of the stage."""
        arrived = time.monotonic()
        with self._lock:
            plan = self._plan_of_key.get(key_value)
            stale = arrived - self._read_started >= self.refresh_seconds
        if plan is None:
            plan = self._after_a_read(key_value, arrived)
        elif stale and self._read_lock.acquire(blocking=False):
            try:
                self._read_into()
            finally:
                self._read_lock.release()
        if plan is None:
            return None
        with self._lock:
            bucket = self._buckets.get((key_value, *plan))
            if bucket is None:
                bucket = self._buckets[(key_value, *plan)] = StageThrottle(plan[1], plan[2])
        return bucket.admit()

    def _after_a_read(self, key_value: str, arrived: float) -> tuple[str, float | None, int | None] | None:
        """The key's plan as of a read that began after ``arrived`` (an unknown key reads once a second)."""
        with self._read_lock:
            with self._lock:
                # a read that began after this request arrived, or one (begun a moment before it) that
                # found the key while this request waited for it: that read's answer stands
                known = self._plan_of_key.get(key_value)
                if known is not None or self._read_started >= arrived:
                    return known
                if arrived - self._missed.get(key_value, float("-inf")) < 1.0:
                    return None
                if len(self._missed) >= 10_000:
                    self._missed.clear()
                self._missed[key_value] = arrived
            # A failed read is the emulator's own hiccup (its server busy or briefly unreachable), not
            # an answer: read again before a known key would be refused as in no plan.
            for pause in READ_RETRY_PAUSES_S:
                if self._read_into():
                    break
                time.sleep(pause)
            else:
                with self._lock:
                    self._missed.pop(key_value, None)  # not known to be missing: the next request reads
        with self._lock:
            return self._plan_of_key.get(key_value)

    def _read_into(self) -> bool:
        """One read of the plans and keys (the caller holds the read lock); a failed read changes nothing
        (False)."""
        started = time.monotonic()
        try:
            read = self._read()
        except Exception:  # the emulator briefly unreachable: keep the plans read last
            return False
        with self._lock:
            self._plan_of_key, self._read_started = read, started
        return True

    def _read(self) -> dict[str, tuple[str, float | None, int | None]]:
        keys: dict[str, dict[str, Any]] = {}
        for page in self._client.get_paginator("get_api_keys").paginate(includeValues=True):
            keys.update({key["id"]: key for key in page.get("items", [])})
        plan_of_key: dict[str, tuple[str, float | None, int | None]] = {}
        for page in self._client.get_paginator("get_usage_plans").paginate():
            for plan in page.get("items", []):
                stages = plan.get("apiStages") or []
                if not any(
                    s.get("apiId") == self.rest_api_id and s.get("stage") == self.stage for s in stages
                ):
                    continue
                throttle = plan.get("throttle") or {}
                rate, burst = throttle.get("rateLimit"), throttle.get("burstLimit")
                limits = (
                    str(plan["id"]),
                    float(rate) if rate is not None else None,
                    int(burst) if burst is not None else None,
                )
                paginator = self._client.get_paginator("get_usage_plan_keys")
                for keys_page in paginator.paginate(usagePlanId=plan["id"]):
                    for plan_key in keys_page.get("items", []):
                        key = keys.get(plan_key["id"])
                        if key is not None and key.get("enabled", True) and key.get("value"):
                            plan_of_key[str(key["value"])] = limits
        return plan_of_key

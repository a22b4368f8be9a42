"""Token buckets in the state table, leased in chunks (``pk=tenant#<id>``, ``sk=bucket#<purpose>``, or
the tenant's counters item for a consumer bucket kept beside its leases: :mod:`breakwater.aws.bucket_items`).

Shared by ingest (purpose ``ingest``) and the workers (purpose ``consumer``). One conditional
UpdateItem on ``version`` takes a lease; it returns the new item (so the next lease needs no read)
and, when another container won the race, the current item (so a lost race costs one more call,
never a read), taken after a jittered pause (:func:`breakwater.aws.conflicts.pause_before_retry`) that
parts containers which raced at one instant. The math is :mod:`breakwater.fairness`; this module only
moves state in and out.

Every write also stores ``full_at``, when the bucket is full again at the limits the writer used.
A container whose copy says the bucket must be full by now (a tenant under its limits, the common
case) takes its lease with a write conditional on ``full_at`` and the multiplier instead of the
version: a copy that other containers made stale since (they wrote the item) then costs no lost
race, which with one tenant's traffic spread over many containers was every second write. A bucket
that is not full is leased the same way: relative to what is stored (``full_at`` and ``tokens``
move by the lease), on condition that the tokens are still there, not that nobody wrote
(:meth:`LeasedTokenBucket._take_from_partial`; a generic cell rate algorithm). The versioned write
remains for items written before ``full_at`` was kept and for the fail-open path. A container whose
last call found the bucket short of full (a busy tenant) tries the relative write first even when its
copy says the bucket must be full by now, since others have most likely taken tokens since.

A refused tenant costs no call until the container asks again: it refuses locally until the bucket
holds the tokens it asks for (computed from the item a refused write returned, or its own copy), or
for its contention backoff if longer, jittered (:func:`breakwater.fairness.local_refusal_seconds`).
The backoff grows when a call finds fewer tokens than the container's copy promised (others are taking
them: a lost probe), shrinks with each lease the table grants, and paces the next ask after a grant;
every lease stores it on the item so a container's first lost probe starts from what the tenant's
other containers learnt. A flooding tenant's containers then ask its item about once per lease the
bucket can grant, however many containers its requests are spread over.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from botocore.exceptions import BotoCoreError, ClientError

from breakwater.aws import clients
from breakwater.aws.bucket_items import (
    BucketItem,
    StoredBucket,
    multiplier_condition,
    parse_bucket_item,
    state_values,
)
from breakwater.aws.conflicts import pause_before_retry
from breakwater.aws.counters import Rider, carried_write
from breakwater.fairness import (
    QUIET_LEASE_SECONDS,
    BucketLimits,
    BucketState,
    DemandMeter,
    LeaseDecision,
    LocalLease,
    backoff_cap,
    contention_backoff,
    demand_lease_size,
    is_full,
    lease_size,
    local_refusal_seconds,
    paced_lease_size,
    quiet_lease_size,
    relaxed_backoff,
    take_lease,
)
from breakwater.observability import logger

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient


class LeasedTokenBucket:
    """Per-tenant token buckets of one purpose, spent locally from leases taken from DynamoDB.

    ``try_acquire`` returns ``(True, 0.0)`` or ``(False, retry_after_seconds)``. After a refused lease
    the tenant is blocked locally until ``retry_after`` (the refill, or the contention backoff if
    longer), so a throttled tenant costs no DynamoDB calls until then.
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
        size_to_demand: bool = True,
        rng: random.Random | None = None,
        pause: Callable[[int], bool] = pause_before_retry,
        contended_interval_s: float = 0.0,
        shared_item: BucketItem | None = None,
    ) -> None:
        self.table_name = table_name
        self.purpose = purpose
        self.lease_seconds = lease_seconds
        self.max_fraction = max_fraction
        self.max_attempts = max_attempts
        self._clock = clock
        self._client: DynamoDBClient = client or clients.client("dynamodb")
        self._leases: dict[str, LocalLease] = {}
        self._known: dict[str, StoredBucket] = {}
        self._demand: dict[str, DemandMeter] = {}
        # Whether the last call found the tenant's bucket short of full: busy tenants' leases try the
        # relative write first, quiet tenants' the full-bucket one
        self._busy: dict[str, bool] = {}
        self.size_to_demand = size_to_demand  # False: always the usual lease (tests of the writes)
        self._rng = rng or random.Random()  # the jitter of local refusals; seeded in tests and benchmarks
        # before the next attempt after a lost race (False: no time left for one); a benchmark on a
        # simulated clock, whose containers take turns, passes one that does not sleep
        self._pause = pause
        # About how long this container waits before it asks a tenant's bucket again after an ask that
        # was refused or cut short (:func:`breakwater.fairness.contended_ask_interval_s`): the containers
        # sharing a contended tenant then ask its item at a bounded rate however large the fleet, each
        # lease sized to last until the next ask. 0: asks are paced by the refill and the backoff only.
        self.contended_interval_s = contended_interval_s
        # The bucket's own item, and the item it shares with the tenant's leases where the caller says
        # they are there (asked ``on_counters``); where each tenant's bucket was last asked, and the
        # write a call's lease write may carry (:class:`breakwater.aws.counters.Rider`).
        self._own_item = BucketItem(f"bucket#{purpose}")
        self.shared_item = shared_item
        self._at: dict[str, BucketItem] = {}
        self._riders: dict[str, Rider] = {}

    def try_acquire(self, tenant: str, limits: BucketLimits) -> tuple[bool, float]:
        taken, retry_after = self.try_acquire_up_to(tenant, limits, 1)
        return taken == 1, retry_after

    def try_acquire_up_to(
        self,
        tenant: str,
        limits: BucketLimits,
        count: int,
        *,
        on_counters: bool = False,
        rider: Rider | None = None,
    ) -> tuple[int, float]:
        """Up to ``count`` tokens for requests waiting now: ``(taken, 0.0)`` or ``(taken, retry_after)``.

        A worker's batch asks for all the messages of a tenant at once: when its lease is short, it
        leases what the batch needs in one write (at least the usual lease, at most the burst), not
        one lease per message; tokens it spends at once starve nobody.

        ``on_counters``: the tenant's bucket is on the item it shares with its leases
        (``shared_item``), not on its own. ``rider``: a write of that item to make in the lease write,
        if this call makes one (``rider.landed`` says whether it did); never made otherwise.
        """
        at = self.shared_item if on_counters and self.shared_item is not None else self._own_item
        if self._at.setdefault(tenant, at) != at:  # moved (its leases moved): what was known is elsewhere
            self._known.pop(tenant, None)
            self._busy.pop(tenant, None)
            self._at[tenant] = at
        if rider is None:
            return self._acquire_up_to(tenant, limits, count)
        self._riders[tenant] = rider
        try:
            return self._acquire_up_to(tenant, limits, count)
        finally:
            self._riders.pop(tenant, None)

    def _acquire_up_to(self, tenant: str, limits: BucketLimits, count: int) -> tuple[int, float]:
        now = self._clock()
        self._demand.setdefault(tenant, DemandMeter()).observe(now, count)
        lease = self._leases.setdefault(tenant, LocalLease())
        taken = lease.spend_up_to(count, now)
        if taken == count:
            return taken, 0.0
        if lease.is_blocked(now):
            return taken, lease.blocked_until - now
        decision, lost, ttl = self._lease(tenant, limits, now, count - taken)
        # Contended: refused, or granted less than this container's copy promised (others are taking the
        # tenant's tokens). Jittered about the interval: a fleet refused together would otherwise all
        # come back together, and the bucket would refill past its burst, unasked, in between.
        paced = 0.0
        if (lost or not decision.ok) and self.contended_interval_s > 0:
            paced = self.contended_interval_s * (0.5 + self._rng.random())
        known = self._known.get(tenant)
        effective = limits.scaled(known.multiplier) if known else limits
        if lost:  # others took tokens this container's copy promised (fairness.contention_backoff)
            own_rate = self._demand[tenant].own_rate(now)
            # at least until this container's next request: others evidently take the refill first
            floor = max(decision.retry_after, 1.0 / own_rate if own_rate > 0 else 0.0)
            shared = known.backoff if known else 0.0
            lease.backoff = contention_backoff(lease.backoff, floor, shared, backoff_cap(effective, own_rate))
        if decision.ok:
            # a lease cut short by others paces the next ask by the grown backoff; a whole one relaxes it
            left = known.tokens_at(effective, now) if known else None
            backoff = lease.backoff if lost else relaxed_backoff(lease.backoff, left, effective)
            lease.grant(decision.granted, now, max(ttl, paced), backoff)
            lease.blocked_until = max(lease.blocked_until, now + paced)
            return taken + lease.spend_up_to(count - taken, now), 0.0
        blocked_for = local_refusal_seconds(decision.retry_after, lease.backoff, self._rng.random())
        blocked_for = max(blocked_for, paced)
        lease.refuse(now, blocked_for)
        return taken, blocked_for

    def multiplier(self, tenant: str) -> float:
        """The controller's multiplier as last seen by this container (1 until a lease was taken)."""
        known = self._known.get(tenant)
        return known.multiplier if known else 1.0

    def _lease(
        self, tenant: str, limits: BucketLimits, now: float, need: int = 1
    ) -> tuple[LeaseDecision, bool, float]:
        """The lease decision, whether a call found fewer tokens than this container's copy promised
        on the way and it got less than it asked for (a lost probe: other containers are taking this
        tenant's tokens), and how long the lease lasts."""
        known = self._known.get(tenant) or StoredBucket(state=None, version=None)
        predicts_full = self._predicts_full(known, limits, now)
        if predicts_full and not self._busy.get(tenant, False):
            try:
                decision, item, ttl = self._take_from_full(tenant, known, limits, now, need)
            except ClientError as exc:
                if exc.response.get("Error", {}).get("Code") != "ConditionalCheckFailedException":
                    return self._fail_open(tenant, known, limits, now, exc), False, self.lease_seconds
                # Not full after all (or the multiplier moved): the error carries the current item.
                known = self._parsed(tenant, exc.response.get("Item"))  # type: ignore[arg-type]
                self._known[tenant] = known
                decision, lost = self._lease_partial(tenant, known, limits, now, need, failed_full=True)
                return decision, lost, self.lease_seconds
            except BotoCoreError as exc:
                return self._fail_open(tenant, known, limits, now, exc), False, self.lease_seconds
            else:
                self._known[tenant] = self._parsed(tenant, item)
                return decision, False, ttl
        # A busy tenant's bucket is seldom full when a copy says it must be by now (others took tokens
        # since): take from it relative to what is stored first, rather than lose the full-bucket write.
        decision, lost = self._lease_partial(tenant, known, limits, now, need, relative=predicts_full)
        return decision, lost, self.lease_seconds

    def _lease_partial(
        self,
        tenant: str,
        known: StoredBucket,
        limits: BucketLimits,
        now: float,
        need: int,
        *,
        relative: bool = False,
        failed_full: bool = False,
    ) -> tuple[LeaseDecision, bool]:
        """A lease from a bucket that is not full (or of unknown state): the decision and whether it is
        a lost probe (a call found fewer tokens than this container's copy promised, and it got less
        than it asked for). ``relative``: take the first lease with the relative write even though
        ``known`` says the bucket is full by now; ``failed_full``: a full-bucket write just failed and
        ``known`` is the item it returned."""
        decision, wanted = self._decide(tenant, known, limits, now, need)
        # what our copy promised: the whole lease if it said the bucket was full
        promised = wanted if failed_full else decision.granted
        contended = failed_full
        full = False  # the item a lost race returned says the bucket is full again by now
        for attempt in range(self.max_attempts):
            if not decision.ok:
                # Other containers only ever take tokens, so a refusal on our view is a refusal on theirs.
                self._busy[tenant] = True
                return decision, contended
            relative = known.full_at is not None and (relative or known.full_at >= now)
            try:
                if full:
                    decision, item, _ = self._take_from_full(tenant, known, limits, now, need)
                elif relative:
                    item = self._take_from_partial(tenant, known, decision.granted, limits, now)
                else:
                    item = self._write(tenant, known, decision, limits, now)
            except ClientError as exc:
                if exc.response.get("Error", {}).get("Code") != "ConditionalCheckFailedException":
                    return self._fail_open(tenant, known, limits, now, exc), False
                # Lost the race (a versioned write), or fewer tokens were left than our copy said (a
                # relative one), or the bucket is full after all: the error carries the current item,
                # recompute and try once more.
                contended = True
                known = self._parsed(tenant, exc.response.get("Item"))  # type: ignore[arg-type]
                self._known[tenant] = known
                if attempt + 1 == self.max_attempts:
                    break
                # A full-bucket write that failed returned the item as others just left it: the next
                # write goes at once. A lost relative or versioned write pauses first, which parts
                # containers that raced at one instant.
                if not full and not self._pause(attempt):
                    break
                # Decided again at the time of the next write: the item others wrote meanwhile moved on
                # with their clocks, and a stale ``now`` would read their fresh tokens as taken. Full
                # again by then: the full-bucket write, which no other container's stale copy makes
                # lose; else the relative write if the item says tokens are there, the versioned one
                # for an item without full_at.
                now = self._clock()
                decision, _ = self._decide(tenant, known, limits, now, need)
                full = known.full_at is not None and self._predicts_full(known, limits, now)
                relative = False
                continue
            except BotoCoreError as exc:
                return self._fail_open(tenant, known, limits, now, exc), False
            self._busy[tenant] = relative or not self._predicts_full(known, limits, now)
            self._known[tenant] = self._parsed(tenant, item)
            return decision, contended and decision.granted < promised
        # Heavy contention on one bucket: refuse briefly rather than spin.
        current = decision.state
        return LeaseDecision(granted=0, state=current, retry_after=min(1.0, self.lease_seconds)), True

    def _predicts_full(self, known: StoredBucket, limits: BucketLimits, now: float) -> bool:
        """Whether our copy says the bucket has refilled to its burst by now (or we have no copy yet)."""
        if known.state is None:
            return known.version is None  # never seen here: most tenants' buckets are full
        return is_full(known.state, limits.scaled(known.multiplier), now)

    def _take_from_full(
        self, tenant: str, known: StoredBucket, limits: BucketLimits, now: float, need: int = 1
    ) -> tuple[LeaseDecision, dict[str, Any], float]:
        """A whole lease from a full bucket, conditional on ``full_at`` and the multiplier, not the version;
        how long it lasts (a quiet lease, :func:`breakwater.fairness.quiet_lease_size`, lasts longer).

        Whatever other containers wrote since our copy, the bucket is full now if the stored
        ``full_at`` has passed (at the stored multiplier, the one we compute with), so the lease is
        exactly what a versioned write would have taken; a bucket nobody leased from yet (no
        ``version``) is full too. Raises ConditionalCheckFailedException (with the current item) if
        the bucket is not full, the multiplier differs, or the item predates ``full_at``.
        """
        effective = limits.scaled(known.multiplier)
        wanted, ttl = self._wanted(tenant, effective, now, need, full=True)
        decision = take_lease(BucketState.full(effective, now), effective, now, wanted)
        multiplier, values = multiplier_condition(known.multiplier)
        values |= {
            **state_values(decision.state, effective),
            ":now": {"N": f"{now:.6f}"},
            ":one": {"N": "1"},
        }
        item = self._update(
            tenant,
            "SET #tok = :tokens, #upd = :updated, #fat = :full ADD #ver :one",
            # No version yet: nobody has leased from this bucket, so it is full (the multiplier still counts).
            f"(attribute_not_exists(#ver) OR #fat <= :now) AND {multiplier}",
            values,
        )
        return decision, item, ttl

    def _take_from_partial(
        self, tenant: str, known: StoredBucket, tokens: int, limits: BucketLimits, now: float
    ) -> dict[str, Any]:
        """``tokens`` from a bucket that is not full, conditional on enough being left, not on the version.

        A bucket's state is the one instant ``full_at`` (a generic cell rate algorithm's theoretical
        arrival time, plus the burst): at ``now`` it holds ``burst - (full_at - now) * rate`` tokens
        while ``full_at >= now``. Taking ``n`` of them moves ``full_at`` by ``n / rate`` and ``tokens``
        (as of ``updated_at``) down by ``n``, both relative to what is stored, so the write holds
        whatever other containers took since our copy, as long as ``n`` tokens are still there:
        ``full_at <= now + (burst - n) / rate``. Containers sharing a busy tenant's bucket then no
        longer lose races to each other; a failed condition means the tokens are really gone (or the
        bucket refilled, or the multiplier moved) and carries the current item. ``tokens`` as stored
        may go below zero: it is the level at ``updated_at``, and the refill since then covers it.
        """
        effective = limits.scaled(known.multiplier)
        multiplier, values = multiplier_condition(known.multiplier)
        values |= {
            ":n": {"N": str(tokens)},
            ":dt": {"N": f"{tokens / effective.rate:.6f}"},
            ":now": {"N": f"{now:.6f}"},
            ":limit": {"N": f"{now + (effective.burst - tokens) / effective.rate:.6f}"},
            ":one": {"N": "1"},
        }
        return self._update(
            tenant,
            "SET #tok = #tok - :n, #fat = #fat + :dt ADD #ver :one",
            f"#fat BETWEEN :now AND :limit AND {multiplier}",
            values,
        )

    def _update(self, tenant: str, update: str, condition: str, values: dict[str, Any]) -> dict[str, Any]:
        """One conditional lease write: the new item (a failed condition raises, with the current item).

        Every lease also stores this container's contention backoff, so a container that loses a
        probe starts from the backoff the tenant's other containers have learnt, not from nothing.
        """
        lease = self._leases.get(tenant)
        if lease is not None and lease.backoff > 0:  # one that never lost a probe has nothing to teach
            update = update.replace("SET ", "SET #bko = :backoff, ", 1)
            values = values | {":backoff": {"N": f"{lease.backoff:.3f}"}}
        at = self._item(tenant)
        request = {
            "TableName": self.table_name,
            "Key": at.key(tenant),
            "UpdateExpression": update,
            "ConditionExpression": condition,
            "ExpressionAttributeNames": at.names(update, condition),
            "ExpressionAttributeValues": values,
            "ReturnValues": "ALL_NEW",
            "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
        }
        response = carried_write(self._client, request, self._riders.get(tenant))
        return dict(response.get("Attributes", {}))

    def _item(self, tenant: str) -> BucketItem:
        return self._at.get(tenant, self._own_item)

    def _parsed(self, tenant: str, item: Mapping[str, Any] | None) -> StoredBucket:
        return parse_bucket_item(item, self._item(tenant).prefix)

    def _decide(
        self, tenant: str, known: StoredBucket, limits: BucketLimits, now: float, need: int = 1
    ) -> tuple[LeaseDecision, int]:
        """The lease our view of the bucket grants, and the tokens it asked for."""
        effective = limits.scaled(known.multiplier)
        state = known.state if known.state is not None else BucketState.full(effective, now)
        # A lowered multiplier also caps what is already in the bucket.
        state = BucketState(tokens=min(state.tokens, effective.burst), updated_at=state.updated_at)
        short = known.state is not None and not is_full(state, effective, now)
        wanted, _ = self._wanted(tenant, effective, now, need, short=short)
        return take_lease(state, effective, now, wanted), wanted

    def _wanted(
        self,
        tenant: str,
        effective: BucketLimits,
        now: float,
        need: int,
        *,
        full: bool = False,
        short: bool = False,
    ) -> tuple[int, float]:
        """What this container will spend before the lease expires (at most the usual lease), or what
        the requests waiting now need if more (never above the burst), and how long the lease lasts.

        ``full``: the bucket is full, so where the container sees the tenant too rarely for its usual
        lease to hold more than one token, a quiet lease (:func:`breakwater.fairness.quiet_lease_size`)
        if it is the larger. ``short``: the table said the bucket is short of full (others are taking
        its tokens), so a container new to the tenant leases only what its requests so far need.
        """
        usual = lease_size(effective, self.lease_seconds, self.max_fraction)
        meter = self._demand.get(tenant) if self.size_to_demand else None
        demand = meter.rate(now) if meter else None
        if demand is not None:
            sized = demand_lease_size(usual, demand, self.lease_seconds)
        elif not short or meter is None:
            sized = usual
        else:
            # New to the tenant here and others are draining its bucket: lease what the requests seen
            # so far need. The usual lease, spent by one request, would forfeit the rest, and with the
            # tenant spread over many containers every container's first lease would.
            sized = max(1, min(usual, math.floor(meter.current)))
        lease = self._leases.get(tenant)
        if self.contended_interval_s > self.lease_seconds and lease is not None and lease.backoff > 0:
            # a container that has lost probes to others is paced after its asks: lease for that long
            sized = paced_lease_size(sized, effective.burst, demand, self.contended_interval_s)
        wanted = max(sized, min(need, math.floor(effective.burst)))
        if full and meter is not None and demand is not None and sized <= 1:
            quiet = quiet_lease_size(usual, meter.recent_rate(now), effective.burst)
            if quiet > wanted:
                return quiet, max(QUIET_LEASE_SECONDS, self.lease_seconds)
        return wanted, self.lease_seconds

    def _write(
        self, tenant: str, known: StoredBucket, decision: LeaseDecision, limits: BucketLimits, now: float
    ) -> dict[str, Any]:
        values = {
            **state_values(decision.state, limits.scaled(known.multiplier)),
            ":next": {"N": str((known.version or 0) + 1)},
        }
        if known.version is None:
            condition = "attribute_not_exists(#ver)"
        else:
            condition = "#ver = :version"
            values[":version"] = {"N": str(known.version)}
        return self._update(
            tenant,
            "SET #tok = :tokens, #upd = :updated, #fat = :full, #ver = :next",
            condition,
            values,
        )

    def _fail_open(
        self, tenant: str, known: StoredBucket, limits: BucketLimits, now: float, exc: Exception
    ) -> LeaseDecision:
        """DynamoDB failed: lease from this container's own view of the bucket, which it then draws down.

        Admission stays bounded (a local token bucket per container) and a later write, still
        conditional on the last version seen, carries the drawn-down view back to the table.
        """
        decision, _ = self._decide(tenant, known, limits, now)
        if decision.ok:
            self._known[tenant] = StoredBucket(decision.state, known.version, known.multiplier)
        logger.warning(
            "token bucket unavailable; leasing from the local view",
            extra={"tenant": tenant, "purpose": self.purpose, "granted": decision.granted, "error": str(exc)},
        )
        return decision

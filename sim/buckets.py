"""The worker's consumer buckets in memory (``RateGate``: one ask per tenant and batch), and the
refusals a container answers without asking the table; :mod:`sim.gates` re-exports them with the leases.

With a :class:`sim.dynamodb.StateTable`, each ask is a write of the tenant's bucket item at its
virtual time: its counters item for a tenant whose leases are on it (``on_counters``: the live
worker keeps the bucket there, and the floor lease rides on that write, :meth:`sim.gates.LeaseTable.
acquire_many`'s ``riding``), its ``bucket#consumer`` item for a tenant whose leases are on lease
shards; one still throttled after botocore's retries fails open, as ``LeasedTokenBucket`` does.

A contended ask (refused, or granted less than it wanted) paces the container's next ask of that
tenant, as ``LeasedTokenBucket`` with ``contended_interval_s`` does: about ``interval_s`` later
(jittered between half and one and a half of it), the lease it took sized to what it will spend
until then and spent before it asks again. Such a lease is decided on a copy of the item the
container read an interval ago, so when less than it wanted is left it costs a failed conditional
write before the one that takes the rest: two writes.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Hashable

from breakwater.concurrency import lease_shard_count
from breakwater.fairness import BucketLimits, BucketState, lease_size, take_lease
from breakwater.settings import TierLimits
from breakwater.worker.options import concurrency_limits, consumer_bucket_limits
from sim.dynamodb import CONSUMER_BUCKET, COUNTERS, StateTable


class LocalRefusals:
    """Who was refused a bucket's tokens, and until when they refuse the tenant without asking the table.

    ``LeasedTokenBucket``'s rule on a refusal: the container computes from the bucket it read when it
    holds a lease's tokens again and makes no DynamoDB call for the tenant before then. The
    contention backoff on top of it (a container that keeps losing the tokens to others waits
    longer, and is paced after a grant) is not modelled: each bucket here is one shared state, with
    no container's copy of it to lose against, so a refused container here asks again sooner than
    the real one would.
    """

    def __init__(self, lease_seconds: float = 1.0, max_fraction: float = 0.25) -> None:
        # a container's lease: ``fairness.lease_size`` (seconds of the rate, at most a share of the burst)
        self.lease_seconds = lease_seconds
        self.max_fraction = max_fraction
        self._until: dict[Hashable, float] = {}
        self.refused_locally = 0  # asks answered with a refusal and no call

    def blocked(self, key: Hashable, now_s: float) -> bool:
        until = self._until.get(key)
        if until is None:
            return False
        if now_s < until:
            self.refused_locally += 1
            return True
        del self._until[key]
        return False

    def hold(self, key: Hashable, until_s: float) -> None:
        """Refuse ``key`` locally until ``until_s`` at least (a paced container's next ask)."""
        self._until[key] = max(self._until.get(key, until_s), until_s)

    def refused(self, key: Hashable, now_s: float, state: BucketState, limits: BucketLimits) -> None:
        """The table refused ``key``'s ask at ``now_s``, leaving the bucket at ``state``: refused
        locally until it holds a lease (``fairness.lease_size``, at least one token) again. A
        container never found contended waits exactly that (``fairness.local_refusal_seconds`` jitters
        only a contention backoff, which is not modelled)."""
        lease = lease_size(limits, self.lease_seconds, self.max_fraction)
        self._until[key] = now_s + max((lease - state.tokens) / limits.rate, 0.001)


class ConsumerBuckets:
    """The consumer-side token bucket per tenant (``RateGate``): one shared bucket, asked once per batch.

    With a ``table``, each ask is a write of the tenant's ``bucket#consumer`` item; one still throttled
    after botocore's retries is answered from the container's own view, as ``LeasedTokenBucket``
    fails open (here: the shared state's decision, not written back).
    """

    def __init__(
        self,
        limits: Callable[[int], TierLimits],
        table: StateTable | None = None,
        refusals: LocalRefusals | None = None,
        interval_s: float = 0.0,
        seed: int = 0,
    ) -> None:
        self._limits = limits
        self._state: dict[int, BucketState] = {}
        self._bucket_limits: dict[int, BucketLimits] = {}
        self.table = table
        self.writes = 0  # one conditional UpdateItem of the bucket's item per ask
        self.waited_s = 0.0  # botocore's waits on throttled asks, since the caller last took them
        self.failed_open = 0  # asks answered from the local view after the retries
        self.refusals = refusals or LocalRefusals()  # by (container, tenant)
        self.interval_s = interval_s  # ``fairness.contended_ask_interval_s`` of the fleet; 0: no pacing
        self._rng = random.Random(seed)
        # (container, tenant) -> [tokens held, when it may ask again (and the lease expires), messages
        # seen since its last ask, when that was]: only containers a contended ask paced
        self._paced: dict[Hashable, list[float]] = {}
        self._swept_at = 0.0
        # whether each tenant's bucket is on its counters item (its leases are there)
        self._on_counters: dict[int, bool] = {}
        self.wrote = False  # whether the last ask wrote the tenant's counters item (a lease may ride on it)

    def on_counters(self, tenant: int) -> bool:
        """Whether ``tenant``'s bucket is kept on its counters item: its leases are on it."""
        beside = self._on_counters.get(tenant)
        if beside is None:
            limits = concurrency_limits(self._limits(tenant))
            beside = self._on_counters[tenant] = lease_shard_count(limits) == 1
        return beside

    def try_acquire_up_to(self, tenant: int, count: int, now_s: float, holder: str = "") -> int:
        """Up to ``count`` tokens of ``tenant`` for the container ``holder``."""
        refusals = self.refusals
        key = (holder, tenant)
        self.wrote = False
        if refusals._until and refusals.blocked(key, now_s):
            if key in self._paced:
                self._paced[key][2] += count  # its demand, for the lease it takes when it may ask again
            return 0
        wanted = count
        paced = self._paced.get(key) if self._paced else None
        if paced is not None:
            if now_s < paced[1]:  # spend the lease; the rest of the batch waits for the next ask
                taken = min(count, int(paced[0]))
                paced[0] -= taken
                paced[2] += count
                if taken < count:
                    refusals.refused_locally += 1
                return taken
            del self._paced[key]
            # what this container will spend until its next ask, at its rate since the last one
            demand = paced[2] / max(now_s - paced[3], 1e-9)
            wanted = max(count, math.ceil(demand * self.interval_s))
        limits = self._bucket_limits.get(tenant)
        if limits is None:
            limits = self._bucket_limits[tenant] = consumer_bucket_limits(self._limits(tenant))
        wanted = min(wanted, max(count, math.floor(limits.burst)))
        state = self._state.get(tenant) or BucketState.full(limits, now_s)
        decision = take_lease(state, limits, now_s, wanted)
        granted = decision.granted
        contended = self.interval_s > 0 and granted < wanted
        # a lease a stale copy promised and only part of it left: the failed write, then the one that takes it
        writes = 2 if contended and granted and paced is not None else 1
        self.writes += writes
        if not granted:
            refusals.refused(key, now_s, decision.state, limits)
        if contended:
            pace = self.interval_s * (0.5 + self._rng.random())
            if granted:
                self._paced[key] = [granted - min(count, granted), now_s + pace, 0.0, now_s]
            else:
                refusals.hold(key, now_s + pace)
                self._paced[key] = [0.0, now_s, float(count), now_s]  # asks again with its demand known
            self._sweep(now_s)
        table = self.table
        if table is not None:
            if self.on_counters(tenant):  # the item beside its leases (sized as holding one)
                item, kind, units = table.counters_items[tenant], COUNTERS, table.counters_units(1) * writes
            else:
                item, kind, units = table.consumer_items[tenant], CONSUMER_BUCKET, table.bucket_wcu * writes
            if not table.write(item, kind, now_s, units):
                written, waited = table.retried_write(item, kind, now_s, units)
                self.waited_s += waited
                if not written:
                    self.failed_open += 1
                    return min(count, granted)
        self.wrote = granted > 0 and self.on_counters(tenant)
        self._state[tenant] = decision.state
        return min(count, granted)

    def _sweep(self, now_s: float) -> None:
        """Forget the paced containers whose lease and pacing are over (most never see the tenant again)."""
        if now_s - self._swept_at < 4 * self.interval_s + 1:
            return
        self._swept_at = now_s
        horizon = now_s - 2 * self.interval_s
        self._paced = {key: paced for key, paced in self._paced.items() if paced[1] >= horizon}

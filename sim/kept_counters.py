"""The counters a worker container keeps between batches, as ``breakwater.worker.settlement`` keeps them.

A small leased tenant's counters go out with its lease release, in the same write. Those of a tenant
whose leases are on shards of their own (its release goes to its lease shard), of one that held no
lease, or what differs from the counts a lapsing floor lease's write took ahead, ride on no release:
written at every batch by every container that counts the tenant, they would make its counters item
hot. So each container keeps them and writes them at most every ``WorkerSetup.counters_interval_s``,
at a release or a batch's end once the interval has passed since that container's last write of
them; a write still throttled after botocore's retries keeps them for the next. The counts written
this way are summed per tenant, so a test can check that none is lost.
"""

from __future__ import annotations

from collections.abc import Callable, Collection

from breakwater.concurrency import ConcurrencyLimits, lease_shard_count
from breakwater.settings import TierLimits
from breakwater.worker.options import concurrency_limits
from sim.billing import Meter
from sim.dynamodb import COUNTERS, StateTable
from sim.gates import LeaseTable


class KeptCounters:
    """One worker function's containers' counters that ride on no release, and their writes."""

    def __init__(
        self,
        interval_s: float,
        limits: Callable[[int], TierLimits],
        known: dict[int, ConcurrencyLimits],
        leases: LeaseTable | None,
        table: StateTable | None,
        meter: Meter,
    ) -> None:
        self.interval_s = interval_s
        self.limits = limits
        self.known = known  # the worker's tenants' concurrency limits read so far (shared with its gate)
        self.leases = leases
        self.table = table  # the state table the writes are metered in (None: not metered)
        self.meter = meter
        self._sharded: dict[int, bool] = {}  # tenant -> whether its leases are on shards of their own
        self._carried: dict[str, dict[int, int]] = {}  # holder -> tenant -> counts not written yet
        self._due: dict[tuple[str, int], float] = {}  # (holder, tenant) -> next write from
        self.counts_written: dict[int, int] = {}  # counts in writes of counters that rode on no release

    def sharded(self, tenant: int) -> bool:
        """Whether the tenant's leases are on shards of their own (its release carries no counters)."""
        sharded = self._sharded.get(tenant)
        if sharded is None:
            limits = self.known.get(tenant) or concurrency_limits(self.limits(tenant))
            sharded = self._sharded[tenant] = lease_shard_count(limits) > 1
        return sharded

    def keep(self, holder: str, tenant: int, amount: int, at: float) -> float:
        """``amount`` more counts of ``tenant`` that ride on no release kept by ``holder``, and all it
        keeps written at ``at`` if the interval has passed since its last write (a write still throttled
        keeps them for the next): the time botocore's retries took."""
        carried = self._carried.setdefault(holder, {})
        pending = carried[tenant] = carried.get(tenant, 0) + amount
        if not pending:
            del carried[tenant]
            return 0.0
        if self._due.get((holder, tenant), at) > at:
            return 0.0
        self._due[(holder, tenant)] = at + self.interval_s
        self.meter.dynamodb_writes += 1
        done, waited = True, 0.0
        if (table := self.table) is not None:
            # billed by its size: a sharded tenant's without leases, a small one's with its map
            held = 0 if self.sharded(tenant) or self.leases is None else self.leases.held_count(tenant)
            counters = table.counters_items[tenant]
            done, waited = table.retried_write(counters, COUNTERS, at, table.counters_units(held))
        if done:
            del carried[tenant]
            self.counts_written[tenant] = self.counts_written.get(tenant, 0) + pending
        return waited

    def settle(
        self,
        holder: str,
        counts: dict[tuple[int, str], int],
        granted: frozenset[int],
        counted: dict[int, int],
        at_s: float,
        lapsed: Collection[int] = (),
    ) -> None:
        """When an invocation of ``holder`` returns at ``at_s``: its ``counts`` that rode on no release
        (a sharded tenant's, a tenant's that held no lease) kept, less what its releases kept already
        (``counted``), then those due written (a small leased tenant's went with its release)."""
        kept: dict[int, int] = {}
        sharded = self.sharded
        for (tenant, _), amount in counts.items():
            if sharded(tenant) or tenant not in granted or tenant in lapsed:
                kept[tenant] = kept.get(tenant, 0) + amount
        carried = self._carried.get(holder)
        if kept or carried:
            for tenant in {*kept, *(carried or ())}:
                rest = kept.get(tenant, 0) - counted.get(tenant, 0)
                self.keep(holder, tenant, rest, at_s)

    def carried(self, tenant: int) -> int:
        """A tenant's counts its containers keep, not written yet."""
        return sum(kept.get(tenant, 0) for kept in self._carried.values())

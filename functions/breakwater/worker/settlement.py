"""Settling a batch: the lease releases with each tenant's counters, and the counters kept for later.

A tenant's lease and its counters live on the same item, so giving the lease back and writing the
counters is one write per tenant, made as soon as its last message of the batch is done (a tenant
never holds its lease while other tenants' messages run). A floor lease the container expects to end
close to that moment is left to lapse instead (:meth:`Settlement.lapse`): its counters went ahead
with the lease, and only what differs is written. Kept counters ride on the tenant's next floor
write, or go out with a later batch's settle, from the container's background flush once due
(:meth:`Settlement.flush`, every :data:`FLUSH_S`), or at its shutdown. Two kinds of counters cannot
go out at once. Those a failed write left behind are kept and added to the container's next write, so the
backlog estimates lose them only with the container. Those that ride on no release of a lease held on
the counters item (a sharded tenant's, whose release goes to its lease shard; a refused tenant's) are
written at most every ``WorkerOptions.counters_interval_s`` by this container
(:func:`breakwater.concurrency.counters_interval_s`): otherwise every container that counts a busy
tenant would write its counters item at every batch. Kept in between, they are written at the end of
the first batch after that interval, with or without the tenant.

The worker (``breakwater.worker.batch.Worker``) holds one :class:`Settlement` per container and
decides when to call it; this module owns what is written and what is kept.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Mapping

from breakwater.concurrency import Grant
from breakwater.observability import logger
from breakwater.worker.ports import SettleWrite, WorkerPorts
from breakwater.worker.tally import BatchTally

FLUSH_S = 5.0  # how often the worker's background thread writes the kept counters that are due


class Settlement:
    """One per container: the writes that give back a batch's leases with its counters, and the
    counters kept between batches."""

    def __init__(self, ports: WorkerPorts) -> None:
        self.ports = ports
        # the batch and the background flush (:meth:`flush`) both settle: one at a time
        self._lock = threading.RLock()
        # Counters a failed write left behind, and counters that ride on no release waiting for their
        # interval: added to a later write.
        self.unsettled: dict[str, dict[str, int]] = {}
        # When each tenant's counters that ride on no release may next go (monotonic), and the tenants
        # whose leases are on shards of their own (no release to ride on).
        self._counters_due: dict[str, float] = {}
        self._sharded: set[str] = set()

    def note_sharding(self, tenant: str, sharded: bool) -> None:
        """Whether ``tenant``'s leases are on shards of their own (its release then carries no counters)."""
        if sharded:
            self._sharded.add(tenant)
        else:
            self._sharded.discard(tenant)

    def release(self, batch: BatchTally, tenant: str, interval_s: float) -> None:
        """Give back ``tenant``'s lease as soon as its last message of the batch is done, with its
        counters (and those an earlier write left behind) in the same write; counters that cannot
        ride on the release only once ``interval_s`` has passed (:meth:`_carried`)."""
        with self._lock:
            grant = batch.grants.pop(tenant, None)
            counters = batch.unwritten(tenant)
            counters.update(self.unsettled.pop(tenant, {}))
            if self._carried(tenant, counters, self._rides(tenant, grant), interval_s):
                counters = Counter()
            self._write({tenant: grant} if grant is not None else {}, {tenant: counters}, self.ports.release)
            batch.written[tenant] = Counter(batch.counters.get(tenant, Counter()))

    def lapse(self, batch: BatchTally, tenant: str, interval_s: float) -> None:
        """``tenant``'s floor lease lapses on its own: no release is written. Its counters went ahead
        with the lease (the worker's ``_counted_ahead``); what differs (a failure, a spill, a drop, a
        hold) and what an earlier write left behind is written now, as a release's counters would
        be, or kept for the interval as counters that ride on no release are."""
        with self._lock:
            batch.grants.pop(tenant, None)
            counters = batch.unwritten(tenant)
            counters.update(self.unsettled.pop(tenant, {}))
            if not self._carried(tenant, counters, False, interval_s):
                self._write({}, {tenant: counters}, self.ports.release)
            batch.written[tenant] = Counter(batch.counters.get(tenant, Counter()))

    def settle(self, batch: BatchTally, interval_s: float) -> None:
        """Give back the leases still held and write the counters not written yet, with those an
        earlier batch left behind (not those a write of this batch just failed to write: they wait
        for the next batch rather than meet the same trouble again at once)."""
        with self._lock:
            counters = {
                tenant: Counter(deltas)
                for tenant, deltas in self.unsettled.items()
                if tenant not in batch.written
            }
            self.unsettled = {
                tenant: deltas for tenant, deltas in self.unsettled.items() if tenant not in counters
            }
            for tenant in batch.counters:
                counters.setdefault(tenant, Counter()).update(batch.unwritten(tenant))
            counters = {
                tenant: deltas
                for tenant, deltas in counters.items()
                if not self._carried(
                    tenant, deltas, self._rides(tenant, batch.grants.get(tenant)), interval_s
                )
            }
            self._write(dict(batch.grants), counters)
            batch.grants = {}

    def take_for_ride(self, tenants: list[str]) -> dict[str, dict[str, int]]:
        """The kept counters of ``tenants`` whose leases are on their counters item, taken out to ride
        on their floor writes of this batch; what does not land goes back with :meth:`keep_back`."""
        with self._lock:
            return {
                tenant: self.unsettled.pop(tenant)
                for tenant in tenants
                if tenant in self.unsettled and tenant not in self._sharded
            }

    def keep_back(self, counters: Mapping[str, Mapping[str, int]]) -> None:
        """Counters taken to ride on a write that did not take them: kept again, for a later write."""
        with self._lock:
            for tenant, deltas in counters.items():
                self._keep(tenant, deltas)

    def flush(self, force: bool) -> None:
        """Write the counters kept for a later write whose time has come (every one if ``force``): the
        worker's background flush, and its shutdown. A failed write keeps them, as any does."""
        with self._lock:
            now = self.ports.monotonic()
            due = {
                tenant: Counter(deltas)
                for tenant, deltas in self.unsettled.items()
                if force or self._counters_due.get(tenant, now) <= now
            }
            for tenant in due:
                del self.unsettled[tenant]
            self._write({}, due, self.ports.release)

    def _rides(self, tenant: str, grant: Grant | None) -> bool:
        """Whether ``tenant``'s counters go in the write that releases its lease: a lease held on its
        counters item (not refused, not on a shard of its own)."""
        return grant is not None and grant is not Grant.REFUSED and tenant not in self._sharded

    def _carried(self, tenant: str, counters: Mapping[str, int], rides: bool, interval_s: float) -> bool:
        """Whether ``tenant``'s ``counters`` wait for a later write (kept with those a failed write left):
        counters that do not ride on a release, whose last write is less than ``interval_s`` ago.
        False: write them now."""
        if rides or not interval_s or not any(counters.values()):
            return False
        now = self.ports.monotonic()
        if self._counters_due.get(tenant, now) > now:
            self._keep(tenant, counters)
            return True
        self._counters_due[tenant] = now + interval_s
        return False

    def _write(
        self,
        grants: Mapping[str, Grant],
        counters: Mapping[str, Counter[str]],
        write: SettleWrite | None = None,
    ) -> None:
        """One write per tenant (release and counters) with ``write`` (the ports' settle by default);
        counters not written are kept for the next one."""
        grants = {tenant: grant for tenant, grant in grants.items() if grant is not Grant.REFUSED}
        pending = {tenant: dict(deltas) for tenant, deltas in counters.items() if any(deltas.values())}
        if not grants and not pending:
            return
        unwritten: Mapping[str, Mapping[str, int]]
        try:  # leases expire on their own, and counters not written go out with the next write
            unwritten = (write or self.ports.settle)(grants, pending)
        except Exception as exc:
            logger.warning("lease release and counter flush failed", extra={"error": str(exc)})
            unwritten = pending
        for tenant, deltas in unwritten.items():
            if any(deltas.values()):
                self._keep(tenant, deltas)
                logger.warning("counters kept for the next batch", extra={"tenant": tenant})

    def _keep(self, tenant: str, deltas: Mapping[str, int]) -> None:
        """Add ``deltas`` to what is kept of ``tenant``'s counters for a later write."""
        kept = Counter(self.unsettled.get(tenant, {}))
        kept.update(deltas)
        self.unsettled[tenant] = dict(kept)

"""The controller's state in memory: ``breakwater.controller.run_controller`` with in-memory ports.

The ports hold what DynamoDB holds for the real one: each tenant's counters item (the ADD counters
the ingest and the workers write, and the controller's own attributes), the changed-tenant marks by
shard, the shards' ledgers and the run state, the workers' oldest-age reports (the same conditional
window as ``breakwater.aws.health.raise_oldest_age``) and the breakers' outage reports. Queue depths
are read from the simulated queues, as the real ports read SQS's attributes.

Each port call counts the AWS calls it stands for (:class:`sim.billing.Meter`): a GetQueueAttributes
per queue read, the run state and the shards' items read and written, a Query page of changed
tenants, their counters items read, a page's commit as one transaction (each tenant's item and the
shard's ledger), a changed multiplier written where ingest reads it.

With a :class:`sim.dynamodb.StateTable`, each of those DynamoDB calls is also made against its item
(the run state, a shard's ledger, the dirty index's partition, each tenant's counters item, its
ingest bucket), and a throttled one raises the ``ClientError`` the real port's client raises after
its retries, so ``run_controller`` takes the path it takes in AWS: the shard fails and the run goes
on, or (the run state, a claim) the run fails. A tenant's first mark is a write to its shard's
partition of the index (re-marking a marked tenant writes nothing there), and so is the
controller's clearing of it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from breakwater.age_reports import WINDOW_MS
from breakwater.archive_budget import ArchiveDue, SidelineObservation
from breakwater.aws.health import oldest_in_window
from breakwater.backlog import DIRTY_SHARDS, Ledger, RunState, shard_of
from breakwater.controller import ControllerPorts, ShardState, TenantSnapshot, TenantWrite
from breakwater.settings import TierLimits
from local.pricing.usage import read_units, write_units
from sim.billing import Billing, Meter
from sim.dynamodb import (
    CONTROLLER_SCALE,
    COUNTERS,
    DIRTY_SHARD,
    INGEST_BUCKET,
    LEDGER,
    QUEUE_HEALTH,
    STANDARD,
    Item,
    StateTable,
    throttled_error,
)
from sim.sqs import SqsQueue

_CONTROLLER_RETRIES = STANDARD  # the controller's clients: standard retries, 3 attempts
# A run is one instant of virtual time, and its calls are metered then; but the deployed run clears the
# tenants' dirty marks over its seconds (a write per tenant, a few threads at once), and the index's
# partitions would otherwise take every clear of a run, and the re-marks that follow, in one second.
# So, when metered, each clear lands this long after the one before (and, as the real one, only if
# nothing wrote the tenant since the run read it).
CLEAR_S = 0.01 / 8  # a call's round trip over breakwater.aws.controller_ports.WRITE_THREADS threads


class ControllerState:
    """Everything the controller and the writers share, keyed by tenant index."""

    def __init__(
        self,
        names: Sequence[str],
        limits: Callable[[int], TierLimits],
        meter: Meter | None = None,
        billing: Billing | None = None,
        table: StateTable | None = None,
        clock_s: Callable[[], float] | None = None,
        defer: Callable[[float, Callable[[], object]], None] | None = None,
        *,
        health_shards: int = 1,
    ) -> None:
        self.meter = meter if meter is not None else Meter()
        self.table = table
        self._clock_s = clock_s or (lambda: 0.0)
        self._defer = defer  # (delay_s, call): a call to make later in virtual time
        self._run_at = -1.0  # the virtual time of the run under way, and its clears so far
        self._clears = 0
        self._writes: dict[int, int] = {}  # writes to each tenant's counters item (its ``writes``)
        self._mark_bytes = (billing or Billing()).mark_bytes
        self.names = list(names)
        self._index = {name: index for index, name in enumerate(self.names)}
        self._limits = limits
        self._shard = [shard_of(name) for name in self.names]
        self.counters: dict[int, dict[str, Any]] = {}
        self.dirty: list[set[int]] = [set() for _ in range(DIRTY_SHARDS)]
        self.multipliers: dict[int, float] = {}
        self.ledgers: dict[int, Ledger] = {}
        self.versions: dict[int, int] = {}
        self.cursors: dict[int, str | None] = {}
        self.run_state = RunState()
        # (role, shard) -> (oldest age ms, observed at ms): each shard of a role's health item
        self.health: dict[tuple[str, int], tuple[int, int]] = {}
        self.health_shards = health_shards
        self.down_until: int | None = None

    # -- the writers ---------------------------------------------------------------------------------
    def add(self, tenant: int, counter: str, amount: float) -> None:
        """An ADD to the tenant's counters item, which marks the tenant changed (its shard's index)."""
        item = self.counters.get(tenant)
        if item is None:
            item = self.counters[tenant] = {}
        item[counter] = item.get(counter, 0) + amount
        self._writes[tenant] = self._writes.get(tenant, 0) + 1
        marked = self.dirty[self._shard[tenant]]
        if tenant not in marked:
            marked.add(tenant)
            table = self.table
            if table is not None:  # the item enters the index: a write to its shard's partition
                table.write(table.dirty[self._shard[tenant]], DIRTY_SHARD, self._clock_s(), table.index_wcu)

    def record_oldest_age(self, role: str, age_ms: int, now_ms: int, shard: int = 0) -> tuple[int, int]:
        """``raise_oldest_age`` on the role's health shard ``shard``: the same conditional window; the
        report the shard stands on after it (age, observed at)."""
        key = (role, shard)
        stored = self.health.get(key)
        if stored is None or stored[1] < now_ms - WINDOW_MS or stored[0] <= age_ms:
            stored = self.health[key] = (age_ms, now_ms)
        return stored

    def oldest_age(self, role: str, now_ms: int | None) -> tuple[int | None, int | None]:
        """What ``read_oldest_age`` answers over the role's shards (``health.oldest_in_window``)."""
        health = self.health
        reports = []
        for shard in range(self.health_shards):
            stored = health.get((role, shard))
            if stored is not None:
                reports.append({"oldest_age_ms": stored[0], "observed_at": stored[1]})
        return oldest_in_window(reports, now_ms)

    def report_outage(self, until_ms: int) -> None:
        if self.down_until is None or self.down_until < until_ms:
            self.down_until = until_ms

    def multiplier(self, tenant: int) -> float:
        return self.multipliers.get(tenant, 1.0)

    # -- the controller's ports ----------------------------------------------------------------------
    def ports(
        self,
        *,
        live: Sequence[SqsQueue],
        every: Sequence[SqsQueue],
        sideline: Mapping[str, SqsQueue],
        set_sideline_enabled: Callable[[bool, frozenset[str]], Iterable[str]],
        start_archiver: Callable[[ArchiveDue], None] | None,
        clock_ms: Callable[[], int],
    ) -> ControllerPorts:
        meter = self.meter
        table = self.table

        def live_oldest() -> tuple[int | None, int | None]:
            shards = self.health_shards
            meter.dynamodb_item_reads += shards  # the health item's shards, one BatchGetItem
            if table is not None:
                for shard in range(shards):
                    item = table.health("live", shard, shards)
                    self._read(item, QUEUE_HEALTH, table.health_rcu, "BatchGetItem")
            return self.oldest_age("live", clock_ms())

        def live_depth() -> int:
            meter.sqs(0, len(live))
            return sum(queue.visible_count + queue.in_flight for queue in live)

        def observed_depth() -> int:
            meter.sqs(0, len(every))
            return sum(queue.depth for queue in every)

        def read_run_state() -> RunState:
            meter.dynamodb_item_reads += 1
            if table is not None:
                self._read(table.run_state, CONTROLLER_SCALE, table.controller_rcu, "GetItem")
            return self.run_state

        def read_ledgers(shards: Sequence[int]) -> dict[int, Ledger]:
            meter.dynamodb_item_reads += len(shards)
            if table is not None:
                for shard in shards:
                    self._read(table.ledgers[shard], LEDGER, table.ledger_rcu, "BatchGetItem")
            return {shard: self.ledgers.get(shard, Ledger()) for shard in shards}

        def observations() -> list[SidelineObservation]:
            meter.sqs(0, len(sideline))
            seen = []
            for role, queue in sideline.items():
                age, at = self.oldest_age(role, clock_ms())
                seen.append(SidelineObservation(role, queue.name, queue.waiting, age, at))
            return seen

        return ControllerPorts(
            live_depth=live_depth,
            live_oldest=live_oldest,
            set_sideline_enabled=set_sideline_enabled,
            observed_depth=observed_depth,
            read_run_state=read_run_state,
            write_run_state=self._write_run_state,
            claim_shard=self._claim_shard,
            dirty_tenants=self._dirty_tenants,
            read_tenants=self._read_tenants,
            commit=self._commit,
            release_shard=self._release_shard,
            read_ledgers=read_ledgers,
            sideline_observations=observations,
            dependency_down_until=lambda: self.down_until,
            start_archiver=start_archiver,
            clock_ms=clock_ms,
        )

    # -- the calls, against their items when metered -----------------------------------------------------
    def _read(self, item: Item, kind: str, units: float, operation: str) -> None:
        table = self.table
        if table is None:
            return
        at = self._clock_s()
        if not table.retried(lambda when: table.read(item, kind, when, units), at, _CONTROLLER_RETRIES)[0]:
            raise throttled_error(operation)

    def _write(self, item: Item, kind: str, units: float, operation: str) -> None:
        table = self.table
        if table is None:
            return
        if not table.retried_write(item, kind, self._clock_s(), units, _CONTROLLER_RETRIES)[0]:
            raise throttled_error(operation)

    def _clear_mark(self, table: StateTable, shard: int, tenant: int) -> None:
        """Clear the tenant's mark as the deployed run does, over its seconds: the tenant's write (on
        condition that nobody wrote the item since it was read) lands a round trip after the run's
        previous one, and then its entry leaves the index. A tenant written meanwhile stays marked."""
        now = self._clock_s()
        if now != self._run_at:
            self._run_at, self._clears = now, 0
        self._clears += 1
        assert self._defer is not None
        seen = self._writes.get(tenant, 0)

        def clear() -> None:
            marked = self.dirty[shard]
            if self._writes.get(tenant, 0) == seen and tenant in marked:
                marked.discard(tenant)
                table.write(table.dirty[shard], DIRTY_SHARD, self._clock_s(), table.index_wcu)

        self._defer(self._clears * CLEAR_S, clear)

    def _write_run_state(self, state: RunState) -> None:
        self.meter.dynamodb_writes += 1
        if self.table is not None:
            self._write(self.table.run_state, CONTROLLER_SCALE, self.table.controller_wcu, "UpdateItem")
        self.run_state = state

    def _claim_shard(self, shard: int, _now_ms: int, _until_ms: int) -> ShardState | None:
        self.meter.dynamodb_writes += 1  # the shard's item, claimed under a condition
        if self.table is not None:
            self._write(self.table.ledgers[shard], LEDGER, self.table.ledger_wcu, "UpdateItem")
        return ShardState(
            shard, self.ledgers.get(shard, Ledger()), self.versions.get(shard, 0), self.cursors.get(shard)
        )

    def _dirty_tenants(self, shard: int, cursor: str | None, limit: int) -> tuple[list[str], str | None]:
        after = int(cursor) if cursor else -1
        marked = sorted(tenant for tenant in self.dirty[shard] if tenant > after)
        page = marked[:limit]
        more = len(marked) > limit
        self.meter.query(len(page), self._mark_bytes)
        table = self.table
        if table is not None:
            units = read_units(len(page) * self._mark_bytes)
            self._read(table.dirty[shard], DIRTY_SHARD, units, "Query")
        return [self.names[tenant] for tenant in page], (str(page[-1]) if more else None)

    def _read_tenants(self, tenants: Sequence[str]) -> list[TenantSnapshot]:
        self.meter.dynamodb_item_reads += len(tenants)  # BatchGetItem of their counters items
        index, limits, counters, multipliers = self._index, self._limits, self.counters, self.multipliers
        table = self.table
        if table is not None:
            units = read_units(table.sizes.counters, consistent=True)
            for name in tenants:
                self._read(table.counters(index[name]), COUNTERS, units, "BatchGetItem")
        snapshots = []
        for name in tenants:
            tenant = index[name]
            item = dict(counters.get(tenant, {}))
            snapshots.append(TenantSnapshot(name, limits(tenant), item, multipliers.get(tenant, 1.0)))
        return snapshots

    def _commit(self, state: ShardState, writes: Sequence[TenantWrite]) -> ShardState:
        meter = self.meter
        meter.dynamodb_transact_items += len(writes) + 1  # the page's tenants and the shard's ledger
        meter.dynamodb_writes += sum(write.multiplier_changed for write in writes)  # bucket#ingest
        table = self.table
        if table is not None:
            # the intent on the ledger, each tenant's write, a changed multiplier, the ledger last
            self._write(table.ledgers[state.shard], LEDGER, table.ledger_wcu, "UpdateItem")
            units = write_units(table.sizes.counters)
            for write in writes:
                tenant = self._index[write.tenant]
                self._write(table.counters(tenant), COUNTERS, units, "UpdateItem")
                if write.multiplier_changed:
                    self._write(table.ingest_bucket(tenant), INGEST_BUCKET, table.bucket_wcu, "UpdateItem")
            self._write(table.ledgers[state.shard], LEDGER, table.ledger_wcu, "UpdateItem")
        for write in writes:
            tenant = self._index[write.tenant]
            item = self.counters.setdefault(tenant, {})
            item.update(
                seen_accepted=write.seen["accepted"],
                seen_throttled=write.seen["throttled"],
                seen_at=write.seen["at"],
                estimate=write.stored.estimate,
                estimate_mark=write.stored.mark,
                backlog_offset=write.stored.offset,
                multiplier=write.multiplier,
            )
            self.multipliers[tenant] = write.multiplier
            if not write.keep_dirty:
                if table is not None and self._defer is not None:
                    self._clear_mark(table, state.shard, tenant)
                else:
                    # A virtual-time run is atomic: nothing wrote to the tenant since it was read.
                    self.dirty[state.shard].discard(tenant)
        ledger = Ledger(state.ledger.total + sum(write.ledger_delta for write in writes), state.ledger.mark)
        self.ledgers[state.shard] = ledger
        self.versions[state.shard] = state.version + 1
        return ShardState(state.shard, ledger, state.version + 1, state.cursor)

    def _release_shard(self, state: ShardState, cursor: str | None) -> None:
        self.meter.dynamodb_writes += 1
        if self.table is not None:
            self._write(self.table.ledgers[state.shard], LEDGER, self.table.ledger_wcu, "UpdateItem")
        self.ledgers[state.shard] = state.ledger
        self.cursors[state.shard] = cursor

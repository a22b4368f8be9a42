"""The DynamoDB items the simulated policies read and write: metered per virtual second, throttled.

Every DynamoDB call the simulator counts for billing (:class:`sim.billing.Meter`) is also made here
against its item, keyed as the real adapters in ``breakwater.aws`` key it (the state table's ``pk``
and ``sk``, or the dirty-tenant index's partition), in the capacity units AWS bills for it
(``local.pricing.usage``: a write unit per KB, twice in a transaction; a strongly consistent read
unit per 4 KB) at the simulation's virtual time. :class:`local.aws_limits.ItemThroughput` refuses a
call past a partition's limits (:class:`local.aws_limits.AwsLimits`, AWS's own figures unless a run
divides them), as DynamoDB throttles it, and the caller takes the path the real code takes on that
error (``sim.worker``, ``sim.system``, ``sim.control``).

What an item weighs is not modelled byte for byte: :class:`ItemSizes` states an estimate per kind,
and the items that grow with what they hold (a tenant's counters item with its leases, a large
tenant's lease shards, the burst pool with its places) are sized from what the simulation holds in
them at the time.

botocore retries a throttled call before the caller sees the error (:class:`Retries`): the worker's
clients with standard retries (3 attempts, a random wait of up to 1 s, then 2 s), ingest's with the
legacy ones (10 attempts for DynamoDB, waiting 50 ms and doubling). A retry is made later in virtual
time, so it meets a refilled budget; the waits are time the caller spends.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

from botocore.exceptions import ClientError

from breakwater.aws.concurrency import POOL_PK, POOL_SK
from breakwater.aws.controller_ports import CONTROLLER_PK, INGEST_BUCKET_SK, LEDGER_SK, SCALE_SK, ledger_pk
from breakwater.aws.counters import COUNTERS_SK, tenant_pk
from breakwater.aws.health import DEPENDENCY_PK, HEALTH_SK, health_sk, queue_pk
from breakwater.aws.lease_shards import lease_shard_sk
from breakwater.backlog import DIRTY_SHARDS, shard_key
from local.aws_limits import AwsLimits, ItemStats, ItemThroughput, _Budget, item_kind
from local.pricing.usage import read_units, write_units

STATE = "state"  # the state table
DIRTY_INDEX = "state.dirty_shard"  # its sparse index of changed tenants, partitioned by dirty_shard
CONSUMER_BUCKET_SK = "bucket#consumer"


def _kind(pk: str, sk: str) -> str:
    return item_kind("State", {"pk": pk, "sk": sk})


# The items' kinds as local.aws_limits.item_kind names them, so that the simulator's figures compare
# with the embedded AWS's.
COUNTERS = _kind(tenant_pk("t"), COUNTERS_SK)
BURST_POOL = _kind(POOL_PK, POOL_SK)
INGEST_BUCKET = _kind(tenant_pk("t"), INGEST_BUCKET_SK)
CONSUMER_BUCKET = _kind(tenant_pk("t"), CONSUMER_BUCKET_SK)
DIRTY_SHARD = item_kind("State", {"dirty_shard": shard_key(0)})
QUEUE_HEALTH = _kind(queue_pk("live"), HEALTH_SK)
DEPENDENCY_HEALTH = _kind(DEPENDENCY_PK, HEALTH_SK)
LEDGER = _kind(ledger_pk(0), LEDGER_SK)
CONTROLLER_SCALE = _kind(CONTROLLER_PK, SCALE_SK)
# a large tenant's lease shard (``tenant#<t>/lease#<k>``), which local.aws_limits.item_kind files
# under "other": named apart so that the report tells it from the tenant's counters
LEASE_SHARD = "lease_shard"

Item = tuple[str, ...]  # (table, partition key, sort key), or (index, partition key)


class _SecondsStats(ItemStats):
    """An item's units per whole second when calls come out of time order.

    A worker's invocation is computed when it starts, so the writes it makes as it goes (a tenant's
    release after its last message, a retry after botocore's wait) are metered at their own virtual
    time, up to an invocation's length ahead of calls other workers make meanwhile. The embedded AWS's
    :class:`~local.aws_limits.ItemStats` keeps one current second and would start it again on every
    step back, losing what the later second held; this keeps the last few seconds apart.
    """

    KEPT_S = 8  # seconds kept behind the latest one seen (longer than an invocation's look-ahead)

    def __init__(self, kind: str) -> None:
        super().__init__(kind)
        self._seconds: dict[int, list[float]] = {}
        self._current: list[float] = [0.0, 0.0]  # the latest second's totals (most calls add there)

    def add(self, second: int, read_units: float, write_units: float) -> None:
        if second == self.second:
            totals = self._current
        else:
            seconds = self._seconds
            totals = seconds.get(second)  # type: ignore[assignment]
            if totals is None:
                totals = seconds[second] = [0.0, 0.0]
            if second > self.second:
                self.second, self._current = second, totals
                if len(seconds) > self.KEPT_S:
                    oldest = second - self.KEPT_S
                    self._seconds = {at: kept for at, kept in seconds.items() if at >= oldest}
        if read_units:
            totals[0] += read_units
            if totals[0] > self.peak_read_units:
                self.peak_read_units = totals[0]
        if write_units:
            totals[1] += write_units
            if totals[1] > self.peak_write_units:
                self.peak_write_units = totals[1]


class _Meter(ItemThroughput):
    """:class:`~local.aws_limits.ItemThroughput` with per-second figures kept out of time order."""

    def _stats(self, item: Hashable, kind: str) -> ItemStats:
        stats = self.stats.get(item)
        if stats is None:
            stats = self.stats[item] = _SecondsStats(kind)
        return stats

    def consume(
        self,
        item: Hashable,
        now_s: float,
        *,
        read_units: float = 0.0,
        write_units: float = 0.0,
        kind: str = "",
    ) -> bool:
        """``ItemThroughput.consume`` (the same rule and figures) in one method: a scale run makes
        millions of calls, and the refill's and the stats' own calls cost a third of them."""
        cost = read_units / self.read_limit + write_units / self.write_limit
        burst = self.burst_seconds
        budget = self.budgets.get(item)
        if budget is None:
            budget = self.budgets[item] = _Budget(burst, now_s)
        elif now_s > budget.at_s:
            level = budget.level + (now_s - budget.at_s)
            budget.level = level if level < burst else burst
            budget.at_s = now_s
        stats = self.stats.get(item)
        if stats is None:
            stats = self.stats[item] = _SecondsStats(kind)
        if cost > budget.level and budget.level < burst:
            stats.throttled += 1
            return False
        budget.level -= cost
        stats.add(math.floor(now_s), read_units, write_units)
        return True


@dataclass(frozen=True)
class ItemSizes:
    """Stated sizes (bytes) of the items, by kind: what AWS bills a call to them by."""

    counters: int = 600  # a dozen counters, the dirty mark, the controller's fields, keys
    lease: int = 64  # one lease in a counters item's map: a container id, its expiry, burst or not
    lease_shard: int = (
        60  # a tenant's lease shard without its leases: keys, version (at most ``LEASE_SHARD_PLACES`` leases)
    )
    pool: int = 60  # a burst pool shard's item without its places
    pool_place: int = 60  # one place: "tenant#container" and its expiry (at most 16 a shard)
    bucket: int = 200  # a token bucket: tokens, times, version, multiplier
    health: int = 120
    ledger: int = 1024  # a shard's ledger with a page's intent (its tenants' deltas)
    controller: int = 120  # the run state
    index_entry: int = 100  # a tenant's entry in the dirty index (keys projected)


@dataclass(frozen=True)
class Retries:
    """botocore's retries of a throttled call: ``attempts`` in all, waits from :meth:`wait`."""

    attempts: int
    legacy: bool  # legacy: base x 2^(n-1); standard: random x min(20, 2^(n-1))
    base_s: float = 0.05

    def wait(self, attempt: int, rng: random.Random | None) -> float:
        """The wait after failed attempt ``attempt`` (1: the first)."""
        if self.legacy or rng is None:
            return self.base_s * 2 ** (attempt - 1)
        return rng.random() * min(20.0, 2.0 ** (attempt - 1))


STANDARD = Retries(attempts=3, legacy=False)  # the worker's clients (worker_ports.client_config)
LEGACY_DYNAMODB = Retries(attempts=10, legacy=True)  # ingest's (clients built without a Config)


def throttled_error(operation: str) -> ClientError:
    """The error a client sees once botocore stops retrying a throttled call."""
    return ClientError(
        {
            "Error": {
                "Code": "ProvisionedThroughputExceededException",
                "Message": "The level of configured provisioned throughput for the table was exceeded.",
            },
            "ResponseMetadata": {
                "HTTPStatusCode": 400,
                "RequestId": "",
                "HostId": "",
                "HTTPHeaders": {},
                "RetryAttempts": STANDARD.attempts - 1,
            },
        },
        operation,
    )


class StateTable:
    """The items of one simulated configuration, each metered against its partition's limits."""

    def __init__(
        self,
        names: Sequence[str],
        limits: AwsLimits | None = None,
        *,
        sizes: ItemSizes | None = None,
        seed: int = 1,
    ) -> None:
        self.limits = limits if limits is not None else AwsLimits()
        self.sizes = sizes or ItemSizes()
        self.meter = _Meter.for_dynamodb(self.limits)
        self._consume = self.meter.consume
        self._within = self.meter.within
        self._rng = random.Random(seed)
        # every tenant's items, by tenant index (looked up on every call: a list costs least)
        pks = [tenant_pk(name) for name in names]
        self.names = list(names)  # what the real adapters key a tenant by (its lease shards hash it)
        self.counters_items: list[Item] = [(STATE, pk, COUNTERS_SK) for pk in pks]
        self._lease_shards: dict[tuple[int, int], Item] = {}
        self.ingest_items: list[Item] = [(STATE, pk, INGEST_BUCKET_SK) for pk in pks]
        self.consumer_items: list[Item] = [(STATE, pk, CONSUMER_BUCKET_SK) for pk in pks]
        self._units: dict[tuple[str, int], float] = {}  # (what, count held) -> units
        self.pool: Item = (STATE, POOL_PK, POOL_SK)  # the pool's item when it has one shard
        self._pool_shards: dict[tuple[int, int], Item] = {}
        self.dependency: Item = (STATE, DEPENDENCY_PK, HEALTH_SK)
        self.run_state: Item = (STATE, CONTROLLER_PK, SCALE_SK)
        self.ledgers: list[Item] = [(STATE, ledger_pk(shard), LEDGER_SK) for shard in range(DIRTY_SHARDS)]
        self.dirty: list[Item] = [(DIRTY_INDEX, shard_key(shard)) for shard in range(DIRTY_SHARDS)]
        self._health: dict[tuple[str, int, int], Item] = {}
        # the units of the fixed-size kinds, computed once
        sizes = self.sizes
        self.bucket_wcu = write_units(sizes.bucket)
        self.health_wcu = write_units(sizes.health)
        self.health_rcu = read_units(sizes.health, consistent=True)
        self.ledger_wcu = write_units(sizes.ledger)
        self.ledger_rcu = read_units(sizes.ledger, consistent=True)
        self.controller_wcu = write_units(sizes.controller)
        self.controller_rcu = read_units(sizes.controller, consistent=True)
        self.index_wcu = write_units(sizes.index_entry)

    # -- the items, keyed as the real adapters key them ------------------------------------------------
    def counters(self, tenant: int) -> Item:
        return self.counters_items[tenant]

    def ingest_bucket(self, tenant: int) -> Item:
        return self.ingest_items[tenant]

    def consumer_bucket(self, tenant: int) -> Item:
        return self.consumer_items[tenant]

    def health(self, role: str, shard: int = 0, shards: int = 1) -> Item:
        """Shard ``shard`` of ``shards`` of the role's health item (``health``, or ``health#<n>``)."""
        key = (role, shard, shards)
        item = self._health.get(key)
        if item is None:
            sk = HEALTH_SK if shards == 1 else health_sk(shard, shards)
            item = self._health[key] = (STATE, queue_pk(role), sk)
        return item

    def lease_shard(self, tenant: int, shard: int) -> Item:
        """Shard ``shard`` of a large tenant's leases (``lease#<k>``: only its leases and version)."""
        key = (tenant, shard)
        item = self._lease_shards.get(key)
        if item is None:
            item = self._lease_shards[key] = (STATE, self.counters_items[tenant][1], lease_shard_sk(shard))
        return item

    def pool_shard(self, shard: int, shards: int) -> Item:
        """Shard ``shard`` of the burst pool's ``shards`` items (``burst``, or ``burst#<n>``)."""
        key = (shard, shards)
        item = self._pool_shards.get(key)
        if item is None:
            sk = POOL_SK if shards == 1 else f"{POOL_SK}#{shard}"
            item = self._pool_shards[key] = (STATE, POOL_PK, sk)
        return item

    # -- sizes that grow with what the item holds ------------------------------------------------------
    def _units_of(
        self, kind: str, base: int, per_entry: int, entries: int, *, read: bool, transactional: bool
    ) -> float:
        """The units of one call on an item of ``base`` bytes plus ``per_entry`` for each of ``entries``
        (a strongly consistent read, or a write, doubled in a transaction), computed once per size."""
        key = (f"{kind}-read" if read else f"{kind}-tx" if transactional else kind, entries)
        units = self._units.get(key)
        if units is None:
            size = base + per_entry * entries
            units = (
                read_units(size, consistent=True) if read else write_units(size, transactional=transactional)
            )
            self._units[key] = units
        return units

    def counters_units(self, leases: int, *, transactional: bool = False) -> float:
        sizes = self.sizes
        return self._units_of(
            "counters", sizes.counters, sizes.lease, leases, read=False, transactional=transactional
        )

    def counters_read_units(self, leases: int) -> float:
        sizes = self.sizes
        return self._units_of("counters", sizes.counters, sizes.lease, leases, read=True, transactional=False)

    def lease_shard_units(self, leases: int, *, transactional: bool = False) -> float:
        sizes = self.sizes
        return self._units_of(
            "lease-shard", sizes.lease_shard, sizes.lease, leases, read=False, transactional=transactional
        )

    def lease_shard_read_units(self, leases: int) -> float:
        sizes = self.sizes
        return self._units_of(
            "lease-shard", sizes.lease_shard, sizes.lease, leases, read=True, transactional=False
        )

    def pool_units(self, places: int, *, transactional: bool = False) -> float:
        sizes = self.sizes
        return self._units_of(
            "pool", sizes.pool, sizes.pool_place, places, read=False, transactional=transactional
        )

    def pool_read_units(self, places: int) -> float:
        sizes = self.sizes
        return self._units_of("pool", sizes.pool, sizes.pool_place, places, read=True, transactional=False)

    # -- calls ---------------------------------------------------------------------------------------
    def write(self, item: Hashable, kind: str, now_s: float, units: float) -> bool:
        """One write (PutItem, UpdateItem, a BatchWriteItem's item); False: throttled, nothing written."""
        return self._consume(item, now_s, write_units=units, kind=kind)

    def read(self, item: Hashable, kind: str, now_s: float, units: float) -> bool:
        return self._consume(item, now_s, read_units=units, kind=kind)

    def transact(self, items: Sequence[tuple[Hashable, str, float]], now_s: float) -> bool:
        """A TransactWriteItems of ``(item, kind, units)`` (units already doubled): all or nothing.

        A transaction one of whose items' partitions is past its limit is cancelled whole (reason
        ThrottlingError for that item) and takes no capacity from any of them.
        """
        within = self._within
        for item, kind, units in items:
            if not within(item, now_s, write_units=units):
                self._consume(item, now_s, write_units=units, kind=kind)  # refused: counted as throttled
                return False
        consume = self._consume
        for item, kind, units in items:
            consume(item, now_s, write_units=units, kind=kind)
        return True

    def retried(self, call: Callable[[float], bool], now_s: float, retries: Retries) -> tuple[bool, float]:
        """``call`` at ``now_s`` and, while throttled, again after botocore's waits: whether one
        attempt passed, and the time spent waiting."""
        if call(now_s):
            return True, 0.0
        spent = 0.0
        for attempt in range(1, retries.attempts):
            spent += retries.wait(attempt, self._rng)
            if call(now_s + spent):
                return True, spent
        return False, spent

    def retried_write(
        self, item: Hashable, kind: str, now_s: float, units: float, retries: Retries = STANDARD
    ) -> tuple[bool, float]:
        """:meth:`write` with botocore's retries (the fast path, admitted at once, takes no closure)."""
        if self._consume(item, now_s, write_units=units, kind=kind):
            return True, 0.0
        return self.retried(lambda at: self._consume(item, at, write_units=units, kind=kind), now_s, retries)

    # -- the report ----------------------------------------------------------------------------------
    def report(self, count: int = 10) -> dict[str, Any]:
        """``hottest_items`` (highest peak WCU/s first), ``dynamodb_throttles`` by kind, the limits."""
        hottest = self.meter.hottest(count)
        limit = self.limits.write_units_per_s
        for entry in hottest:
            entry["share_of_write_limit"] = round(entry["peak_wcu_per_s"] / limit, 4) if limit else None
        return {
            "limits": self.limits.describe(),
            "limits_scale": self.limits.scale,
            "hottest_items": hottest,
            "dynamodb_throttles": self.meter.throttles_by_kind(),
            "metered_items": len(self.meter.stats),
        }

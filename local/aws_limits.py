"""AWS's documented limits as data, and the per-item meter that enforces the throughput ones.

The embedded AWS (``local/emulator/moto_patches``) and the simulator (``sim/``) push back as AWS does
with the same model: :class:`AwsLimits` holds AWS's figures, :class:`ItemThroughput` meters each
DynamoDB item (or Kinesis shard) in capacity units per second and refuses what passes its partition's
limit. Only the rates take the scale factor: on one machine the emulator cannot reach AWS's rates, so a
test or scenario divides them (``AwsLimits(scale=20)``: a partition's 1,000 write units per second become
50) and every report states it (:meth:`AwsLimits.describe`). Sizes and counts (400 KB items, 100 items a
transaction, 10 entries a batch) are never scaled.

A partition serves at most 3,000 read units and 1,000 write units per second, "or a combination of both":
a second's budget is shared, ``reads / 3,000 + writes / 1,000 <= 1``. Burst capacity (unused capacity kept
for up to 300 seconds) is a provisioned table's and "can't alleviate partition-level throttling", so the
only burst modelled is the second's own: the budget refills continuously and holds at most
``burst_seconds`` of it. DynamoDB splits a hot partition by sort-key range, so the limit no split can lift
is the item's own: throughput is metered and throttled per item (table and full key).
"""

from __future__ import annotations

import math
import os
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

SCALE_ENV = "BREAKWATER_LOCAL_LIMIT_SCALE"  # the scale factor; unset or "off" (see from_env)
# a transaction's hold in seconds, where a run asks for another than AWS's (an experiment: 0 holds nothing)
HOLD_ENV = "BREAKWATER_LOCAL_TRANSACTION_HOLD_S"
KiB = 1024
MiB = 1024 * KiB


@dataclass(frozen=True)
class AwsLimits:
    """AWS's limits; the per-second rates are divided by ``scale`` (1: AWS's own)."""

    scale: float = 1.0
    # DynamoDB: per partition (here, per item), per second
    partition_write_units_per_s: float = 1000.0
    partition_read_units_per_s: float = 3000.0
    partition_burst_seconds: float = 1.0
    item_bytes: int = 400 * KiB
    transaction_items: int = 100
    transaction_bytes: int = 4 * MiB
    # how long a transaction holds its items: a write to one of them meanwhile conflicts
    transaction_hold_s: float = 0.02
    # SQS: a batch's entries, their total size, one message's size (1 MiB since August 2025)
    sqs_batch_entries: int = 10
    sqs_batch_bytes: int = 1 * MiB
    sqs_message_bytes: int = 1 * MiB
    # Kinesis: per shard, per second
    kinesis_shard_bytes_per_s: float = 1.0 * MiB
    kinesis_shard_records_per_s: float = 1000.0

    def __post_init__(self) -> None:
        if not (isinstance(self.scale, int | float) and math.isfinite(self.scale) and self.scale >= 1):
            raise ValueError(
                f"the limits' scale must be a number >= 1 (AWS's rates divided by it), not {self.scale!r}"
            )

    @property
    def write_units_per_s(self) -> float:
        return self.partition_write_units_per_s / self.scale

    @property
    def read_units_per_s(self) -> float:
        return self.partition_read_units_per_s / self.scale

    @property
    def shard_bytes_per_s(self) -> float:
        return self.kinesis_shard_bytes_per_s / self.scale

    @property
    def shard_records_per_s(self) -> float:
        return self.kinesis_shard_records_per_s / self.scale

    def describe(self) -> str:
        """One line for a report: which limits hold, at which scale."""
        where = "AWS's own rates" if self.scale == 1 else f"AWS's rates divided by {self.scale:g}"
        return (
            f"AWS limits on ({where}): a DynamoDB item {self.write_units_per_s:g} WCU/s, "
            f"{self.read_units_per_s:g} RCU/s; a Kinesis shard {self.shard_records_per_s:g} records/s, "
            f"{self.shard_bytes_per_s / MiB:g} MiB/s"
        )

    def as_dict(self) -> dict[str, Any]:
        return {item.name: getattr(self, item.name) for item in fields(self)}

    def scaled(self, scale: float) -> AwsLimits:
        return replace(self, scale=scale)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> AwsLimits | None:
        """The limits a process was started with (:data:`SCALE_ENV`), or None: moto as released."""
        value = (os.environ if environ is None else environ).get(SCALE_ENV, "").strip()
        if not value or value.lower() == "off":
            return None
        try:
            scale = float(value)
        except ValueError:
            raise ValueError(f"{SCALE_ENV}={value!r}: expected a number >= 1 or 'off'") from None
        hold = (os.environ if environ is None else environ).get(HOLD_ENV, "").strip()
        if not hold:
            return cls(scale=scale)
        try:
            hold_s = float(hold)
        except ValueError:
            raise ValueError(f"{HOLD_ENV}={hold!r}: expected seconds >= 0") from None
        if not (math.isfinite(hold_s) and hold_s >= 0):
            raise ValueError(f"{HOLD_ENV}={hold!r}: expected seconds >= 0")
        return cls(scale=scale, transaction_hold_s=hold_s)

    def to_env(self) -> dict[str, str]:
        env = {SCALE_ENV: f"{self.scale:g}"}
        if self.transaction_hold_s != AwsLimits.transaction_hold_s:
            env[HOLD_ENV] = f"{self.transaction_hold_s:g}"
        return env


@dataclass
class _Budget:
    """A partition's budget of capacity, in seconds of its limit, refilled at one per second."""

    level: float
    at_s: float


@dataclass
class ItemStats:
    """What one item saw: units per whole second (peaks kept) and calls refused."""

    kind: str
    second: int = -1
    write_units: float = 0.0  # in the current second
    read_units: float = 0.0
    peak_write_units: float = 0.0
    peak_read_units: float = 0.0
    throttled: int = 0
    total_write_units: float = 0.0  # over the run: where a workload's write cost goes, by kind

    def add(self, second: int, read_units: float, write_units: float) -> None:
        self.total_write_units += write_units
        if second != self.second:
            self.second, self.read_units, self.write_units = second, 0.0, 0.0
        self.read_units += read_units
        self.write_units += write_units
        self.peak_read_units = max(self.peak_read_units, self.read_units)
        self.peak_write_units = max(self.peak_write_units, self.write_units)


@dataclass
class ItemThroughput:
    """Per item: capacity taken per second against a partition's limit; a call past it is refused whole.

    ``consume`` meters and admits (or refuses) one call's units at ``now_s`` (any clock that only moves
    forward: the emulator's monotonic time, the simulator's virtual seconds). A refused call takes no
    capacity, as a throttled request on AWS consumes none. ``read_limit`` and ``write_limit`` are per
    second; ``burst_seconds`` is how much unused budget a partition keeps.
    """

    read_limit: float
    write_limit: float
    burst_seconds: float = 1.0
    budgets: dict[Hashable, _Budget] = field(default_factory=dict)
    stats: dict[Hashable, ItemStats] = field(default_factory=dict)

    @classmethod
    def for_dynamodb(cls, limits: AwsLimits) -> ItemThroughput:
        return cls(limits.read_units_per_s, limits.write_units_per_s, limits.partition_burst_seconds)

    @classmethod
    def for_kinesis_records(cls, limits: AwsLimits) -> ItemThroughput:
        """A shard's records per second, metered as "writes" (its bytes are a limit of their own)."""
        return cls(math.inf, limits.shard_records_per_s, 1.0)

    @classmethod
    def for_kinesis_bytes(cls, limits: AwsLimits) -> ItemThroughput:
        """A shard's bytes per second, metered as "writes"."""
        return cls(math.inf, limits.shard_bytes_per_s, 1.0)

    def consume(
        self,
        item: Hashable,
        now_s: float,
        *,
        read_units: float = 0.0,
        write_units: float = 0.0,
        kind: str = "",
    ) -> bool:
        """Admit the call and take its units (True), or refuse it and count a throttle (False)."""
        cost = read_units / self.read_limit + write_units / self.write_limit
        budget = self._refilled(item, now_s)
        stats = self._stats(item, kind)
        # A call bigger than the whole budget would never pass: it is admitted on a full budget and
        # leaves it in debt, as AWS serves a 400 KB write on a partition that was idle.
        if cost > budget.level and budget.level < self.burst_seconds:
            stats.throttled += 1
            return False
        budget.level -= cost
        stats.add(math.floor(now_s), read_units, write_units)
        return True

    def charge(
        self,
        item: Hashable,
        now_s: float,
        *,
        read_units: float = 0.0,
        write_units: float = 0.0,
        kind: str = "",
    ) -> None:
        """Take units a call used that were known only after it ran (never refused; may leave a debt):
        an update that grew its item, an index partition the write changed."""
        self._refilled(item, now_s).level -= read_units / self.read_limit + write_units / self.write_limit
        self._stats(item, kind).add(math.floor(now_s), read_units, write_units)

    def _refilled(self, item: Hashable, now_s: float) -> _Budget:
        """The item's budget, refilled up to ``now_s`` (a new item's is full)."""
        budget = self.budgets.get(item)
        if budget is None:
            budget = self.budgets[item] = _Budget(self.burst_seconds, now_s)
        elif now_s > budget.at_s:
            budget.level = min(self.burst_seconds, budget.level + (now_s - budget.at_s))
            budget.at_s = now_s
        return budget

    def _stats(self, item: Hashable, kind: str) -> ItemStats:
        stats = self.stats.get(item)
        if stats is None:
            stats = self.stats[item] = ItemStats(kind)
        return stats

    def within(
        self, item: Hashable, now_s: float, *, read_units: float = 0.0, write_units: float = 0.0
    ) -> bool:
        """Whether ``consume`` would admit the call now, without taking or counting anything."""
        budget = self.budgets.get(item)
        if budget is None:
            return True
        level = min(self.burst_seconds, budget.level + max(0.0, now_s - budget.at_s))
        cost = read_units / self.read_limit + write_units / self.write_limit
        return cost <= level or level >= self.burst_seconds

    def hottest(self, count: int = 10) -> list[dict[str, Any]]:
        """The items with the highest peak write units per second (ties: peak reads, throttles)."""
        ranked = sorted(
            self.stats.items(),
            key=lambda entry: (entry[1].peak_write_units, entry[1].peak_read_units, entry[1].throttled),
            reverse=True,
        )
        return [
            {
                "item": _label(item),
                "kind": stats.kind,
                "peak_wcu_per_s": round(stats.peak_write_units, 3),
                "peak_rcu_per_s": round(stats.peak_read_units, 3),
                "throttled": stats.throttled,
            }
            for item, stats in ranked[:count]
        ]

    def write_units_by_kind(self) -> dict[str, float]:
        """Write units taken over the run, per kind of item (most first)."""
        totals: dict[str, float] = {}
        for stats in self.stats.values():
            totals[stats.kind] = totals.get(stats.kind, 0.0) + stats.total_write_units
        return {kind: round(units, 1) for kind, units in sorted(totals.items(), key=lambda kv: -kv[1])}

    def throttles_by_kind(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for stats in self.stats.values():
            if stats.throttled:
                counts[stats.kind] = counts.get(stats.kind, 0) + stats.throttled
        return dict(sorted(counts.items()))


def _label(item: Hashable) -> str:
    if isinstance(item, tuple):
        return "/".join(str(part) for part in item)
    return str(item)


# The kinds of item the blueprint keeps in DynamoDB, by key. The embedded AWS and the simulator report
# throttles and the hottest items under these names, so a figure from one compares with the other's:
#   counters           state  tenant#<t> / counters        counters, concurrency leases, controller fields
#   ingest_bucket      state  tenant#<t> / bucket#ingest   the front door's bucket (and the multiplier)
#   consumer_bucket    state  tenant#<t> / bucket#consumer the workers' consumer-rate bucket
#   bucket             state  tenant#<t> / bucket#<other>  any other token bucket
#   sweep              state  tenant#<t> / sweep           a tenant's sweep marker (the worker's housekeeping)
#   burst_pool         state  pool#concurrency / burst     the fleet's one burst pool of concurrency
#   ledger             state  controller#shard#<n> / ledger a controller shard's ledger
#   controller_scale   state  controller / scale           the controller's scale item
#   queue_health       state  queue#<role> / health[#<n>]  a queue's health item (or one of its shards)
#   dependency_health  state  dependency / health          the downstream dependency's health (the breaker)
#   group_backlog      state  group#<g> / backlog          an ordering group's backlog (FIFO path)
#   redrive_marker     state  redrive#<dlq> / <message id> the fallback redrive's dedup marker
#   dirty_shard        state's index on dirty_shard        a dirty-tenant shard (the index's partition)
#   idempotency_record idempotency  breakwater.process#... a message's processing record (Powertools layout)
#   request_key        idempotency  breakwater.request#... an Idempotency-Key claim at the front door
#   tenant_config      tenants  tenant_id                  a tenant's configuration
#   write_ahead        write-ahead  <group> / <dedup id>   the ordered path's write-ahead record
#   stream_aggregate   aggregates  <partition key> / <type> the stream consumer's aggregate and checkpoint
#   other              anything else
_STATE_SORT_KEYS = {
    "counters": "counters",
    "bucket#ingest": "ingest_bucket",
    "bucket#consumer": "consumer_bucket",
    "sweep": "sweep",
}


def item_kind(table: str, key: Mapping[str, Any]) -> str:
    """The kind of a DynamoDB item (see the list above) from its table's name and its key.

    ``key`` maps the key's attribute names to their values, plain (``{"pk": "tenant#a"}``) or as
    DynamoDB sends them (``{"pk": {"S": "tenant#a"}}``). A key on the state table's index of dirty
    tenants (``dirty_shard``) is a dirty shard. Tables are told apart by their key attributes, and
    the two tables keyed by ``pk``/``sk`` outside the state table by their names (CloudFormation
    names a table after its construct).
    """
    plain = {name: _plain(value) for name, value in key.items()}
    if "dirty_shard" in plain:
        return "dirty_shard"
    if "tenant_id" in plain:
        return "tenant_config"
    if "id" in plain:
        ident = plain["id"]
        if ident.startswith("breakwater.request"):
            return "request_key"
        if ident.startswith("breakwater.process"):
            return "idempotency_record"
        return "other"
    pk, sk = plain.get("pk", ""), plain.get("sk", "")
    if "WriteAhead" in table:
        return "write_ahead"
    if "Aggregates" in table:
        return "stream_aggregate"
    if pk.startswith("tenant#"):
        return _STATE_SORT_KEYS.get(sk, "bucket" if sk.startswith("bucket#") else "other")
    if pk == "pool#concurrency":
        return "burst_pool"
    if pk.startswith("controller#shard#"):
        return "ledger"
    if pk == "controller":
        return "controller_scale"
    if pk.startswith("queue#") and (sk == "health" or sk.startswith("health#")):
        return "queue_health"
    if pk == "dependency":
        return "dependency_health"
    if pk.startswith("group#"):
        return "group_backlog"
    if pk.startswith("redrive#"):
        return "redrive_marker"
    return "other"


def _plain(value: Any) -> str:
    if isinstance(value, Mapping):
        value = next(iter(value.values()), "")
    return str(value)

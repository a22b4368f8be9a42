"""The simulator's lease shards as ``breakwater.aws.concurrency`` and the worker now take them.

A tenant whose ceiling is above ``LEASE_SHARD_PLACES`` leases in ``tenant#<t>/lease#<k>`` items, each
with its share of the floor and ceiling, in the container's own shard and then in one other; its
counters item holds no lease, and each container writes its counters at most every
``counters_interval_s``, keeping them in between. A tenant of one shard is as before. Virtual time
throughout; the table's calls are recorded by wrapping the simulator's own meter.
"""

from __future__ import annotations

from collections.abc import Hashable

import pytest
import simpy

import sim  # noqa: F401
from breakwater.concurrency import (
    LEASE_SHARD_PLACES,
    ConcurrencyLimits,
    Grant,
    counters_interval_s,
    lease_shard_count,
    lease_shard_of,
    shard_limits,
)
from breakwater.settings import TierLimits
from local.aws_limits import AwsLimits
from sim.dynamodb import LEASE_SHARD, StateTable
from sim.gates import ConsumerBuckets, LeaseTable
from sim.messages import Message
from sim.sqs import SqsQueue
from sim.worker import Costs, WorkerModel, WorkerSetup
from tests.sim.test_gates import FAR_MS, NOW_MS, NOW_S, TimedSink, exhaust
from tests.sim.test_worker_model import decision_config

NAMES = ["big", "small"]
BIG, SMALL = 0, 1
BIG_LIMITS = TierLimits(rate=1000, burst=1000, consumer_rate=1000, concurrency=400, concurrency_floor=4)
SMALL_LIMITS = TierLimits(rate=1000, burst=1000, consumer_rate=1000, concurrency=4, concurrency_floor=1)


def record_calls(
    table: StateTable, monkeypatch: pytest.MonkeyPatch
) -> list[tuple[Hashable, float, float, float]]:
    """Every call the table meters, as (item, virtual time, read units, write units)."""
    calls: list[tuple[Hashable, float, float, float]] = []
    consume = table._consume

    def recorded(
        item: Hashable, now_s: float, *, read_units: float = 0.0, write_units: float = 0.0, kind: str = ""
    ) -> bool:
        calls.append((item, now_s, read_units, write_units))
        return consume(item, now_s, read_units=read_units, write_units=write_units, kind=kind)

    monkeypatch.setattr(table, "_consume", recorded)
    return calls


def writes_on(calls: list[tuple[Hashable, float, float, float]], item: Hashable) -> list[tuple[float, float]]:
    return [(at, units) for each, at, _, units in calls if each == item and units]


def reads_on(calls: list[tuple[Hashable, float, float, float]], item: Hashable) -> int:
    return sum(1 for each, _, units, _ in calls if each == item and units)


# -- the lease items -----------------------------------------------------------------------------------------


def test_a_sharded_tenants_lease_items_never_hold_more_than_their_places_and_its_counters_item_none(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    table = StateTable(NAMES)
    calls = record_calls(table, monkeypatch)
    leases = LeaseTable(4000, table)
    limits = ConcurrencyLimits(floor=4, ceiling=40)  # three shards of 14, 13 and 13 places
    shards = lease_shard_count(limits)
    grants = [
        leases.acquire_many({BIG: limits}, f"live-{index % 17}#{index}", FAR_MS, NOW_MS)[BIG]
        for index in range(300)
    ]
    assert leases.lease_shards(BIG) == shards == 3
    assert grants.count(Grant.REFUSED) == 300 - 40  # the tenant's ceiling, over all its shards
    assert leases.held(BIG, NOW_MS) == 40
    for shard in range(shards):
        assert leases.held_count(BIG, shard) == shard_limits(limits, shard).ceiling <= LEASE_SHARD_PLACES
    assert leases.held_count(BIG) == 0  # the counters item holds none
    assert not [call for call in calls if call[0] == table.counters(BIG)]
    # each shard billed by its own size: at most its leases' (twice in a burst lease's transaction)
    for shard in range(shards):
        assert max(
            units for _, units in writes_on(calls, table.lease_shard(BIG, shard))
        ) <= table.lease_shard_units(LEASE_SHARD_PLACES, transactional=True)
    reported = {entry["item"]: entry["kind"] for entry in table.report(50)["hottest_items"]}
    assert {item: kind for item, kind in reported.items() if "tenant#big" in item} == {
        f"state/tenant#big/lease#{shard}": LEASE_SHARD for shard in range(shards)
    }


def test_the_second_shard_is_read_and_written_when_the_first_is_full(monkeypatch: pytest.MonkeyPatch) -> None:
    table = StateTable(NAMES)
    leases = LeaseTable(4000, table)
    limits = ConcurrencyLimits(floor=2, ceiling=32)  # two shards of 16, a floor of 1 each
    holder = "live-0#999"
    first = lease_shard_of("big", holder, 2)
    second = 1 - first
    hashed = {
        shard: [
            f"live-1#{index}" for index in range(200) if lease_shard_of("big", f"live-1#{index}", 2) == shard
        ]
        for shard in (0, 1)
    }
    for other in hashed[first][:16]:  # the first shard's 16 places taken
        assert leases.acquire_many({BIG: limits}, other, FAR_MS, NOW_MS)[BIG] is not Grant.REFUSED
    leases.acquire_many({BIG: limits}, hashed[second][0], FAR_MS, NOW_MS)  # the second's floor taken
    assert leases.held_count(BIG, first) == 16
    calls = record_calls(table, monkeypatch)
    assert leases.acquire_many({BIG: limits}, holder, FAR_MS, NOW_MS) == {BIG: Grant.BURST}
    assert leases.second_tries == 1
    assert leases.lease_key(holder, BIG) == (BIG, second)
    # the first shard's floor tried without reading (its condition failing: billed), then read in the
    # batch's read; the second read on its own, then written (with the pool's shard)
    assert len(writes_on(calls, table.lease_shard(BIG, first))) == 1
    assert reads_on(calls, table.lease_shard(BIG, first)) == 1
    assert reads_on(calls, table.lease_shard(BIG, second)) == 1
    assert len(writes_on(calls, table.lease_shard(BIG, second))) == 1
    # the release goes where the lease is; until it is written, that item is tried first
    assert leases.release_write(holder, BIG)[0] == table.lease_shard(BIG, second)
    assert leases.choices(BIG, limits, holder)[0][0] == (BIG, second)
    leases.end(holder, BIG, NOW_MS + 10)
    assert leases.lease_key(holder, BIG) == BIG
    assert leases.choices(BIG, limits, holder)[0][0] == (BIG, first)


def test_a_first_shard_that_stays_throttled_leaves_the_lease_to_the_second() -> None:
    table = StateTable(NAMES, AwsLimits(scale=100))
    leases = LeaseTable(10, table)
    limits = ConcurrencyLimits(floor=2, ceiling=32)
    holder = "live-0#1"
    first = lease_shard_of("big", holder, 2)
    exhaust(table, table.lease_shard(BIG, first), LEASE_SHARD)
    assert leases.acquire_many({BIG: limits}, holder, FAR_MS, NOW_MS) == {BIG: Grant.FLOOR}
    assert leases.lease_key(holder, BIG) == (BIG, 1 - first)
    assert leases.refused_on_error == 0


def test_a_shard_whose_share_of_the_floor_is_0_is_read_before_it_is_written(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    table = StateTable(NAMES)
    leases = LeaseTable(10, table)
    limits = ConcurrencyLimits(floor=1, ceiling=32)  # shard 0 the floor, shard 1 none
    holder = next(
        f"live-0#{index}" for index in range(100) if lease_shard_of("big", f"live-0#{index}", 2) == 1
    )
    calls = record_calls(table, monkeypatch)
    assert leases.acquire_many({BIG: limits}, holder, FAR_MS, NOW_MS) == {BIG: Grant.BURST}
    shard = table.lease_shard(BIG, 1)
    assert calls[0][0] == shard and calls[0][2] > 0  # no write without reading: the shard read first
    assert reads_on(calls, shard) == 1


# -- the worker: releases and counters -----------------------------------------------------------------------


class CountingSink(TimedSink):
    def __init__(self) -> None:
        super().__init__()
        self.counted: dict[int, int] = {}

    def count(self, tenant: int, counter: str, amount: int = 1) -> None:
        self.counted[tenant] = self.counted.get(tenant, 0) + amount


INTERVAL_S = counters_interval_s(400)  # 400 containers may receive a tenant: a write a second each


def worker(table: StateTable) -> tuple[WorkerModel, CountingSink, SqsQueue]:
    env = simpy.Environment(initial_time=NOW_S)
    queue = SqsQueue(env, "live-0", visibility_timeout_s=360, max_receive_count=5)
    sink = CountingSink()
    limits = {BIG: BIG_LIMITS, SMALL: SMALL_LIMITS}
    setup = WorkerSetup(
        decision_config("live"), True, (5, 60), 5, 60, Costs(0, 0, 0, 0, 0, 0), counters_interval_s=INTERVAL_S
    )
    model = WorkerModel(
        "worker",
        setup,
        sink,
        limits.__getitem__,
        ConsumerBuckets(limits.__getitem__, table),
        LeaseTable(100, table),
    )
    return model, sink, queue


def batch(model: WorkerModel, queue: SqsQueue, container: int, tenants: list[int], at_s: float) -> None:
    for tenant in tenants:
        queue.send(Message(tenant, int(at_s * 1000) - 10, None, None, 0.0, False))
    model.handle(queue.receive(10), queue, container, at_s).finish()


def test_a_sharded_tenants_counters_go_out_at_most_once_per_interval_per_container_and_none_is_lost(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    table = StateTable(NAMES)
    calls = record_calls(table, monkeypatch)
    model, sink, queue = worker(table)
    batch(model, queue, 1, [BIG, BIG, BIG], NOW_S)  # its first write: at once
    batch(model, queue, 2, [BIG], NOW_S + 0.1)  # another container's first
    batch(model, queue, 1, [BIG, BIG], NOW_S + 0.3)  # within the interval: kept
    assert model.kept.carried(BIG) == 2
    batch(model, queue, 1, [SMALL], NOW_S + 0.6)  # no message of it, not due yet: still kept
    assert model.kept.carried(BIG) == 2
    batch(model, queue, 1, [SMALL], NOW_S + 1.2)  # due: written at the end of this batch
    assert [at for at, _ in writes_on(calls, table.counters(BIG))] == pytest.approx(
        [NOW_S, NOW_S + 0.1, NOW_S + 1.2]
    )
    assert {units for _, units in writes_on(calls, table.counters(BIG))} == {table.counters_units(0)}
    assert model.kept.carried(BIG) == 0
    assert model.kept.counts_written[BIG] == sink.counted[BIG] == 6
    # its releases went to its lease shards (a write each), never to its counters item
    shard_writes = [call for call in calls if call[0][2].startswith("lease#") and call[3]]  # type: ignore[index]
    assert len(shard_writes) >= 3


def test_a_small_tenants_writes_per_batch_are_one_once_its_lease_lapses(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    table = StateTable(NAMES)
    calls = record_calls(table, monkeypatch)
    model, _, queue = worker(table)
    counters = table.counters(SMALL)
    batch(model, queue, 1, [SMALL, SMALL], NOW_S)
    # its consumer bucket's write with the floor lease, which finds no map of leases, the bucket's write
    # again alone, a write without reading that finds no map either, the read, the map made, the
    # floor, the release
    first = writes_on(calls, counters)
    assert len(first) == 6
    batch(model, queue, 1, [SMALL, SMALL], NOW_S + 0.2)
    # then, the container knowing how long its messages take, the bucket's write with the floor lease
    # and the counts ahead: the lease lapses, nothing is kept
    assert len(writes_on(calls, counters)) - len(first) == 1
    assert not [call for call in calls if str(call[0][2]).startswith("lease#")]  # type: ignore[index]
    assert model.kept.counts_written == {}
    assert model.kept.carried(SMALL) == 0


def test_a_lease_shard_is_keyed_as_the_adapter_keys_it_and_billed_by_its_leases() -> None:
    table = StateTable(NAMES)
    assert table.lease_shard(BIG, 3) == ("state", "tenant#big", "lease#3")
    assert table.lease_shard_units(0) == 1
    assert table.lease_shard_units(LEASE_SHARD_PLACES) == 2  # 60 + 16 x 64 bytes: just over 1 KB
    assert table.lease_shard_units(LEASE_SHARD_PLACES, transactional=True) == 4
    assert table.lease_shard_read_units(LEASE_SHARD_PLACES) == 1


def test_a_refused_tenants_counters_go_out_at_most_once_per_interval(monkeypatch: pytest.MonkeyPatch) -> None:
    table = StateTable(NAMES)
    calls = record_calls(table, monkeypatch)
    model, sink, queue = worker(table)
    assert model.leases is not None
    monkeypatch.setattr(
        model.leases,
        "acquire_many",
        lambda requests, *_args, **_kwargs: dict.fromkeys(requests, Grant.REFUSED),
    )
    assert model.rate is not None
    model.rate.table = None  # its consumer bucket's writes of the same item are not what is counted here
    batch(model, queue, 1, [SMALL], NOW_S)  # deferred, counted: its first write at once
    batch(model, queue, 1, [SMALL], NOW_S + 0.5)  # within the interval: kept
    assert model.kept.carried(SMALL) == 1
    batch(model, queue, 1, [SMALL], NOW_S + INTERVAL_S)  # due: written with what was kept
    assert [at for at, _ in writes_on(calls, table.counters(SMALL))] == pytest.approx(
        [NOW_S, NOW_S + INTERVAL_S]
    )
    assert model.kept.counts_written[SMALL] == sink.counted[SMALL] == 3

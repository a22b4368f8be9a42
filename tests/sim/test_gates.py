"""The worker model's gates as the real ones now behave under DynamoDB's limits.

A gate's trouble costs only its tenant (its messages are deferred as a refused tenant's are, the
batch's other tenants go on), the burst pool is spread over shard items of at most
``POOL_SHARD_PLACES`` places, a tenant's lease goes back when its last message is done, the moves go
out before processing, and the health reports are spread over shard items. Small batches in virtual
time, AWS's rates divided so that a handful of calls passes them; nothing here reads a wall clock.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pytest
import simpy

import sim  # noqa: F401
from breakwater.concurrency import POOL_SHARD_PLACES, ConcurrencyLimits, Grant
from breakwater.envelope import Origin
from breakwater.settings import TierLimits
from breakwater_cdk.ceilings import health_report_shards
from local.aws_limits import AwsLimits
from sim.config import blueprint, load_context, setups
from sim.control import ControllerState
from sim.dynamodb import BURST_POOL, CONSUMER_BUCKET, COUNTERS, QUEUE_HEALTH, StateTable
from sim.gates import ConsumerBuckets, LeaseTable
from sim.messages import Message
from sim.scale import scale_scenario, sizing
from sim.sqs import SqsQueue
from sim.system import System
from sim.worker import Costs, Outcome, WorkerModel, WorkerSetup
from tests.sim.test_worker_model import LIMITS, decision_config

NAMES = ["t0", "t1", "t2"]
NOW_S = 1_000.0
NOW_MS = int(NOW_S * 1000)
LIMIT = AwsLimits(scale=100)  # a partition: 10 write units and 30 read units a second
FAR_MS = NOW_MS + 600_000


def exhaust(table: StateTable, item: tuple[str, ...], kind: str, seconds: int = 6) -> None:
    """Spend the item's budget from NOW_S for ``seconds`` (longer than botocore's retries wait)."""
    for second in range(seconds):
        while table.write(item, kind, NOW_S + second, 1):
            pass


@dataclass
class TimedSink:
    """A sink whose tenants' messages take ``work_s`` each; it records the moves with when they left."""

    work_s: dict[int, float] = field(default_factory=dict)
    moves: list[tuple[Message, Origin, int, float]] = field(default_factory=list)
    processed: list[Message] = field(default_factory=list)
    health: ControllerState | None = None

    def observe(self, message: Message, role: str, now_s: float) -> None: ...

    def process(self, message: Message, at_s: float) -> tuple[Outcome, float]:
        self.processed.append(message)
        return "ok", self.work_s.get(message.tenant, 0.0)

    def send_move(self, message: Message, destination: Origin, delay_s: int, after_s: float = 0.0) -> None:
        self.moves.append((message, destination, delay_s, after_s))

    def count(self, tenant: int, counter: str, amount: int = 1) -> None: ...

    def report_oldest(self, role: str, age_ms: int, now_ms: int, shard: int = 0) -> None:
        if self.health is not None:
            self.health.record_oldest_age(role, age_ms, now_ms, shard)

    def report_outage(self, until_ms: int) -> None: ...


def worker(
    tenants: list[int],
    table: StateTable | None = None,
    sink: TimedSink | None = None,
    leases: LeaseTable | None = None,
    health_shards: int = 1,
    limits: TierLimits = LIMITS,
) -> tuple[WorkerModel, TimedSink, SqsQueue, list[Message]]:
    env = simpy.Environment(initial_time=NOW_S)
    queue = SqsQueue(env, "live-0", visibility_timeout_s=360, max_receive_count=5)
    for index, tenant in enumerate(tenants):
        queue.send(Message(tenant, NOW_MS - index, None, None, 0.0, False))
    sink = sink or TimedSink()
    setup = WorkerSetup(decision_config("live"), True, (5, 60), 5, 60, Costs(0, 0, 0, 0, 0, 0), health_shards)
    model = WorkerModel(
        "worker",
        setup,
        sink,
        lambda _t: limits,
        ConsumerBuckets(lambda _t: limits, table),
        leases if leases is not None else LeaseTable(10, table),
    )
    return model, sink, queue, queue.receive(10)


# -- a gate's trouble costs its tenant -----------------------------------------------------------------------


def test_a_tenant_whose_lease_item_stays_throttled_has_only_its_messages_deferred() -> None:
    table = StateTable(NAMES, LIMIT)
    exhaust(table, table.counters(0), COUNTERS)
    model, sink, queue, batch = worker([0, 1, 0, 1], table)
    model.handle(batch, queue, 1, NOW_S).finish()
    assert [message.tenant for message in sink.processed] == [1, 1]
    assert [(message.tenant, role) for message, role, _, _ in sink.moves] == [
        (0, Origin.SURGE),
        (0, Origin.SURGE),
    ]  # set aside as a tenant refused a lease is
    assert model.batch_failures == 0
    assert model.leases is not None and model.leases.refused_on_error == 1
    queue.env.run(until=NOW_S + 361)
    assert queue.receive(10) == []  # nothing comes back after the visibility timeout


def test_a_consumer_bucket_throttled_through_its_retries_fails_open() -> None:
    table = StateTable(NAMES, LIMIT)
    exhaust(table, table.consumer_bucket(0), CONSUMER_BUCKET)
    # tenants whose leases are on lease shards: their consumer buckets are on items of their own
    model, sink, queue, batch = worker(
        [0, 1, 0, 1], table, limits=LIMITS.model_copy(update={"concurrency": 64})
    )
    model.handle(batch, queue, 1, NOW_S).finish()
    assert model.rate is not None and model.rate.failed_open == 1
    assert len(sink.processed) == 4  # within the tenants' rates and leases: processed all the same
    assert model.batch_failures == 0


def test_a_floor_lease_rides_on_the_consumer_bucket_s_write_of_the_counters_item() -> None:
    table = StateTable(NAMES, LIMIT)
    model, sink, queue, batch = worker([0, 1, 0, 1], table)
    model.handle(batch, queue, 1, NOW_S).finish()  # the tenants' first leases make their maps
    assert model.rate is not None and model.leases is not None
    rate_writes, lease_writes = model.rate.writes, model.leases.writes
    later = NOW_S + 5
    for index, tenant in enumerate([0, 1, 1]):
        queue.send(Message(tenant, int(later * 1000) - index, None, None, 0.0, False))
    model.handle(queue.receive(10), queue, 1, later).finish()
    assert len(sink.processed) == 7
    assert model.rate.writes - rate_writes == 2  # one ask per tenant, each a write of its counters item
    assert model.leases.writes == lease_writes  # the floor leases rode on those asks
    assert all(row["kind"] != CONSUMER_BUCKET for row in table.report(count=100)["hottest_items"])


def test_a_pool_shard_left_unread_leaves_the_batch_floors_only() -> None:
    table = StateTable(NAMES, LIMIT)
    leases = LeaseTable(10, table)
    limits = ConcurrencyLimits(floor=1, ceiling=3)
    assert leases.acquire_many({0: limits}, "c1", FAR_MS, NOW_MS) == {0: Grant.FLOOR}
    exhaust(table, table.pool, BURST_POOL)
    # t0 is past its floor and needs the pool; t1 is within its floor and does not
    grants = leases.acquire_many({0: limits, 1: limits}, "c2", FAR_MS, NOW_MS)
    assert grants == {0: Grant.REFUSED, 1: Grant.FLOOR}
    assert leases.refused_on_error == 0  # refused as a full pool is, not an error


def test_a_burst_transaction_that_never_goes_through_is_retried_after_pauses_then_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    table = StateTable(NAMES, LIMIT)
    leases = LeaseTable(10, table)
    limits = ConcurrencyLimits(floor=1, ceiling=3)
    assert leases.acquire_many({0: limits}, "c1", FAR_MS, NOW_MS) == {0: Grant.FLOOR}
    leases.waited_s = 0.0
    monkeypatch.setattr(table, "transact", lambda _items, _now_s: False)  # cancelled every time
    assert leases.acquire_many({0: limits}, "c2", FAR_MS, NOW_MS) == {0: Grant.REFUSED}
    assert leases.conflicts == 4  # the batch's transaction, then three on its own
    assert leases.refused_on_error == 1
    assert 0 < leases.waited_s <= 0.01 + 0.02  # two jittered pauses in windows of 10 and 20 ms
    assert leases.held(0, NOW_MS) == 1  # only c1's


# -- the burst pool over shard items -------------------------------------------------------------------


def test_the_burst_pool_is_spread_over_shards_that_never_hold_more_than_their_places() -> None:
    capacity = 3506  # a share of 0.75 of 17 mappings x 275, the scale scenario's
    table = StateTable(NAMES)
    leases = LeaseTable(capacity, table)
    assert len(leases.shards) == math.ceil(capacity / POOL_SHARD_PLACES)
    assert sum(shard.capacity for shard in leases.shards) == capacity
    assert max(shard.capacity for shard in leases.shards) <= POOL_SHARD_PLACES
    limits = ConcurrencyLimits(floor=1, ceiling=100_000)
    grants = [
        leases.acquire_many({0: limits}, f"live-{index % 17}#{index}", FAR_MS, NOW_MS)[0]
        for index in range(6000)
    ]
    burst = grants.count(Grant.BURST)
    assert 0 < burst <= capacity
    assert all(len(shard.places) <= shard.capacity for shard in leases.shards)
    # a holder is refused when its own shard is full, whatever room the others have
    assert grants.count(Grant.REFUSED) == 6000 - 1 - burst
    pool_items = [entry for entry in table.report(400)["hottest_items"] if entry["kind"] == BURST_POOL]
    assert len(pool_items) == len(leases.shards)
    assert {entry["item"].rsplit("/", 1)[1] for entry in pool_items} == {
        f"burst#{shard}" for shard in range(len(leases.shards))
    }


def test_a_pool_of_one_shard_keeps_the_original_key() -> None:
    table = StateTable(NAMES)
    assert table.pool_shard(0, 1) == table.pool == ("state", "pool#concurrency", "burst")
    assert table.pool_shard(3, 5) == ("state", "pool#concurrency", "burst#3")


# -- release per tenant, moves before processing -------------------------------------------------------------


def test_a_tenants_lease_goes_back_when_its_last_message_is_done_not_with_the_batch() -> None:
    sink = TimedSink(work_s={0: 0.1, 1: 1.0})
    model, sink, queue, batch = worker([0, 1, 1], sink=sink)
    invocation = model.handle(batch, queue, 1, NOW_S)
    leases = model.leases
    assert leases is not None
    assert invocation.duration_s == pytest.approx(2.1)
    assert leases.held(0, NOW_MS + 50) == 1 and leases.held(1, NOW_MS + 50) == 1
    assert leases.held(0, NOW_MS + 150) == 0  # t0's only message ended at 0.1 s
    assert leases.held(1, NOW_MS + 1_500) == 1  # t1's run on
    assert leases.held(1, NOW_MS + 2_150) == 0


def test_a_tenants_release_is_written_when_its_messages_end() -> None:
    table = StateTable(NAMES, LIMIT)
    sink = TimedSink(work_s={0: 0.1, 1: 3.0})
    model, sink, queue, batch = worker([0, 1], table, sink)
    model.handle(batch, queue, 1, NOW_S).finish()
    written = {entry["item"]: entry for entry in table.report(20)["hottest_items"]}
    assert written["state/tenant#t0/counters"]["peak_wcu_per_s"] >= 1
    # t0's lease and release in the first second; t1's release three seconds later
    stats = table.meter.stats
    assert stats[table.counters(1)].second == int(NOW_S) + 3
    assert stats[table.counters(0)].second == int(NOW_S)


def test_the_moves_go_out_before_the_batch_is_processed() -> None:
    leases = LeaseTable(10)
    busy = ConcurrencyLimits(floor=1, ceiling=1)
    leases.acquire_many({2: busy}, "other", FAR_MS, NOW_MS)  # t2's ceiling held elsewhere
    sink = TimedSink(work_s={0: 1.0})
    model, sink, queue, batch = worker([2, 0, 0], sink=sink, leases=leases)
    model._concurrency[2] = busy
    invocation = model.handle(batch, queue, 1, NOW_S)
    assert [(message.tenant, role) for message, role, _, _ in sink.moves] == [(2, Origin.SURGE)]
    sent_after = sink.moves[0][3]
    assert sent_after < invocation.duration_s - 1.5  # before both of t0's seconds of work


# -- the health reports over shards --------------------------------------------------------------------


def test_the_health_reports_spread_over_shards_and_the_controller_reads_them_all() -> None:
    shards = 4
    table = StateTable(NAMES)
    state = ControllerState(NAMES, lambda _t: LIMITS, health_shards=shards)
    sink = TimedSink(health=state)
    model, _, queue, _ = worker([], table, sink, health_shards=shards)
    for index in range(200):  # 200 containers, each its first report
        holder, _, shard = model._container(queue, index)
        model.report_oldest(holder, shard, "live", 1_000 + index, NOW_MS)
    reported = table.report(50)["hottest_items"]
    health = {entry["item"]: entry for entry in reported if entry["kind"] == QUEUE_HEALTH}
    assert set(health) == {f"state/queue#live/health#{shard}" for shard in range(shards)}
    assert max(entry["peak_wcu_per_s"] for entry in health.values()) < 200  # spread, none takes them all
    assert state.oldest_age("live", NOW_MS) == (1_199, NOW_MS)  # the largest age in the window
    # a larger age reported over a minute ago no longer counts once a shard has a newer one
    state.record_oldest_age("live", 99_000, NOW_MS - 61_000, 0)
    assert state.oldest_age("live", NOW_MS) == (1_199, NOW_MS)


def test_a_run_spreads_the_health_reports_as_the_stack_sets_them() -> None:
    config = blueprint(load_context(), [sizing(total_rate=20_000)])
    scenario = scale_scenario(config, tenants=100, total_rate=20_000)
    system = System(scenario, setups(config, same_fleet=True)["breakwater"], Costs())
    assert system.health_shards == health_report_shards(config) == 4  # 17 mappings of 275: 935 reports/s
    assert system.live_worker.setup.health_shards == 4
    assert system.state.health_shards == 4


# -- a refused container backs off until the refill ----------------------------------------------------------


def test_a_container_refused_a_tenants_tokens_asks_the_table_again_only_after_the_refill() -> None:
    # a consumer rate of 3 a second and a burst of 3: a container's lease is one token (a quarter of
    # the burst at most), so a refused one waits a third of a second
    buckets = ConsumerBuckets(lambda _t: LIMITS)
    assert buckets.try_acquire_up_to(0, 3, NOW_S, "c1") == 3
    assert buckets.try_acquire_up_to(0, 2, NOW_S, "c1") == 0  # the table refuses: a write all the same
    assert buckets.writes == 2
    assert buckets.try_acquire_up_to(0, 2, NOW_S + 0.2, "c1") == 0
    assert buckets.writes == 2  # refused by the container itself: no call
    assert buckets.try_acquire_up_to(0, 2, NOW_S + 0.2, "c2") == 0  # another container asks the table
    assert buckets.writes == 3
    assert buckets.try_acquire_up_to(0, 2, NOW_S + 0.5, "c1") == 1  # refilled: c1 asks again
    assert buckets.writes == 4
    assert buckets.refusals.refused_locally == 1

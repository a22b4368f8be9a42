"""The simulator's worker sends every message where the real ``Worker.handle`` sends it.

The same batches go through the real worker (Powertools' batch processor, fake ports) and through
``sim.worker.WorkerModel`` with the same gates; each message's fate (processed, dropped, failed, or
moved to which queue role with which delay) must be the same.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest
import simpy

import sim  # noqa: F401
from breakwater.concurrency import ConcurrencyLimits, Grant
from breakwater.envelope import Envelope, Origin, new_envelope_id
from breakwater.fairness import BucketLimits
from breakwater.processor import DependencyUnavailableError, WorkContext
from breakwater.settings import TierLimits
from breakwater.sideline import DecisionConfig, Move
from breakwater.worker.batch import Worker, WorkerOptions
from breakwater.worker.ports import WorkerPorts
from sim.gates import ConsumerBuckets, LeaseTable
from sim.messages import Message
from sim.sqs import SqsQueue
from sim.worker import Costs, Outcome, WorkerModel, WorkerSetup

NOW_MS = 1_700_000_000_000
LIMITS = TierLimits(rate=50, burst=100, consumer_rate=3, concurrency=2, concurrency_floor=1)
TENANTS = ["t0", "t1", "t2"]
URLS = {role: f"https://sqs/{role.value}" for role in (Origin.SPILLOVER, Origin.BACKLOG, Origin.SURGE)}
ROLE_OF_URL = {url: role for role, url in URLS.items()}
HOLDER = "container-1"
OTHERS_HOLD = {"t2": 2}  # other containers hold t2's ceiling: its batches are refused a lease


@dataclass(frozen=True)
class Item:
    tenant: int
    age_ms: int = 0
    receive_count: int = 1
    expired: bool = False
    poison: bool = False
    origin: Origin = Origin.LIVE


def decision_config(mode: str) -> DecisionConfig:
    return DecisionConfig(
        mode="sideline" if mode == "sideline" else "live",
        sideline_age_ms=300_000,
        defer_base_seconds=2,
        max_defer_seconds=900,
    )


def leases_held_by_others() -> LeaseTable:
    table = LeaseTable(burst_capacity=10)
    for tenant_name, count in OTHERS_HOLD.items():
        tenant = TENANTS.index(tenant_name)
        for other in range(count):
            table.acquire_many(
                {tenant: ConcurrencyLimits(floor=1, ceiling=2)}, f"other-{other}", NOW_MS + 600_000, NOW_MS
            )
    return table


# -- the real worker --------------------------------------------------------------------------------------


@dataclass
class RealPorts:
    down: bool = False
    moves: list[Move] = field(default_factory=list)
    processed: list[str] = field(default_factory=list)
    buckets: ConsumerBuckets = field(default_factory=lambda: ConsumerBuckets(lambda _t: LIMITS))
    leases: LeaseTable = field(default_factory=leases_held_by_others)

    def try_acquire_up_to(self, tenant: str, limits: BucketLimits, count: int) -> tuple[int, float]:
        return self.buckets.try_acquire_up_to(TENANTS.index(tenant), count, NOW_MS / 1000), 0.0

    def acquire_many(
        self,
        requests: Mapping[str, ConcurrencyLimits],
        expires_at_ms: int,
        floor_until: Mapping[str, int] | None = None,
    ) -> dict[str, Grant]:
        grants = self.leases.acquire_many(
            {TENANTS.index(tenant): limits for tenant, limits in requests.items()},
            HOLDER,
            expires_at_ms,
            NOW_MS,
        )
        return {TENANTS[tenant]: grant for tenant, grant in grants.items()}

    def renew(self, tenant: str, limits: ConcurrencyLimits, until_ms: int) -> bool:
        return True

    def carry(self, counters: Mapping[str, Mapping[str, int]]) -> None: ...

    def contended(self, tenant: str) -> bool:
        return False

    def carried_landed(self) -> set[str]:
        return set()

    def process(self, envelope: Envelope, work: WorkContext) -> dict[str, Any]:
        if self.down:
            raise DependencyUnavailableError("down")
        if envelope.payload.get("poison"):
            raise RuntimeError("poison")
        self.processed.append(envelope.id)
        return {}

    def worker_ports(self) -> WorkerPorts:
        return WorkerPorts(
            tenant_limits=lambda _tenant: LIMITS,
            swept_at_ms=lambda _tenant: None,
            send_moves=lambda moves: self.moves.extend(moves) or set(),  # type: ignore[func-returns-value]
            settle=lambda _grants, _counters: {},
            record_oldest_age=lambda _role, _age, _now: None,
            extend_visibility=lambda _url, _handle, _seconds: None,
            process=self.process,
            rate=self,
            leases=self,
            clock_ms=lambda: NOW_MS,
            monotonic=lambda: NOW_MS / 1000,
        )


class Context:
    function_name = "worker"
    memory_limit_in_mb = 1024
    invoked_function_arn = "arn:aws:lambda:us-east-1:123456789012:function:worker"
    aws_request_id = "request"

    def get_remaining_time_in_millis(self) -> int:
        return 60_000


def envelope_of(index: int, item: Item) -> Envelope:
    enqueued = NOW_MS - item.age_ms
    return Envelope(
        id=new_envelope_id(enqueued, bytes([index]) * 10),
        tenant=TENANTS[item.tenant],
        type="t",
        payload={"poison": item.poison},
        enqueued_at=enqueued,
        expires_at=NOW_MS - 1 if item.expired else None,
        origin=item.origin,
    )


def real_fates(items: list[Item], mode: str, *, down: bool = False) -> list[tuple[str, Any]]:
    ports = RealPorts(down=down)
    options = WorkerOptions(
        decision=decision_config(mode),
        queue_urls=URLS,
        visibility_timeout_s=360,
        heartbeat_s=30,
        max_receive_count=5,
        outage_backoff_s=5 if mode else None,
        outage_backoff_max_s=60,
    )
    # both take a deferral's whole backoff (each draws its share at random otherwise)
    worker = Worker(options, ports.worker_ports(), metrics=_NoMetrics(), jitter=lambda: 1.0)
    envelopes = [envelope_of(index, item) for index, item in enumerate(items)]
    records = [
        {
            "messageId": f"m{index}",
            "receiptHandle": f"h{index}",
            "body": each.to_json(),
            "attributes": {"ApproximateReceiveCount": str(item.receive_count)},
            "messageAttributes": {},
            "eventSourceARN": "arn:aws:sqs:us-east-1:123456789012:live-0",
        }
        for index, (each, item) in enumerate(zip(envelopes, items, strict=True))
    ]
    response = worker.handle({"Records": records}, Context())  # type: ignore[arg-type]
    failed = {failure["itemIdentifier"] for failure in response["batchItemFailures"]}
    moved = {move.key: move for move in ports.moves}
    fates: list[tuple[str, Any]] = []
    for index, each in enumerate(envelopes):
        key = f"m{index}"
        if key in failed:
            fates.append(("failed", None))
        elif key in moved:
            move = moved[key]
            body = json.loads(move.body)
            fates.append(("moved", (ROLE_OF_URL[move.queue_url], move.delay_seconds, body["attempt"])))
        elif each.id in ports.processed:
            fates.append(("processed", None))
        else:
            fates.append(("dropped", None))
    return fates


class _NoMetrics:
    def add_dimension(self, name: str, value: str) -> None: ...
    def add_metric(self, name: str, unit: Any, value: float, resolution: Any = 60) -> None: ...
    def add_metadata(self, key: str, value: Any) -> None: ...
    def flush_metrics(self, raise_on_empty_metrics: bool = False) -> None: ...


# -- the simulator's worker -------------------------------------------------------------------------------


@dataclass
class Sink:
    down: bool = False
    moves: list[tuple[Message, Origin, int]] = field(default_factory=list)
    processed: list[Message] = field(default_factory=list)

    def observe(self, message: Message, role: str, now_s: float) -> None: ...

    def process(self, message: Message, at_s: float) -> tuple[Outcome, float]:
        if self.down:
            return "down", 0.0
        if message.poison:
            return "failed", 0.0
        self.processed.append(message)
        return "ok", 0.0

    def send_move(self, message: Message, destination: Origin, delay_s: int, after_s: float = 0.0) -> None:
        self.moves.append((message, destination, delay_s))

    def count(self, tenant: int, counter: str, amount: int = 1) -> None: ...
    def report_oldest(self, role: str, age_ms: int, now_ms: int, shard: int = 0) -> None: ...
    def report_outage(self, until_ms: int) -> None: ...


def sim_fates(items: list[Item], mode: str, *, down: bool = False) -> list[tuple[str, Any]]:
    env = simpy.Environment(initial_time=NOW_MS / 1000)
    queue = SqsQueue(env, "live-0", visibility_timeout_s=360, max_receive_count=5)
    messages = []
    for index, item in enumerate(items):
        message = Message(item.tenant, NOW_MS - item.age_ms - index, None, None, 0.0, item.poison)
        if item.origin is not Origin.LIVE:
            message = message.moved(item.origin, 0)
        if item.expired:
            message.expires_at = NOW_MS - 1
        messages.append(message)
        queue.send(message)
    batch = queue.receive(10)
    for message, item in zip(batch, items, strict=True):
        message.receive_count = item.receive_count
    sink = Sink(down=down)
    setup = WorkerSetup(decision_config(mode), True, (5, 60), 5, 60, Costs(0, 0, 0, 0, 0, 0))
    model = WorkerModel(
        "worker",
        setup,
        sink,
        lambda _t: LIMITS,
        ConsumerBuckets(lambda _t: LIMITS),
        leases_held_by_others(),
        jitter=lambda: 1.0,
    )
    model.handle(batch, queue, 1, NOW_MS / 1000).finish()
    moved = {(copy.tenant, copy.enqueued_at): (role, delay, copy.attempt) for copy, role, delay in sink.moves}
    fates: list[tuple[str, Any]] = []
    for message in messages:
        key = (message.tenant, message.enqueued_at)
        if key in moved:
            fates.append(("moved", moved[key]))
        elif message in sink.processed:
            fates.append(("processed", None))
        elif message.expires_at is not None:
            fates.append(("dropped", None))
        else:
            fates.append(("failed", None))
    return fates


BATCHES = {
    "fresh, several tenants": [Item(0), Item(1), Item(0), Item(1)],
    "old ones are sidelined, an old retry is not": [Item(0, age_ms=400_000), Item(1), Item(0, 400_000, 2)],
    "expired ones are dropped": [Item(0, expired=True), Item(1)],
    "over the consumer rate they spill": [Item(1) for _ in range(6)],
    "over the concurrency they are deferred": [Item(2), Item(2), Item(0)],
    "poison fails": [Item(0, poison=True), Item(1)],
    "a mix": [
        Item(0),
        Item(2),
        Item(1, 500_000),
        Item(1, expired=True),
        Item(1),
        Item(1),
        Item(1),
        Item(0, 1, 3),
    ],
}


@pytest.mark.parametrize("name", list(BATCHES))
@pytest.mark.parametrize("mode", ["live", "sideline"])
def test_the_model_sends_every_message_where_the_worker_does(name: str, mode: str) -> None:
    items = BATCHES[name]
    if mode == "sideline":
        items = [
            Item(i.tenant, i.age_ms, i.receive_count, i.expired, i.poison, Origin.SPILLOVER) for i in items
        ]
    assert sim_fates(items, mode) == real_fates(items, mode)


@pytest.mark.parametrize("mode", ["live", "sideline"])
def test_in_an_outage_the_model_holds_what_the_worker_holds(mode: str) -> None:
    origin = Origin.BACKLOG if mode == "sideline" else Origin.LIVE
    items = [Item(0, origin=origin), Item(1, origin=origin), Item(0, origin=origin)]
    assert sim_fates(items, mode, down=True) == real_fates(items, mode, down=True)


def test_the_comparison_sees_every_kind_of_fate() -> None:
    seen = {fate for items in BATCHES.values() for fate, _ in real_fates(items, "live")}
    moved_to = {
        detail[0]
        for items in BATCHES.values()
        for fate, detail in real_fates(items, "live")
        if fate == "moved"
    }
    assert seen == {"processed", "dropped", "failed", "moved"}
    assert moved_to == {Origin.BACKLOG, Origin.SPILLOVER, Origin.SURGE}

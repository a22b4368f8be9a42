"""The worker's policy against fake ports: what it processes, moves, acknowledges and reports.

Every port is a plain object that records what the worker asked of it; the AWS side of each port
is tested against moto in tests/integration/test_worker*.py.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, cast

import pytest
from aws_lambda_powertools.utilities.typing import LambdaContext

from breakwater.concurrency import ConcurrencyLimits, Grant, LeaseTerms
from breakwater.envelope import REDRIVEN_ATTRIBUTE, REDRIVEN_COPY_ATTRIBUTE, Envelope, Origin, new_envelope_id
from breakwater.fairness import BucketLimits
from breakwater.processor import DependencyUnavailableError, WorkContext
from breakwater.settings import TierLimits
from breakwater.sideline import DecisionConfig, Move
from breakwater.worker import Worker, WorkerOptions, WorkerPorts

NOW = 1_700_000_000_000
SOURCE_ARN = "arn:aws:sqs:us-east-1:123456789012:bw-live-0"
SOURCE_URL = "https://sqs.us-east-1.amazonaws.com/123456789012/bw-live-0"
QUEUE_URLS = {
    Origin.SPILLOVER: "https://sqs/spillover",
    Origin.BACKLOG: "https://sqs/backlog",
    Origin.SURGE: "https://sqs/surge",
}
LIMITS = TierLimits(rate=50, burst=100, consumer_rate=1000, concurrency=4, concurrency_floor=1)
MAX_RECEIVE_COUNT = 3  # the queues' redrive policy


@dataclass
class FakeContext:
    remaining_ms: int = 60_000
    function_name: str = "breakwater-worker"
    memory_limit_in_mb: int = 1024
    invoked_function_arn: str = "arn:aws:lambda:us-east-1:123456789012:function:breakwater-worker"
    aws_request_id: str = "request-1"

    def get_remaining_time_in_millis(self) -> int:
        return self.remaining_ms


@dataclass
class FakeRate:
    """The consumer bucket: ``tokens`` per tenant (unlimited for a tenant not named)."""

    tokens: dict[str, int] = field(default_factory=dict)
    asked: list[tuple[str, int]] = field(default_factory=list)

    def try_acquire_up_to(self, tenant: str, limits: BucketLimits, count: int) -> tuple[int, float]:
        self.asked.append((tenant, count))
        granted = min(count, self.tokens.get(tenant, count))
        return granted, 0.0


@dataclass
class FakeLeases:
    """Concurrency leases: the tenants in ``full`` are refused, every other gets a floor lease."""

    full: set[str] = field(default_factory=set)
    asked: list[dict[str, ConcurrencyLimits]] = field(default_factory=list)
    carried: dict[str, Mapping[str, int]] = field(default_factory=dict)
    floors: set[str] = field(default_factory=set)  # the tenants given a floor lease since the carry
    rode: list[dict[str, dict[str, int]]] = field(default_factory=list)  # counters floor writes took

    def acquire_many(
        self,
        requests: Mapping[str, ConcurrencyLimits],
        expires_at_ms: int,
        floor_until: Mapping[str, int] | None = None,
    ) -> dict[str, Grant]:
        self.asked.append(dict(requests))
        grants = {tenant: Grant.REFUSED if tenant in self.full else Grant.FLOOR for tenant in requests}
        self.floors |= {tenant for tenant, grant in grants.items() if grant is Grant.FLOOR}
        return grants

    def renew(self, tenant: str, limits: ConcurrencyLimits, until_ms: int) -> bool:
        return True

    def carry(self, counters: Mapping[str, Mapping[str, int]]) -> None:
        self.carried = dict(counters)
        self.floors = set()

    def contended(self, tenant: str) -> bool:
        return tenant in self.full

    def carried_landed(self) -> set[str]:
        """The counters carried for the tenants given a floor lease land, as a floor write takes them."""
        landed = {tenant: dict(deltas) for tenant, deltas in self.carried.items() if tenant in self.floors}
        if landed:
            self.rode.append(landed)
        self.carried = {}
        return set(landed)


@dataclass
class FakeIdempotency:
    """The idempotent processor's contract: a completed envelope id is never worked again.

    ``lock`` takes the batch's locks before any message runs; a duplicate (already completed, in
    this batch or an earlier one) is answered from its record without running the work.
    """

    completed: dict[str, dict[str, Any]] = field(default_factory=dict)
    worked: list[str] = field(default_factory=list)
    locked: list[list[str]] = field(default_factory=list)
    flushes: int = 0
    failing: set[str] = field(default_factory=set)  # envelope ids whose work raises
    down: bool = False  # the processor's dependency is down: every call raises DependencyUnavailableError
    unlocked: list[list[str]] = field(default_factory=list)

    def lock(self, envelopes: list[Envelope]) -> None:
        self.locked.append([envelope.id for envelope in envelopes])

    def __call__(self, envelope: Envelope, work: WorkContext) -> dict[str, Any]:
        if envelope.id in self.completed:
            return self.completed[envelope.id]
        self.worked.append(envelope.id)
        if self.down:
            raise DependencyUnavailableError("downstream refused the connection")
        if envelope.id in self.failing:
            raise RuntimeError("boom")
        result = {"id": envelope.id}
        self.completed[envelope.id] = result
        return result

    def flush(self) -> None:
        self.flushes += 1

    def unlock(self, envelopes: list[Envelope]) -> None:
        self.unlocked.append([envelope.id for envelope in envelopes])


@dataclass
class FakeMetrics:
    """Powertools' Metrics as the batch uses it: one blob per flush, the last one left open."""

    blobs: list[dict[str, Any]] = field(default_factory=list)
    open: dict[str, Any] = field(default_factory=lambda: {"dimensions": {}, "metrics": {}, "metadata": {}})

    def add_dimension(self, name: str, value: str) -> None:
        self.open["dimensions"][name] = value

    def add_metric(self, name: str, unit: Any, value: float, resolution: Any = 60) -> None:
        self.open["metrics"].setdefault(name, []).append(value)

    def add_metadata(self, key: str, value: Any) -> None:
        self.open["metadata"][key] = value

    def flush_metrics(self, raise_on_empty_metrics: bool = False) -> None:
        self.blobs.append(self.open)
        self.open = {"dimensions": {}, "metrics": {}, "metadata": {}}

    def all_blobs(self) -> list[dict[str, Any]]:
        return [*self.blobs, self.open] if self.open["metrics"] else list(self.blobs)

    def values(self, name: str, **dimensions: str) -> list[float]:
        return [
            value
            for blob in self.all_blobs()
            if blob["dimensions"] == dimensions
            for value in blob["metrics"].get(name, [])
        ]


class Unestimated(LeaseTerms):
    """A container that cannot tell how long its messages take: its floor leases are given back, as
    every test here expects (tests/unit/test_worker_lapse.py: leases that lapse)."""

    def ends_ms(
        self, now_ms: int, order: object, skip: object = (), before_ms: object = None
    ) -> dict[str, int]:
        return {}


@dataclass
class World:
    """A worker over fake ports, and what each port was asked."""

    rate: FakeRate = field(default_factory=FakeRate)
    leases: FakeLeases = field(default_factory=FakeLeases)
    idempotency: FakeIdempotency = field(default_factory=FakeIdempotency)
    metrics: FakeMetrics = field(default_factory=FakeMetrics)
    swept: dict[str, int] = field(default_factory=dict)
    failing_moves: set[str] = field(default_factory=set)  # message ids whose move fails
    moves: list[Move] = field(default_factory=list)
    settled: list[tuple[dict[str, Grant], dict[str, dict[str, int]]]] = field(default_factory=list)
    # what the next settles do instead of writing everything: raise, or leave these tenants unwritten
    settle_faults: list[Exception | set[str]] = field(default_factory=list)
    ages: list[tuple[str, int, int]] = field(default_factory=list)
    visibility: list[tuple[str, str, int]] = field(default_factory=list)
    monotonic_s: float = 1_000.0  # the breaker's clock
    outages_reported: list[int] = field(default_factory=list)  # down-until epoch ms per report
    jitter_draws: list[float] = field(default_factory=list)  # the deferrals' draws (none left: 1.0)

    def worker(
        self,
        mode: str = "live",
        *,
        sidelining_enabled: bool = True,
        max_receive_count: int | None = MAX_RECEIVE_COUNT,
        outage_backoff_s: float | None = None,
        lapsing: bool = False,
    ) -> Worker:
        config = WorkerOptions(
            decision=DecisionConfig(
                mode="sideline" if mode == "sideline" else "live",
                sidelining_enabled=sidelining_enabled,
                sideline_age_ms=300_000,
            ),
            queue_urls=QUEUE_URLS,
            visibility_timeout_s=60,
            heartbeat_s=30,
            max_receive_count=max_receive_count,
            outage_backoff_s=outage_backoff_s,
            outage_backoff_max_s=8 * outage_backoff_s if outage_backoff_s else None,
        )

        def send_moves(moves: list[Move]) -> set[str]:
            self.moves.extend(move for move in moves if move.key not in self.failing_moves)
            return {move.key for move in moves if move.key in self.failing_moves}

        ports = WorkerPorts(
            tenant_limits=lambda tenant: LIMITS,
            swept_at_ms=self.swept.get,
            send_moves=send_moves,
            settle=self.settle,
            record_oldest_age=lambda role, age, now: self.ages.append((role, age, now)),
            extend_visibility=lambda url, handle, seconds: self.visibility.append((url, handle, seconds)),
            process=self.idempotency,
            rate=self.rate,
            leases=self.leases,
            lock=self.idempotency.lock,
            flush_processed=self.idempotency.flush,
            unlock=self.idempotency.unlock,
            report_outage=self.outages_reported.append,
            clock_ms=lambda: NOW,
            monotonic=lambda: self.monotonic_s,
        )
        worker = Worker(
            config,
            ports,
            metrics=self.metrics,
            jitter=lambda: self.jitter_draws.pop(0) if self.jitter_draws else 1.0,
        )
        if not lapsing:
            worker.terms = Unestimated()
        return worker

    def settle(
        self, grants: Mapping[str, Grant], counters: Mapping[str, Mapping[str, int]]
    ) -> dict[str, dict[str, int]]:
        """Records what was written; returns the counters left unwritten (a raise writes nothing)."""
        fault = self.settle_faults.pop(0) if self.settle_faults else set()
        if isinstance(fault, Exception):
            raise fault
        written = {tenant: dict(deltas) for tenant, deltas in counters.items() if tenant not in fault}
        self.settled.append((dict(grants), written))
        return {tenant: dict(counters[tenant]) for tenant in fault if tenant in counters}

    def counters(self) -> dict[str, dict[str, int]]:
        """The per-tenant counters the batches settled, added up."""
        total: dict[str, dict[str, int]] = {}
        for _, counters in [*self.settled, *((None, rode) for rode in self.leases.rode)]:
            for tenant, deltas in counters.items():
                for name, value in deltas.items():
                    total.setdefault(tenant, {}).setdefault(name, 0)
                    total[tenant][name] += value
        return total


def envelope(tenant: str = "acme", *, age_ms: int = 0, **fields: Any) -> Envelope:
    values: dict[str, Any] = {
        "id": new_envelope_id(NOW - age_ms),
        "tenant": tenant,
        "type": "test",
        "enqueued_at": NOW - age_ms,
        **fields,
    }
    return Envelope.model_validate(values)


def event(*envelopes: Envelope, receive_count: int = 1) -> dict[str, Any]:
    """The SQS event of ``envelopes``; the message id of the n-th is ``m<n>``."""
    return {
        "Records": [
            {
                "messageId": f"m{index}",
                "receiptHandle": f"handle-{index}",
                "body": each.to_json(),
                "attributes": {
                    "ApproximateReceiveCount": str(receive_count),
                    "SentTimestamp": str(NOW),
                    "SenderId": "AIDA",
                    "ApproximateFirstReceiveTimestamp": str(NOW),
                },
                "messageAttributes": {},
                "md5OfBody": "",
                "eventSource": "aws:sqs",
                "eventSourceARN": SOURCE_ARN,
                "awsRegion": "us-east-1",
            }
            for index, each in enumerate(envelopes)
        ]
    }


def redriven(batch: dict[str, Any], *indexes: int) -> dict[str, Any]:
    """``batch`` with the redrive's mark (as Lambda delivers attributes) on the records at ``indexes``,
    or on every record."""
    for index in indexes or range(len(batch["Records"])):
        batch["Records"][index]["messageAttributes"][REDRIVEN_ATTRIBUTE] = {
            "stringValue": str(NOW - 1_000),
            "stringListValues": [],
            "binaryListValues": [],
            "dataType": "Number",
        }
    return batch


def context(remaining_ms: int = 60_000) -> LambdaContext:
    return cast(LambdaContext, FakeContext(remaining_ms=remaining_ms))


def failed_ids(response: dict[str, Any]) -> set[str]:
    return {item["itemIdentifier"] for item in response["batchItemFailures"]}


@pytest.fixture
def world() -> World:
    return World()


def test_a_fresh_message_is_processed_and_acknowledged(world: World) -> None:
    fresh = envelope(age_ms=1_000)

    response = world.worker().handle(event(fresh), context())

    assert response == {"batchItemFailures": []}
    assert world.idempotency.worked == [fresh.id]
    assert world.idempotency.locked == [[fresh.id]]  # locked before it ran
    assert world.idempotency.flushes == 1
    assert world.moves == []
    assert world.counters() == {"acme": {"processed": 1}}
    assert world.leases.asked == [{"acme": ConcurrencyLimits(floor=1, ceiling=4)}]
    # the lease the batch took is given back with its counters
    assert world.settled[0][0] == {"acme": Grant.FLOOR}
    assert world.ages == [("live", 1_000, NOW)]
    assert world.metrics.values("AgeOfFirstAttempt", QueueRole="live") == [1_000]
    assert world.metrics.values("Processed", QueueRole="live") == [1]


def test_an_old_message_is_sidelined_to_the_backlog_not_processed(world: World) -> None:
    old = envelope(age_ms=301_000)

    response = world.worker().handle(event(old), context())

    assert response == {"batchItemFailures": []}  # acknowledged: its copy is in the backlog
    assert world.idempotency.worked == []
    assert [(move.key, move.queue_url) for move in world.moves] == [("m0", QUEUE_URLS[Origin.BACKLOG])]
    moved = Envelope.from_json(world.moves[0].body)
    assert (moved.id, moved.origin, moved.enqueued_at) == (old.id, Origin.BACKLOG, old.enqueued_at)
    assert world.counters() == {"acme": {"sidelined": 1}}
    assert world.metrics.values("Sidelined", QueueRole="live") == [1]
    assert world.leases.asked == []  # the gates are paid only for admitted messages


def test_a_move_that_fails_leaves_its_original_unacknowledged(world: World) -> None:
    world.failing_moves = {"m0"}

    response = world.worker().handle(event(envelope(age_ms=301_000), envelope()), context())

    assert failed_ids(response) == {"m0"}
    assert world.counters() == {"acme": {"failed": 1, "processed": 1}}


def test_a_failing_record_is_a_batch_item_failure_while_the_others_succeed(world: World) -> None:
    good, bad, also_good = envelope(), envelope(), envelope()
    world.idempotency.failing = {bad.id}

    response = world.worker().handle(event(good, bad, also_good), context())

    assert failed_ids(response) == {"m1"}
    assert world.idempotency.worked == [good.id, bad.id, also_good.id]
    assert world.counters() == {"acme": {"processed": 2, "failed": 1}}
    assert world.metrics.values("Failed", QueueRole="live") == [1]


def test_a_record_that_is_not_an_envelope_fails_alone(world: World) -> None:
    batch = event(envelope(), envelope())
    batch["Records"][0]["body"] = json.dumps({"not": "an envelope"})

    response = world.worker().handle(batch, context())

    assert failed_ids(response) == {"m0"}
    assert world.counters() == {"acme": {"processed": 1}}


def test_deferred_messages_each_wait_their_own_share_of_the_backoff(world: World) -> None:
    world.leases.full = {"busy"}
    first, second = envelope("busy", attempt=3), envelope("busy", attempt=3)
    world.jitter_draws = [0.0, 0.5]  # one draw per decision the gate refused

    world.worker().handle(event(first, second), context())

    # the default backoff at attempt 3 is 16 s: one waits the base, the other half of it
    assert [move.delay_seconds for move in world.moves] == [2, 8]


def test_a_duplicate_is_not_processed_twice(world: World) -> None:
    once = envelope()

    first = world.worker().handle(event(once, once), context())  # two copies in one batch
    again = world.worker().handle(event(once, receive_count=2), context())  # and a later one

    assert first == again == {"batchItemFailures": []}  # every copy acknowledged
    assert world.idempotency.worked == [once.id]


def test_a_tenant_over_its_concurrency_is_deferred_to_surge(world: World) -> None:
    world.leases.full = {"busy"}
    busy, free = envelope("busy"), envelope("free")

    response = world.worker().handle(event(busy, free), context())

    assert response == {"batchItemFailures": []}
    assert world.idempotency.worked == [free.id]
    (move,) = world.moves
    deferred = Envelope.from_json(move.body)
    assert (move.key, move.queue_url, move.group_id) == ("m0", QUEUE_URLS[Origin.SURGE], "busy")
    assert move.delay_seconds > 0
    assert (deferred.id, deferred.origin, deferred.attempt) == (busy.id, Origin.SURGE, 1)
    assert world.counters() == {"busy": {"deferred": 1}, "free": {"processed": 1}}
    # only the granted lease is given back
    assert world.settled[0][0] == {"free": Grant.FLOOR}


def test_a_tenant_over_its_consumer_rate_spills_its_later_messages(world: World) -> None:
    world.rate.tokens = {"slow": 2}
    slow = [envelope("slow") for _ in range(3)]

    world.worker().handle(event(*slow), context())

    assert world.rate.asked == [("slow", 3)]  # one ask for the tenant's messages of the batch
    assert world.idempotency.worked == [each.id for each in slow[:2]]
    assert [(move.key, move.queue_url) for move in world.moves] == [("m2", QUEUE_URLS[Origin.SPILLOVER])]


def test_an_expired_or_swept_message_is_dropped(world: World) -> None:
    world.swept = {"swept": NOW - 10}
    expired = envelope(expires_at=NOW - 1)
    swept = envelope("swept", age_ms=60)

    response = world.worker().handle(event(expired, swept), context())

    assert response == {"batchItemFailures": []}
    assert world.idempotency.worked == [] and world.moves == []
    assert world.counters() == {"acme": {"dropped": 1}, "swept": {"dropped": 1}}


def test_a_message_is_not_started_without_time_left(world: World) -> None:
    response = world.worker().handle(event(envelope()), context(remaining_ms=1_000))

    assert failed_ids(response) == {"m0"}  # redelivered later, not started now
    assert world.idempotency.worked == []


def test_sideline_mode_defers_back_into_its_own_queue(world: World) -> None:
    world.leases.full = {"busy"}
    old = envelope("busy", age_ms=3_600_000, origin=Origin.SPILLOVER)

    world.worker("sideline").handle(event(old), context())

    (move,) = world.moves
    assert move.queue_url == QUEUE_URLS[Origin.SPILLOVER]
    assert world.ages == [("spillover", 3_600_000, NOW)]


def test_without_sidelining_every_unexpired_message_is_processed(world: World) -> None:
    world.leases.full = {"acme"}
    world.rate.tokens = {"acme": 0}
    old = envelope(age_ms=10**7)

    world.worker(sidelining_enabled=False).handle(event(old), context())

    assert world.idempotency.worked == [old.id]
    assert world.rate.asked == [] and world.leases.asked == []


def test_one_emf_blob_per_queue_role(world: World) -> None:
    live, surge = envelope(age_ms=100), envelope(age_ms=200, origin=Origin.SURGE)

    world.worker().handle(event(live, surge), context())

    assert [blob["dimensions"] for blob in world.metrics.all_blobs()] == [
        {"QueueRole": "live"},
        {"QueueRole": "surge"},
    ]
    assert world.metrics.values("AgeOfFirstAttempt", QueueRole="surge") == [200]
    assert world.metrics.all_blobs()[0]["metadata"] == {"AgeOfFirstAttemptByTenant": {"acme": [100]}}


def test_a_redelivery_is_measured_as_a_later_attempt(world: World) -> None:
    world.worker().handle(event(envelope(age_ms=500), receive_count=2), context())

    assert world.metrics.values("AgeOfFirstAttempt", QueueRole="live") == []
    assert world.metrics.values("AgeOfAttempt", QueueRole="live") == [500]


# -- replayed work is measured apart from the live signals ----------------------------------------------
DAY_MS = 86_400_000


def replayed(tenant: str = "acme", *, age_ms: int = 3 * DAY_MS, **fields: Any) -> Envelope:
    """An envelope the replay brought back from the archive: its age runs from its first enqueue."""
    return envelope(tenant, age_ms=age_ms, **{"origin": Origin.REPLAY, "replay_run": "run-1", **fields})


def test_a_replayed_message_leaves_the_live_age_metric_and_health_report_untouched(world: World) -> None:
    response = world.worker().handle(event(replayed()), context())

    assert response == {"batchItemFailures": []}
    assert len(world.idempotency.worked) == 1  # processed as any other
    assert world.ages == []  # no health report: the live set is not judged by the replay's ages
    assert world.metrics.values("AgeOfFirstAttempt", QueueRole="live") == []
    assert world.metrics.values("Processed", QueueRole="live") == []
    assert world.metrics.values("AgeOfFirstAttempt", QueueRole="replay") == [3 * DAY_MS]
    assert world.metrics.values("Processed", QueueRole="replay") == [1]
    assert world.counters() == {"acme": {"processed": 1, "replayed": 1}}


def test_a_live_message_beside_a_replayed_one_moves_the_live_signals_by_its_own_age(world: World) -> None:
    world.worker().handle(event(replayed(), envelope(age_ms=1_500)), context())

    assert world.ages == [("live", 1_500, NOW)]
    assert world.metrics.values("AgeOfFirstAttempt", QueueRole="live") == [1_500]
    assert world.metrics.values("AgeOfFirstAttempt", QueueRole="replay") == [3 * DAY_MS]
    blobs = {blob["dimensions"]["QueueRole"]: blob for blob in world.metrics.all_blobs()}
    assert blobs["live"]["metadata"] == {"AgeOfFirstAttemptByTenant": {"acme": [1_500]}}
    assert blobs["replay"]["metadata"] == {"AgeOfFirstAttemptByTenant": {"acme": [3 * DAY_MS]}}


def test_replayed_work_deferred_to_surge_stays_replayed_work(world: World) -> None:
    world.leases.full = {"busy"}

    world.worker().handle(event(replayed("busy")), context())
    (move,) = world.moves
    again = Envelope.from_json(move.body)
    assert (again.origin, again.replay_run) == (Origin.SURGE, "run-1")
    assert world.metrics.values("Deferred", QueueRole="replay") == [1]
    assert world.metrics.values("Deferred", QueueRole="live") == []

    world.leases.full = set()
    world.worker().handle(event(again), context())  # its delivery from the surge queue

    assert world.idempotency.worked == [again.id]  # processed, not sidelined again for its age
    assert len(world.moves) == 1
    assert world.counters() == {"busy": {"deferred": 1, "processed": 1, "replayed": 1}}
    assert world.ages == []  # neither a live nor a surge health report
    assert world.metrics.values("AgeOfFirstAttempt", QueueRole="surge") == []
    assert world.metrics.values("AgeOfFirstAttempt", QueueRole="replay") == [3 * DAY_MS, 3 * DAY_MS]


# -- a message that fails on its last receive leaves for the dead-letter queue ----------------------------
def test_a_message_that_fails_on_its_last_receive_is_counted_dead_lettered(world: World) -> None:
    bad = envelope()
    world.idempotency.failing = {bad.id}

    before = world.worker().handle(event(bad, receive_count=MAX_RECEIVE_COUNT - 1), context())
    last = world.worker().handle(event(bad, receive_count=MAX_RECEIVE_COUNT), context())

    assert failed_ids(before) == failed_ids(last) == {"m0"}
    # only the last failure takes it out of the backlog estimate: SQS moves it on its next receive
    assert [counters for _, counters in world.settled] == [
        {"acme": {"failed": 1}},
        {"acme": {"failed": 1, "dead_lettered": 1}},
    ]


def test_on_the_last_receive_only_what_stays_unacknowledged_is_dead_lettered(world: World) -> None:
    world.failing_moves = {"m1"}
    world.leases.full = {"busy"}
    bad, unmovable, deferred, fine = envelope(), envelope("busy"), envelope("busy"), envelope()
    world.idempotency.failing = {bad.id}

    response = world.worker().handle(event(bad, unmovable, deferred, fine, receive_count=5), context())

    assert failed_ids(response) == {"m0", "m1"}
    assert world.counters() == {
        "acme": {"failed": 1, "processed": 1, "dead_lettered": 1},
        # the deferred one's copy waits in the surge queue: still in the estimate
        "busy": {"failed": 1, "dead_lettered": 1, "deferred": 1},
    }


def test_a_copy_carries_the_receives_its_original_failed(world: World) -> None:
    world.leases.full = {"busy"}
    again, carried = envelope("busy"), envelope("busy", failed_receives=2)

    world.worker().handle(event(again, receive_count=2), context())
    world.worker().handle(event(carried, receive_count=3), context())

    assert [Envelope.from_json(move.body).failed_receives for move in world.moves] == [1, 4]


def test_a_first_receive_moved_carries_no_failures(world: World) -> None:
    world.leases.full = {"busy"}

    world.worker().handle(event(envelope("busy")), context())

    assert Envelope.from_json(world.moves[0].body).failed_receives is None
    assert '"failed_receives":null' in world.moves[0].body


def test_a_message_moved_between_failures_is_dead_lettered_by_the_worker_on_its_last_receive(
    world: World,
) -> None:
    """SQS counts one queue's receives: a message moved after failing starts again at one there."""
    bad = envelope(failed_receives=MAX_RECEIVE_COUNT - 1)
    world.idempotency.failing = {bad.id}

    response = world.worker().handle(event(bad), context())

    assert failed_ids(response) == set()  # acknowledged: its copy is in the dead-letter queue
    assert [(move.key, move.queue_url) for move in world.moves] == [("m0", SOURCE_URL + "-dlq")]
    copy = Envelope.from_json(world.moves[0].body)
    # redriven after a fix, it gets every receive again
    assert (copy.id, copy.origin, copy.failed_receives) == (bad.id, bad.origin, None)
    assert world.counters() == {"acme": {"failed": 1, "dead_lettered": 1}}


def test_a_message_with_receives_left_across_queues_goes_back_to_its_queue(world: World) -> None:
    bad = envelope(failed_receives=MAX_RECEIVE_COUNT - 2)
    world.idempotency.failing = {bad.id}

    response = world.worker().handle(event(bad), context())

    assert failed_ids(response) == {"m0"} and world.moves == []
    assert world.counters() == {"acme": {"failed": 1}}


def test_a_dead_letter_copy_that_cannot_be_sent_leaves_its_original_unacknowledged(world: World) -> None:
    world.failing_moves = {"m0"}
    bad = envelope(failed_receives=MAX_RECEIVE_COUNT)
    world.idempotency.failing = {bad.id}

    response = world.worker().handle(event(bad), context())

    assert failed_ids(response) == {"m0"}
    assert world.counters() == {"acme": {"failed": 1}}  # still in the estimate: it stays on its queue


def test_a_message_without_time_left_on_its_last_receive_is_dead_lettered(world: World) -> None:
    response = world.worker().handle(
        event(envelope(), receive_count=MAX_RECEIVE_COUNT), context(remaining_ms=1_000)
    )

    assert failed_ids(response) == {"m0"}
    assert world.counters() == {"acme": {"failed": 1, "dead_lettered": 1}}


def test_when_the_invocation_fails_every_unsettled_message_on_its_last_receive_is_dead_lettered(
    world: World,
) -> None:
    def unavailable(_envelopes: list[Envelope]) -> None:
        raise ConnectionError("idempotency table unavailable")

    world.idempotency.lock = unavailable  # type: ignore[method-assign]
    batch = event(envelope(), envelope(expires_at=NOW - 1), envelope(), receive_count=MAX_RECEIVE_COUNT)
    batch["Records"][2]["attributes"]["ApproximateReceiveCount"] = "1"

    with pytest.raises(ConnectionError):
        world.worker().handle(batch, context())

    # the whole batch goes back: the dropped one left already, the first one leaves for the DLQ
    assert world.counters() == {"acme": {"dropped": 1, "dead_lettered": 1}}


def test_a_lease_gate_that_fails_defers_its_messages_instead_of_failing_the_batch(world: World) -> None:
    class Unavailable(FakeLeases):
        def acquire_many(
            self,
            requests: Mapping[str, ConcurrencyLimits],
            expires_at_ms: int,
            floor_until: Mapping[str, int] | None = None,
        ) -> dict[str, Grant]:
            raise ConnectionError("state table unavailable")

    world.leases = Unavailable()

    response = world.worker().handle(event(envelope(), envelope("globex")), context())

    assert response == {"batchItemFailures": []}
    assert world.idempotency.worked == []
    assert world.counters() == {"acme": {"deferred": 1}, "globex": {"deferred": 1}}


def test_a_tenant_whose_limits_cannot_be_read_is_set_aside_and_the_others_processed(world: World) -> None:
    worker = world.worker()
    known = worker.ports.tenant_limits

    def limits(tenant: str) -> Any:
        if tenant == "globex":
            raise ConnectionError("tenants table throttled")
        return known(tenant)

    worker.ports.tenant_limits = limits
    ok, throttled = envelope(), envelope("globex")

    response = worker.handle(event(ok, throttled), context())

    assert response == {"batchItemFailures": []}
    assert world.idempotency.worked == [ok.id]
    # set aside as when it is over its consumer rate: to the spillover queue
    assert world.counters() == {"acme": {"processed": 1}, "globex": {"spilled": 1}}


def test_a_consumer_rate_that_fails_for_one_tenant_sets_aside_only_that_tenant(world: World) -> None:
    class Throttled(FakeRate):
        def try_acquire_up_to(self, tenant: str, limits: BucketLimits, count: int) -> tuple[int, float]:
            if tenant == "globex":
                raise ConnectionError("its bucket item is throttled")
            return super().try_acquire_up_to(tenant, limits, count)

    world.rate = Throttled()
    ok, throttled = envelope(), envelope("globex")

    response = world.worker().handle(event(ok, throttled), context())

    assert response == {"batchItemFailures": []}
    assert world.idempotency.worked == [ok.id]
    assert world.counters() == {"acme": {"processed": 1}, "globex": {"spilled": 1}}


def test_without_the_queues_max_receive_count_nothing_is_counted_dead_lettered(world: World) -> None:
    bad = envelope()
    world.idempotency.failing = {bad.id}

    world.worker(max_receive_count=None).handle(event(bad, receive_count=100), context())

    assert world.counters() == {"acme": {"failed": 1}}


# -- counters a failed write left behind go out with the next batch ----------------------------------------
def test_counters_whose_write_failed_go_out_with_the_next_batch(world: World) -> None:
    world.settle_faults = [ConnectionError("throttled")]
    worker = world.worker()  # one container

    worker.handle(event(envelope(), envelope(expires_at=NOW - 1)), context())
    assert world.settled == []  # nothing written
    worker.handle(event(envelope()), context())

    # the kept ones ride on the tenant's floor lease write, the batch's own go with its release
    assert world.leases.rode == [{"acme": {"processed": 1, "dropped": 1}}]
    assert [counters for _, counters in world.settled] == [{"acme": {"processed": 1}}]
    assert world.counters() == {"acme": {"processed": 2, "dropped": 1}}


def test_only_the_tenants_whose_counters_were_not_written_are_kept(world: World) -> None:
    world.settle_faults = [set(), {"globex"}]  # each tenant's release is its own write
    worker = world.worker()

    worker.handle(event(envelope("acme"), envelope("globex")), context())
    worker.handle(event(envelope("acme")), context())
    worker.handle(event(envelope("acme")), context())  # nothing left to add

    assert [counters for _, counters in world.settled] == [
        {"acme": {"processed": 1}},
        {},  # globex's write failed: kept, not tried again in the same batch
        {"acme": {"processed": 1}},
        {"globex": {"processed": 1}},
        {"acme": {"processed": 1}},
    ]
    assert world.counters() == {"acme": {"processed": 3}, "globex": {"processed": 1}}


def test_kept_counters_belong_to_the_container_that_kept_them(world: World) -> None:
    world.settle_faults = [ConnectionError("throttled")]
    world.worker().handle(event(envelope()), context())

    world.worker().handle(event(envelope("globex")), context())  # another container

    assert [counters for _, counters in world.settled] == [{"globex": {"processed": 1}}]


# -- redriven work is measured apart and counted back into the estimate ----------------------------------
def test_redriven_work_is_measured_apart_and_counted_back_on_its_first_receive(world: World) -> None:
    back = envelope(age_ms=200_000)  # its retries and its time in the dead-letter queue

    response = world.worker().handle(redriven(event(back)), context())

    assert response == {"batchItemFailures": []}
    assert world.idempotency.worked == [back.id]
    # its dead_lettered took it out of the tenant's backlog estimate; redriven gives it back
    assert world.counters() == {"acme": {"redriven": 1, "processed": 1}}
    assert world.ages == []  # its age says nothing of how far behind the live queue is
    assert world.metrics.values("AgeOfFirstAttempt", QueueRole="live") == []
    assert world.metrics.values("AgeOfFirstAttempt", QueueRole="redrive") == [200_000]
    assert world.metrics.values("Processed", QueueRole="redrive") == [1]


def test_old_redriven_work_is_sidelined_like_any_old_work_and_its_copy_stays_marked(world: World) -> None:
    # A redrive can put days of work back into a live queue at once: the backlog keeps it from
    # crowding out fresh messages. Its copy is marked as a copy: measured apart, not counted back twice.
    back = envelope(age_ms=2 * DAY_MS)

    world.worker().handle(redriven(event(back)), context())

    (move,) = world.moves
    assert move.redriven
    assert move.queue_url == QUEUE_URLS[Origin.BACKLOG]
    assert world.counters() == {"acme": {"redriven": 1, "sidelined": 1}}
    assert world.metrics.values("Sidelined", QueueRole="redrive") == [1]


def test_a_copy_of_redriven_work_sent_elsewhere_stays_marked_and_is_not_counted_back_again(
    world: World,
) -> None:
    world.leases.full = {"acme"}  # deferred to the surge queue
    back = envelope(age_ms=1_000)

    world.worker().handle(redriven(event(back)), context())

    (move,) = world.moves
    assert move.redriven  # its copy is marked: never measured as live work
    assert world.counters() == {"acme": {"redriven": 1, "deferred": 1}}

    world.leases.full = set()
    copy = event(Envelope.from_json(move.body))
    copy["Records"][0]["messageAttributes"][REDRIVEN_COPY_ATTRIBUTE] = {
        "stringValue": "1",
        "stringListValues": [],
        "binaryListValues": [],
        "dataType": "String",
    }
    world.worker("live").handle(copy, context())

    assert world.counters() == {"acme": {"redriven": 1, "deferred": 1, "processed": 1}}
    assert world.ages == []  # no queue's oldest age from it
    assert world.metrics.values("AgeOfFirstAttempt", QueueRole="live") == []


def test_redriven_work_is_counted_back_once_however_often_it_is_received(world: World) -> None:
    back = envelope(age_ms=1_000)
    world.idempotency.failing = {back.id}
    worker = world.worker()

    worker.handle(redriven(event(back)), context())
    world.idempotency.failing = set()
    worker.handle(redriven(event(back, receive_count=2)), context())

    assert world.counters() == {"acme": {"redriven": 1, "failed": 1, "processed": 1}}
    assert world.metrics.values("AgeOfAttempt", QueueRole="redrive") == [1_000]


def test_a_live_message_beside_redriven_work_still_reports_its_queue_s_age(world: World) -> None:
    world.worker().handle(redriven(event(envelope(age_ms=DAY_MS), envelope(age_ms=700)), 0), context())

    assert world.ages == [("live", 700, NOW)]
    assert [blob["dimensions"]["QueueRole"] for blob in world.metrics.all_blobs()] == ["live", "redrive"]


def test_an_old_retry_stays_in_its_queue_so_its_receives_still_count_toward_the_dead_letter_queue(
    world: World,
) -> None:
    old = envelope(age_ms=301_000)
    world.idempotency.failing.add(old.id)

    response = world.worker().handle(event(old, receive_count=2), context())

    assert world.moves == []  # not sidelined: a move would start its receive count again
    assert world.idempotency.worked == [old.id] and failed_ids(response) == {"m0"}

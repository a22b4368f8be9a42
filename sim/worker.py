"""The worker's batch in virtual time: the real rules, gates and breaker, with in-memory ports.

Per batch, in the order ``breakwater.worker.batch.Worker`` takes them: every record is observed and
decided (``breakwater.sideline.decide``); the admitted ones pass the consumer rate gate
(``breakwater.fairness.take_lease`` on the tenant's consumer bucket, one ask per tenant) and the
concurrency leases of all their tenants (``breakwater.concurrency.grant_for`` with the burst pool,
one acquisition per batch); a refused gate decides again with the gate's answer. The admitted
messages are then processed one after the other under the container's circuit breaker
(``breakwater.breaker.CircuitBreaker``); an outage holds the rest (``breakwater.sideline.hold_for_outage``).
When the invocation returns, moves are sent, the rest deleted or left to their visibility timeout,
leases released, and the per-tenant counters the controller reads are added.

The gates and the invocation's end count the AWS calls the real worker makes for them
(:class:`sim.billing.Meter`): a write per consumer-bucket ask and per tenant's lease (a burst lease
with the pool in a transaction, after one read of the items), one write per tenant for the release
and the counters, a DeleteMessageBatch per ten settled or moved records, a SendMessageBatch per ten
moves to a queue.

What is not the real code is the batch's bookkeeping (Powertools' ``BatchProcessor``, a pydantic
model per record, logging): it costs far more per message than the rules and is not what decides
where a message goes; ``tests/sim/test_worker_model.py`` runs the same batches through the real
``Worker.handle`` and through this model and compares where every message went.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Protocol

from breakwater.age_reports import LastReport, report_due
from breakwater.backlog import will_dead_letter
from breakwater.breaker import CircuitBreaker
from breakwater.concurrency import ConcurrencyLimits, Grant, Lease, grant_for, live_leases
from breakwater.envelope import Origin
from breakwater.fairness import BucketLimits, BucketState, take_lease
from breakwater.settings import TierLimits
from breakwater.sideline import (
    Decision,
    DecisionConfig,
    SidelineDecision,
    TenantState,
    decide,
    hold_for_outage,
)
from breakwater.worker.batch import concurrency_limits, consumer_bucket_limits
from sim.billing import RECEIVE_MAX, Meter
from sim.dynamodb import BURST_POOL, CONSUMER_BUCKET, COUNTERS, QUEUE_HEALTH, StateTable
from sim.lambda_esm import Invocation
from sim.messages import Message
from sim.sqs import SqsQueue

Outcome = Literal["ok", "failed", "down"]

# the role a record reports its age under, by origin (an enum's ``value`` is a property: looked up once)
_ROLE = {origin: origin.value if origin is not Origin.REPLAY else "live" for origin in Origin}
# enum members as module names: looking one up on its class costs more than the test it is used in
_BURST, _REFUSED = Grant.BURST, Grant.REFUSED
_DROP, _DEFER = SidelineDecision.DROP, SidelineDecision.DEFER
_FRESH = TenantState()
_OVER_RATE = TenantState(within_consumer_rate=False)
_NO_SLOT = TenantState(holds_concurrency_slot=False)
_NO_LEASES: dict[str, Lease] = {}  # a tenant nobody leased yet (read, never written)

COUNTER = {
    SidelineDecision.PROCESS: "processed",
    SidelineDecision.DROP: "dropped",
    SidelineDecision.SIDELINE: "sidelined",
    SidelineDecision.SPILL: "spilled",
    SidelineDecision.DEFER: "deferred",
}


@dataclass(frozen=True)
class Costs:
    """Virtual time an invocation spends besides the processor: AWS calls and the handler's own work."""

    enqueue_ms: float = 10.0  # from ingest stamping enqueued_at to the message stored in SQS (SendMessage)
    invoke_ms: float = 20.0  # from the poll to the first record (invoke, cold paths, parsing)
    per_record_ms: float = 0.5  # reading and deciding one record
    gate_ms: float = 10.0  # the consumer bucket and the concurrency leases (DynamoDB), once per batch
    move_ms: float = 15.0  # one SendMessageBatch (10 moves)
    settle_ms: float = 10.0  # counters, lease release, idempotency records, once per batch


@dataclass(frozen=True)
class WorkerSetup:
    """What a worker mapping needs: the rules' configuration and the gates to ask (Breakwater only)."""

    decision: DecisionConfig
    gates: bool
    breaker: tuple[float, float] | None  # (first open window, longest), seconds
    max_receive_count: int | None
    timeout_s: float
    costs: Costs


class Sink(Protocol):
    """What the worker reports to the rest of the simulated system."""

    def observe(self, message: Message, role: str, now_s: float) -> None: ...
    def process(self, message: Message, at_s: float) -> tuple[Outcome, float]: ...
    def send_move(self, message: Message, destination: Origin, delay_s: int) -> None: ...
    def count(self, tenant: int, counter: str, amount: int = 1) -> None: ...
    def report_oldest(self, role: str, age_ms: int, now_ms: int) -> None: ...
    def report_outage(self, until_ms: int) -> None: ...


class GateThrottledError(Exception):
    """A gate's DynamoDB call stayed throttled through botocore's retries: the error escapes the batch."""

    def __init__(self, waited_s: float) -> None:
        super().__init__("ProvisionedThroughputExceededException")
        self.waited_s = waited_s


class ConsumerBuckets:
    """The consumer-side token bucket per tenant (``RateGate``): one shared bucket, asked once per batch.

    With a ``table``, each ask is a write of the tenant's ``bucket#consumer`` item; one still throttled
    after botocore's retries is answered from the container's own view, as ``LeasedTokenBucket``
    fails open (here: the shared state's decision, not written back).
    """

    def __init__(self, limits: Callable[[int], TierLimits], table: StateTable | None = None) -> None:
        self._limits = limits
        self._state: dict[int, BucketState] = {}
        self._bucket_limits: dict[int, BucketLimits] = {}
        self.table = table
        self.writes = 0  # one conditional UpdateItem of the bucket's item per ask
        self.waited_s = 0.0  # botocore's waits on throttled asks, since the caller last took them
        self.failed_open = 0  # asks answered from the local view after the retries

    def try_acquire_up_to(self, tenant: int, count: int, now_s: float) -> int:
        self.writes += 1
        limits = self._bucket_limits.get(tenant)
        if limits is None:
            limits = self._bucket_limits[tenant] = consumer_bucket_limits(self._limits(tenant))
        state = self._state.get(tenant) or BucketState.full(limits, now_s)
        decision = take_lease(state, limits, now_s, count)
        table = self.table
        if table is not None:
            item, units = table.consumer_items[tenant], table.bucket_wcu
            if not table.write(item, CONSUMER_BUCKET, now_s, units):
                written, waited = table.retried_write(item, CONSUMER_BUCKET, now_s, units)
                self.waited_s += waited
                if not written:
                    self.failed_open += 1
                    return decision.granted
        self._state[tenant] = decision.state
        return decision.granted


class LeaseTable:
    """Per-tenant concurrency leases and the burst pool (``LeaseGate``), as the DynamoDB items hold them."""

    def __init__(self, burst_capacity: int | None, table: StateTable | None = None) -> None:
        self.burst_capacity = burst_capacity
        self.table = table
        self.waited_s = 0.0  # botocore's waits on throttled writes, since the caller last took them
        self.conflicts = 0  # burst transactions cancelled by a throttle, acquired again on their own
        self.unreleased = 0  # releases whose write was throttled: the leases expire on their own
        self._tenants: dict[int, dict[str, Lease]] = {}
        # the pool's leases by (tenant, holder), as the real pool item keys them "tenant#holder": a tuple
        # costs less than formatting that name for every burst lease taken and every release
        self._pool: dict[tuple[int, str], Lease] = {}
        # the pool's places by expiry, to drop expired ones in place (a copy of a pool of thousands of
        # places for every burst lease would cost more than the rest of the batch); stale entries (a
        # place renewed or given back since) are skipped
        self._expiries: list[tuple[int, tuple[int, str]]] = []
        # the items' writes and reads: a lease is one write (refused ones too: a failed condition is
        # billed), a burst lease one transaction of the tenant's item and the pool's after one
        # consistent read of them all, a release of burst leases one write of the pool
        self.writes = 0
        self.transact_items = 0
        self.item_reads = 0

    def acquire_many(
        self, requests: dict[int, ConcurrencyLimits], holder: str, expires_at_ms: int, now_ms: int
    ) -> dict[int, Grant]:
        """Mirrors ``ConcurrencyLeases.acquire_many``: each tenant's grant, burst leases against the pool.

        With a ``table``, each read and write is made against its item: a read or a floor write still
        throttled after botocore's retries raises :class:`GateThrottledError` (``ConcurrencyLeases``
        re-raises every error that is not a conflict), the tenants written before it keeping their
        leases; a throttled burst transaction is cancelled, which the real code takes for a lost race:
        the tenant is acquired again on its own (read, then the transaction, three times) and refused
        when that fails too.
        """
        # the pool is read only when a tenant is past its floor (what decides is the same)
        pool: dict[tuple[int, str], Lease] | None = None
        grants: dict[int, Grant] = {}
        table = self.table
        now_s = now_ms / 1000
        for tenant, limits in requests.items():
            leases = self._tenants.get(tenant) or _NO_LEASES
            grant = grant_for(holder, leases, limits, 0, None, now_ms)
            if grant is _BURST and self.burst_capacity is not None:
                if pool is None:
                    pool = self._live_pool(now_ms)
                    self.item_reads += len(requests) + 1
                    if table is not None:
                        self._read_items(table, requests, len(pool), now_s)
                grant = grant_for(holder, leases, limits, len(pool), self.burst_capacity, now_ms)
                if grant is _BURST:
                    pool[tenant, holder] = Lease(expires_at_ms, True)
                    heapq.heappush(self._expiries, (expires_at_ms, (tenant, holder)))
            if grant is _BURST:
                self.transact_items += 2
            else:
                self.writes += 1
            if table is not None:
                grant = self._write_lease(table, tenant, holder, grant, len(leases), pool, now_s)
            grants[tenant] = grant
            if grant is not _REFUSED:
                kept = live_leases(leases, now_ms) if leases else {}  # most tenants hold none
                kept[holder] = Lease(expires_at_ms, grant is _BURST)
                self._tenants[tenant] = kept
        return grants

    def _live_pool(self, now_ms: int) -> dict[tuple[int, str], Lease]:
        """The pool without its expired places (``live_leases``), pruned in place."""
        pool, expiries = self._pool, self._expiries
        while expiries and expiries[0][0] <= now_ms:
            expires_at, place = heapq.heappop(expiries)
            lease = pool.get(place)
            if lease is not None and lease.expires_at_ms == expires_at:
                del pool[place]
        return pool

    def _read_items(
        self, table: StateTable, requests: dict[int, ConcurrencyLimits], places: int, now_s: float
    ) -> None:
        """The BatchGetItem of the tenants' items and the pool: a throttled key comes back unprocessed,
        ``batch_get`` asks again at once and raises when keys are left."""
        read, items, units, tenants = (
            table.read,
            table.counters_items,
            table.counters_read_units,
            self._tenants,
        )
        for tenant in requests:
            held = len(tenants.get(tenant) or _NO_LEASES)
            if not read(items[tenant], COUNTERS, now_s, units(held)):
                raise GateThrottledError(0.0)
        if not table.read(table.pool, BURST_POOL, now_s, table.pool_read_units(places)):
            raise GateThrottledError(0.0)

    def _write_lease(
        self,
        table: StateTable,
        tenant: int,
        holder: str,
        grant: Grant,
        held: int,
        pool: dict[tuple[int, str], Lease] | None,
        now_s: float,
    ) -> Grant:
        """The grant's write (a refused floor's failed condition is a write too): the grant as written."""
        item = table.counters(tenant)
        if grant is not _BURST or pool is None:
            written, waited = table.retried_write(item, COUNTERS, now_s, table.counters_units(held + 1))
            self.waited_s += waited
            if not written:
                raise GateThrottledError(waited)
            return grant
        places = len(pool)
        transaction = [
            (item, COUNTERS, table.counters_units(held + 1, transactional=True)),
            (table.pool, BURST_POOL, table.pool_units(places, transactional=True)),
        ]
        if table.transact(transaction, now_s):
            return grant
        self.conflicts += 1
        for _ in range(3):  # ConcurrencyLeases.acquire: read the tenant and the pool, then transact
            if not table.read(item, COUNTERS, now_s, table.counters_read_units(held)):
                raise GateThrottledError(0.0)
            if not table.read(table.pool, BURST_POOL, now_s, table.pool_read_units(places)):
                raise GateThrottledError(0.0)
            if table.transact(transaction, now_s):
                return grant
        pool.pop((tenant, holder), None)
        return _REFUSED

    def release(
        self,
        holder: str,
        tenants: list[int],
        now_s: float | None = None,
        unwritten: frozenset[int] = frozenset(),
    ) -> None:
        """The holder's leases of ``tenants`` (each written with its counters, counted by the caller).

        ``unwritten``: tenants whose write (counters and release, one UpdateItem) stayed throttled: their
        leases stay until they expire. With a ``table``, the pool's places are given back in one write
        of the pool; when it stays throttled they too stay until they expire.
        """
        pooled = False
        pool = self._pool
        places = [(tenant, holder) for tenant in tenants if (tenant, holder) in pool] if pool else []
        if places:
            pooled = True
            table = self.table
            self.writes += 1
            if table is not None and now_s is not None:
                written, _ = table.retried_write(table.pool, BURST_POOL, now_s, table.pool_units(len(pool)))
                if not written:
                    self.unreleased += len(places)
                    pooled = False
        for tenant in tenants:
            if tenant not in unwritten:
                leases = self._tenants.get(tenant)
                if leases is not None:
                    leases.pop(holder, None)
        if pooled:
            for place in places:
                del pool[place]

    def held_count(self, tenant: int) -> int:
        """Leases in the tenant's item (expired ones too, until a write drops them): its size."""
        return len(self._tenants.get(tenant) or _NO_LEASES)

    def held(self, tenant: int, now_ms: int) -> int:
        return len(live_leases(self._tenants.get(tenant, {}), now_ms))


class WorkerModel:
    """One worker function (live or sideline mode): the handler its mappings invoke."""

    def __init__(
        self,
        name: str,
        setup: WorkerSetup,
        sink: Sink,
        limits: Callable[[int], TierLimits],
        rate: ConsumerBuckets | None,
        leases: LeaseTable | None,
        meter: Meter | None = None,
    ) -> None:
        self.name = name
        self.setup = setup
        self.sink = sink
        self.limits = limits
        self.rate = rate
        self.leases = leases
        self.meter = meter if meter is not None else Meter()
        self._concurrency: dict[int, ConcurrencyLimits] = {}
        # per container (a mapping's poller stands for one): its lease holder name and its breaker
        self._containers: dict[tuple[str, int], tuple[str, CircuitBreaker | None]] = {}
        self.moves_sent = 0
        # the state table the gates' items are metered in (None: not metered)
        self.table: StateTable | None = (
            leases.table if leases is not None else rate.table if rate is not None else None
        )
        self._age_reports: dict[tuple[str, str], LastReport] = {}  # (holder, role): its last health write
        self.batch_failures = 0  # invocations whose gate error escaped: every message comes back
        self.batch_failure_messages = 0
        self.unreleased_leases = 0  # tenants' leases left to expire: their release write was throttled
        self.health_throttled = 0

    def _container(self, queue: SqsQueue, index: int) -> tuple[str, CircuitBreaker | None]:
        """A new container's lease holder name and breaker."""
        breaker = None
        if self.setup.breaker is not None:
            base, longest = self.setup.breaker
            breaker = CircuitBreaker(base_s=base, max_s=max(base, longest))
        container = self._containers[(queue.name, index)] = (f"{queue.name}#{index}", breaker)
        return container

    def handle(
        self, batch: list[Message], queue: SqsQueue, index: int, now_s: float | None = None
    ) -> Invocation:
        """One invocation with ``batch`` from ``queue`` (by its poller ``index``) at ``now_s`` (the
        queue's clock when None): what it did, and what it does when it returns."""
        if now_s is None:
            now_s = queue.env.now
        setup, sink, costs = self.setup, self.sink, self.setup.costs
        config = setup.decision
        at = now_s + costs.invoke_ms / 1000
        now_ms = int(at * 1000)
        moves: list[tuple[Message, Decision]] = []
        admitted: list[Message] = []
        settled: list[Message] = []
        failed: list[Message] = []
        counts: dict[tuple[int, str], int] = {}
        oldest: dict[str, int] = {}
        fresh = _FRESH
        observe = sink.observe
        roles = _ROLE
        for message in batch:
            role = roles[message.origin]
            observe(message, role, at)
            if message.replay_run is None:
                age = now_ms - message.enqueued_at
                if age > oldest.get(role, -1):
                    oldest[role] = age
            decision = decide(message, now_ms, fresh, config, retried=message.receive_count > 1)
            if decision.destination is not None:
                moves.append((message, decision))
            elif decision.action is _DROP:
                key = (message.tenant, "dropped")
                counts[key] = counts.get(key, 0) + 1
                settled.append(message)
            else:
                admitted.append(message)
        at += costs.per_record_ms * len(batch) / 1000
        container = self._containers.get((queue.name, index))
        holder, breaker = container if container is not None else self._container(queue, index)
        granted: list[int] = []
        if breaker is not None and admitted and not breaker.allows(at):
            for message in admitted:
                moves.append((message, hold_for_outage(message, breaker.retry_in_s(at), config)))
            admitted = []
        elif setup.gates and admitted:
            try:
                admitted, granted = self._gate(admitted, moves, holder, at)
            except GateThrottledError as error:
                # Worker.handle: the error escapes; the moves buffered so far are sent in its finally,
                # and Lambda returns every message of the batch after the visibility timeout.
                self.batch_failures += 1
                self.batch_failure_messages += len(batch)
                at += costs.gate_ms / 1000 + self._waited() + error.waited_s
                return _Finish(
                    self, queue, moves, [], [], counts, [], holder, oldest, int(at * 1000), at - now_s, batch
                )
            at += costs.gate_ms / 1000
            if self.table is not None:
                at += self._waited()
        process = sink.process
        for message in admitted:
            if breaker is not None and not breaker.allows(at):
                moves.append((message, hold_for_outage(message, breaker.retry_in_s(at), config)))
                continue
            outcome, spent_s = process(message, at)
            at += spent_s
            if outcome == "ok":
                if breaker is not None:
                    breaker.record_success()
                key = (message.tenant, "processed")
                counts[key] = counts.get(key, 0) + 1
                settled.append(message)
            elif outcome == "down" and breaker is not None:
                until = breaker.record_outage(at)
                sink.report_outage(int(at * 1000) + int((until - at) * 1000))
                moves.append((message, hold_for_outage(message, breaker.retry_in_s(at), config)))
            else:
                key = (message.tenant, "failed")
                counts[key] = counts.get(key, 0) + 1
                failed.append(message)
        if moves:
            at += costs.move_ms * ((len(moves) + 9) // 10) / 1000
        at += costs.settle_ms / 1000
        return _Finish(
            self, queue, moves, settled, failed, counts, granted, holder, oldest, int(at * 1000), at - now_s
        )

    def _waited(self) -> float:
        """botocore's waits on the gates' throttled calls in this batch (taken, so counted once)."""
        waited = 0.0
        for gate in (self.rate, self.leases):
            if gate is not None and gate.waited_s:
                waited += gate.waited_s
                gate.waited_s = 0.0
        return waited

    def report_oldest(self, holder: str, role: str, age_ms: int, now_ms: int) -> None:
        """The health item's report (``throttled_age_reports``): written when this container's last
        one is old or lower; a throttled write is logged and dropped, as the real flush does."""
        table = self.table
        if table is not None:
            key = (holder, role)
            if report_due(self._age_reports.get(key), age_ms, now_ms):
                self._age_reports[key] = LastReport(age_ms, now_ms)
                written, _ = table.retried_write(
                    table.health(role), QUEUE_HEALTH, now_ms / 1000, table.health_wcu
                )
                if not written:
                    self.health_throttled += 1
                    return
        self.sink.report_oldest(role, age_ms, now_ms)

    def _gate(
        self, admitted: list[Message], moves: list[tuple[Message, Decision]], holder: str, at: float
    ) -> tuple[list[Message], list[int]]:
        """The consumer rate, one ask per tenant (its first messages get the tokens), then the leases."""
        config = self.setup.decision
        now_ms = int(at * 1000)
        # the tenants in the order their first message comes, each with its messages' count
        wanted: dict[int, int] = {}
        for message in admitted:
            wanted[message.tenant] = wanted.get(message.tenant, 0) + 1
        within: list[Message]
        if self.rate is not None:
            acquire = self.rate.try_acquire_up_to
            tokens: dict[int, int] = {}
            tenants: list[int] = []
            short = False
            for tenant, count in wanted.items():
                granted = tokens[tenant] = acquire(tenant, count, at)
                if granted > 0:
                    tenants.append(tenant)
                if granted < count:
                    short = True
            if not short:
                within = admitted
            else:
                within = []
                over = _OVER_RATE
                for message in admitted:
                    if tokens[message.tenant] <= 0:
                        decision = decide(message, now_ms, over, config, retried=message.receive_count > 1)
                        moves.append((message, decision))
                        continue
                    tokens[message.tenant] -= 1
                    within.append(message)
        else:
            within = admitted
            tenants = list(wanted)
        if self.leases is None or not within:
            return within, []
        expires_at = now_ms + int(self.setup.timeout_s * 1000) + 1000
        known = self._concurrency
        requests: dict[int, ConcurrencyLimits] = {}
        for tenant in tenants:
            limits = known.get(tenant)
            if limits is None:
                limits = known[tenant] = concurrency_limits(self.limits(tenant))
            requests[tenant] = limits
        grants = self.leases.acquire_many(requests, holder, expires_at, now_ms)
        held: list[int] = []  # plain loops here and in finish: they run for every batch
        for tenant, grant in grants.items():
            if grant is not _REFUSED:
                held.append(tenant)
        if len(held) == len(grants):
            return within, held
        refused = _NO_SLOT
        kept: list[Message] = []
        for message in within:
            if grants[message.tenant] is _REFUSED:
                decision = decide(message, now_ms, refused, config, retried=message.receive_count > 1)
                moves.append((message, decision))
            else:
                kept.append(message)
        return kept, held


class _Finish(Invocation):
    """An invocation, and what it does when it returns: the moves sent, the rest deleted or left, the
    counters."""

    __slots__ = (
        "counts",
        "failed",
        "finished_ms",
        "granted",
        "holder",
        "moves",
        "oldest",
        "queue",
        "returned",
        "settled",
        "worker",
    )

    def __init__(
        self,
        worker: WorkerModel,
        queue: SqsQueue,
        moves: list[tuple[Message, Decision]],
        settled: list[Message],
        failed: list[Message],
        counts: dict[tuple[int, str], int],
        granted: list[int],
        holder: str,
        oldest: dict[str, int],
        finished_ms: int,
        duration_s: float,
        returned: list[Message] | None = None,
    ) -> None:
        self.duration_s = duration_s
        self.returned = returned  # a failed invocation: the whole batch, back after the visibility timeout
        self.worker = worker
        self.queue = queue
        self.moves = moves
        self.settled = settled
        self.failed = failed
        self.counts = counts
        self.granted = granted
        self.holder = holder
        self.oldest = oldest
        self.finished_ms = finished_ms

    def finish(self) -> None:
        worker, queue, moves, counts = self.worker, self.queue, self.moves, self.counts
        sink, setup = worker.sink, worker.setup
        for message, decision in moves:
            assert decision.destination is not None
            attempt = message.attempt + 1 if decision.action is _DEFER else message.attempt
            sink.send_move(
                message.moved(decision.destination, attempt), decision.destination, decision.delay_seconds
            )
            key = (message.tenant, COUNTER[decision.action])
            counts[key] = counts.get(key, 0) + 1
        worker.moves_sent += len(moves)
        meter = worker.meter
        returned = self.returned
        if self.settled:
            queue.delete(self.settled)
        if moves and returned is None:
            queue.delete([message for message, _ in moves])
            # SendMessageBatch per destination, ten at a time
            sent: dict[Origin, int] = {}
            for _, decision in moves:
                destination = decision.destination
                assert destination is not None
                sent[destination] = sent.get(destination, 0) + 1
            for amount in sent.values():
                meter.sqs_batches(amount)
        acknowledged = len(self.settled) + len(moves) if returned is None else 0
        if acknowledged:
            # Lambda deletes what the invocation did not report failed: DeleteMessageBatch, ten at a time
            meter.sqs_requests[0] += (acknowledged + RECEIVE_MAX - 1) // RECEIVE_MAX
        failed = self.failed if returned is None else returned
        if failed:
            queue.return_after_timeout(failed)
            if setup.max_receive_count is not None:
                for message in failed:
                    if will_dead_letter(message.receive_count, setup.max_receive_count):
                        key = (message.tenant, "dead_lettered")
                        counts[key] = counts.get(key, 0) + 1
        count = sink.count
        for (tenant, counter), amount in counts.items():
            count(tenant, counter, amount)
        unwritten: frozenset[int] = frozenset()
        table = worker.table
        at_s = self.finished_ms / 1000
        if setup.gates:
            # the leases' release and the counters: one write per tenant
            written = set(self.granted)
            for tenant, _ in counts:
                written.add(tenant)
            meter.dynamodb_writes += len(written)
            if table is not None:
                unwritten = self._settle(table, written, at_s)
        if self.granted and worker.leases is not None:
            worker.leases.release(self.holder, self.granted, at_s if table is not None else None, unwritten)
        for role, age in self.oldest.items():
            worker.report_oldest(self.holder, role, age, self.finished_ms)

    def _settle(self, table: StateTable, tenants: set[int], at_s: float) -> frozenset[int]:
        """Each tenant's counters item written (``settle``): those whose write stayed throttled."""
        leases = self.worker.leases
        unwritten: list[int] = []
        for tenant in tenants:
            held = leases.held_count(tenant) if leases is not None else 0
            written, _ = table.retried_write(
                table.counters(tenant), COUNTERS, at_s, table.counters_units(held)
            )
            if not written:
                unwritten.append(tenant)
        if unwritten:
            self.worker.unreleased_leases += sum(tenant in self.granted for tenant in unwritten)
        return frozenset(unwritten)

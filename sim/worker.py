"""The worker's batch in virtual time: the real rules, gates and breaker, with in-memory ports.

Per batch, in the order ``breakwater.worker.batch.Worker`` takes them: every record is observed and
decided (``breakwater.sideline.decide``); the admitted ones pass the consumer rate gate
(``breakwater.fairness.take_lease`` on the tenant's consumer bucket, one ask per tenant) and the
concurrency leases of all their tenants (``breakwater.concurrency.grant_for`` with the container's
shard of the burst pool, one acquisition per batch: ``sim.gates``); a refused gate decides again
with the gate's answer, and so does a tenant whose lease could not be read or written (only its
messages: the batch's other tenants go on). The moves decided so far are sent, then the admitted
messages are processed one after the other under the container's circuit breaker
(``breakwater.breaker.CircuitBreaker``); an outage holds the rest (``breakwater.sideline.hold_for_outage``).
Each tenant's lease is given back, with its counters in the same write, as soon as its last
message is done, and its place in the pool's shard with it (a tenant of several lease shards: the
release on its shard). Counters that ride on no release (such a tenant's, or one's that held no lease)
are kept by the container and written at most every ``WorkerSetup.counters_interval_s``
(``sim.kept_counters``). When the invocation returns, the moves made while processing are sent, the rest
deleted or left to their visibility timeout, and the kept counters that are due written. A moved copy
carries the receives that ended unprocessed before its move; a failure whose carried and current
receives reach the limit is sent to its queue's dead-letter queue then (``dead_letters_by_hand``): SQS
counts the current queue's only.

The gates and the invocation count the AWS calls the real worker makes for them
(:class:`sim.billing.Meter`): a write per consumer-bucket ask and per tenant's lease (the batch's
burst leases with the pool's shard in one transaction, after one read of the items), one write per
tenant for the release and the counters, one per place given back in the pool's shard, a
DeleteMessageBatch per ten settled or moved records, a SendMessageBatch per ten moves to a queue.

What is not the real code is the batch's bookkeeping (Powertools' ``BatchProcessor``, a pydantic
model per record, logging): it costs far more per message than the rules and is not what decides
where a message goes; ``tests/sim/test_worker_model.py`` runs the same batches through the real
``Worker.handle`` and through this model and compares where every message went.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Protocol

from breakwater.age_reports import LastReport, report_due, resume_offset_ms, stands_above
from breakwater.aws.health import health_shard
from breakwater.backlog import dead_letters_by_hand, will_dead_letter
from breakwater.breaker import CircuitBreaker
from breakwater.concurrency import LAPSE_MS, ConcurrencyLimits, Grant, LeaseTerms
from breakwater.envelope import Origin
from breakwater.settings import TierLimits
from breakwater.sideline import (
    Decision,
    DecisionConfig,
    SidelineDecision,
    TenantState,
    decide,
    hold_for_outage,
)
from breakwater.worker.options import concurrency_limits
from breakwater.worker.tally import COUNTER  # the counter each decision counts, as the worker names it
from sim.billing import RECEIVE_MAX, Meter
from sim.dynamodb import QUEUE_HEALTH, StateTable
from sim.gates import ConsumerBuckets, LeaseTable
from sim.kept_counters import KeptCounters
from sim.lambda_esm import Invocation
from sim.messages import Message
from sim.sqs import SqsQueue

Outcome = Literal["ok", "failed", "down"]

# the role a record reports its age under, by origin (an enum's ``value`` is a property: looked up once)
_ROLE = {origin: origin.value if origin is not Origin.REPLAY else "live" for origin in Origin}
# enum members as module names: looking one up on its class costs more than the test it is used in
_REFUSED = Grant.REFUSED
_DROP, _DEFER = SidelineDecision.DROP, SidelineDecision.DEFER
_FRESH = TenantState()
_OVER_RATE = TenantState(within_consumer_rate=False)
_NO_SLOT = TenantState(holds_concurrency_slot=False)

Moves = list[tuple[Message, Decision]]


def _count_replayed(counts: dict[tuple[int, str], int], tenant: int) -> None:
    """A replayed message finished (processed or dropped): ``replayed`` too, as the real worker's
    tally counts it, which gives back in the backlog estimate what ``archived`` took."""
    key = (tenant, "replayed")
    counts[key] = counts.get(key, 0) + 1


@dataclass(frozen=True)
class Costs:
    """Virtual time an invocation spends besides the processor: AWS calls and the handler's own work."""

    enqueue_ms: float = 10.0  # from ingest stamping enqueued_at to the message stored in SQS (SendMessage)
    invoke_ms: float = 20.0  # from the poll to the first record (invoke, cold paths, parsing)
    per_record_ms: float = 0.5  # reading and deciding one record
    gate_ms: float = 10.0  # the consumer bucket and the concurrency leases (DynamoDB), once per batch
    move_ms: float = 15.0  # one SendMessageBatch (10 moves)
    settle_ms: float = 10.0  # counters, lease releases, idempotency records, once per batch


@dataclass(frozen=True)
class WorkerSetup:
    """What a worker mapping needs: the rules' configuration and the gates to ask (Breakwater only)."""

    decision: DecisionConfig
    gates: bool
    breaker: tuple[float, float] | None  # (first open window, longest), seconds
    max_receive_count: int | None
    timeout_s: float
    costs: Costs
    health_shards: int = 1  # the items each role's oldest-age reports are spread over
    # how long a container keeps counters that ride on no release (``counters_interval_s`` of the
    # containers the worker's mappings allow)
    counters_interval_s: float = 0.0


class Sink(Protocol):
    """What the worker reports to the rest of the simulated system."""

    def observe(self, message: Message, role: str, now_s: float) -> None: ...
    def process(self, message: Message, at_s: float) -> tuple[Outcome, float]: ...
    def send_move(self, message: Message, destination: Origin, delay_s: int, after_s: float = 0.0) -> None:
        """SendMessage of ``message`` with DelaySeconds ``delay_s``, ``after_s`` after the invocation's
        start (the queue's clock)."""

    def count(self, tenant: int, counter: str, amount: int = 1) -> None: ...
    def report_oldest(self, role: str, age_ms: int, now_ms: int, shard: int = 0) -> tuple[int, int] | None:
        """The report the role's health item stands on after this one (age, observed at), if known."""

    def report_outage(self, until_ms: int) -> None: ...


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
        seed: int = 0,
        jitter: Callable[[], float] | None = None,
    ) -> None:
        self.name = name
        # the share of its backoff each deferral waits, as the real worker draws it
        self._jitter = jitter if jitter is not None else random.Random(seed).random
        self.setup = setup
        self.sink = sink
        self.limits = limits
        self.rate = rate
        self.leases = leases
        self.meter = meter if meter is not None else Meter()
        self._concurrency: dict[int, ConcurrencyLimits] = {}
        # per container (a mapping's poller stands for one): its lease holder name, its breaker and
        # its shard of the health items
        self._containers: dict[tuple[str, int], tuple[str, CircuitBreaker | None, int]] = {}
        self.moves_sent = 0
        # the state table the gates' items are metered in (None: not metered)
        self.table: StateTable | None = (
            leases.table if leases is not None else rate.table if rate is not None else None
        )
        self._age_reports: dict[tuple[str, str], LastReport] = {}  # (holder, role): its last health write
        # (holder, role): the report its health item stands on, as the container's last write learnt it,
        # and how long after that report's window the container reports again
        self._standing: dict[tuple[str, str], tuple[LastReport, int]] = {}
        self.batch_failures = 0  # invocations a gate error failed whole: none since an error costs its tenant
        self.batch_failure_messages = 0
        self.unreleased_leases = 0  # tenants' leases left to expire: their release write was throttled
        self.health_throttled = 0
        # counters that ride on no release (a sharded tenant's, an unleased tenant's), per container
        self.kept = KeptCounters(
            setup.counters_interval_s, limits, self._concurrency, leases, self.table, self.meter
        )
        # per container: how long its messages take, the term of a floor lease left to lapse
        self._terms: dict[str, LeaseTerms] = {}

    def _container(self, queue: SqsQueue, index: int) -> tuple[str, CircuitBreaker | None, int]:
        """A new container's lease holder name, breaker and health shard."""
        breaker = None
        if self.setup.breaker is not None:
            base, longest = self.setup.breaker
            breaker = CircuitBreaker(base_s=base, max_s=max(base, longest))
        holder = f"{queue.name}#{index}"
        shards = self.setup.health_shards
        container = self._containers[(queue.name, index)] = (
            holder,
            breaker,
            health_shard(holder, shards) if shards > 1 else 0,
        )
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
        moves: Moves = []
        admitted: list[Message] = []
        settled: list[Message] = []
        failed: list[Message] = []
        dead: list[Message] = []  # failures sent to the dead-letter queue when the invocation returns
        limit = setup.max_receive_count
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
            # the gates are open here, as in the worker's first pass: no deferral, no jitter drawn
            decision = decide(message, now_ms, fresh, config, retried=message.receive_count > 1)
            if decision.destination is not None:
                moves.append((message, decision))
            elif decision.action is _DROP:
                key = (message.tenant, "dropped")
                counts[key] = counts.get(key, 0) + 1
                if message.replay_run is not None:
                    _count_replayed(counts, message.tenant)
                settled.append(message)
            else:
                admitted.append(message)
        at += costs.per_record_ms * len(batch) / 1000
        container = self._containers.get((queue.name, index))
        holder, breaker, health = container if container is not None else self._container(queue, index)
        granted: list[int] = []
        terms = self._terms.get(holder)
        if terms is None:
            terms = self._terms[holder] = LeaseTerms()
        lease_until: dict[int, int] = {}  # the lapsing floor leases' expiries, renewed as they go
        gated_at: float | None = None  # when the gates were asked (the leases' terms start there)
        if breaker is not None and admitted and not breaker.allows(at):
            for message in admitted:
                moves.append((message, hold_for_outage(message, breaker.retry_in_s(at), config)))
            admitted = []
        elif setup.gates and admitted:
            gated_at = at
            admitted, granted, lease_until = self._gate(admitted, moves, holder, at, terms)
            at += costs.gate_ms / 1000
            if self.table is not None:
                at += self._waited()
        # the moves decided so far go out before processing
        sent_early = moves
        if moves:
            at += costs.move_ms * ((len(moves) + 9) // 10) / 1000
            self._send(moves, counts, at - now_s)
        held: Moves = []  # messages the breaker holds while processing: sent when the invocation returns
        # each leased tenant's last message: its lease goes back as soon as that one is done
        last: dict[int, int] = {}
        counted: dict[int, int] = {}  # a sharded tenant's counts kept at its release
        if granted:
            for position, message in enumerate(admitted):
                last[message.tenant] = position
        process = sink.process
        lapsed: set[int] = set()
        ahead: dict[int, int] = {}  # a lapsing lease's tenant: its ``processed`` written with the lease
        lease_expires = 0  # a lease that lasts the invocation (``Worker._gate``'s expiry)
        if gated_at is not None and granted:
            lease_expires = int(gated_at * 1000) + int(setup.timeout_s * 1000) + 1000
            terms.observe_lead(at - gated_at)
            for message in admitted:
                if message.tenant in lease_until:
                    ahead[message.tenant] = ahead.get(message.tenant, 0) + 1
        for position, message in enumerate(admitted):
            if breaker is not None and not breaker.allows(at):
                held.append((message, hold_for_outage(message, breaker.retry_in_s(at), config)))
            else:
                if lease_until and message.tenant in lease_until:
                    at += self._keep_lease(holder, message.tenant, at, terms, lease_until, lease_expires)
                outcome, spent_s = process(message, at)
                at += spent_s
                terms.observe(message.tenant, spent_s)
                if outcome == "ok":
                    if breaker is not None:
                        breaker.record_success()
                    key = (message.tenant, "processed")
                    counts[key] = counts.get(key, 0) + 1
                    if message.replay_run is not None:
                        _count_replayed(counts, message.tenant)
                    settled.append(message)
                elif outcome == "down" and breaker is not None:
                    until = breaker.record_outage(at)
                    sink.report_outage(int(at * 1000) + int((until - at) * 1000))
                    held.append((message, hold_for_outage(message, breaker.retry_in_s(at), config)))
                else:
                    key = (message.tenant, "failed")
                    counts[key] = counts.get(key, 0) + 1
                    carried = message.failed_receives  # None unless it was moved
                    if carried and limit and dead_letters_by_hand(carried, message.receive_count, limit):
                        dead.append(message)
                    else:
                        failed.append(message)
            if last and last.get(message.tenant) == position:
                lease_end = lease_until.pop(message.tenant, None)
                if lease_end is not None and lease_end - int(at * 1000) <= LAPSE_MS:
                    lapsed.add(message.tenant)
                    at += self._lapse(
                        holder, message.tenant, at, counts, counted, ahead.get(message.tenant, 0)
                    )
                else:
                    at += self._release(holder, message.tenant, at, counts, counted)
        if held or dead:
            at += costs.move_ms * ((len(held) + 9) // 10 + (len(dead) + 9) // 10) / 1000
        at += costs.settle_ms / 1000
        return _Finish(
            self,
            queue,
            sent_early,
            held,
            settled,
            failed,
            dead,
            counts,
            frozenset(granted),
            holder,
            health,
            oldest,
            int(at * 1000),
            at - now_s,
            counted,
            lapsed,
        )

    def _send(self, moves: Moves, counts: dict[tuple[int, str], int], after_s: float) -> None:
        """Each move's copy sent ``after_s`` after the invocation's start (SendMessageBatch per
        destination, ten at a time), counted by its action."""
        send = self.sink.send_move
        sent: dict[Origin, int] = {}
        for message, decision in moves:
            destination = decision.destination
            assert destination is not None
            attempt = message.attempt + 1 if decision.action is _DEFER else message.attempt
            # the receives before this one ended unprocessed; the copy's queue starts counting again
            carried = (message.failed_receives or 0) + message.receive_count - 1
            send(message.moved(destination, attempt, carried), destination, decision.delay_seconds, after_s)
            key = (message.tenant, COUNTER[decision.action])
            counts[key] = counts.get(key, 0) + 1
            sent[destination] = sent.get(destination, 0) + 1
        self.moves_sent += len(moves)
        for amount in sent.values():
            self.meter.sqs_batches(amount)

    def _release(
        self, holder: str, tenant: int, at: float, counts: dict[tuple[int, str], int], counted: dict[int, int]
    ) -> float:
        """The tenant's lease given back with its counters (one write) and its place in the pool's shard
        (one more) at ``at``: the time botocore's retries took. A sharded tenant's release is on its
        lease shard, its ``counts`` kept (in ``counted``) and written only if due (``KeptCounters.keep``)."""
        leases = self.leases
        assert leases is not None
        self.meter.dynamodb_writes += 1
        table = self.table
        waited = 0.0
        done = True
        if table is not None:
            item, kind, units = leases.release_write(holder, tenant)
            done, waited = table.retried_write(item, kind, at, units)
        if done:
            leases.end(holder, tenant, int((at + waited) * 1000))
        else:  # the lease stays until it expires; the counters are modelled as written
            self.unreleased_leases += 1
        if leases.holds_place(holder, tenant):
            leases.release_place(holder, tenant, at + waited)
        if self.kept.sharded(tenant):
            amount = counted[tenant] = sum(each for (whose, _), each in counts.items() if whose == tenant)
            waited += self.kept.keep(holder, tenant, amount, at + waited)
        return waited

    def _lapse(
        self,
        holder: str,
        tenant: int,
        at: float,
        counts: dict[tuple[int, str], int],
        counted: dict[int, int],
        ahead: int,
    ) -> float:
        """``Settlement.lapse``: the tenant's floor lease left to expire (no write). Its ``processed`` (and
        ``replayed``) went ahead with the lease (``ahead`` messages); what differs from that (other
        outcomes, processed ones fewer than counted ahead) is written now, or kept as a sharded
        tenant's counts are (``KeptCounters.keep``)."""
        counted[tenant] = sum(each for (whose, _), each in counts.items() if whose == tenant)
        processed = counts.get((tenant, "processed"), 0)
        others = sum(
            each
            for (whose, name), each in counts.items()
            if whose == tenant and name not in ("processed", "replayed")
        )
        return self.kept.keep(holder, tenant, others + abs(ahead - processed), at)

    def _keep_lease(
        self,
        holder: str,
        tenant: int,
        at: float,
        terms: LeaseTerms,
        lease_until: dict[int, int],
        lease_expires: int,
    ) -> float:
        """``Worker._keep_lease``: a lapsing floor lease the next message may outlast renewed to the end
        of the invocation (one write), then given back at the tenant's end; one not renewed lapses.
        The time botocore's retries took."""
        at_ms = int(at * 1000)
        until = lease_until[tenant]
        if not until or until >= lease_expires or until > at_ms + (terms.message_ms(tenant) or 0.0):
            return 0.0
        leases = self.leases
        assert leases is not None
        if leases.renew(holder, tenant, self._concurrency[tenant], lease_expires, at_ms):
            lease_until[tenant] = lease_expires
        else:  # not renewed: it lapses, never given back (it may be another container's by then)
            lease_until[tenant] = 0
        return self._waited()

    def _waited(self) -> float:
        """botocore's waits and the conflicts' pauses in this batch's gates (taken, so counted once)."""
        waited = 0.0
        for gate in (self.rate, self.leases):
            if gate is not None and gate.waited_s:
                waited += gate.waited_s
                gate.waited_s = 0.0
        return waited

    def report_oldest(self, holder: str, shard: int, role: str, age_ms: int, now_ms: int) -> None:
        """The health item's report (``throttled_age_reports``) to the container's shard: written when
        its last one is old or lower, and not while a larger report the container learnt stands on the
        item (the write would fail its condition); a throttled write is logged and dropped, as the real
        flush does."""
        table = self.table
        key = (holder, role)
        if table is not None:
            standing = self._standing.get(key)
            if standing is not None and stands_above(standing[0], age_ms, now_ms - standing[1]):
                return
            if report_due(self._age_reports.get(key), age_ms, now_ms):
                self._age_reports[key] = LastReport(age_ms, now_ms)
                item = table.health(role, shard, self.setup.health_shards)
                written, _ = table.retried_write(item, QUEUE_HEALTH, now_ms / 1000, table.health_wcu)
                if not written:
                    self.health_throttled += 1
                    return
        stood = self.sink.report_oldest(role, age_ms, now_ms, shard)
        if stood is not None:
            known = self._standing.get(key)
            offset = known[1] if known is not None else resume_offset_ms(holder)
            self._standing[key] = (LastReport(*stood), offset)

    def _gate(
        self, admitted: list[Message], moves: Moves, holder: str, at: float, terms: LeaseTerms
    ) -> tuple[list[Message], list[int], dict[int, int]]:
        """The consumer rate, one ask per tenant (its first messages get the tokens), then the leases."""
        config = self.setup.decision
        now_ms = int(at * 1000)
        # the tenants in the order their first message comes, each with its messages' count
        wanted: dict[int, int] = {}
        for message in admitted:
            wanted[message.tenant] = wanted.get(message.tenant, 0) + 1
        within: list[Message]
        riding: list[int] = []
        if self.rate is not None:
            rate = self.rate
            acquire = rate.try_acquire_up_to
            tokens: dict[int, int] = {}
            tenants: list[int] = []
            short = False
            for tenant, count in wanted.items():
                granted = tokens[tenant] = acquire(tenant, count, at, holder)
                if rate.wrote:  # the tenant's counters item: its floor lease rides on that write
                    riding.append(tenant)
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
                        decision = decide(
                            message,
                            now_ms,
                            over,
                            config,
                            retried=message.receive_count > 1,
                            jitter=self._jitter(),
                        )
                        moves.append((message, decision))
                        continue
                    tokens[message.tenant] -= 1
                    within.append(message)
        else:
            within = admitted
            tenants = list(wanted)
        if self.leases is None or not within:
            return within, [], {}
        expires_at = now_ms + int(self.setup.timeout_s * 1000) + 1000
        # when each tenant's floor lease is to expire, to lapse after its last message (``_floor_terms``)
        order = [message.tenant for message in within]
        leases = self.leases
        skip = {message.tenant for message in within if message.origin is Origin.SURGE}
        skip.update(tenant for tenant in set(order) if leases.contended(holder, tenant, now_ms))
        floor_until = terms.ends_ms(now_ms, order, skip, before_ms=expires_at)
        known = self._concurrency
        requests: dict[int, ConcurrencyLimits] = {}
        for tenant in tenants:
            limits = known.get(tenant)
            if limits is None:
                limits = known[tenant] = concurrency_limits(self.limits(tenant))
            requests[tenant] = limits
        grants = self.leases.acquire_many(requests, holder, expires_at, now_ms, riding, floor_until)
        held: list[int] = []  # plain loops here and in finish: they run for every batch
        lease_until: dict[int, int] = {}
        for tenant, grant in grants.items():
            if grant is not _REFUSED:
                held.append(tenant)
                if grant is Grant.FLOOR and tenant in floor_until:
                    lease_until[tenant] = floor_until[tenant]
        if len(held) == len(grants):
            return within, held, lease_until
        refused = _NO_SLOT
        kept: list[Message] = []
        for message in within:
            if grants[message.tenant] is _REFUSED:
                decision = decide(
                    message, now_ms, refused, config, retried=message.receive_count > 1, jitter=self._jitter()
                )
                moves.append((message, decision))
            else:
                kept.append(message)
        return kept, held, lease_until


class _Finish(Invocation):
    """An invocation, and what it does when it returns: the moves held while processing sent, the
    rest deleted or left, the counters."""

    __slots__ = (
        "counted",
        "counts",
        "dead",
        "failed",
        "finished_ms",
        "granted",
        "health",
        "held",
        "holder",
        "lapsed",
        "oldest",
        "queue",
        "sent_early",
        "settled",
        "worker",
    )

    def __init__(
        self,
        worker: WorkerModel,
        queue: SqsQueue,
        sent_early: Moves,
        held: Moves,
        settled: list[Message],
        failed: list[Message],
        dead: list[Message],
        counts: dict[tuple[int, str], int],
        granted: frozenset[int],
        holder: str,
        health: int,
        oldest: dict[str, int],
        finished_ms: int,
        duration_s: float,
        counted: dict[int, int],
        lapsed: set[int],
    ) -> None:
        self.duration_s = duration_s
        self.lapsed = lapsed
        self.worker = worker
        self.queue = queue
        self.sent_early = sent_early
        self.held = held
        self.settled = settled
        self.failed = failed
        self.dead = dead
        self.counts = counts
        self.granted = granted
        self.holder = holder
        self.health = health
        self.oldest = oldest
        self.finished_ms = finished_ms
        self.counted = counted

    def unsettled(self) -> list[Message]:
        """The failures and the messages the breaker holds (the moves sent early are in their queues)."""
        return [*self.failed, *self.dead, *(message for message, _ in self.held)]

    def finish(self) -> None:
        worker, queue, counts = self.worker, self.queue, self.counts
        setup = worker.setup
        if self.held:
            worker._send(self.held, counts, 0.0)
        meter = worker.meter
        if self.settled:
            queue.delete(self.settled)
        dead = self.dead
        if dead:
            # a copy of each to the dead-letter queue (a SendMessageBatch), as the real worker sends it:
            # no failed receives, so redriven it gets every receive again; then deleted, counted as it leaves
            for message in dead:
                queue.send_to_dead_letter(message.moved(message.origin, message.attempt, 0))
                key = (message.tenant, "dead_lettered")
                counts[key] = counts.get(key, 0) + 1
            meter.sqs_batches(len(dead))
            queue.delete(dead)
        moved = len(self.sent_early) + len(self.held)
        if moved:
            queue.delete([message for message, _ in self.sent_early])
            if self.held:
                queue.delete([message for message, _ in self.held])
        acknowledged = len(self.settled) + moved + len(dead)
        if acknowledged:
            # Lambda deletes what the invocation did not report failed: DeleteMessageBatch, ten at a time
            meter.sqs_requests[0] += (acknowledged + RECEIVE_MAX - 1) // RECEIVE_MAX
        failed = self.failed
        if failed:
            queue.return_after_timeout(failed)
            if setup.max_receive_count is not None:
                for message in failed:
                    if will_dead_letter(message.receive_count, setup.max_receive_count):
                        key = (message.tenant, "dead_lettered")
                        counts[key] = counts.get(key, 0) + 1
        count = worker.sink.count
        for (tenant, counter), amount in counts.items():
            count(tenant, counter, amount)
        if setup.gates:
            worker.kept.settle(
                self.holder, counts, self.granted, self.counted, self.finished_ms / 1000, self.lapsed
            )
        for role, age in self.oldest.items():
            worker.report_oldest(self.holder, self.health, role, age, self.finished_ms)

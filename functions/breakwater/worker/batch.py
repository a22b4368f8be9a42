"""The worker: one SQS batch through the sidelining policy, moves in bulk, admitted messages processed.

Per record (Powertools ``BatchProcessor`` with :class:`EnvelopeSqsRecord`): observe its age and ask
:func:`breakwater.sideline.decide`, then buffer a move, drop it, or admit it. The messages the
rules admitted then pass the gates, paid for per batch rather than per message: the consumer
token bucket (leased in chunks) and the concurrency leases of all their tenants (a floor lease
without a read, in the bucket's own write when the bucket writes and the tenant's leases share its
counters item with it; else one read and one write per tenant), then the idempotency locks of the
messages let through. What passes is processed under a heartbeat, one after the other. After the
batch: every buffered move goes out through ``SendMessageBatch`` and a failed entry turns its
original into a batch item failure (nothing is acknowledged before its copy exists); the
idempotency records, the leases still held with the per-tenant counters (one write per tenant), the
oldest age per queue role and the metrics go out once per batch. A tenant's lease goes back, with its
counters, as soon as its last message is done; what is written then and what is kept for a later
batch is ``breakwater.worker.settlement``'s.
Replayed and redriven work is measured apart (``breakwater.worker.metrics.metric_role``) and never
reported as a queue's oldest age. A message left unacknowledged on its queue's last receive is
counted ``dead_lettered``: SQS moves it to the dead-letter queue without telling anyone, and the
tenant's backlog estimate must let it go; when the redrive brings it back, its first receive counts
``redriven``, which gives it back.

This module talks to AWS only through :class:`WorkerPorts`; what a batch accumulates is in
``breakwater.worker.tally``, the options and per-tenant limits in ``breakwater.worker.options``.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from aws_lambda_powertools.utilities.batch import BatchProcessor, EventType, process_partial_response
from aws_lambda_powertools.utilities.typing import LambdaContext

from breakwater.backlog import dead_letter_queue_url, dead_letters_by_hand
from breakwater.breaker import CircuitBreaker
from breakwater.concurrency import LAPSE_MS, ConcurrencyLimits, Grant, LeaseTerms, lease_shard_count
from breakwater.envelope import Envelope, Origin
from breakwater.heartbeat import Heartbeat, HeartbeatMonitor, HeartbeatPlan
from breakwater.observability import logger
from breakwater.observability import metrics as powertools_metrics
from breakwater.processor import DependencyUnavailableError, WorkCancelledError, WorkContext
from breakwater.settings import TierLimits
from breakwater.sideline import (
    Decision,
    Move,
    SidelineDecision,
    TenantState,
    decide,
    hold_for_outage,
    is_replayed,
    queue_role,
)
from breakwater.worker.metrics import (
    DEPENDENCY_UNAVAILABLE,
    FAILED,
    OUTCOME_METRIC,
    MetricRole,
    MetricsSink,
    metric_role,
)
from breakwater.worker.options import WorkerOptions, concurrency_limits, consumer_bucket_limits
from breakwater.worker.ports import HeldElsewhereError, WorkerPorts
from breakwater.worker.record import EnvelopeSqsRecord, queue_url_from_arn
from breakwater.worker.settlement import Settlement
from breakwater.worker.tally import COUNTER, Admitted, BatchTally, log_tenant_batches

LOG_KEYS = ("tenant", "envelope_id", "request_id", "trace_id")
DEAD_LETTERED = "dead_lettered"  # the counter of a message that leaves for a dead-letter queue


def _gate_error(tenant: str, exc: Exception) -> dict[str, str]:
    return {"gated_tenant": tenant, "error": f"{type(exc).__name__}: {exc}"}


class OutOfTimeError(RuntimeError):
    """Too little Lambda time left to start this record; it is failed fast and redelivered."""


MAX_VISIBILITY_S = 43_200  # SQS's longest visibility timeout


class Worker:
    """One per container: holds the ports, the configuration and the heartbeat thread."""

    def __init__(
        self,
        config: WorkerOptions,
        ports: WorkerPorts,
        metrics: MetricsSink | None = None,
        jitter: Callable[[], float] = random.random,
    ) -> None:
        self.config = config
        # the share of its backoff a deferred message waits: deferrals spread out, not one wave
        self.jitter = jitter
        self.ports = ports
        self.metrics: MetricsSink = metrics if metrics is not None else powertools_metrics
        self.monitor = HeartbeatMonitor(ports.monotonic)
        self._batch: BatchTally | None = None
        # the lease releases with the counters, and the counters kept between batches
        self.settlement = Settlement(ports)
        # how long this container's messages take, per tenant: the term of a floor lease left to lapse
        self.terms = LeaseTerms()
        self.breaker: CircuitBreaker | None = None
        if config.outage_backoff_s is not None:
            self.breaker = CircuitBreaker(
                base_s=config.outage_backoff_s,
                max_s=max(config.outage_backoff_s, config.outage_backoff_max_s or config.outage_backoff_s),
            )

    # -- the invocation ------------------------------------------------------------------------------
    def handle(self, event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
        self.ports.register_context(context)
        batch = self._batch = BatchTally(context=context)
        # An all-failed batch is reported item by item like any other, not raised as a function error.
        processor = BatchProcessor(
            event_type=EventType.SQS,
            # Typed as Powertools' own record models; it only calls model_validate and reads messageId.
            model=EnvelopeSqsRecord,  # type: ignore[arg-type]
            raise_on_entire_batch_failure=False,
        )
        response: dict[str, Any] = {"batchItemFailures": []}
        failures: set[str] = set()
        try:
            response = dict(
                process_partial_response(
                    event=event, record_handler=self._record, processor=processor, context=context
                )
            )
            failures = self._process_admitted(batch)
        finally:
            logger.remove_keys(list(LOG_KEYS))  # what follows is about the batch, not its last record
            self._flush_moves(batch)
            failures |= batch.failed_moves
            self._count_dead_letters(batch)
            self._flush_aggregates(batch)  # settles the batch, its COMPLETED records included
            self._flush_processed()  # whatever the settle did not write (a port without it)
            self._batch = None
        reported = {item["itemIdentifier"] for item in response.get("batchItemFailures", [])}
        response["batchItemFailures"] = [
            *response.get("batchItemFailures", []),
            *({"itemIdentifier": key} for key in sorted(failures - reported)),
        ]
        return response

    def flush_kept_counters(self, force: bool = False) -> None:
        """Write the counters this container keeps for a later write once they are due (every one if
        ``force``): from the handler's background thread, and at shutdown."""
        self.settlement.flush(force)

    # -- one record ------------------------------------------------------------------------------------
    def _record(self, record: EnvelopeSqsRecord) -> None:
        """The rules without the gates: drop, buffer a move, or admit (gates and processing come later)."""
        batch = self._batch
        assert batch is not None
        envelope = record.body
        batch.received[record.messageId] = (envelope.tenant, record.receive_count)
        if record.redrive_arrival and record.first_attempt:
            # Back from a dead-letter queue, where it was counted dead_lettered: in the estimate again.
            batch.counters[envelope.tenant]["redriven"] += 1
        self._log_keys(envelope)
        now = self.ports.clock_ms()
        role = metric_role(envelope, redriven=record.redriven)
        age = envelope.age_ms(now)
        batch.metrics.age(role, envelope.tenant, age, first=record.first_attempt)
        if not record.redriven and not is_replayed(envelope):
            # A replayed or redriven message's age runs from its first enqueue: it tells nothing of how
            # far behind this queue is, and in the live health report it would turn the drainers off.
            queue = queue_role(envelope.origin)
            batch.oldest[queue] = max(age, batch.oldest.get(queue, 0))
        self._check_time(batch, envelope, role)

        config = self.config.decision
        state = TenantState()
        if config.sidelining_enabled:
            state = TenantState(swept_at_ms=self.ports.swept_at_ms(envelope.tenant))
        # the gates are open here (asked later, per batch): nothing is deferred, so no jitter is drawn
        decision = decide(envelope, now, state, config, retried=record.receive_count > 1)
        if decision.moves:
            self._buffer_move(record, envelope, role, decision, batch)
        elif decision.action is SidelineDecision.DROP:
            logger.info("dropped", extra={"reason": decision.reason.value})
            batch.finished(
                record.messageId, envelope, role, COUNTER[decision.action], OUTCOME_METRIC[decision.action]
            )
        else:
            batch.admitted.append(Admitted(record, envelope, role, now, state))

    def _check_time(self, batch: BatchTally, envelope: Envelope, role: MetricRole) -> None:
        if batch.context.get_remaining_time_in_millis() < self.config.safety_margin_s * 1000:
            batch.count(envelope.tenant, role, "failed", FAILED)
            raise OutOfTimeError("too little time left to start this message")

    @staticmethod
    def _log_keys(envelope: Envelope) -> None:
        logger.append_keys(
            tenant=envelope.tenant,
            envelope_id=envelope.id,
            request_id=envelope.request_id,
            trace_id=envelope.trace_id,
        )

    # -- the admitted messages -------------------------------------------------------------------------
    def _process_admitted(self, batch: BatchTally) -> set[str]:
        """Gates for the batch, the idempotency locks, then each message; returns the failed ids.

        While the breaker is open nothing is gated, locked or processed: every admitted message is
        held (:meth:`_hold`). One that meets an outage, and those after it, are held too.
        """
        breaker = self.breaker
        if breaker is not None and batch.admitted and not breaker.allows(self.ports.monotonic()):
            for each in batch.admitted:
                self._hold(breaker, each, batch)
            return set()
        admitted = self._gate(batch) if self.config.decision.sidelining_enabled else batch.admitted
        failures: set[str] = set()
        if not admitted:
            return failures
        self.ports.lock([each.envelope for each in admitted])
        # The copies of what the gates set aside go out now, not after the processing: a tenant's
        # counters are then complete when its last message finishes, and its lease is given back at
        # once (with them, in one write) instead of being held while other tenants' messages run.
        self._flush_moves(batch)
        left = Counter(each.envelope.tenant for each in admitted)
        unused_locks: list[Envelope] = []
        if batch.gated_at is not None:
            self.terms.observe_lead(self.ports.monotonic() - batch.gated_at)
        for index, each in enumerate(admitted):
            tenant = each.envelope.tenant
            self._keep_lease(batch, admitted, index)
            started = self.ports.monotonic()
            failed = self._one(each, breaker, batch, unused_locks)
            self.terms.observe(tenant, self.ports.monotonic() - started)
            if failed is not None:
                failures.add(failed)
            left[tenant] -= 1
            if not left[tenant]:  # its lease goes back now (or lapses), with its counters
                self._count_dead_letters(batch, tenant)
                until = batch.lease_until.pop(tenant, None)
                if until is not None and until - self.ports.clock_ms() <= LAPSE_MS:
                    self.settlement.lapse(batch, tenant, self.config.counters_interval_s)
                else:
                    self.settlement.release(batch, tenant, self.config.counters_interval_s)
        if unused_locks:
            self._unlock(unused_locks)
        return failures

    def _keep_lease(self, batch: BatchTally, admitted: list[Admitted], index: int) -> None:
        """Renew the lapsing floor lease of the tenant of ``admitted[index]`` if the message is expected
        to outlast it (one write): this batch's estimate was wrong, so the lease is taken to the end of
        the invocation and given back at the tenant's end, as a lease the container cannot time is
        (two writes, never more). A lease not renewed (its slot lapsed and was taken, an error) is not
        given back either: it may be another container's by then; the limit is soft for that moment."""
        tenant = admitted[index].envelope.tenant
        until = batch.lease_until.get(tenant)
        leases = self.ports.leases
        if not until or leases is None:  # (0: its renewal failed; it lapses, nothing more is tried)
            return
        now = self.ports.clock_ms()
        renewed = batch.lease_expires_at
        if until >= renewed or until > now + (self.terms.message_ms(tenant) or 0.0):
            return  # renewed already, or expected to end within the lease
        limits = batch.lease_limits.get(tenant)
        if limits is None:
            return
        try:
            if leases.renew(tenant, limits, renewed):
                batch.lease_until[tenant] = renewed
                return
        except Exception as exc:  # the adapter answers False on AWS errors; this is a bug's net
            logger.warning("lease not renewed", extra=_gate_error(tenant, exc))
        logger.warning("lease not renewed: left to lapse", extra={"tenant": tenant})
        batch.lease_until[tenant] = 0

    def _one(
        self, each: Admitted, breaker: CircuitBreaker | None, batch: BatchTally, unused_locks: list[Envelope]
    ) -> str | None:
        """Process one admitted message (or hold it while the breaker is open); its id if it failed."""
        envelope, role = each.envelope, each.role
        self._log_keys(envelope)
        if breaker is not None and not breaker.allows(self.ports.monotonic()):
            unused_locks.append(envelope)
            self._hold(breaker, each, batch)
            return None
        try:
            self._check_time(batch, envelope, role)
            self._process(each.record, envelope, self.ports.clock_ms())
        except OutOfTimeError:
            return each.record.messageId
        except Exception as exc:
            # An outage opens the breaker and the message is held; without a breaker (the naive
            # baseline) it is a failure like any other.
            if breaker is not None and isinstance(exc, DependencyUnavailableError):
                self._trip(breaker, exc, batch, role)  # its lock went with the failure
                self._hold(breaker, each, batch)
                return None
            batch.count(envelope.tenant, role, "failed", FAILED)
            logger.exception("processing failed")
            if isinstance(exc, HeldElsewhereError):
                self._wait_out(each.record, exc.retry_in_s)
            elif self._dead_letter(each, batch):
                return None  # acknowledged once its copy is in the dead-letter queue
            return each.record.messageId
        if breaker is not None and breaker.record_success():
            logger.info("dependency available again: circuit closed")
        batch.finished(
            each.record.messageId, envelope, role, "processed", OUTCOME_METRIC[SidelineDecision.PROCESS]
        )
        return None

    def _dead_letter(self, each: Admitted, batch: BatchTally) -> bool:
        """Buffer the move of a failed message to its queue's dead-letter queue when the receives it
        failed on earlier queues and on this one reach the limit (SQS counts this queue's only).

        The copy carries no failed receives: redriven after a fix, it gets every receive again, as a
        message SQS dead-lettered does. Counted ``dead_lettered`` once the copy is sent.
        """
        record, envelope = each.record, each.envelope
        limit = self.config.max_receive_count
        if limit is None or not dead_letters_by_hand(envelope.failed_receives, record.receive_count, limit):
            return False
        logger.warning(
            "failed on its last receive across queues: sent to the dead-letter queue",
            extra={"failed_receives": (envelope.failed_receives or 0) + record.receive_count},
        )
        batch.moves.append(
            Move(
                key=record.messageId,
                queue_url=dead_letter_queue_url(queue_url_from_arn(record.eventSourceARN)),
                body=envelope.model_copy(update={"failed_receives": None}).to_json(),
            )
        )
        batch.moved[record.messageId] = (envelope.tenant, each.role, DEAD_LETTERED, None)
        return True

    def _wait_out(self, record: EnvelopeSqsRecord, retry_in_s: float) -> None:
        """Keep a message whose lock another invocation holds hidden until that lock can have expired."""
        seconds = min(MAX_VISIBILITY_S, math.ceil(retry_in_s) + 1)
        try:
            self.ports.extend_visibility(
                queue_url_from_arn(record.eventSourceARN), record.receiptHandle, seconds
            )
        except Exception as exc:  # it comes back at the queue's visibility timeout instead
            logger.warning("visibility change failed", extra={"error": str(exc)})

    def _hold(self, breaker: CircuitBreaker, each: Admitted, batch: BatchTally) -> None:
        """Move a message the open breaker keeps from the processor, until about its next probe."""
        retry_in_s = breaker.retry_in_s(self.ports.monotonic())
        decision = hold_for_outage(each.envelope, retry_in_s, self.config.decision)
        self._buffer_move(each.record, each.envelope, each.role, decision, batch)

    def _trip(self, breaker: CircuitBreaker, exc: Exception, batch: BatchTally, role: MetricRole) -> None:
        """Open the breaker on an outage and say so where the controller reads it (its drainers wait)."""
        now = self.ports.monotonic()
        window_ms = int((breaker.record_outage(now) - now) * 1000)
        batch.metrics.outcome(role, DEPENDENCY_UNAVAILABLE)
        logger.warning(
            "dependency unavailable: circuit open", extra={"error": str(exc), "open_ms": window_ms}
        )
        try:
            self.ports.report_outage(self.ports.clock_ms() + window_ms)
        except Exception as report_exc:  # the drainers then run on: each drainer's breaker holds them
            logger.warning("outage report failed", extra={"error": str(report_exc)})

    def _unlock(self, envelopes: list[Envelope]) -> None:
        try:
            self.ports.unlock(envelopes)
        except Exception as exc:  # a lock expires with the invocation that took it
            logger.warning("idempotency unlock failed", extra={"error": str(exc)})

    def _gate(self, batch: BatchTally) -> list[Admitted]:
        """The consumer rate (one ask per tenant, its first messages in record order get the tokens),
        then the concurrency of all tenants at once.

        A tenant whose gate fails (its limits unreadable, its bucket's or leases' item throttled, the
        table unavailable) is refused like a tenant over its limits: its messages are set aside, and
        the batch's other tenants go on. The lease adapter retries lost races itself.

        The counters this container kept for the batch's tenants ride on their floor writes (the
        consumer bucket's write, the floor's own); those no write took are kept again.
        """
        now = self.ports.clock_ms()
        batch.gated_at = self.ports.monotonic()
        expires_at = batch.lease_expires_at = now + batch.context.get_remaining_time_in_millis() + 1000
        floor_until = self._floor_terms(batch, now, expires_at)
        riding: dict[str, dict[str, int]] = {}
        ahead: dict[str, Counter[str]] = {}
        if self.ports.leases is not None:
            tenants = list(dict.fromkeys(each.envelope.tenant for each in batch.admitted))
            riding = self.settlement.take_for_ride(tenants)
            ahead = self._counted_ahead(batch, floor_until)
            carried = {tenant: Counter(riding.get(tenant, {})) for tenant in {*riding, *ahead}}
            for tenant, deltas in ahead.items():
                carried[tenant].update(deltas)
            self.ports.leases.carry(carried)
        try:
            return self._gates(batch, now, expires_at, floor_until)
        finally:
            if self.ports.leases is not None:
                landed = self.ports.leases.carried_landed()
                self.settlement.keep_back(
                    {tenant: deltas for tenant, deltas in riding.items() if tenant not in landed}
                )
                for tenant in landed & ahead.keys():  # what its messages will count, written already
                    batch.written[tenant] = ahead[tenant]

    @staticmethod
    def _counted_ahead(batch: BatchTally, floor_until: dict[str, int]) -> dict[str, Counter[str]]:
        """What the admitted messages of each tenant whose floor lease is to lapse will count once
        processed (``processed``, and ``replayed`` for a replayed one): written with its floor lease, so
        that its last message needs no write. Whatever turns out otherwise (a failure, a spill, a
        hold) is the difference written later, a negative ``processed`` among it."""
        ahead: dict[str, Counter[str]] = {}
        for each in batch.admitted:
            tenant = each.envelope.tenant
            if tenant in floor_until:
                counts = ahead.setdefault(tenant, Counter())
                counts["processed"] += 1
                if each.envelope.replay_run is not None:
                    counts["replayed"] += 1
        return ahead

    def _gates(
        self, batch: BatchTally, now: int, expires_at: int, floor_until: dict[str, int]
    ) -> list[Admitted]:
        """:meth:`_gate`'s asks: the consumer rate, then the leases (their floor expiries given)."""
        within: list[Admitted] = []
        tokens: dict[str, int] = {}
        limits: dict[str, TierLimits] = {}
        lease_limits: dict[str, ConcurrencyLimits] = {}
        # the floor leases taken in the consumer bucket's write (a tenant's leases on its counters item)
        rode: dict[str, Grant] = {}
        for tenant, count in Counter(each.envelope.tenant for each in batch.admitted).items():
            try:
                limits[tenant] = self.ports.tenant_limits(tenant)
                lease_limits[tenant] = concurrency_limits(limits[tenant])
                sharded = lease_shard_count(lease_limits[tenant]) > 1
                self.settlement.note_sharding(tenant, sharded)
                if self.ports.rate is None:
                    continue
                # one ask: the tenant's first messages get the tokens
                bucket = consumer_bucket_limits(limits[tenant])
                if self.ports.tokens_and_floor is not None and not sharded:
                    tokens[tenant], grant = self.ports.tokens_and_floor(
                        tenant, bucket, count, lease_limits[tenant], expires_at, floor_until.get(tenant)
                    )
                    if grant is not None:
                        rode[tenant] = grant
                else:
                    tokens[tenant] = self.ports.rate.try_acquire_up_to(tenant, bucket, count)[0]
            except Exception as exc:
                logger.warning("gate failed: its messages are set aside", extra=_gate_error(tenant, exc))
                tokens[tenant] = 0
        for each in batch.admitted:
            tenant = each.envelope.tenant
            if tenant in tokens:  # asked for (or refused on an error): what it got is counted down
                if tokens[tenant] <= 0:
                    self._redecide(each, replace(each.state, within_consumer_rate=False), batch)
                    continue
                tokens[tenant] -= 1
            within.append(each)
        if self.ports.leases is None or not within:
            return within
        tenants = list(dict.fromkeys(each.envelope.tenant for each in within))
        batch.grants = {tenant: rode[tenant] for tenant in tenants if tenant in rode}
        unleased = [tenant for tenant in tenants if tenant not in rode]
        try:
            if unleased:
                batch.grants |= self.ports.leases.acquire_many(
                    {tenant: lease_limits[tenant] for tenant in unleased}, expires_at, floor_until=floor_until
                )
        except Exception as exc:  # the adapter refuses a tenant it cannot lease; this is a bug's net
            logger.exception("leases failed: the batch's messages are set aside", extra={"error": str(exc)})
            batch.grants |= dict.fromkeys(unleased, Grant.REFUSED)
        batch.lease_limits = lease_limits
        batch.lease_until = {
            tenant: until
            for tenant, until in floor_until.items()
            if tenant in tenants and batch.grants.get(tenant) is Grant.FLOOR
        }
        admitted: list[Admitted] = []
        for each in within:
            if batch.grants.get(each.envelope.tenant) is Grant.REFUSED:
                self._redecide(each, replace(each.state, holds_concurrency_slot=False), batch)
            else:
                admitted.append(each)
        return admitted

    def _floor_terms(self, batch: BatchTally, now: int, expires_at: int) -> dict[str, int]:
        """When each tenant's floor lease is to expire, to lapse after its last message of the batch
        rather than be given back: the expected end of that message, with a margin (the messages are
        processed in record order). A tenant not timed yet, or whose floor is contended (a blind
        write found it taken lately, or a message of the batch was deferred over the tenant's
        concurrency: its slots must turn over as soon as its work is done), takes the invocation's
        lease, given back."""
        order = [each.envelope.tenant for each in batch.admitted]
        skip = {each.envelope.tenant for each in batch.admitted if each.envelope.origin is Origin.SURGE}
        leases = self.ports.leases
        if leases is not None:
            skip.update(tenant for tenant in set(order) if leases.contended(tenant))
        return self.terms.ends_ms(now, order, skip, before_ms=expires_at)

    def _redecide(self, each: Admitted, state: TenantState, batch: BatchTally) -> None:
        """Decide again for ``each`` with the gate's answer in ``state``, and buffer the move."""
        decision = decide(
            each.envelope,
            each.now,
            state,
            self.config.decision,
            retried=each.record.receive_count > 1,
            jitter=self.jitter(),
        )
        self._buffer_move(each.record, each.envelope, each.role, decision, batch)

    def _buffer_move(
        self,
        record: EnvelopeSqsRecord,
        envelope: Envelope,
        role: MetricRole,
        decision: Decision,
        batch: BatchTally,
    ) -> None:
        assert decision.destination is not None
        attempt = envelope.attempt + 1 if decision.action is SidelineDecision.DEFER else envelope.attempt
        # The receives before this one ended unprocessed; the copy's queue starts counting again.
        failed = (envelope.failed_receives or 0) + record.receive_count - 1
        batch.moves.append(
            Move(
                key=record.messageId,
                queue_url=self.config.queue_urls[decision.destination],
                body=envelope.moved(decision.destination, attempt=attempt, failed_receives=failed).to_json(),
                delay_seconds=decision.delay_seconds,
                group_id=envelope.tenant if self.config.fair_queues else None,
                redriven=record.redriven,
            )
        )
        batch.moved[record.messageId] = (
            envelope.tenant,
            role,
            COUNTER[decision.action],
            OUTCOME_METRIC[decision.action],
        )

    def _process(self, record: EnvelopeSqsRecord, envelope: Envelope, now_ms: int) -> None:
        """Run the processor under a heartbeat; a cancelled message is made visible again at once."""
        batch = self._batch
        assert batch is not None
        started = self.ports.monotonic()
        remaining_s = batch.context.get_remaining_time_in_millis() / 1000
        message_deadline = None
        if envelope.expires_at is not None:
            message_deadline = started + (envelope.expires_at - now_ms) / 1000
        plan = HeartbeatPlan(
            visibility_timeout_s=self.config.visibility_timeout_s,
            heartbeat_s=self.config.heartbeat_s,
            started_at=started,
            lambda_deadline=started + remaining_s,
            message_deadline=message_deadline,
            safety_margin_s=self.config.safety_margin_s,
        )
        queue_url = queue_url_from_arn(record.eventSourceARN)
        work = WorkContext()
        beat = Heartbeat(
            plan,
            lambda seconds: self.ports.extend_visibility(queue_url, record.receiptHandle, seconds),
            cancel=work.cancel,
            on_error=lambda exc: logger.warning("visibility extension failed", extra={"error": str(exc)}),
        )
        try:
            with self.monitor.watch(beat):
                self.ports.process(envelope, work)
        except WorkCancelledError:
            logger.warning("processing cancelled", extra={"reason": str(beat.cancel_reason)})
            # The work has stopped, so another worker may have the message now: no parallel processing.
            self.ports.extend_visibility(queue_url, record.receiptHandle, 0)
            raise
        finally:
            if beat.extensions:
                logger.info("heartbeat", extra={"extensions": beat.extensions})

    # -- after the records --------------------------------------------------------------------------------
    def _flush_moves(self, batch: BatchTally) -> None:
        """Send the moves buffered since the last flush; a failed one's original stays unacknowledged."""
        moves, moved = batch.moves, batch.moved
        if not moves:
            return
        batch.moves, batch.moved = [], {}
        failed = self.ports.send_moves(moves)
        for key, (tenant, role, counter, metric) in moved.items():
            if key in failed:
                if counter != DEAD_LETTERED:  # a dead-letter copy's original was counted failed already
                    batch.count(tenant, role, "failed", FAILED)
            else:
                batch.count(tenant, role, counter, metric)
                batch.settled.add(key)
        batch.failed_moves |= failed
        if failed:
            logger.error("moves failed; originals stay unacknowledged", extra={"message_ids": sorted(failed)})

    def _count_dead_letters(self, batch: BatchTally, tenant: str | None = None) -> None:
        leaving = batch.dead_letters(self.config.max_receive_count, tenant)
        if leaving:
            logger.warning(
                "failed on the last receive: bound for the dead-letter queue", extra={"message_ids": leaving}
            )

    def _flush_processed(self) -> None:
        try:
            self.ports.flush_processed()
        except Exception as exc:  # the records only guard against duplicates; the work is done
            logger.error("idempotency flush failed", extra={"error": str(exc)})

    def _flush_aggregates(self, batch: BatchTally) -> None:
        now = self.ports.clock_ms()
        log_tenant_batches(batch)
        for tenant in batch.lease_until:  # a lapsing lease is never given back: it may be another's by now
            batch.grants.pop(tenant, None)
        self.settlement.settle(batch, self.config.counters_interval_s)
        for role, oldest in batch.oldest.items():
            try:
                self.ports.record_oldest_age(role, oldest, now)
            except Exception as exc:
                logger.warning("health flush failed", extra={"role": role, "error": str(exc)})
        batch.metrics.emit(self.metrics)

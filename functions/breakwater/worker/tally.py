"""What one worker invocation accumulates about its batch, flushed once at the end: the admitted
messages, the buffered moves, the leases granted, the per-tenant counters and the metrics."""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field

from aws_lambda_powertools.utilities.typing import LambdaContext

from breakwater.backlog import will_dead_letter
from breakwater.concurrency import ConcurrencyLimits, Grant
from breakwater.envelope import Envelope
from breakwater.observability import logger
from breakwater.sideline import Move, QueueRole, SidelineDecision, TenantState
from breakwater.worker.metrics import BatchMetrics, MetricRole
from breakwater.worker.record import EnvelopeSqsRecord

# counter name (the tenant's counters item) per outcome
COUNTER = {
    SidelineDecision.PROCESS: "processed",
    SidelineDecision.DROP: "dropped",
    SidelineDecision.SIDELINE: "sidelined",
    SidelineDecision.SPILL: "spilled",
    SidelineDecision.DEFER: "deferred",
}


@dataclass(frozen=True)
class Admitted:
    """A message the rules let through, waiting for the gates and then the processor."""

    record: EnvelopeSqsRecord
    envelope: Envelope
    role: MetricRole  # what its outcome is counted under
    now: int
    state: TenantState


@dataclass
class BatchTally:
    """What one invocation accumulates; flushed once at the end."""

    context: LambdaContext
    admitted: list[Admitted] = field(default_factory=list)
    moves: list[Move] = field(default_factory=list)
    # message id -> (tenant, role, counter, outcome metric or None) of each buffered move
    moved: dict[str, tuple[str, MetricRole, str, str | None]] = field(default_factory=dict)
    grants: dict[str, Grant] = field(default_factory=dict)
    # the tenants' concurrency limits, and when each lapsing floor lease expires (renewed as it goes)
    lease_limits: dict[str, ConcurrencyLimits] = field(default_factory=dict)
    lease_until: dict[str, int] = field(default_factory=dict)
    gated_at: float | None = None  # (monotonic) when the gates were asked: the leases' terms start there
    lease_expires_at: int = 0  # a lease that lasts the invocation (epoch ms)
    counters: dict[str, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))
    metrics: BatchMetrics = field(default_factory=BatchMetrics)
    oldest: dict[QueueRole, int] = field(default_factory=dict)
    # message id -> (tenant, receive count) of every record read as an envelope
    received: dict[str, tuple[str, int]] = field(default_factory=dict)
    # the message ids that may be acknowledged: finished, or their copy sent elsewhere
    settled: set[str] = field(default_factory=set)
    # the moves whose copies could not be sent (their originals stay unacknowledged)
    failed_moves: set[str] = field(default_factory=set)
    # per tenant, the counters already written (with its lease's release, once its messages finished)
    written: dict[str, Counter[str]] = field(default_factory=dict)
    dead_lettered: set[str] = field(default_factory=set)  # the ids counted ``dead_lettered``

    def unwritten(self, tenant: str) -> Counter[str]:
        """The tenant's counters this batch has not written yet: what it counted less what was written,
        negative where a count written ahead (a lapsing lease's ``processed``) did not happen."""
        left = Counter(self.counters.get(tenant, Counter()))
        left.subtract(self.written.get(tenant, Counter()))
        return Counter({name: value for name, value in left.items() if value})

    def count(self, tenant: str, role: MetricRole, counter: str, metric: str | None) -> None:
        self.counters[tenant][counter] += 1
        if metric is not None:
            self.metrics.outcome(role, metric)

    def finished(self, key: str, envelope: Envelope, role: MetricRole, counter: str, metric: str) -> None:
        """Count a message that leaves the system (processed or dropped); ``key`` is its message id.

        A replayed one (``replay_run`` set) also counts ``replayed``: the archiver counted it
        ``archived`` when it parked it, and the backlog estimate must not take it off twice.
        """
        self.count(envelope.tenant, role, counter, metric)
        self.settled.add(key)
        if envelope.replay_run is not None:
            self.counters[envelope.tenant]["replayed"] += 1

    def dead_letters(self, max_receive_count: int | None, tenant: str | None = None) -> list[str]:
        """Count ``dead_lettered`` for every message SQS will move to the dead-letter queue; their ids.

        A message not settled goes back to its queue (a batch item failure, or the whole batch when
        the invocation fails); on its last receive that means the dead-letter queue. One settled is
        acknowledged, or its copy elsewhere is already counted in the estimate; one whose move is
        still buffered is not decided yet. ``tenant``: only that tenant's (its messages are done).
        Each message is counted once.
        """
        if max_receive_count is None:
            return []
        leaving = [
            key
            for key, (owner, receive_count) in self.received.items()
            if (tenant is None or owner == tenant)
            and key not in self.settled
            and key not in self.moved
            and key not in self.dead_lettered
            and will_dead_letter(receive_count, max_receive_count)
        ]
        for key in leaving:
            self.counters[self.received[key][0]]["dead_lettered"] += 1
            self.dead_lettered.add(key)
        return leaving


def log_tenant_batches(batch: BatchTally) -> None:
    """One ``tenant batch`` line per tenant of the batch, every field a scalar, for the per-tenant views
    (Contributor Insights rules and Logs Insights queries, breakwater_cdk/insights.py): the EMF blob's
    ``AgeOfFirstAttemptByTenant`` is a dict, which Contributor Insights cannot aggregate.

    Cheap on purpose: one line per tenant per batch, never one per message, built from what the batch
    already counted; a batch of one tenant's messages is one line. ``first_attempts`` and
    ``first_attempt_age_ms_max`` are about its live messages only (``QueueRole`` live, what the
    ``AgeOfFirstAttemptP99`` alarm reads), 0 when it had none; ``set_aside`` is what was sidelined,
    spilled or deferred instead of processed.
    """
    counted = ("processed", "dropped", "sidelined", "spilled", "deferred", "failed", "dead_lettered")
    live_ages = batch.metrics.first_by_tenant.get("live", {})
    for tenant in sorted(set(batch.counters) | set(live_ages)):
        counts = batch.counters.get(tenant, Counter())
        ages = live_ages.get(tenant, [])
        logger.info(
            "tenant batch",
            extra={
                "tenant": tenant,
                "first_attempts": len(ages),
                "first_attempt_age_ms_max": max(ages, default=0),
                **{name: counts[name] for name in counted},
                "set_aside": counts["sidelined"] + counts["spilled"] + counts["deferred"],
            },
        )

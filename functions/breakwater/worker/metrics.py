"""The EMF metrics of one batch: ages and outcomes per queue role, one blob per role.

CloudWatch takes one dimension set per EMF blob, so the batch's roles go out as one blob each:
every role but the last is flushed here, the last by ``log_metrics`` around the handler.

Replayed work is measured under a role of its own, ``replay`` (:func:`metric_role`): its age runs
from its first enqueue, before it was archived, so counted as live it fed the live p99
``AgeOfFirstAttempt`` alarm with ages that say nothing of how the live queues keep up. Redriven
work (moved back from a dead-letter queue by the redrive) goes under ``redrive`` for the same
reason: its age includes every retry and its time in the dead-letter queue.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from aws_lambda_powertools.metrics import MetricUnit

from breakwater.envelope import Envelope
from breakwater.sideline import QueueRole, SidelineDecision, is_replayed, queue_role

DIMENSION = "QueueRole"
FIRST_ATTEMPT = "AgeOfFirstAttempt"
LATER_ATTEMPT = "AgeOfAttempt"
# The EMF property (not a dimension) with the batch's first-attempt ages per tenant, in ms, beside
# the AgeOfFirstAttempt values of the same blob: per-tenant percentiles come from the logs, at no
# metric cost and no extra log line.
FIRST_ATTEMPT_PROPERTY = "AgeOfFirstAttemptByTenant"

# metric name per outcome
OUTCOME_METRIC = {
    SidelineDecision.PROCESS: "Processed",
    SidelineDecision.DROP: "Dropped",
    SidelineDecision.SIDELINE: "Sidelined",
    SidelineDecision.SPILL: "Spilled",
    SidelineDecision.DEFER: "Deferred",
}
FAILED = "Failed"
DEPENDENCY_UNAVAILABLE = "DependencyUnavailable"  # the processor's dependency was down: the breaker opened

REPLAY: Literal["replay"] = "replay"
REDRIVE: Literal["redrive"] = "redrive"
MetricRole = QueueRole | Literal["replay", "redrive"]


def metric_role(envelope: Envelope, *, redriven: bool = False) -> MetricRole:
    """The ``QueueRole`` dimension of the envelope's metrics: ``redrive`` for a message the redrive
    moved back (its SQS record says so), ``replay`` for replayed work, else its queue role."""
    if redriven:
        return REDRIVE
    return REPLAY if is_replayed(envelope) else queue_role(envelope.origin)


class MetricsSink(Protocol):
    """The part of Powertools' ``Metrics`` the batch writes to."""

    def add_dimension(self, name: str, value: str) -> None: ...

    def add_metric(self, name: str, unit: Any, value: float, resolution: Any = ...) -> None: ...

    def add_metadata(self, key: str, value: Any) -> None: ...

    def flush_metrics(self, raise_on_empty_metrics: bool = ...) -> None: ...


@dataclass
class BatchMetrics:
    """What one batch measured, per metric role (the ``QueueRole`` dimension's value)."""

    ages: dict[str, list[tuple[str, int]]] = field(default_factory=lambda: defaultdict(list))
    outcomes: dict[str, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))
    # per role, tenant -> ages of first attempts: an EMF property (high cardinality), never a dimension
    first_by_tenant: dict[str, dict[str, list[int]]] = field(
        default_factory=lambda: defaultdict(lambda: defaultdict(list))
    )

    def age(self, role: str, tenant: str, age_ms: int, *, first: bool) -> None:
        self.ages[role].append((FIRST_ATTEMPT if first else LATER_ATTEMPT, age_ms))
        if first:
            self.first_by_tenant[role][tenant].append(age_ms)

    def outcome(self, role: str, metric: str) -> None:
        self.outcomes[role][metric] += 1

    def emit(self, sink: MetricsSink) -> None:
        """One blob per role; the last is left to the handler's ``log_metrics``."""
        roles = sorted(set(self.ages) | set(self.outcomes))
        for index, role in enumerate(roles):
            sink.add_dimension(name=DIMENSION, value=role)
            for name, age in self.ages.get(role, []):
                sink.add_metric(name=name, unit=MetricUnit.Milliseconds, value=age)
            for name, count in self.outcomes.get(role, Counter()).items():
                sink.add_metric(name=name, unit=MetricUnit.Count, value=count)
            by_tenant = self.first_by_tenant.get(role)
            if by_tenant:  # a property of this role's blob: searchable in Logs Insights, not a metric
                sink.add_metadata(key=FIRST_ATTEMPT_PROPERTY, value=dict(by_tenant))
            if index < len(roles) - 1:  # one dimension set per EMF blob
                sink.flush_metrics()

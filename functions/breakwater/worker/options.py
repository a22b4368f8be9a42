"""The worker's settings: what it reads from its environment, and the per-tenant limits of its gates."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from breakwater.concurrency import ConcurrencyLimits, counters_interval_s
from breakwater.envelope import Origin
from breakwater.fairness import BucketLimits
from breakwater.settings import TierLimits, WorkerSettings
from breakwater.sideline import DecisionConfig


@dataclass(frozen=True)
class WorkerOptions:
    decision: DecisionConfig
    queue_urls: Mapping[Origin, str]  # destination role -> queue url
    visibility_timeout_s: int
    heartbeat_s: int
    fair_queues: bool = True
    safety_margin_s: float = 2.0
    max_receive_count: int | None = None  # the queues' redrive policy; None: dead letters are not counted
    # The circuit breaker on the processor's dependency (``breakwater.breaker``): its first open window
    # and the longest; None: no breaker, an outage fails the message like any other error.
    outage_backoff_s: float | None = None
    outage_backoff_max_s: float | None = None
    # How long a tenant's counters that ride on no lease release are kept before they are written, so
    # that all the containers that may count a tenant write its counters item at a bounded rate.
    counters_interval_s: float = 0.0

    @classmethod
    def from_settings(cls, settings: WorkerSettings) -> WorkerOptions:
        return cls(
            decision=DecisionConfig(
                mode=settings.worker_mode,
                sidelining_enabled=settings.sidelining_enabled,
                sideline_age_ms=settings.sideline_age_seconds * 1000,
                defer_base_seconds=settings.defer_base_seconds,
                max_defer_seconds=settings.max_defer_seconds,
            ),
            queue_urls={
                Origin.SPILLOVER: settings.spillover_queue_url,
                Origin.BACKLOG: settings.backlog_queue_url,
                Origin.SURGE: settings.surge_queue_url,
            },
            visibility_timeout_s=settings.visibility_timeout_seconds,
            heartbeat_s=settings.heartbeat_seconds,
            fair_queues=settings.fair_queues,
            max_receive_count=settings.max_receive_count,
            outage_backoff_s=settings.outage_backoff_seconds if settings.sidelining_enabled else None,
            outage_backoff_max_s=settings.outage_backoff_max_seconds,
            counters_interval_s=counters_interval_s(settings.worker_containers),
        )


def concurrency_limits(limits: TierLimits) -> ConcurrencyLimits:
    """The tenant's floor and ceiling, clamped to what the design is sized for (a tenant record may
    set either beyond the tier's validated bounds)."""
    return ConcurrencyLimits.clamped(limits.concurrency_floor, limits.concurrency)


def consumer_bucket_limits(limits: TierLimits) -> BucketLimits:
    """The consumer-side bucket: refill ``consumer_rate`` per second, burst one second of it."""
    return BucketLimits(rate=limits.consumer_rate, burst=max(1.0, limits.consumer_rate))

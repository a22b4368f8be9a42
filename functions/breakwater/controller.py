"""The controller, once a minute: backpressure and organic growth per tenant, sideline drainers on health.

Reads the aggregate counters (one item per tenant, flushed by ingest and the workers), turns them
into a backlog estimate and a utilisation, and writes each tenant's inbound multiplier where ingest
reads it (``bucket#ingest``.``multiplier``). Then it looks at the live queues (depth from SQS, oldest
age from the workers' reports) and lets the sideline drainers run only while the live set is
healthy: old work never competes with fresh work for the same workers. Last, a sideline queue whose
oldest message or depth passed the archive budget is handed to the archiver (asynchronously), so no
sidelined backlog grows without bound; its drainer stays off meanwhile. Every decision is a log
line (with the tenant) and the totals are metrics. AWS is reached only through :class:`ControllerPorts`.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from aws_lambda_powertools.metrics import MetricUnit

from breakwater.archive_budget import ArchiveBudget, ArchiveDue, SidelineObservation, archive_due
from breakwater.backpressure import (
    BackpressureConfig,
    LiveHealth,
    MultiplierChange,
    backlog_estimate,
    live_health,
    next_multiplier,
    utilisation,
)
from breakwater.observability import logger, metrics
from breakwater.settings import ControllerSettings, TierLimits


@dataclass(frozen=True)
class TenantSnapshot:
    tenant: str
    limits: TierLimits
    counters: Mapping[str, Any]  # the counters item: ADD counters and the controller's seen_* bookmarks
    multiplier: float = 1.0


@dataclass
class ControllerPorts:
    snapshots: Callable[[], Sequence[TenantSnapshot]]
    set_multiplier: Callable[[str, float], None]
    set_bookmark: Callable[[str, Mapping[str, float]], None]
    live_depth: Callable[[], int]
    live_oldest: Callable[[], tuple[int | None, int | None]]  # (age ms, observed at epoch ms)
    # (enabled, queue URLs held for the archiver) -> the mappings it changed
    set_sideline_enabled: Callable[[bool, frozenset[str]], Iterable[str]]
    sideline_observations: Callable[[], Sequence[SidelineObservation]] = lambda: ()
    start_archiver: Callable[[ArchiveDue], None] | None = None  # None: no archiver configured
    clock_ms: Callable[[], int] = lambda: int(time.time() * 1000)


@dataclass(frozen=True)
class ControllerConfig:
    backpressure: BackpressureConfig
    healthy_age_s: int
    archive_budget: ArchiveBudget = field(default_factory=lambda: ArchiveBudget(age_s=3600, depth=100_000))

    @classmethod
    def from_settings(cls, settings: ControllerSettings) -> ControllerConfig:
        return cls(
            backpressure=BackpressureConfig(
                backlog_target=settings.backlog_target,
                min_multiplier=settings.min_multiplier,
                growth_step=settings.growth_step,
                max_multiplier=settings.max_multiplier,
            ),
            healthy_age_s=settings.healthy_age_seconds,
            archive_budget=ArchiveBudget(age_s=settings.archive_age_seconds, depth=settings.archive_depth),
        )


@dataclass
class ControllerReport:
    multipliers: dict[str, float] = field(default_factory=dict)
    changes: Counter[str] = field(default_factory=Counter)
    backlogs: dict[str, int] = field(default_factory=dict)
    health: LiveHealth | None = None
    sideline_enabled: bool = False
    mappings_changed: list[str] = field(default_factory=list)
    archiving: list[ArchiveDue] = field(default_factory=list)


def _number(counters: Mapping[str, Any], name: str) -> float:
    return float(counters.get(name, 0) or 0)


def run_controller(config: ControllerConfig, ports: ControllerPorts) -> ControllerReport:
    report = ControllerReport()
    now = ports.clock_ms()
    for snapshot in ports.snapshots():
        counters = snapshot.counters
        backlog = backlog_estimate(counters)
        seen_at = counters.get("seen_at")
        elapsed = (now - float(seen_at)) / 1000 if seen_at is not None else 0.0
        used = utilisation(
            accepted_delta=_number(counters, "accepted") - _number(counters, "seen_accepted"),
            throttled_delta=_number(counters, "throttled") - _number(counters, "seen_throttled"),
            elapsed_s=elapsed,
            limit_rate=snapshot.limits.rate * snapshot.multiplier,
        )
        if seen_at is None:
            used = 0.0  # first sight of this tenant: no interval to measure yet
        decision = next_multiplier(snapshot.multiplier, backlog, used, config.backpressure)
        if decision.multiplier != snapshot.multiplier:
            ports.set_multiplier(snapshot.tenant, decision.multiplier)
        ports.set_bookmark(
            snapshot.tenant,
            {
                "accepted": _number(counters, "accepted"),
                "throttled": _number(counters, "throttled"),
                "at": now,
            },
        )
        report.multipliers[snapshot.tenant] = decision.multiplier
        report.backlogs[snapshot.tenant] = backlog
        report.changes[decision.change.value] += 1
        if decision.change is not MultiplierChange.HOLD or decision.multiplier != 1.0:
            logger.info(
                "tenant multiplier",
                extra={
                    "tenant": snapshot.tenant,
                    "change": decision.change.value,
                    "multiplier": decision.multiplier,
                    "previous_multiplier": snapshot.multiplier,
                    "backlog": backlog,
                    "utilisation": round(used, 3),
                },
            )

    depth = ports.live_depth()
    oldest_ms, observed_at = ports.live_oldest()
    health = live_health(depth, oldest_ms, observed_at, now, config.healthy_age_s)
    report.health = health
    report.sideline_enabled = health.healthy
    # A sideline queue past its archive budget belongs to the archiver until the next run: its drainer
    # stays off, or it would feed the live workers the very backlog the budget says to park (and race
    # the archiver for it). The replay brings it back later at a rate the live system can take.
    due = (
        archive_due(ports.sideline_observations(), config.archive_budget, now)
        if ports.start_archiver is not None
        else []
    )
    held = frozenset(d.queue_url for d in due)
    report.mappings_changed = list(ports.set_sideline_enabled(health.healthy, held))
    logger.info(
        "live health",
        extra={
            "depth": health.depth,
            "oldest_age_s": health.oldest_age_s,
            "healthy": health.healthy,
            "sideline_enabled": health.healthy,
            "held_for_archive": sorted(held),
            "mappings_changed": report.mappings_changed,
        },
    )
    report.archiving = _start_archiving(ports, due)
    _emit_metrics(report)
    return report


def _start_archiving(ports: ControllerPorts, queues: Sequence[ArchiveDue]) -> list[ArchiveDue]:
    """Start the archiver for each sideline queue past its budget; a failed start is retried next run."""
    started: list[ArchiveDue] = []
    if ports.start_archiver is None:
        return started
    for due in queues:
        extra = {
            "role": due.role,
            "reason": due.reason.value,
            "depth": due.depth,
            "oldest_age_s": due.oldest_age_s,
        }
        try:
            ports.start_archiver(due)
        except Exception as exc:  # the other decisions of this run stand
            logger.error("archiver start failed", extra=extra | {"error": str(exc)})
            continue
        logger.info("sideline queue past its archive budget: archiver started", extra=extra)
        started.append(due)
    return started


def _emit_metrics(report: ControllerReport) -> None:
    assert report.health is not None
    metrics.add_metric(name="LiveDepth", unit=MetricUnit.Count, value=report.health.depth)
    if report.health.oldest_age_s is not None:
        metrics.add_metric(name="LiveOldestAge", unit=MetricUnit.Seconds, value=report.health.oldest_age_s)
    metrics.add_metric(name="SidelineEnabled", unit=MetricUnit.Count, value=int(report.sideline_enabled))
    metrics.add_metric(name="TenantsThrottled", unit=MetricUnit.Count, value=report.changes["throttle"])
    metrics.add_metric(name="TenantsReleased", unit=MetricUnit.Count, value=report.changes["release"])
    metrics.add_metric(name="TenantsGrown", unit=MetricUnit.Count, value=report.changes["grow"])
    metrics.add_metric(name="ArchiverStarts", unit=MetricUnit.Count, value=len(report.archiving))

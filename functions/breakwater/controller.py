"""The controller, once a minute: backpressure and organic growth per tenant, sideline drainers on health.

A scheduled run first looks at the live queues (depth from SQS, oldest age from the workers' reports)
and lets the sideline drainers run only while the live set is healthy: old work never competes with
fresh work for the same workers. A sideline queue whose oldest message or depth passed the archive
budget is handed to the archiver (asynchronously), so no sidelined backlog grows without bound; its
drainer stays off meanwhile.

Then the tenants, and only those that changed: every counter write marks its tenant in one of
:data:`~breakwater.backlog.DIRTY_SHARDS` shards, and the controller reads the marked tenants of each
shard, page by page. For each it corrects the backlog estimate (:mod:`breakwater.backlog`), decides
the inbound multiplier, writes the multiplier where ingest reads it (``bucket#ingest``) only when it
changed, stores its estimate and clears the mark (one write), and adds what changed to the shard's
ledger, the sum of its tenants' estimates. A throttled tenant stays marked, so it is looked at every
run until released.
A run that reaches its deadline leaves a cursor in the shard and the next run resumes there; with
``invocations`` above 1 the scheduled run hands groups of shards to other invocations of itself and
waits for them. Last, the sum of all ledgers is reconciled with the observed depth of every queue.

Every decision is a log line (with the tenant) and the totals are metrics. AWS is reached only
through :class:`ControllerPorts`.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

from aws_lambda_powertools.metrics import MetricUnit

from breakwater.archive_budget import ArchiveBudget, ArchiveDue, SidelineObservation, archive_due
from breakwater.backlog import (
    DIRTY_SHARDS,
    Correction,
    DriftLimits,
    Ledger,
    Reconciliation,
    RunState,
    StoredEstimate,
    evaluate,
    reconcile,
    shard_groups,
)
from breakwater.backpressure import (
    BackpressurePolicy,
    LiveHealth,
    MultiplierChange,
    live_health,
    next_multiplier,
    utilisation,
)
from breakwater.observability import logger, metrics
from breakwater.settings import ControllerSettings, TierLimits
from breakwater.shard_report import ShardReport
from breakwater.tenant_depth import ObservedDepths, tenant_depth

PAGE_SIZE = 99
"""Tenants per page: their updates and the shard's ledger fit one TransactWriteItems (100 items)."""


class TenantSnapshot(NamedTuple):
    """A tenant's counters item as read (a named tuple, as the others built for every changed tenant)."""

    tenant: str
    limits: TierLimits | None  # None: no active tenant record, so only its estimate is kept
    counters: Mapping[str, Any]  # the counters item: ADD counters and the controller's own attributes
    multiplier: float = 1.0


class TenantWrite(NamedTuple):
    """What the controller stores on a tenant's counters item after evaluating it.

    A named tuple, not a frozen dataclass: one is built for every changed tenant of every run, and a
    frozen dataclass costs several times as much to build (each field set through ``object``).
    """

    tenant: str
    seen: Mapping[str, float]  # bookmarks for the next utilisation: accepted, throttled, at
    stored: StoredEstimate
    multiplier: float
    multiplier_changed: bool  # then ingest's bucket gets it too, before the counters item
    writes: float | None  # the writers' change count as read: the mark is cleared only if unchanged
    keep_dirty: bool
    ledger_delta: float  # what this write changes in the shard's ledger


@dataclass(frozen=True)
class ShardState:
    """A shard held by this run: its ledger, the ledger's version, where the last run stopped."""

    shard: int
    ledger: Ledger
    version: int
    cursor: str | None = None


@dataclass(frozen=True)
class ShardRequest:
    """What every shard run of one scheduled run shares (passed in the event of a fanned-out one)."""

    depth: int  # observed total of the live, surge and sideline queues
    scale_log: float
    now_ms: int
    deadline_ms: int
    resume_shard: int = 0  # the first shard to work: where the last run ran out of time
    live_depths: tuple[int, ...] = ()  # each live queue's part of ``depth``; () when not observed

    def as_event(self, shards: Sequence[int]) -> dict[str, Any]:
        return {
            "shards": list(shards),
            "depth": self.depth,
            "scale_log": self.scale_log,
            "now_ms": self.now_ms,
            "deadline_ms": self.deadline_ms,
            "resume_shard": self.resume_shard,
            "live_depths": list(self.live_depths),
        }

    def tenant_depth(self, tenant: str, shard_size: int | None) -> int:
        """The depth the tenant's estimate is capped by: its own queues' where known, else the total."""
        own = tenant_depth(tenant, self.live_depths, self.depth - sum(self.live_depths), shard_size)
        return self.depth if own is None else min(own, self.depth)

    @classmethod
    def from_event(cls, event: Mapping[str, Any], deadline_ms: int) -> ShardRequest:
        return cls(
            depth=int(event["depth"]),
            scale_log=float(event["scale_log"]),
            now_ms=int(event["now_ms"]),
            deadline_ms=min(deadline_ms, int(event.get("deadline_ms", deadline_ms))),
            resume_shard=int(event.get("resume_shard", 0)),
            live_depths=tuple(int(depth) for depth in event.get("live_depths") or ()),
        )


@dataclass
class ControllerPorts:
    # queues, mappings, the archiver
    live_depth: Callable[[], int]
    live_oldest: Callable[[], tuple[int | None, int | None]]  # (age ms, observed at epoch ms)
    # (enabled, queue URLs held for the archiver) -> the mappings it changed
    set_sideline_enabled: Callable[[bool, frozenset[str]], Iterable[str]]
    observed_depth: Callable[[], int]  # every message still in the system: live, surge, sideline
    # the controller's state: the reconciliations' running scale, shards and their ledgers
    read_run_state: Callable[[], RunState]
    write_run_state: Callable[[RunState], None]
    claim_shard: Callable[[int, int, int], ShardState | None]  # (shard, now, held until) -> None if busy
    # (shard, cursor, limit) -> (tenants, cursor of the next page or None at the end)
    dirty_tenants: Callable[[int, str | None, int], tuple[Sequence[str], str | None]]
    read_tenants: Callable[[Sequence[str]], Sequence[TenantSnapshot]]
    # (state, the page's writes) -> the state after (its ledger plus what landed), None if no longer ours
    commit: Callable[[ShardState, Sequence[TenantWrite]], ShardState | None]
    release_shard: Callable[[ShardState, str | None], None]
    read_ledgers: Callable[[Sequence[int]], Mapping[int, Ledger]]
    sideline_observations: Callable[[], Sequence[SidelineObservation]] = lambda: ()
    # until when (epoch ms) the workers' breakers last reported the processor's dependency down
    dependency_down_until: Callable[[], int | None] = lambda: None
    start_archiver: Callable[[ArchiveDue], None] | None = None  # None: no archiver configured
    # (groups of shards, request) -> their reports; None: every shard runs in this invocation
    run_elsewhere: Callable[[Sequence[Sequence[int]], ShardRequest], Sequence[ShardReport]] | None = None
    clock_ms: Callable[[], int] = lambda: int(time.time() * 1000)
    # the same messages as ``observed_depth``, each live queue apart: each tenant's estimate is then
    # capped by its own queues (breakwater.tenant_depth); None: by the total only
    queue_depths: Callable[[], ObservedDepths] | None = None


@dataclass(frozen=True)
class ControllerConfig:
    backpressure: BackpressurePolicy
    healthy_age_s: int
    archive_budget: ArchiveBudget = field(default_factory=lambda: ArchiveBudget(age_s=3600, depth=100_000))
    drift: DriftLimits = field(default_factory=DriftLimits)
    invocations: int = 1  # shard groups per scheduled run, each in an invocation of its own
    parallel_shards: int = 4  # shards an invocation works at once (the calls wait on the network)
    reconcile_margin_ms: int = 3_000  # left after the shards for the reconciliation
    lease_slack_ms: int = 5_000  # a shard is held this long past the deadline: until the invocation ends
    shard_size: int | None = None  # ingest's live queues per tenant; None: estimates capped by the total

    @classmethod
    def from_settings(cls, settings: ControllerSettings) -> ControllerConfig:
        return cls(
            backpressure=BackpressurePolicy(
                backlog_target=settings.backlog_target,
                min_multiplier=settings.min_multiplier,
                growth_step=settings.growth_step,
                max_multiplier=settings.max_multiplier,
            ),
            healthy_age_s=settings.healthy_age_seconds,
            archive_budget=ArchiveBudget(age_s=settings.archive_age_seconds, depth=settings.archive_depth),
            drift=DriftLimits(minimum=settings.drift_tolerance, fraction=settings.drift_tolerance_fraction),
            invocations=settings.controller_invocations,
            parallel_shards=settings.parallel_shards,
            shard_size=settings.shard_size,
        )


@dataclass
class ControllerReport:
    multipliers: dict[str, float] = field(default_factory=dict)
    changes: Counter[str] = field(default_factory=Counter)
    backlogs: dict[str, int] = field(default_factory=dict)
    health: LiveHealth | None = None
    sideline_enabled: bool = False
    dependency_down: bool = False
    mappings_changed: list[str] = field(default_factory=list)
    archiving: list[ArchiveDue] = field(default_factory=list)
    shards: ShardReport = field(default_factory=ShardReport)
    reconciliation: Reconciliation | None = None


def _number(counters: Mapping[str, Any], name: str) -> float:
    return float(counters.get(name, 0) or 0)


def run_controller(config: ControllerConfig, ports: ControllerPorts, deadline_ms: int) -> ControllerReport:
    """The scheduled run: live health and the drainers, the archiver, every shard, the reconciliation."""
    report = ControllerReport()
    now = ports.clock_ms()
    _gate_sideline(config, ports, now, report)
    state = ports.read_run_state()
    observed = ports.queue_depths() if ports.queue_depths is not None else None
    request = ShardRequest(
        depth=observed.total if observed is not None else ports.observed_depth(),
        scale_log=state.scale_log,
        now_ms=now,
        deadline_ms=deadline_ms - config.reconcile_margin_ms,
        resume_shard=state.resume_shard,
        live_depths=observed.live if observed is not None else (),
    )
    groups = shard_groups(config.invocations)
    here, elsewhere = groups[0], groups[1:]
    if elsewhere and ports.run_elsewhere is None:
        here, elsewhere = [shard for group in groups for shard in group], []
    with ThreadPoolExecutor(max_workers=1) as pool:
        remote = (
            pool.submit(ports.run_elsewhere, elsewhere, request)
            if elsewhere and ports.run_elsewhere
            else None
        )
        report.shards = run_shards(config, ports, here, request)
        for other in remote.result() if remote is not None else ():
            report.shards.merge(other)
    report.multipliers = report.shards.multipliers
    report.backlogs = report.shards.backlogs
    report.changes = report.shards.changes
    unfinished = report.shards.pending + report.shards.busy + report.shards.failed
    after = replace(state, resume_shard=report.shards.pending[0] if report.shards.pending else 0)
    if unfinished:
        # Some ledgers still hold estimates older than the depth: comparing them would be guesswork.
        logger.warning(
            "shards left for the next run: no reconciliation", extra={"shards": sorted(unfinished)}
        )
    else:
        report.reconciliation = _reconcile(config, ports, request, after)
        after = report.reconciliation.state
    if after != state:
        ports.write_run_state(after)
    _emit_metrics(report)
    return report


def _gate_sideline(
    config: ControllerConfig, ports: ControllerPorts, now: int, report: ControllerReport
) -> None:
    depth = ports.live_depth()
    oldest_ms, observed_at = ports.live_oldest()
    health = live_health(depth, oldest_ms, observed_at, now, config.healthy_age_s)
    report.health = health
    # While the workers report the dependency down, draining the sideline would only cycle its messages
    # through the drainers' breakers: it waits, and the live queues get the dependency first when it is back.
    down_until = ports.dependency_down_until()
    report.dependency_down = down_until is not None and down_until > now
    report.sideline_enabled = health.healthy and not report.dependency_down
    # A sideline queue past its archive budget belongs to the archiver until the next run: its drainer
    # stays off, or it would feed the live workers the very backlog the budget says to park (and race
    # the archiver for it). The replay brings it back later at a rate the live system can take.
    due = (
        archive_due(ports.sideline_observations(), config.archive_budget, now)
        if ports.start_archiver is not None
        else []
    )
    held = frozenset(d.queue_url for d in due)
    report.mappings_changed = list(ports.set_sideline_enabled(report.sideline_enabled, held))
    logger.info(
        "live health",
        extra={
            "depth": health.depth,
            "oldest_age_s": health.oldest_age_s,
            "healthy": health.healthy,
            "sideline_enabled": report.sideline_enabled,
            "dependency_down": report.dependency_down,
            "held_for_archive": sorted(held),
            "mappings_changed": report.mappings_changed,
        },
    )
    report.archiving = _start_archiving(ports, due)


def _reconcile(
    config: ControllerConfig, ports: ControllerPorts, request: ShardRequest, previous: RunState
) -> Reconciliation:
    ledgers = ports.read_ledgers(range(DIRTY_SHARDS))
    result = reconcile(list(ledgers.values()), request.depth, previous, config.drift)
    extra = {
        "total_estimate": round(result.total_estimate, 1),
        "depth": result.depth,
        "tolerance": round(result.tolerance, 1),
        "scale": result.scale,
    }
    if result.scale < 1.0:
        logger.warning("backlog estimates drifted above the queues' depth: scaled down", extra=extra)
    else:
        logger.info("backlog estimates reconciled", extra=extra)
    return result


def run_shards(
    config: ControllerConfig, ports: ControllerPorts, shards: Sequence[int], request: ShardRequest
) -> ShardReport:
    """The changed tenants of ``shards``, a few shards at a time, until done or the deadline."""
    report = ShardReport()
    if not shards:
        return report
    # From where the last run ran out of time, so that the same shards are never the ones left behind.
    first = next((i for i, shard in enumerate(shards) if shard >= request.resume_shard), 0)
    ordered = [*shards[first:], *shards[:first]]
    workers = max(1, min(config.parallel_shards, len(shards)))
    if workers == 1:
        # One shard at a time: a thread would only hand each shard over and back, in the same order.
        # A shard that raises ends the run here, as the pool's map cancels the shards not yet started.
        # Each shard adds to the run's report itself: merging a report per shard would only copy it.
        for shard in ordered:
            _run_shard(config, ports, shard, request, report)
        return report
    with ThreadPoolExecutor(max_workers=workers) as pool:
        for part in pool.map(lambda shard: _run_shard(config, ports, shard, request), ordered):
            report.merge(part)
    return report


def _run_shard(
    config: ControllerConfig,
    ports: ControllerPorts,
    shard: int,
    request: ShardRequest,
    report: ShardReport | None = None,
) -> ShardReport:
    """One shard's changed tenants, added to ``report`` (a new one when None), which is returned."""
    if report is None:
        report = ShardReport()
    now = ports.clock_ms()
    if now >= request.deadline_ms:
        report.pending.append(shard)
        return report
    claimed = ports.claim_shard(shard, now, request.deadline_ms + config.lease_slack_ms)
    if claimed is None:
        report.busy.append(shard)
        return report
    # The ledger as of this run's scale: every tenant delta of this run is computed at it.
    # A new state, not ``replace``: that looks the dataclass's fields up for every shard of every run.
    ledger = Ledger(claimed.ledger.at(request.scale_log), request.scale_log)
    state = ShardState(claimed.shard, ledger, claimed.version, claimed.cursor)
    cursor = state.cursor
    try:
        while True:
            if ports.clock_ms() >= request.deadline_ms:
                report.pending.append(shard)
                break
            tenants, next_cursor = ports.dirty_tenants(shard, cursor, PAGE_SIZE)
            if tenants:
                writes = [
                    _evaluate_tenant(config, snapshot, request, report)
                    for snapshot in ports.read_tenants(tenants)
                ]
                committed = ports.commit(state, writes) if writes else state
                if committed is None:  # another run took the shard over: its ledger is not ours to write
                    report.failed.append(shard)
                    return report
                state = committed
            cursor = next_cursor
            if cursor is None:
                break
    except Exception as exc:  # the shard's ledger and marks stay as last committed; the next run goes on
        logger.exception("shard failed", extra={"shard": shard, "error": str(exc)})
        report.failed.append(shard)
    try:
        ports.release_shard(state, cursor)
    except Exception as exc:  # the lease runs out on its own; the cursor is lost, the marks are not
        logger.error("shard release failed", extra={"shard": shard, "error": str(exc)})
    return report


def _evaluate_tenant(
    config: ControllerConfig, snapshot: TenantSnapshot, request: ShardRequest, report: ShardReport
) -> TenantWrite:
    counters = snapshot.counters
    estimate = evaluate(
        counters,
        StoredEstimate.from_item(counters),
        depth=request.tenant_depth(snapshot.tenant, config.shard_size),
        scale_log=request.scale_log,
        limits=config.drift,
    )
    multiplier = snapshot.multiplier
    report.evaluated += 1
    report.backlogs[snapshot.tenant] = estimate.backlog
    if estimate.correction is not Correction.NONE:
        report.corrections[estimate.correction.value] += 1
        logger.info(
            "backlog estimate corrected",
            extra={
                "tenant": snapshot.tenant,
                "correction": estimate.correction.value,
                "backlog": estimate.backlog,
                "offset": round(estimate.stored.offset, 1),
            },
        )
    if snapshot.limits is not None:
        multiplier = _decide(config, snapshot, estimate.backlog, request.now_ms, report)
    # A throttled tenant is looked at until released, a grown one until its growth is given back:
    # neither may have a counter write to mark it again.
    keep_dirty = multiplier != 1.0
    report.kept_dirty += int(keep_dirty)
    return TenantWrite(
        tenant=snapshot.tenant,
        seen={
            "accepted": _number(counters, "accepted"),
            "throttled": _number(counters, "throttled"),
            "at": request.now_ms,
        },
        stored=estimate.stored,
        multiplier=multiplier,
        multiplier_changed=not math.isclose(multiplier, snapshot.multiplier),
        writes=float(counters["writes"]) if "writes" in counters else None,
        keep_dirty=keep_dirty,
        ledger_delta=estimate.ledger_delta,
    )


def _decide(
    config: ControllerConfig, snapshot: TenantSnapshot, backlog: int, now: int, report: ShardReport
) -> float:
    """The tenant's multiplier for the next minute (written where ingest reads it only when it changed)."""
    assert snapshot.limits is not None
    counters = snapshot.counters
    seen_at = counters.get("seen_at")
    elapsed = (now - float(seen_at)) / 1000 if seen_at is not None else 0.0
    used = (
        utilisation(
            accepted_delta=_number(counters, "accepted") - _number(counters, "seen_accepted"),
            elapsed_s=elapsed,
            limit_rate=snapshot.limits.rate * snapshot.multiplier,
        )
        if seen_at is not None
        else None  # first sight of this tenant: no interval to measure yet
    )
    decision = next_multiplier(snapshot.multiplier, backlog, used, config.backpressure)
    report.multipliers[snapshot.tenant] = decision.multiplier
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
                "utilisation": round(used, 3) if used is not None else None,
            },
        )
    return decision.multiplier


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
    metrics.add_metric(name="TenantsShrunk", unit=MetricUnit.Count, value=report.changes["shrink"])
    metrics.add_metric(name="ArchiverStarts", unit=MetricUnit.Count, value=len(report.archiving))
    metrics.add_metric(name="TenantsEvaluated", unit=MetricUnit.Count, value=report.shards.evaluated)
    metrics.add_metric(name="ShardsPending", unit=MetricUnit.Count, value=len(report.shards.pending))
    metrics.add_metric(
        name="BacklogCorrections", unit=MetricUnit.Count, value=sum(report.shards.corrections.values())
    )
    if report.reconciliation is not None:
        metrics.add_metric(name="BacklogDrift", unit=MetricUnit.Count, value=report.reconciliation.drift)
        metrics.add_metric(
            name="BacklogScaledDown", unit=MetricUnit.Count, value=int(report.reconciliation.scale < 1.0)
        )

"""When a sideline queue must be parked in S3: its oldest message or its depth past the budget.

Sidelined traffic must never become an insurmountable backlog. The controller compares each sideline
queue (spillover, backlog) with the archive budget once a minute and starts the archiver for the
queues that passed it; the replay job brings the parked messages back later, at a rate the live
system can take. Pure: the controller's ports supply the observations.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum


class ArchiveReason(Enum):
    AGE = "age"
    DEPTH = "depth"


@dataclass(frozen=True)
class SidelineObservation:
    """One sideline queue as the controller sees it."""

    role: str  # spillover | backlog (the workers' health item is queue#<role>)
    queue_url: str
    depth: int  # messages waiting: visible plus delayed (in flight ones are being worked or archived)
    oldest_age_ms: int | None = None  # the maximum oldest age workers reported in their last window
    observed_at_ms: int | None = None


@dataclass(frozen=True)
class ArchiveBudget:
    age_s: int
    depth: int
    # An age report older than this says nothing about the queue now (workers report every batch).
    freshness_s: int = 120


@dataclass(frozen=True)
class ArchiveDue:
    role: str
    queue_url: str
    reason: ArchiveReason
    depth: int
    oldest_age_s: float | None


def archive_due(
    observations: Iterable[SidelineObservation], budget: ArchiveBudget, now_ms: int
) -> list[ArchiveDue]:
    """The queues to archive now, in the order observed; an empty queue never is.

    Age is what the sideline workers observed, so it is known only while the drainers run (while the
    live set is healthy); with the drainers off, depth is the budget that still holds.
    """
    due = []
    for seen in observations:
        if seen.depth <= 0:
            continue
        age_s = _fresh_age_s(seen, budget, now_ms)
        if age_s is not None and age_s >= budget.age_s:
            due.append(ArchiveDue(seen.role, seen.queue_url, ArchiveReason.AGE, seen.depth, age_s))
        elif seen.depth >= budget.depth:
            due.append(ArchiveDue(seen.role, seen.queue_url, ArchiveReason.DEPTH, seen.depth, age_s))
    return due


def _fresh_age_s(seen: SidelineObservation, budget: ArchiveBudget, now_ms: int) -> float | None:
    if seen.oldest_age_ms is None or seen.observed_at_ms is None:
        return None
    if now_ms - seen.observed_at_ms > budget.freshness_s * 1000:
        return None
    return seen.oldest_age_ms / 1000

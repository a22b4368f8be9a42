"""What a controller run did with its shards: counts, and the shards it left for the next run.

A fanned-out invocation returns :meth:`ShardReport.summary` and the scheduled run merges it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass
class ShardReport:
    evaluated: int = 0
    kept_dirty: int = 0
    changes: Counter[str] = field(default_factory=Counter)
    corrections: Counter[str] = field(default_factory=Counter)
    pending: list[int] = field(default_factory=list)  # stopped at the deadline: resumes next run
    busy: list[int] = field(default_factory=list)  # held by another run
    failed: list[int] = field(default_factory=list)
    multipliers: dict[str, float] = field(default_factory=dict)  # evaluated here (not fanned out)
    backlogs: dict[str, int] = field(default_factory=dict)

    def merge(self, other: ShardReport) -> None:
        self.evaluated += other.evaluated
        self.kept_dirty += other.kept_dirty
        self.changes.update(other.changes)
        self.corrections.update(other.corrections)
        self.pending += other.pending
        self.busy += other.busy
        self.failed += other.failed
        self.multipliers |= other.multipliers
        self.backlogs |= other.backlogs

    def summary(self) -> dict[str, Any]:
        """The counts, as a fanned-out invocation returns them (no per-tenant maps)."""
        return {
            "evaluated": self.evaluated,
            "kept_dirty": self.kept_dirty,
            "changes": dict(self.changes),
            "corrections": dict(self.corrections),
            "pending": sorted(self.pending),
            "busy": sorted(self.busy),
            "failed": sorted(self.failed),
        }

    @classmethod
    def from_summary(cls, summary: Mapping[str, Any]) -> ShardReport:
        return cls(
            evaluated=int(summary.get("evaluated", 0)),
            kept_dirty=int(summary.get("kept_dirty", 0)),
            changes=Counter(summary.get("changes") or {}),
            corrections=Counter(summary.get("corrections") or {}),
            pending=list(summary.get("pending") or []),
            busy=list(summary.get("busy") or []),
            failed=list(summary.get("failed") or []),
        )

"""When a worker container writes the oldest age it saw for a queue role (the health item's report).

The health item keeps the maximum reported in its window (``breakwater.aws.health.record_oldest_age``),
and the controller reads it once a minute and judges it in whole seconds (``healthy_age_seconds``).
So a report not ``rise_ms`` above this container's last one for the role, made less than
``interval_ms`` after it, adds nothing the controller would read: skipping it saves a DynamoDB write
per batch. An age risen by ``rise_ms`` or more is news (the live set may be falling behind) and is
always written. Without the margin, ages that creep up by a few milliseconds from batch to batch (a
steady queue) were written on every batch.

Everything here is pure; ``now`` is injected and the write is a callable.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

REPORT_INTERVAL_MS = 5_000  # a container writes a role's age at most this often, unless it rose
RISE_MS = 1_000  # ... by at least this much over its last write


@dataclass(frozen=True)
class LastReport:
    age_ms: int
    at_ms: int


def report_due(
    last: LastReport | None,
    oldest_age_ms: int,
    now_ms: int,
    *,
    interval_ms: int = REPORT_INTERVAL_MS,
    rise_ms: int = RISE_MS,
) -> bool:
    """Whether ``oldest_age_ms`` observed at ``now_ms`` is worth a write after the ``last`` one."""
    if last is None:
        return True
    return oldest_age_ms >= last.age_ms + rise_ms or now_ms - last.at_ms >= interval_ms


class ThrottledAgeReports:
    """One container's health writes: ``write`` is called only when :func:`report_due` says so.

    Called as ``reports(role, oldest_age_ms, now_ms)``; returns what ``write`` returned, or False
    when the report was skipped.
    """

    def __init__(
        self,
        write: Callable[[str, int, int], bool],
        interval_ms: int = REPORT_INTERVAL_MS,
        rise_ms: int = RISE_MS,
    ) -> None:
        self._write = write
        self._interval_ms = interval_ms
        self._rise_ms = rise_ms
        self._last: dict[str, LastReport] = {}

    def __call__(self, role: str, oldest_age_ms: int, now_ms: int) -> bool:
        due = report_due(
            self._last.get(role), oldest_age_ms, now_ms, interval_ms=self._interval_ms, rise_ms=self._rise_ms
        )
        if not due:
            return False
        self._last[role] = LastReport(oldest_age_ms, now_ms)
        return self._write(role, oldest_age_ms, now_ms)

"""When a worker container writes the oldest age it saw for a queue role (the health item's report).

The health item keeps the maximum reported in its window (``breakwater.aws.health.raise_oldest_age``),
and the controller reads it once a minute and judges it in whole seconds (``healthy_age_seconds``).
So a report not ``rise_ms`` above this container's last one for the role, made less than
``interval_ms`` after it, adds nothing the controller would read: skipping it saves a DynamoDB write
per batch. An age risen by ``rise_ms`` or more is news (the live set may be falling behind) and is
always written. Without the margin, ages that creep up by a few milliseconds from batch to batch (a
steady queue) were written on every batch.

A write answers with the report the item stands on: this one, or a larger one within its window that
another container made (the write's condition failed, and a failed conditional write still costs its
write units). Until that report's window closes, a report no larger than it would fail the same way,
so it is not made: at low load, when every container's ages are small and alike, most reports were.
Every container of a shard learns the same report, so each resumes its reports at its own offset into
the interval after that window closes (:func:`resume_offset_ms`), not all in the same second.

Everything here is pure; ``now`` is injected and the write is a callable.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from dataclasses import dataclass

REPORT_INTERVAL_MS = 5_000  # a container writes a role's age at most this often, unless it rose
RISE_MS = 1_000  # ... by at least this much over its last write
WINDOW_MS = 60_000  # the health item keeps the maximum reported within this long of its report


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
    """One container's health writes: ``write`` is called only when :func:`report_due` says so, and
    not while a report it learnt stands on the item is at least as large (:func:`stands_above`).

    Called as ``reports(role, oldest_age_ms, now_ms)``; returns whether the report was written.
    ``write(role, oldest_age_ms, now_ms)`` returns the report the item stands on after it: the one
    given if it was written, else the larger one that stood.
    """

    def __init__(
        self,
        write: Callable[[str, int, int], LastReport],
        interval_ms: int = REPORT_INTERVAL_MS,
        rise_ms: int = RISE_MS,
        window_ms: int = WINDOW_MS,
        offset_ms: int = 0,
    ) -> None:
        self._write = write
        self._interval_ms = interval_ms
        self._rise_ms = rise_ms
        self._window_ms = window_ms
        self._offset_ms = offset_ms  # how long after a standing report's window it reports again
        self._last: dict[str, LastReport] = {}
        self._standing: dict[str, LastReport] = {}  # per role: the item's report as last learnt

    def __call__(self, role: str, oldest_age_ms: int, now_ms: int) -> bool:
        if stands_above(self._standing.get(role), oldest_age_ms, now_ms - self._offset_ms, self._window_ms):
            return False
        due = report_due(
            self._last.get(role), oldest_age_ms, now_ms, interval_ms=self._interval_ms, rise_ms=self._rise_ms
        )
        if not due:
            return False
        report = LastReport(oldest_age_ms, now_ms)
        self._last[role] = report
        standing = self._standing[role] = self._write(role, oldest_age_ms, now_ms)
        return standing == report


def stands_above(
    standing: LastReport | None, oldest_age_ms: int, now_ms: int, window_ms: int = WINDOW_MS
) -> bool:
    """Whether the item's ``standing`` report (as last learnt) makes a report of ``oldest_age_ms`` at
    ``now_ms`` fail: a larger age whose window is still open (the item's maximum only rises within it;
    the write's condition lets a report replace one observed more than ``window_ms`` before it)."""
    return standing is not None and standing.age_ms > oldest_age_ms and now_ms <= standing.at_ms + window_ms


def resume_offset_ms(holder: str, interval_ms: int = REPORT_INTERVAL_MS) -> int:
    """A container's offset into the report interval (from its id, stable across processes): the
    containers that learnt one standing report then resume over the interval once its window closes,
    as their reports are spread by it otherwise, instead of writing its shard in the same instant."""
    return zlib.crc32(f"{holder}/age-reports".encode()) % interval_ms

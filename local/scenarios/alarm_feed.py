"""``python -m local serve`` prints the stack's alarm transitions as they happen.

Every :data:`INTERVAL_S` the feed samples the queue gauges (:class:`local.emulator.alarms.AlarmWatch`),
evaluates every alarm of the template over a recent window, and prints each alarm whose state
changed since it last printed it. The window keeps each evaluation's cost flat however long the
server runs; an alarm already in ALARM when a window starts is not news, since the feed remembers
the state it printed.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from local.emulator.alarms import ALARM, AlarmReport

INTERVAL_S = 5.0
WINDOW_PERIODS = 30  # of the longest alarm period: wider than any alarm's M-of-N looks back


class Watch(Protocol):
    started_at: float

    def sample(self, now: float | None = None) -> None: ...

    def evaluate(
        self, end_s: float | None = None, time_scale: float = 1.0, start_s: float = 0.0
    ) -> AlarmReport: ...


class AlarmFeed:
    """The printed state of every alarm, and what changed at each step."""

    def __init__(
        self, watch: Watch, time_scale: float, window_s: float, emit: Callable[[str], None] = print
    ) -> None:
        self.watch = watch
        self.time_scale = time_scale
        self.window_s = window_s
        self.emit = emit
        self.states: dict[str, str] = {}  # alarm -> the state last printed (OK unless printed otherwise)

    def step(self, now: float | None = None) -> list[str]:
        """Sample, evaluate the recent window, print and return the lines of the alarms that changed."""
        now = time.time() if now is None else now
        self.watch.sample(now)
        end = now - self.watch.started_at
        report = self.watch.evaluate(end, time_scale=self.time_scale, start_s=max(0.0, end - self.window_s))
        latest: dict[str, dict[str, Any]] = {}
        for transition in report.transitions:
            latest[str(transition["alarm"])] = transition
        lines = []
        for alarm, transition in latest.items():
            state = str(transition["state"])
            if self.states.get(alarm, "OK") == state:
                continue
            self.states[alarm] = state
            mark = "ALARM" if state == ALARM else "ok   "
            at = float(transition["at_s"])
            lines.append(f"[alarm] {mark} {alarm} at +{at:.0f}s: {transition['description']}")
        for line in lines:
            self.emit(line)
        return lines

    def run(self, stop: threading.Event, interval_s: float = INTERVAL_S) -> None:
        while not stop.wait(interval_s):
            try:
                self.step()
            except Exception as exc:  # a failed evaluation must not take the server down; say so
                self.emit(f"[alarm] evaluation failed: {exc}")

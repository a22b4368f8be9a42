"""The heartbeat a message is processed under: keep it invisible while it is worked on, stop in time.

A slow message must never be processed twice in parallel. Two things can make it happen: its
visibility timeout lapses mid-work (SQS hands it to another worker), or the Lambda is killed
mid-work (SQS redelivers it after the visibility timeout, while nothing is running: harmless).
So the heartbeat extends the visibility every ``heartbeat_seconds`` (and always before half of
the visibility timeout has passed since the last extension), and asks the work to stop
cooperatively before the message's own deadline (``expires_at``) or the Lambda's remaining time
would be exceeded. Timing is pure (:class:`HeartbeatPlan`, clock injected); :class:`Heartbeat`
steps it with an injected ``extend``, and :class:`HeartbeatMonitor` ticks every
watched heartbeat from one background thread.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from enum import StrEnum


class CancelReason(StrEnum):
    MESSAGE_DEADLINE = "message_deadline"
    LAMBDA_TIMEOUT = "lambda_timeout"


@dataclass(frozen=True)
class HeartbeatPlan:
    """When to extend and when to cancel, all in seconds on one monotonic-like clock."""

    visibility_timeout_s: float
    heartbeat_s: float
    started_at: float
    lambda_deadline: float  # clock time the Lambda is killed at
    message_deadline: float | None = None  # clock time the message expires at
    safety_margin_s: float = 2.0  # time kept to report the failure and return the batch response

    @property
    def interval_s(self) -> float:
        """Extend at least twice per visibility timeout, so one slow or failed extension cannot lapse it."""
        return max(0.1, min(self.heartbeat_s, self.visibility_timeout_s / 2))

    def next_extension_at(self, last_extended_at: float) -> float:
        return last_extended_at + self.interval_s

    def lapses_at(self, last_extended_at: float) -> float:
        return last_extended_at + self.visibility_timeout_s

    def cancel_at(self) -> float:
        """The earliest of the message's deadline and the Lambda's deadline minus the margin."""
        lambda_stop = self.lambda_deadline - self.safety_margin_s
        if self.message_deadline is None:
            return lambda_stop
        return min(self.message_deadline, lambda_stop)

    def cancel_reason(self, now: float) -> CancelReason | None:
        if self.message_deadline is not None and now >= self.message_deadline:
            return CancelReason.MESSAGE_DEADLINE
        if now >= self.lambda_deadline - self.safety_margin_s:
            return CancelReason.LAMBDA_TIMEOUT
        return None

    def next_wakeup(self, last_extended_at: float) -> float:
        return min(self.next_extension_at(last_extended_at), self.cancel_at())


class Heartbeat:
    """One message's heartbeat: :meth:`tick` extends the visibility or sets ``cancel`` when due.

    ``extend(visibility_timeout_s)`` resets the message's visibility timeout (ChangeMessageVisibility);
    a failing extension is reported through ``on_error`` and retried half an interval later.
    """

    def __init__(
        self,
        plan: HeartbeatPlan,
        extend: Callable[[int], None],
        *,
        cancel: threading.Event | None = None,
        on_error: Callable[[Exception], None] | None = None,
    ) -> None:
        self.plan = plan
        self.cancel = cancel or threading.Event()
        self.cancel_reason: CancelReason | None = None
        self.extensions = 0
        self.next_wake = plan.next_wakeup(plan.started_at)
        self._extend = extend
        self._on_error = on_error
        self._last_extended_at = plan.started_at

    def tick(self, now: float) -> float:
        """One step at ``now``: cancel or extend as due; returns (and keeps) the time of the next step."""
        self.next_wake = self._step(now)
        return self.next_wake

    def _step(self, now: float) -> float:
        reason = self.plan.cancel_reason(now)
        if reason is not None:
            self.cancel_reason = reason
            self.cancel.set()
            return math.inf
        if now >= self.plan.next_extension_at(self._last_extended_at):
            try:
                self._extend(int(self.plan.visibility_timeout_s))
            except Exception as exc:  # retried soon: one failed call must not lapse the visibility
                if self._on_error is not None:
                    self._on_error(exc)
                return min(now + self.plan.interval_s / 2, self.plan.cancel_at())
            self._last_extended_at = now
            self.extensions += 1
        return self.plan.next_wakeup(self._last_extended_at)


class HeartbeatMonitor:
    """One daemon thread per container that ticks every watched :class:`Heartbeat` when it is due.

    Starting a thread per message would cost more than the rest of the worker's per-message
    overhead; watching is a lock, and a notify only when the new heartbeat is due before the thread
    would look anyway (waking the thread for every message of a batch cost more CPU than the rest of
    the message). ``clock`` must be the clock the plans were made with.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._cond = threading.Condition()
        self._beats: list[Heartbeat] = []
        self._thread: threading.Thread | None = None
        self._wake_at = math.inf  # when the thread looks next on its own (its wait's deadline)

    @contextmanager
    def watch(self, beat: Heartbeat) -> Iterator[Heartbeat]:
        with self._cond:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="heartbeat", daemon=True)
                self._thread.start()
            self._beats.append(beat)
            if beat.next_wake < self._wake_at:
                self._cond.notify()
        try:
            yield beat
        finally:
            with self._cond:  # waits for a tick in progress: no extension happens after the work ended
                self._beats.remove(beat)

    def _run(self) -> None:
        with self._cond:
            while True:
                now = self._clock()
                for beat in list(self._beats):
                    if beat.next_wake <= now:
                        beat.tick(now)
                wake = min((beat.next_wake for beat in self._beats), default=math.inf)
                # Watches ended since are not notified: the thread looks once more at ``wake`` for
                # nothing, and the next message of the batch, due later, needs no notify.
                self._wake_at = wake
                self._cond.wait(None if wake == math.inf else max(0.0, wake - self._clock()))

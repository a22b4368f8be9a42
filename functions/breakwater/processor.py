"""The user's processor: the one function a fork replaces.

Breakwater calls :func:`process` once per admitted message, under a heartbeat and behind
idempotency (an envelope id that was processed successfully is never processed again). The
contract for a replacement:

- return a JSON-serialisable dict (it is stored as the idempotent result) or raise to fail the
  message (it is retried, then dead-lettered after ``maxReceiveCount``);
- raise :class:`DependencyUnavailableError` when a dependency it needs is down (a connection refused,
  a 503, a timeout of the downstream) rather than the message being bad: the worker then opens its
  circuit breaker (``breakwater.breaker``) and sets the message aside without spending its receives;
- check ``work.check()`` (or ``work.cancelled``) between steps of long work: when the message's
  deadline or the Lambda's remaining time is about to run out it raises :class:`WorkCancelledError`, so
  the work stops before SQS could hand the message to another worker;
- write side effects idempotently, keyed by ``envelope.id`` (or the client's ``dedup_key``) where they
  leave this function: a worker that dies mid-batch, after this function returned but before the
  batch recorded it, runs the message again once its lock expires.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from breakwater.envelope import Envelope


class DependencyUnavailableError(RuntimeError):
    """A dependency of the processor is unavailable; the message itself is fine and must not be
    dead-lettered for it. Raise it from the processor (wrapping the client's error) on an outage."""


class WorkCancelledError(RuntimeError):
    """The heartbeat asked the work to stop (deadline or Lambda time); the message will be retried."""


@dataclass
class WorkContext:
    """What the processor may look at while it works: the cancel signal and its configured duration."""

    cancel: threading.Event = field(default_factory=threading.Event)
    simulated_work_ms: int = 0
    reason: str = ""

    @property
    def cancelled(self) -> bool:
        return self.cancel.is_set()

    def check(self) -> None:
        if self.cancel.is_set():
            raise WorkCancelledError(self.reason or "work cancelled")

    def pause(self, seconds: float) -> None:
        """Sleep, but wake up (and raise) at once if the work is cancelled."""
        if self.cancel.wait(seconds):
            self.check()


# ---------------------------------------------------------------------------------------------------
# FORK HERE: replace the body of ``process`` with your workload. Keep the signature.
# ---------------------------------------------------------------------------------------------------
def process(envelope: Envelope, work: WorkContext) -> dict[str, Any]:
    """Sample workload: simulates ``simulated_work_ms`` of work, cooperatively cancellable.

    A payload ``{"work_factor": n}`` (1 to 100) makes the message ``n`` times as expensive: it stands
    for a downstream that got slower for this message's tenant (the demo's ``slow`` scenario).
    """
    remaining = work.simulated_work_ms * work_factor(envelope.payload) / 1000
    step = 0.05
    while remaining > 0:
        work.pause(min(step, remaining))
        remaining -= step
    work.check()
    return {"id": envelope.id, "tenant": envelope.tenant, "type": envelope.type}


MAX_WORK_FACTOR = 100.0


def work_factor(payload: Any) -> float:
    """The sample workload's cost multiplier named by the payload (1 when it names none or a bad one)."""
    if not isinstance(payload, dict):
        return 1.0
    value = payload.get("work_factor")
    if isinstance(value, bool) or not isinstance(value, int | float):
        return 1.0
    return min(max(float(value), 1.0), MAX_WORK_FACTOR)

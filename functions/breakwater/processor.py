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
- hand a side effect that is a DynamoDB write to ``work.add_effect`` (a TransactWriteItems entry)
  instead of making it: the worker writes it in one transaction with the message's idempotency
  record (the inbox pattern), so it happens exactly once, even when a worker dies mid-batch or two
  copies of the message run at once, and never for a message that fails. The worker's role needs
  write access to the table it names (``workers.effect_tables`` in cdk.json);
- write any other side effect idempotently, keyed by ``envelope.id`` (or the client's ``dedup_key``,
  :func:`breakwater.envelope.processing_id`): a worker that dies mid-batch, after this function
  returned but before the batch recorded it, runs the message again once its lock expires.
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


# TransactWriteItems takes 100 entries; the worker adds the message's idempotency record to the effects.
MAX_EFFECTS = 99


class TooManyEffectsError(ValueError):
    """More transactional effects than one DynamoDB transaction can take beside the record."""


@dataclass
class WorkContext:
    """What the processor may look at while it works: the cancel signal and its configured duration,
    and the transactional effects it hands back (:meth:`add_effect`)."""

    cancel: threading.Event = field(default_factory=threading.Event)
    simulated_work_ms: int = 0
    reason: str = ""
    effects: list[dict[str, Any]] = field(default_factory=list)

    def add_effect(self, item: dict[str, Any]) -> None:
        """Write ``item`` (a TransactWriteItems entry: ``{"Put": ...}``, ``{"Update": ...}``,
        ``{"Delete": ...}`` or ``{"ConditionCheck": ...}``, in the low-level client's attribute-value
        form) in the transaction that records this message as processed, and only there.

        A condition of the item that fails makes the message fail like an exception would.
        """
        if len(item) != 1 or next(iter(item)) not in {"Put", "Update", "Delete", "ConditionCheck"}:
            raise ValueError(
                f"an effect is one Put, Update, Delete or ConditionCheck entry, not {sorted(item)}"
            )
        if len(self.effects) >= MAX_EFFECTS:
            raise TooManyEffectsError(f"at most {MAX_EFFECTS} transactional effects per message")
        self.effects.append(item)

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

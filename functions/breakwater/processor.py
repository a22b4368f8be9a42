"""The processor contract: what Breakwater's workers promise the user's processor, and ask of it.

The processor is the user's own function ``process(envelope, work) -> dict`` in their own directory
(``breakwater_cdk.Processor(directory=..., handler="module.function")``); the live, sideline and FIFO
workers load it at cold start (:func:`deploy`) and call it through :func:`process`. Breakwater calls
it once per admitted message, under a heartbeat and behind
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
  copies of the message run at once, and never for a message that fails. The workers' role needs
  write access to the table it names (the processor's ``grants``);
- write any other side effect idempotently, keyed by ``envelope.id`` (or the client's ``dedup_key``,
  :func:`breakwater.envelope.processing_id`): a worker that dies mid-batch, after this function
  returned but before the batch recorded it, runs the message again once its lock expires.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

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
    """What the processor may look at while it works: the cancel signal (:meth:`check`, :meth:`pause`)
    and the transactional effects it hands back (:meth:`add_effect`)."""

    cancel: threading.Event = field(default_factory=threading.Event)
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


ProcessFunction = Callable[[Envelope, WorkContext], dict[str, Any]]
_deployed: ProcessFunction | None = None


def load_processor(handler: str) -> ProcessFunction:
    """The function ``handler`` names as ``module.function`` (``PROCESSOR_HANDLER``): the user's processor."""
    module, _, name = handler.rpartition(".")
    if not module or not name:
        raise ValueError(f"PROCESSOR_HANDLER {handler!r} is not 'module.function'")
    function = getattr(importlib.import_module(module), name, None)
    if not callable(function):
        raise ValueError(f"PROCESSOR_HANDLER {handler!r}: module {module!r} has no function {name!r}")
    return cast(ProcessFunction, function)


def deploy(handler: str) -> None:
    """Make the function ``handler`` names the one :func:`process` runs (the workers, at cold start)."""
    global _deployed
    _deployed = load_processor(handler)


def process(envelope: Envelope, work: WorkContext) -> dict[str, Any]:
    """Run the deployed processor on one message.

    The workers look this function up at call time, so the local tools' hooks (and tests) may wrap
    or replace it around whichever processor is deployed.
    """
    if _deployed is None:
        raise RuntimeError("no processor deployed: the worker's PROCESSOR_HANDLER is not set")
    return _deployed(envelope, work)

"""What a worker does with one message: the sidelining policy (Amazon Builders' Library, "Avoiding
insurmountable queue backlogs").

Rules, in order (the first that matches wins):

- DROP      the message expired (``expires_at`` passed) or was enqueued before the tenant's last
            anti-entropy sweep: work nobody is waiting for any more is the cheapest to shed.
- SIDELINE  older than ``sideline_age``: moved to the backlog queue so fresh messages are not stuck
            behind old ones (serve the newest first during a backlog, drain the old later).
            Never replayed work (:func:`is_replayed`): the replay already paces it. Never a retry
            (a message received before, ``retried``): it is old because processing it failed, and a
            move would start its receive count again, so a message that fails every time would
            never reach its dead-letter queue after the configured receives.
- SPILL     the tenant is over its consumer-side rate: moved to the spillover queue, so one tenant's
            flood cannot use up the workers.
- DEFER     the tenant holds no concurrency slot: re-sent to the surge queue with a delay that grows
            with ``attempt``, jittered (:func:`defer_delay_seconds`).
- PROCESS   run the processor.

Sideline mode (the spillover and backlog drainers) applies DROP, and the rate and concurrency gates,
but never SIDELINE or SPILL: a sidelined message is by definition old, and spilling it again would
only loop it between queues. Over a gate it is DEFERred back to *its own* queue with the same
growing delay, so draining the sideline respects every tenant's limits and stays behind live traffic.

With sidelining disabled (the naive baseline) every message is PROCESSed except expired ones.
Everything here is pure; ``now`` and the jitter are injected.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum
from typing import Literal, NamedTuple, Protocol

from breakwater.envelope import Origin


class SidelineDecision(StrEnum):
    DROP = "drop"
    SIDELINE = "sideline"
    SPILL = "spill"
    DEFER = "defer"
    PROCESS = "process"


class Reason(StrEnum):
    EXPIRED = "expired"
    SWEPT = "swept"
    TOO_OLD = "too_old"
    OVER_RATE = "over_rate"
    OVER_CONCURRENCY = "over_concurrency"
    DEPENDENCY_DOWN = "dependency_down"
    ADMITTED = "admitted"


QueueRole = Literal["live", "surge", "spillover", "backlog"]


class DecisionSubject(Protocol):
    """What the rules read of a message: :class:`breakwater.envelope.Envelope` is one.

    A Protocol rather than the model itself, so a caller that holds millions of messages (the
    seed-scale simulator, ``sim/``) can ask the same rules with plain objects instead of building a
    validated model per message.
    """

    @property
    def enqueued_at(self) -> int: ...
    @property
    def expires_at(self) -> int | None: ...
    @property
    def attempt(self) -> int: ...
    @property
    def origin(self) -> Origin: ...
    @property
    def replay_run(self) -> str | None: ...

    def age_ms(self, now_ms: int) -> int: ...
    def is_expired(self, now_ms: int) -> bool: ...


def is_replayed(envelope: DecisionSubject) -> bool:
    """Work a replay brought back from the archive, in the queue it was put in or any it was moved to
    since (a deferral re-homes it to surge, but ``replay_run`` stays)."""
    return envelope.origin is Origin.REPLAY or envelope.replay_run is not None


def queue_role(origin: Origin) -> QueueRole:
    """The queue role an envelope sits in; replayed messages are put back into the live set."""
    if origin is Origin.REPLAY:
        return "live"
    return origin.value  # type: ignore[return-value]


@dataclass(frozen=True)
class TenantState:
    """What the worker knows about the message's tenant when it decides.

    The gates are answered by the adapters (the consumer token bucket, the concurrency leases);
    a gate that was not asked yet counts as open, so ``decide`` can be called before paying for it.
    """

    swept_at_ms: int | None = None
    within_consumer_rate: bool = True
    holds_concurrency_slot: bool = True


@dataclass(frozen=True)
class DecisionConfig:
    mode: Literal["live", "sideline"] = "live"
    sidelining_enabled: bool = True
    sideline_age_ms: int = 300_000
    defer_base_seconds: int = 2
    max_defer_seconds: int = 900


class Decision(NamedTuple):
    """A named tuple, not a frozen dataclass: one is built for every message that is not processed."""

    action: SidelineDecision
    reason: Reason
    destination: Origin | None = None  # queue role a moved message goes to
    delay_seconds: int = 0

    @property
    def moves(self) -> bool:
        return self.destination is not None


@dataclass(frozen=True)
class Move:
    """A message to re-send elsewhere; its original is acknowledged only once the send succeeded."""

    key: str  # the original's SQS message id, reported as a batch item failure if the move fails
    queue_url: str
    body: str
    delay_seconds: int = 0
    group_id: str | None = None  # MessageGroupId (the tenant) so SQS fair queues apply at the destination
    redriven: bool = False  # a copy of redriven work: marked, so it is never measured as live


def defer_delay_seconds(attempt: int, config: DecisionConfig, jitter: float = 1.0) -> int:
    """Exponential backoff on ``attempt`` (0, 1, 2, ...), capped by ``max_defer_seconds`` (SQS allows 900),
    with full jitter: ``jitter`` (in [0, 1], drawn at random by the caller) is the share of that
    backoff the delay takes, never less than ``defer_base_seconds``. 1: the whole backoff.

    Without jitter every message deferred at the same attempt comes back at the same instant: a
    tenant's deferred backlog returns as one wave, its bucket grants a burst's worth, and the rest of
    the wave is deferred again, longer, together: its oldest messages starve while fresher ones pass.
    """
    exponent = min(max(attempt, 0), 20)  # 2**20 already exceeds any cap; keeps the number small
    capped = min(config.max_defer_seconds, config.defer_base_seconds * 2**exponent)
    if jitter >= 1.0:
        return capped
    return max(min(config.defer_base_seconds, capped), math.ceil(max(jitter, 0.0) * capped))


_PROCESS = Decision(SidelineDecision.PROCESS, Reason.ADMITTED)


def decide(
    envelope: DecisionSubject,
    now_ms: int,
    tenant_state: TenantState,
    config: DecisionConfig,
    *,
    retried: bool = False,
    jitter: float = 1.0,
) -> Decision:
    """The one decision per message; see the module docstring for the rules and their order.

    ``retried``: the message was received before (its SQS receive count is above one); ``jitter``:
    the share of the backoff a deferral waits (:func:`defer_delay_seconds`)."""
    if envelope.is_expired(now_ms):
        return Decision(SidelineDecision.DROP, Reason.EXPIRED)
    if not config.sidelining_enabled:
        return _PROCESS
    if tenant_state.swept_at_ms is not None and envelope.enqueued_at < tenant_state.swept_at_ms:
        return Decision(SidelineDecision.DROP, Reason.SWEPT)

    sideline_mode = config.mode == "sideline"
    # A replayed envelope is old by definition and already paced by the replay: sidelining it for its
    # age would park it again (archive -> replay -> backlog -> archive), also once a deferral moved it
    # to surge. The gates still apply.
    too_old = envelope.age_ms(now_ms) > config.sideline_age_ms
    # the age first: most messages are young, and the other tests then need not run
    if too_old and not sideline_mode and not retried and not is_replayed(envelope):
        return Decision(SidelineDecision.SIDELINE, Reason.TOO_OLD, Origin.BACKLOG)

    if not tenant_state.within_consumer_rate:
        if sideline_mode:
            return _defer(envelope, Reason.OVER_RATE, config, jitter)
        return Decision(SidelineDecision.SPILL, Reason.OVER_RATE, Origin.SPILLOVER)

    if not tenant_state.holds_concurrency_slot:
        return _defer(envelope, Reason.OVER_CONCURRENCY, config, jitter)
    return _PROCESS


def hold_for_outage(envelope: DecisionSubject, retry_in_s: int, config: DecisionConfig) -> Decision:
    """A message the worker cannot process while its dependency is down (``breakwater.breaker``).

    The live worker sidelines it to the backlog queue, delayed until the breaker's next probe: the live
    queues stay free for fresh traffic, which is served first once the dependency is back, and the
    backlog drains after it (its drainers stay off while the outage is reported). A sideline drainer
    defers it back into its own queue with the usual growing delay, at least until that probe. Either
    way it is a new message, so the outage spends none of its receives towards the dead-letter queue.
    """
    delay = min(config.max_defer_seconds, max(1, retry_in_s))
    if config.mode == "sideline":
        deferred = _defer(envelope, Reason.DEPENDENCY_DOWN, config)
        return Decision(
            SidelineDecision.DEFER,
            Reason.DEPENDENCY_DOWN,
            deferred.destination,
            min(config.max_defer_seconds, max(delay, deferred.delay_seconds)),
        )
    return Decision(SidelineDecision.SIDELINE, Reason.DEPENDENCY_DOWN, Origin.BACKLOG, delay)


def _defer(
    envelope: DecisionSubject, reason: Reason, config: DecisionConfig, jitter: float = 1.0
) -> Decision:
    if config.mode == "sideline":
        # Back into its own sideline queue; a replayed/live origin never reaches a sideline worker.
        destination = (
            envelope.origin if envelope.origin in (Origin.SPILLOVER, Origin.BACKLOG) else Origin.BACKLOG
        )
    else:
        destination = Origin.SURGE
    return Decision(
        SidelineDecision.DEFER, reason, destination, defer_delay_seconds(envelope.attempt, config, jitter)
    )

"""The ordered ingest path: validate, admit fairly, bound the group, stamp the envelope, send it to its
group's FIFO queue.

The same steps as :class:`breakwater.ingest.IngestService` with the ordered request model, and a
FIFO sender in place of the shuffle-sharded router (a group must always land on one queue). Between
the tenant's rate and the send, the group's backlog bound (:class:`breakwater.ordered.GroupBound`):
past it the answer is a 429 naming the group and the limit, so no group can grow deep enough to
fill the FIFO queue's scan window (docs/ordering-and-streams.md). The tenant's bound over all its
groups (:class:`TenantBound`) comes next: a tenant opening many ordering keys holds no more of the
queue, and so of the FIFO worker, than its bound, whatever the number of keys.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from breakwater.envelope import Envelope
from breakwater.errors import BadRequestError, ThrottledError
from breakwater.ingest import TenantContext, TokenGate, admit, build_envelope
from breakwater.ordered import (
    GroupBacklogs,
    GroupBound,
    TenantBacklogs,
    deduplication_id,
    is_sqs_id,
    message_group_id,
)
from breakwater.request_keys import HEADER, request_key
from breakwater.requests import MAX_SQS_ID_LENGTH, OrderedMessageRequest, RequestLimits, parse_message

GROUP_FULL_RETRY_AFTER_SECONDS = 5.0
"""A full group gains room only as its consumer finishes messages, one at a time in order; asking the
client to wait a few seconds lets it drain instead of spending the tenant's tokens on refusals."""


class RecentRefusals:
    """The groups and tenants this container refused for a full backlog, until the Retry-After it
    answered: asked again meanwhile, it refuses from memory without a write, so a client hammering a
    full bound costs its counter item one write per container per Retry-After, not one per request."""

    def __init__(self, clock: Callable[[], float], *, capacity: int = 10_000) -> None:
        self._clock = clock
        self._capacity = capacity
        self._until: dict[str, tuple[float, int]] = {}

    def backlog(self, key: str) -> int | None:
        """The backlog that refused ``key``, while its refusal stands; else None."""
        seen = self._until.get(key)
        if seen is None:
            return None
        if self._clock() >= seen[0]:
            del self._until[key]
            return None
        return seen[1]

    def remember(self, key: str, backlog: int) -> None:
        if len(self._until) >= self._capacity:
            now = self._clock()
            self._until = {k: v for k, v in self._until.items() if v[0] > now}
            while len(self._until) >= self._capacity:  # the oldest refusal goes first
                del self._until[next(iter(self._until))]
        self._until[key] = (self._clock() + GROUP_FULL_RETRY_AFTER_SECONDS, backlog)


class OrderedSender(Protocol):
    """Sends an envelope to its group's FIFO queue (``breakwater.aws.fifo_queues.FifoQueues``).

    Raises :class:`breakwater.errors.UnavailableError` when the message was not stored.
    """

    def send(self, envelope: Envelope) -> str: ...


class GroupBacklogFullError(ThrottledError):
    """429: the message's group holds ``limit`` messages accepted and not yet processed."""

    code = "group_backlog_full"

    def __init__(self, group_id: str, limit: int, backlog: int) -> None:
        super().__init__(
            f"message group '{group_id}' has {backlog} messages accepted and not yet processed, "
            f"its limit is {limit}; retry after the Retry-After header's seconds",
            retry_after=GROUP_FULL_RETRY_AFTER_SECONDS,
        )
        self.group_id = group_id
        self.limit = limit
        self.backlog = backlog

    def body(self) -> dict[str, Any]:
        return super().body() | {"group": self.group_id, "limit": self.limit, "backlog": self.backlog}


class TenantBacklogFullError(ThrottledError):
    """429: the tenant holds ``limit`` messages accepted and not yet processed over all its groups."""

    code = "tenant_backlog_full"

    def __init__(self, tenant: str, limit: int, backlog: int) -> None:
        super().__init__(
            f"tenant '{tenant}' has {backlog} ordered messages accepted and not yet processed over all "
            f"its ordering keys, its tenant limit is {limit}; retry after the Retry-After header's seconds",
            retry_after=GROUP_FULL_RETRY_AFTER_SECONDS,
        )
        self.tenant = tenant
        self.limit = limit
        self.backlog = backlog

    def body(self) -> dict[str, Any]:
        return super().body() | {"tenant": self.tenant, "limit": self.limit, "backlog": self.backlog}


@dataclass(frozen=True)
class TenantBound:
    """At most ``limit`` messages per tenant, over all its groups, accepted and not yet released
    (counted per the group bound's window)."""

    limit: int
    counters: TenantBacklogs

    def __post_init__(self) -> None:
        if self.limit < 1:
            raise ValueError(f"a tenant bound needs limit >= 1, got {self.limit}")


@dataclass(frozen=True)
class AcceptedOrdered:
    envelope: Envelope

    def body(self) -> dict[str, Any]:
        return {
            "id": self.envelope.id,
            "ordering_key": self.envelope.ordering_key,
            "dedup_id": deduplication_id(self.envelope),
        }


class OrderedIngestService:
    """``backlogs`` and ``bound`` together turn the group bound on; without them only the rate applies.
    ``tenant_bound`` (with the group bound only) bounds each tenant over all its groups."""

    def __init__(
        self,
        *,
        sender: OrderedSender,
        gate: TokenGate | None,
        clock: Callable[[], float],
        limits: RequestLimits,
        backlogs: GroupBacklogs | None = None,
        bound: GroupBound | None = None,
        tenant_bound: TenantBound | None = None,
    ) -> None:
        if (backlogs is None) != (bound is None):
            raise ValueError("the group bound needs both its counters (backlogs) and its bound")
        if tenant_bound is not None and bound is None:
            raise ValueError("the tenant bound is counted in the group bound's window: set the group bound")
        self.tenant_bound = tenant_bound
        self.refusals = RecentRefusals(clock)
        self.sender = sender
        self.gate = gate
        self.limits = limits
        self.backlogs = backlogs
        self.bound = bound
        self._clock = clock

    def accept(
        self,
        raw_body: bytes | None,
        tenant: TenantContext,
        *,
        request_id: str | None,
        trace_id: str | None,
        idempotency_key: str | None = None,
    ) -> AcceptedOrdered:
        """An ``Idempotency-Key`` is the message's ``dedup_key``: its deduplication id in the FIFO queue."""
        request = parse_message(OrderedMessageRequest, raw_body, self.limits)
        key = request_key(idempotency_key, request.dedup_key)
        if key is not None and not is_sqs_id(key):
            raise BadRequestError(
                f"{HEADER} {key[:40]!r} cannot be a FIFO deduplication id: at most {MAX_SQS_ID_LENGTH} "
                "printable ASCII characters without spaces",
                code="invalid_idempotency_key",
            )
        admit(self.gate, tenant)
        now_ms = int(self._clock() * 1000)
        envelope = build_envelope(
            request,
            tenant=tenant.tenant,
            now_ms=now_ms,
            request_id=request_id,
            trace_id=trace_id,
            dedup_key=key,
        )
        if self.backlogs is None or self.bound is None:
            self.sender.send(envelope)
            return AcceptedOrdered(envelope)
        group = message_group_id(envelope.tenant, request.ordering_key)
        generation = self.bound.window.generation(envelope.enqueued_at)
        tenant_bound = self.tenant_bound
        tenant_key = f"tenant:{envelope.tenant}"
        if tenant_bound is not None and (seen := self.refusals.backlog(tenant_key)) is not None:
            raise TenantBacklogFullError(envelope.tenant, tenant_bound.limit, seen)
        if (seen := self.refusals.backlog(f"group:{group}")) is not None:
            raise GroupBacklogFullError(group, self.bound.limit, seen)
        admission = self.backlogs.admit(group, generation, self.bound.limit, now_ms)
        if not admission.admitted:
            self.refusals.remember(f"group:{group}", admission.backlog)
            raise GroupBacklogFullError(group, self.bound.limit, admission.backlog)
        if tenant_bound is not None:
            try:
                held = tenant_bound.counters.admit(envelope.tenant, generation, tenant_bound.limit, now_ms)
            except BaseException:
                self.backlogs.release(group, generation, now_ms)
                raise
            if not held.admitted:
                # Not admitted by its tenant: the group's slot goes back, or the group would count it.
                self.backlogs.release(group, generation, now_ms)
                self.refusals.remember(tenant_key, held.backlog)
                raise TenantBacklogFullError(envelope.tenant, tenant_bound.limit, held.backlog)
        try:
            self.sender.send(envelope)
        except BaseException:
            # Not stored: give the slots back, or the group and tenant would count a message they never had.
            self.backlogs.release(group, generation, now_ms)
            if tenant_bound is not None:
                tenant_bound.counters.release(envelope.tenant, generation, now_ms)
            raise
        return AcceptedOrdered(envelope)

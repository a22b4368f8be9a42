"""The ordered ingest path: validate, admit fairly, stamp the envelope, send it to its group's FIFO queue.

The same steps as :class:`breakwater.ingest.IngestService` with the ordered request model, and a
FIFO sender in place of the shuffle-sharded router (a group must always land on one queue).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from breakwater.envelope import Envelope
from breakwater.ingest import TenantContext, TokenGate, admit, build_envelope
from breakwater.ordered import deduplication_id
from breakwater.requests import OrderedMessageRequest, RequestLimits, parse_message


class OrderedSender(Protocol):
    """Sends an envelope to its group's FIFO queue (``breakwater.aws.fifo_queues.FifoQueues``).

    Raises :class:`breakwater.errors.UnavailableError` when the message was not stored.
    """

    def send(self, envelope: Envelope) -> str: ...


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
    def __init__(
        self,
        *,
        sender: OrderedSender,
        gate: TokenGate | None,
        clock: Callable[[], float],
        limits: RequestLimits,
    ) -> None:
        self.sender = sender
        self.gate = gate
        self.limits = limits
        self._clock = clock

    def accept(
        self, raw_body: bytes | None, tenant: TenantContext, *, request_id: str | None, trace_id: str | None
    ) -> AcceptedOrdered:
        request = parse_message(OrderedMessageRequest, raw_body, self.limits)
        admit(self.gate, tenant)
        envelope = build_envelope(
            request,
            tenant=tenant.tenant,
            now_ms=int(self._clock() * 1000),
            request_id=request_id,
            trace_id=trace_id,
        )
        self.sender.send(envelope)
        return AcceptedOrdered(envelope)

"""The events ingest path: validate one event or a batch, admit it per tenant, stamp it, write it.

Each event is stamped (id, tenant, received_at) and written with PutRecords; records that fail are
retried as a subset by the writer. The answer never calls an unwritten event written: 202 when all
are written, 207 with per-event results when some are not (the client resends those), 429 or 503
when none are (a problem details object carrying the same per-event results).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from breakwater.envelope import new_envelope_id
from breakwater.errors import BadRequestError, problem
from breakwater.events import KinesisRecord, PartitionKeyMode, StreamEvent, to_record
from breakwater.fairness import BucketLimits, retry_after_header
from breakwater.ingest import TenantContext, TokenGate, admit_up_to
from breakwater.request_keys import HEADER
from breakwater.requests import RequestLimits, parse_events


class PutResult(Protocol):
    """What the stream writer reports (``breakwater.aws.kinesis.PutOutcome``)."""

    @property
    def written(self) -> Mapping[int, Any]: ...

    @property
    def failed(self) -> Mapping[int, str]: ...

    @property
    def throttled(self) -> bool:
        """Whether a shard refused a write for its throughput."""
        ...


class RecordWriter(Protocol):
    def put(self, records: Sequence[KinesisRecord]) -> PutResult: ...


@dataclass(frozen=True)
class EventsAnswer:
    status: int
    body: dict[str, Any]
    headers: dict[str, str]


def answer(
    events: Sequence[StreamEvent], outcome: PutResult, *, refused: int = 0, retry_after: float = 1.0
) -> EventsAnswer:
    """202 all written, 207 some; 429 none because the tenant or the shard was throttled, else 503.

    The last ``refused`` events were over the tenant's event rate and were not written.
    """
    results: list[dict[str, Any]] = []
    offered = len(events) - refused
    for index, event in enumerate(events):
        if index in outcome.written:
            results.append({"index": index, "id": event.id, "status": "written"})
        elif index >= offered:
            results.append({"index": index, "id": event.id, "status": "throttled", "error": "tenant_rate"})
        else:
            results.append(
                {"index": index, "id": event.id, "status": "failed", "error": outcome.failed[index]}
            )
    written = len(outcome.written)
    failed = len(events) - written
    body = {"written": written, "failed": failed, "results": results}
    if not failed:
        return EventsAnswer(202, body, {})
    if written:
        return EventsAnswer(207, body, {})
    throttled = refused > 0 or outcome.throttled
    wait = retry_after_header(retry_after if refused else 1.0)
    if throttled:
        status, code = 429, "throttled"
        detail = "no event was written: over the tenant's event rate or the stream's throughput"
    else:
        status, code = 503, "write_failed"
        detail = "no event was written: the stream refused them"
    detail += "; the results say why for each, send them again after the Retry-After header's seconds"
    return EventsAnswer(status, problem(status, code, detail, **body), {"Retry-After": wait})


class EventsService:
    """``rate_multiplier``: events per second a tenant may send per message per second of its rate."""

    def __init__(
        self,
        *,
        writer: RecordWriter,
        gate: TokenGate | None,
        clock: Callable[[], float],
        limits: RequestLimits,
        partition_key_mode: PartitionKeyMode,
        rate_multiplier: float = 1.0,
    ) -> None:
        self.writer = writer
        self.gate = gate
        self.limits = limits
        self.mode = partition_key_mode
        self.rate_multiplier = rate_multiplier
        self._clock = clock

    def accept(
        self,
        raw_body: bytes | None,
        tenant: TenantContext,
        *,
        request_id: str | None,
        trace_id: str | None,
        idempotency_key: str | None = None,
    ) -> EventsAnswer:
        if idempotency_key is not None:
            raise BadRequestError(
                f"{HEADER} is not supported on /v1/events: a batch is answered per event; "
                "retry only the events the 207 names as failed",
                code="invalid_idempotency_key",
            )
        incoming = parse_events(raw_body, self.limits)
        limits = BucketLimits(
            rate=tenant.rate * self.rate_multiplier, burst=max(1.0, tenant.burst * self.rate_multiplier)
        )
        admitted, retry_after = admit_up_to(self.gate, tenant.tenant, limits, len(incoming))
        now_ms = int(self._clock() * 1000)
        events = [
            StreamEvent(
                id=new_envelope_id(now_ms),
                tenant=tenant.tenant,
                type=event.type,
                key=event.key,
                value=event.value,
                payload=event.payload,
                occurred_at=event.occurred_at,
                received_at=now_ms,
                request_id=request_id,
                trace_id=trace_id,
            )
            for event in incoming
        ]
        records = [to_record(event, self.mode) for event in events[:admitted]]
        outcome = self.writer.put(records) if records else _NOTHING_WRITTEN
        return answer(events, outcome, refused=len(events) - admitted, retry_after=retry_after)


@dataclass(frozen=True)
class _Nothing:
    written: Mapping[int, Any]
    failed: Mapping[int, str]
    throttled: bool = False


_NOTHING_WRITTEN = _Nothing(written={}, failed={})

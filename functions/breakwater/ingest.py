"""The live ingest path: validate a request, build the envelope, admit it fairly, route it, store it.

Pure policy with injected ports (a token gate, the live queues) and an injected clock; the handler
turns the API Gateway event into plain values and calls :meth:`IngestService.accept` once.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from breakwater.counting import CounterBuffer
from breakwater.envelope import Envelope, Origin, new_envelope_id
from breakwater.errors import (
    BadRequestError,
    PayloadTooLargeError,
    ThrottledError,
    UnauthenticatedError,
    UnavailableError,
)
from breakwater.fairness import BucketLimits
from breakwater.routing import QueueDepths, choose_queue, shard_for

ALLOWED_FIELDS = ("type", "payload", "dedup_key", "ordering_key", "ttl_seconds")
MAX_KEY_LENGTH = 128


@dataclass(frozen=True)
class MessageRequest:
    """A validated ``POST /v1/messages`` body."""

    type: str
    payload: Any = None
    dedup_key: str | None = None
    ordering_key: str | None = None
    ttl_seconds: int | None = None


def _optional_key(body: Mapping[str, Any], name: str) -> str | None:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, str):
        raise BadRequestError(
            f"field '{name}' must be a string, got {_json_type(value)}", code="invalid_field"
        )
    if not 1 <= len(value) <= MAX_KEY_LENGTH:
        raise BadRequestError(
            f"field '{name}' must be 1 to {MAX_KEY_LENGTH} characters, got {len(value)}", code="invalid_field"
        )
    return value


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def parse_message_request(
    raw_body: bytes | None, *, max_payload_bytes: int, max_ttl_seconds: int
) -> MessageRequest:
    """The request body as a :class:`MessageRequest`, or a 400/413 :class:`ApiError` naming the problem."""
    if not raw_body:
        raise BadRequestError(
            "request body is empty; expected a JSON object with at least 'type'", code="invalid_json"
        )
    if len(raw_body) > max_payload_bytes:
        raise PayloadTooLargeError(
            f"request body is {len(raw_body)} bytes; the limit is {max_payload_bytes} bytes"
        )
    try:
        body = json.loads(raw_body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BadRequestError(f"request body is not valid JSON: {exc}", code="invalid_json") from exc
    if not isinstance(body, dict):
        raise BadRequestError(
            f"request body must be a JSON object, got {_json_type(body)}", code="invalid_json"
        )
    if "tenant" in body:
        raise BadRequestError(
            "field 'tenant' is not allowed: the tenant comes from your API key, never from the body",
            code="tenant_in_body",
        )
    unknown = sorted(name for name in body if name not in ALLOWED_FIELDS)
    if unknown:
        raise BadRequestError(
            f"unknown field '{unknown[0]}'; allowed fields: {', '.join(ALLOWED_FIELDS)}", code="unknown_field"
        )
    message_type = body.get("type")
    if message_type is None:
        raise BadRequestError("field 'type' is required", code="invalid_field")
    if not isinstance(message_type, str):
        raise BadRequestError(
            f"field 'type' must be a string, got {_json_type(message_type)}", code="invalid_field"
        )
    if not 1 <= len(message_type) <= MAX_KEY_LENGTH:
        raise BadRequestError(
            f"field 'type' must be 1 to {MAX_KEY_LENGTH} characters, got {len(message_type)}",
            code="invalid_field",
        )
    ttl = body.get("ttl_seconds")
    if ttl is not None and (
        isinstance(ttl, bool) or not isinstance(ttl, int) or not 1 <= ttl <= max_ttl_seconds
    ):
        raise BadRequestError(
            f"field 'ttl_seconds' must be an integer from 1 to {max_ttl_seconds}, got {json.dumps(ttl)}",
            code="invalid_field",
        )
    return MessageRequest(
        type=message_type,
        payload=body.get("payload"),
        dedup_key=_optional_key(body, "dedup_key"),
        ordering_key=_optional_key(body, "ordering_key"),
        ttl_seconds=ttl,
    )


class TenantContext(BaseModel):
    """What the authorizer put in ``requestContext.authorizer`` (API Gateway passes the values as strings)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    tenant: str = Field(min_length=1, max_length=64)
    tier: str
    rate: float = Field(gt=0)
    burst: float = Field(ge=1)

    @classmethod
    def from_authorizer(cls, context: Mapping[str, Any] | None) -> TenantContext:
        try:
            return cls.model_validate(dict(context or {}))
        except ValidationError as exc:
            # Only reachable if the API was deployed without the authorizer: fail closed.
            raise UnauthenticatedError("no authenticated tenant on this request") from exc

    def bucket_limits(self) -> BucketLimits:
        return BucketLimits(rate=self.rate, burst=self.burst)


def build_envelope(
    request: MessageRequest,
    *,
    tenant: str,
    now_ms: int,
    request_id: str | None,
    trace_id: str | None,
    envelope_id: str | None = None,
) -> Envelope:
    """The envelope of DESIGN §2; ``enqueued_at`` is stamped here, never taken from the client."""
    return Envelope(
        id=envelope_id or new_envelope_id(now_ms),
        tenant=tenant,
        type=request.type,
        payload=request.payload,
        request_id=request_id,
        trace_id=trace_id,
        enqueued_at=now_ms,
        expires_at=now_ms + request.ttl_seconds * 1000 if request.ttl_seconds is not None else None,
        dedup_key=request.dedup_key,
        ordering_key=request.ordering_key,
        origin=Origin.LIVE,
    )


class TokenGate(Protocol):
    """Per-tenant admission (``breakwater.aws.buckets.LeasedTokenBucket``)."""

    def try_acquire(self, tenant: str, limits: BucketLimits) -> tuple[bool, float]: ...


class QueueSet(Protocol):
    """The live queues (``breakwater.aws.queues.LiveQueues``)."""

    def __len__(self) -> int: ...

    def depth(self, index: int) -> int: ...

    def send(self, index: int, body: str, group_id: str) -> str: ...


class Router:
    """Shuffle sharding onto the live queues, then the shortest candidate by cached depth."""

    def __init__(
        self,
        queues: QueueSet,
        shard_size: int,
        depth_refresh_seconds: float,
        clock: Callable[[], float],
        *,
        send_errors: tuple[type[Exception], ...] = (Exception,),
    ) -> None:
        self.queues = queues
        self.queue_count = len(queues)
        self.shard_size = min(shard_size, self.queue_count)
        self.depths = QueueDepths(depth_refresh_seconds)
        self._clock = clock
        self._send_errors = send_errors
        self._shards: dict[str, tuple[int, ...]] = {}

    def candidates(self, tenant: str) -> tuple[int, ...]:
        shard = self._shards.get(tenant)
        if shard is None:
            shard = shard_for(tenant, self.queue_count, self.shard_size)
            if len(self._shards) < 100_000:
                self._shards[tenant] = shard
        return shard

    def send(self, envelope: Envelope) -> int:
        """Stores the envelope on a candidate queue and returns its index; tries a second candidate once."""
        candidates = self.candidates(envelope.tenant)
        self._refresh(candidates)
        first = choose_queue(candidates, self.depths.snapshot(candidates))
        order = [first, *[index for index in candidates if index != first][:1]]
        body = envelope.to_json()
        failure: Exception | None = None
        for index in order:
            try:
                self.queues.send(index, body, envelope.tenant)
            except self._send_errors as exc:
                failure = exc
                self.depths.observe(index, None, self._clock())
                continue
            self.depths.record_send(index)
            return index
        raise UnavailableError(f"the message was not stored, please retry: {failure}", retry_after=1.0)

    def _refresh(self, candidates: tuple[int, ...]) -> None:
        now = self._clock()
        for index in candidates:
            if self.depths.is_stale(index, now):
                try:
                    depth: int | None = self.queues.depth(index)
                except Exception:  # a probe never fails a request: route on the estimate, the send decides
                    depth = None
                self.depths.observe(index, depth, now)


@dataclass(frozen=True)
class Accepted:
    envelope: Envelope
    queue: int

    def body(self) -> dict[str, Any]:
        return {"id": self.envelope.id, "queue": self.queue}


class CounterSink(Protocol):
    """Adds per-tenant counter deltas to the shared counters (one write per tenant)."""

    def add(self, deltas: Mapping[str, Mapping[str, int]]) -> None: ...


class IngestService:
    """One call per request: validate, stamp, admit, route, store."""

    def __init__(
        self,
        *,
        router: Router,
        gate: TokenGate | None,
        clock: Callable[[], float],
        max_payload_bytes: int,
        max_ttl_seconds: int,
        counters: CounterSink | None = None,
        counter_flush_seconds: float = 10.0,
    ) -> None:
        self.router = router
        self.gate = gate  # None: throttling disabled (the naive baseline)
        self._clock = clock
        self.max_payload_bytes = max_payload_bytes
        self.max_ttl_seconds = max_ttl_seconds
        self._sink = counters
        self._counts = CounterBuffer(counter_flush_seconds, clock)

    def accept(
        self,
        raw_body: bytes | None,
        tenant: TenantContext,
        *,
        request_id: str | None,
        trace_id: str | None,
    ) -> Accepted:
        request = parse_message_request(
            raw_body, max_payload_bytes=self.max_payload_bytes, max_ttl_seconds=self.max_ttl_seconds
        )
        if self.gate is not None:
            admitted, retry_after = self.gate.try_acquire(tenant.tenant, tenant.bucket_limits())
            if not admitted:
                self._count(tenant.tenant, "throttled")
                raise ThrottledError(
                    f"tenant '{tenant.tenant}' is over its rate limit (base {tenant.rate:g} messages/s, "
                    f"burst {tenant.burst:g}); retry after the Retry-After header's seconds",
                    retry_after=retry_after,
                )
        now_ms = int(self._clock() * 1000)
        envelope = build_envelope(
            request, tenant=tenant.tenant, now_ms=now_ms, request_id=request_id, trace_id=trace_id
        )
        queue = self.router.send(envelope)
        self._count(tenant.tenant, "accepted")
        return Accepted(envelope=envelope, queue=queue)

    def _count(self, tenant: str, name: str) -> None:
        """Tally for the controller's backlog estimate; flushed in aggregate, never per request."""
        if self._sink is None:
            return
        self._counts.add(tenant, name)
        self.flush_counters(force=False)

    def flush_counters(self, *, force: bool = True) -> None:
        """Write the tallies (all of them if ``force``, else only once the interval has passed)."""
        if self._sink is None:
            return
        taken = self._counts.take_all() if force else self._counts.take_due()
        if not taken:
            return
        try:
            self._sink.add(taken)
        except Exception:
            # counts only feed estimates; keep them for the next flush rather than fail a request
            self._counts.restore(taken)

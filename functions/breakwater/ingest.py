"""The live ingest path: validate a request, build the envelope, admit it fairly, route it, store it.

Pure policy with injected ports (a token gate, the live queues) and an injected clock; the handler
turns the API Gateway event into plain values and calls :meth:`IngestService.accept` once.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from breakwater.counting import CounterBuffer
from breakwater.envelope import Envelope, Origin, new_envelope_id
from breakwater.errors import ThrottledError, UnauthenticatedError, UnavailableError
from breakwater.fairness import BucketLimits
from breakwater.request_keys import RequestKeys, fingerprint, request_key
from breakwater.requests import MessageRequest, OrderedMessageRequest, RequestLimits, parse_message
from breakwater.routing import QueueDepths, choose_queue, shard_for


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
    request: MessageRequest | OrderedMessageRequest,
    *,
    tenant: str,
    now_ms: int,
    request_id: str | None,
    trace_id: str | None,
    envelope_id: str | None = None,
    dedup_key: str | None = None,
) -> Envelope:
    """The envelope for an accepted message; ``enqueued_at`` is stamped here, never taken from the client."""
    return Envelope(
        id=envelope_id or new_envelope_id(now_ms),
        tenant=tenant,
        type=request.type,
        payload=request.payload,
        request_id=request_id,
        trace_id=trace_id,
        enqueued_at=now_ms,
        expires_at=now_ms + request.ttl_seconds * 1000 if request.ttl_seconds is not None else None,
        dedup_key=dedup_key or request.dedup_key,
        ordering_key=request.ordering_key,
        origin=Origin.LIVE,
    )


class TokenGate(Protocol):
    """Per-tenant admission (``breakwater.aws.buckets.LeasedTokenBucket``)."""

    def try_acquire(self, tenant: str, limits: BucketLimits) -> tuple[bool, float]: ...


def admit(gate: TokenGate | None, tenant: TenantContext) -> None:
    """Take a token from the tenant's bucket or raise the 429 that says when to come back.

    ``gate`` None is throttling disabled (the naive baseline).
    """
    if gate is None:
        return
    admitted, retry_after = gate.try_acquire(tenant.tenant, tenant.bucket_limits())
    if not admitted:
        raise ThrottledError(
            f"tenant '{tenant.tenant}' is over its rate limit (base {tenant.rate:g} messages/s, "
            f"burst {tenant.burst:g}); retry after the Retry-After header's seconds",
            retry_after=retry_after,
        )


def admit_up_to(gate: TokenGate | None, tenant: str, limits: BucketLimits, count: int) -> tuple[int, float]:
    """How many of ``count`` items the tenant's bucket admits now (a prefix), and when to retry the rest."""
    if gate is None:
        return count, 0.0
    for admitted in range(count):
        ok, retry_after = gate.try_acquire(tenant, limits)
        if not ok:
            return admitted, retry_after
    return count, 0.0


class RoutedQueues(Protocol):
    """The live queues (``breakwater.aws.queues.LiveQueues``)."""

    def __len__(self) -> int: ...

    def depth(self, index: int) -> int: ...

    def send(self, index: int, body: str, group_id: str) -> str: ...


class Router:
    """Shuffle sharding onto the live queues, then the shortest candidate by cached depth."""

    def __init__(
        self,
        queues: RoutedQueues,
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
    """A stored message; ``replayed``: a client's retry answered with its original id, nothing stored."""

    message_id: str
    queue: int | None
    envelope: Envelope | None = None  # None when replayed
    replayed: bool = False

    def body(self) -> dict[str, Any]:
        return {"id": self.message_id, "queue": self.queue}


class CounterSink(Protocol):
    """Adds per-tenant counter deltas to the shared counters (one write per tenant)."""

    def add(self, deltas: Mapping[str, Mapping[str, int]]) -> Mapping[str, Mapping[str, int]]:
        """Writes the deltas; returns those not written (their tenants' writes failed)."""
        ...


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
        keys: RequestKeys | None = None,
    ) -> None:
        self.router = router
        self.keys = keys  # None: no idempotency keys (a key only dedups through processing)
        self.gate = gate  # None: throttling disabled (the naive baseline)
        self._clock = clock
        self.limits = RequestLimits(max_payload_bytes=max_payload_bytes, max_ttl_seconds=max_ttl_seconds)
        self._sink = counters
        self._counts = CounterBuffer(counter_flush_seconds, clock)

    @property
    def counter_flush_seconds(self) -> float:
        return self._counts.interval

    def accept(
        self,
        raw_body: bytes | None,
        tenant: TenantContext,
        *,
        request_id: str | None,
        trace_id: str | None,
        idempotency_key: str | None = None,
    ) -> Accepted:
        """Parse, admit, then store the message; a keyed retry gets its original answer
        (``breakwater.request_keys``)."""
        request = parse_message(MessageRequest, raw_body, self.limits)
        key = request_key(idempotency_key, request.dedup_key)
        keys = self.keys if key is not None else None  # the claims this request takes part in
        try:
            admit(self.gate, tenant)
        except ThrottledError:
            if keys is not None and key is not None:
                now_ms = int(self._clock() * 1000)
                earlier = keys.earlier_answer(tenant.tenant, key, fingerprint(request, key), now_ms)
                if earlier is not None:
                    return Accepted(message_id=earlier.message_id, queue=earlier.queue, replayed=True)
            self._count(tenant.tenant, "throttled")
            raise
        now_ms = int(self._clock() * 1000)
        message_id = new_envelope_id(now_ms)
        if keys is not None and key is not None:
            decision = keys.decide(tenant.tenant, key, fingerprint(request, key), message_id, now_ms)
            if decision.replay:
                return Accepted(message_id=decision.message_id, queue=decision.queue, replayed=True)
            message_id = decision.message_id
        envelope = build_envelope(
            request,
            tenant=tenant.tenant,
            now_ms=now_ms,
            request_id=request_id,
            trace_id=trace_id,
            envelope_id=message_id,
            dedup_key=key,
        )
        try:
            queue = self.router.send(envelope)
        except UnavailableError:
            if keys is not None and key is not None:
                with contextlib.suppress(Exception):  # the claim's pending window ends on its own
                    keys.store.release(tenant.tenant, key, message_id)
            raise
        if keys is not None and key is not None:
            # If this fails the claim stays pending: a retry after its window resends the same id, and
            # processing runs it once.
            with contextlib.suppress(Exception):
                keys.store.accepted(tenant.tenant, key, message_id, queue)
        self._count(tenant.tenant, "accepted")
        return Accepted(message_id=message_id, queue=queue, envelope=envelope)

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
            left = self._sink.add(taken)
        except Exception:
            left = taken
        if left:  # counts only feed estimates; keep them for the next flush rather than fail a request
            self._counts.restore(left)

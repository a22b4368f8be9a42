"""Client retries, end to end: an ``Idempotency-Key`` (or the body's ``dedup_key``) per tenant.

A client that lost a 202 retries its request. Without a key the retry is a second message with a new
id, and processing idempotency (keyed by envelope id) cannot tell the two apart. With a key, ingest
claims ``(tenant, key)`` before it stores the message:

- a new key: the claim records the request's fingerprint and the message id it is about to store,
  pending for ``pending_seconds``; once the message is stored the claim is marked accepted;
- the same key and the same request, accepted: the original 202 again (the same message id), no
  second message;
- the same key and the same request, pending (the first attempt is still running, or died between
  its claim and its send): 409 while the pending window lasts; after it, the retry takes the claim
  over and stores the message under the *same* id, and the worker's processing idempotency, keyed by
  ``(tenant, key)`` (:func:`breakwater.envelope.processing_id`), runs it once even if the first
  attempt had stored it too;
- the same key with a different request: 422, naming the key;
- the same key and the same request, accepted, while the tenant is over its rate: the original 202
  still (:meth:`RequestKeys.earlier_answer`, one read on the throttled path only): the retry asks
  for nothing new, so the throttle has nothing to refuse.

A claim lasts ``window_seconds`` (the processing records last as long): after it, the key is new
again. What is compared is the request's fingerprint (:func:`fingerprint`): type, payload, TTL and
key, never the time it was sent.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from breakwater.errors import BadRequestError, IdempotencyConflictError, IdempotencyKeyReusedError
from breakwater.requests import MAX_KEY_LENGTH, MessageRequest

HEADER = "Idempotency-Key"


class ClaimState(StrEnum):
    PENDING = "pending"
    ACCEPTED = "accepted"


@dataclass(frozen=True)
class Claim:
    """What the store holds for ``(tenant, key)``."""

    message_id: str
    fingerprint: str
    state: ClaimState
    pending_until_ms: int
    queue: int | None = None


class ClaimStore(Protocol):
    """The claims (``breakwater.aws.request_keys.DynamoClaimStore``)."""

    def claim(self, tenant: str, key: str, claim: Claim, expires_at_s: int, now_s: int) -> Claim | None:
        """Record ``claim`` unless a claim whose window has not passed at ``now_s`` holds the key (returns
        None), else return the one that does."""
        ...

    def take_over(self, tenant: str, key: str, stale: Claim, pending_until_ms: int) -> bool:
        """Extend a pending claim whose window passed, if it is still ``stale``; False if another did."""
        ...

    def accepted(self, tenant: str, key: str, message_id: str, queue: int) -> None: ...

    def held(self, tenant: str, key: str, now_s: int) -> Claim | None:
        """The claim whose window has not passed at ``now_s``, or None; a read, nothing written."""
        ...

    def release(self, tenant: str, key: str, message_id: str) -> None:
        """Forget a pending claim whose message was not stored, so the client's retry runs at once."""
        ...


def request_key(header: str | None, body_key: str | None) -> str | None:
    """The request's key: the header, else the body's ``dedup_key``; a 400 if they differ or it is bad."""
    if header is not None:
        header = header.strip()
        if not header or len(header) > MAX_KEY_LENGTH or not header.isprintable() or not header.isascii():
            raise BadRequestError(
                f"{HEADER} must be 1 to {MAX_KEY_LENGTH} printable ASCII characters, got {header[:40]!r}",
                code="invalid_idempotency_key",
            )
        if body_key is not None and body_key != header:
            raise BadRequestError(
                f"{HEADER} {header!r} and the body's dedup_key {body_key!r} differ: give one, or the same",
                code="invalid_idempotency_key",
            )
        return header
    return body_key


def fingerprint(request: MessageRequest, key: str) -> str:
    """The request's identity for its key: what it asks to store, not when (SHA-256 of canonical JSON)."""
    fields = {
        "type": request.type,
        "payload": request.payload,
        "ttl_seconds": request.ttl_seconds,
        "key": key,
    }
    canonical = json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


@dataclass(frozen=True)
class Decision:
    """What ingest does with a keyed request: store ``message_id`` (``replay`` False) or answer again."""

    message_id: str
    replay: bool = False
    queue: int | None = None


@dataclass(frozen=True)
class RequestKeys:
    """The claim policy over a :class:`ClaimStore`; times are epoch milliseconds."""

    store: ClaimStore
    window_seconds: int
    pending_seconds: int

    def decide(self, tenant: str, key: str, print_: str, new_id: str, now_ms: int) -> Decision:
        pending_until = now_ms + self.pending_seconds * 1000
        fresh = Claim(
            message_id=new_id, fingerprint=print_, state=ClaimState.PENDING, pending_until_ms=pending_until
        )
        held = self.store.claim(
            tenant, key, fresh, expires_at_s=now_ms // 1000 + self.window_seconds, now_s=now_ms // 1000
        )
        if held is None:
            return Decision(message_id=new_id)
        if held.fingerprint != print_:
            raise IdempotencyKeyReusedError(
                f"{HEADER} {key!r} was already used by tenant '{tenant}' for a different request "
                f"(within {self.window_seconds} s); use a new key for a new message"
            )
        if held.state is ClaimState.ACCEPTED:
            return Decision(message_id=held.message_id, replay=True, queue=held.queue)
        retry_after = (held.pending_until_ms - now_ms) / 1000
        if retry_after <= 0 and self.store.take_over(tenant, key, held, pending_until):
            return Decision(message_id=held.message_id)
        raise IdempotencyConflictError(
            f"a request with {HEADER} {key!r} is still being stored; "
            "retry after the Retry-After header's seconds",
            retry_after=max(retry_after, 1.0),
        )

    def earlier_answer(self, tenant: str, key: str, print_: str, now_ms: int) -> Decision | None:
        """The original answer to this request if it was already accepted under ``key``, else None.

        For a request refused by the tenant's rate: a retry of a stored message is answered as any
        retry is, whatever the bucket says now. A pending, reused or unknown key gets None (the refusal
        stands); so does a store that cannot be read.
        """
        try:
            held = self.store.held(tenant, key, now_ms // 1000)
        except Exception:
            return None
        if held is None or held.state is not ClaimState.ACCEPTED or held.fingerprint != print_:
            return None
        return Decision(message_id=held.message_id, replay=True, queue=held.queue)

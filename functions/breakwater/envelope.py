"""The one message envelope that travels everywhere: queues, archive and replay.

The replay job mirrors this model as a Spark schema (``glue_jobs``); a test keeps the two equal.
"""

from __future__ import annotations

import json
import os
import time
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

ENVELOPE_VERSION: Literal[1] = 1

# The SQS message attribute the redrive puts on what it moves back from a dead-letter queue by hand
# (``breakwater.aws.redrive``), beside the body it sends back unchanged: workers measure such work
# apart and count it back into the backlog estimate.
REDRIVEN_ATTRIBUTE = "breakwater-redriven"
# The attribute a worker puts on the copy it sends elsewhere (deferred, spilled, sidelined) of a
# redriven message: the copy is still measured apart, but it was counted back into the estimate
# already, when its original arrived.
REDRIVEN_COPY_ATTRIBUTE = "breakwater-redriven-copy"

_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"


class Origin(StrEnum):
    """Which queue role (or job) put the envelope where it is now."""

    LIVE = "live"
    SPILLOVER = "spillover"
    BACKLOG = "backlog"
    SURGE = "surge"
    REPLAY = "replay"


class Envelope(BaseModel):
    """A tenant's message as Breakwater stores it. ``enqueued_at`` is stamped by ingest, never the client."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    v: Literal[1] = ENVELOPE_VERSION
    id: str = Field(min_length=26, max_length=26, description="time-ordered unique id (ULID layout)")
    tenant: str = Field(min_length=1, max_length=64)
    type: str = Field(min_length=1, max_length=128)
    payload: Any = None
    request_id: str | None = None
    trace_id: str | None = None
    enqueued_at: int = Field(ge=0, description="epoch milliseconds, stamped by ingest")
    expires_at: int | None = Field(default=None, ge=0, description="epoch milliseconds")
    dedup_key: str | None = Field(default=None, max_length=128)
    ordering_key: str | None = Field(default=None, max_length=128)
    attempt: int = Field(default=0, ge=0)
    # Receives that ended unprocessed on the queues the message was moved off (None: none). A move
    # starts SQS's receive count again, so without it a message that fails every time and is moved
    # between failures would never reach a dead-letter queue.
    failed_receives: int | None = Field(default=None, ge=0)
    origin: Origin = Origin.LIVE
    replay_run: str | None = None

    def to_json(self) -> str:
        """Compact JSON, the form put on queues and into the archive."""
        return self.model_dump_json(exclude_none=False)

    @classmethod
    def from_json(cls, body: str | bytes) -> Envelope:
        return cls.model_validate_json(body)

    def age_ms(self, now_ms: int) -> int:
        return max(0, now_ms - self.enqueued_at)

    def is_expired(self, now_ms: int) -> bool:
        return self.expires_at is not None and now_ms >= self.expires_at

    def moved(
        self, origin: Origin, *, attempt: int | None = None, failed_receives: int | None = None
    ) -> Envelope:
        """The same message, re-homed to another queue role (its id and ``enqueued_at`` never change)."""
        next_attempt = self.attempt if attempt is None else attempt
        failed = self.failed_receives if failed_receives is None else failed_receives or None
        return self.model_copy(update={"origin": origin, "attempt": next_attempt, "failed_receives": failed})


def processing_id(envelope: Envelope) -> str:
    """What processing idempotency is keyed on: ``(tenant, dedup_key)`` when the client gave a key (its
    retries and any copy of it are one piece of work), else the envelope id."""
    if envelope.dedup_key:
        return f"key:{json.dumps([envelope.tenant, envelope.dedup_key], separators=(',', ':'))}"
    return envelope.id


def new_envelope_id(now_ms: int | None = None, randomness: bytes | None = None) -> str:
    """A 26-character, lexicographically time-ordered id: 48 bits of epoch ms + 80 random bits (ULID layout).

    Time-ordered ids let the archive and the replay job sort and dedup cheaply.
    """
    ms = int(time.time() * 1000) if now_ms is None else now_ms
    rand = os.urandom(10) if randomness is None else randomness
    if len(rand) != 10:
        raise ValueError("randomness must be 10 bytes")
    value = (ms << 80) | int.from_bytes(rand, "big")
    chars = []
    for _ in range(26):
        chars.append(_CROCKFORD[value & 0x1F])
        value >>= 5
    return "".join(reversed(chars))


def envelope_id_time_ms(envelope_id: str) -> int:
    """The millisecond timestamp encoded in an id made by :func:`new_envelope_id`."""
    value = 0
    for char in envelope_id:
        value = (value << 5) | _CROCKFORD.index(char)
    return value >> 80


def payload_size(payload: Any) -> int:
    """Bytes the payload takes as compact JSON, the measure the payload limit applies to."""
    return len(json.dumps(payload, separators=(",", ":")).encode())

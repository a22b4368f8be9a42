"""What the worker needs from AWS, as Protocols and plain callables.

``breakwater.aws.worker_ports`` builds the real ones; tests and benchmarks build others.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from aws_lambda_powertools.utilities.typing import LambdaContext

from breakwater.concurrency import ConcurrencyLimits, Grant
from breakwater.envelope import Envelope
from breakwater.fairness import BucketLimits
from breakwater.processor import WorkContext
from breakwater.settings import TierLimits
from breakwater.sideline import Move


class HeldElsewhereError(RuntimeError):
    """Another invocation holds this message's idempotency lock; it can have expired ``retry_in_s`` from now.

    The worker fails the message and keeps it hidden that long, so a copy whose lock a dead
    invocation still holds waits the lock out instead of spending a receive per visibility timeout.
    """

    def __init__(self, message: str, retry_in_s: float) -> None:
        super().__init__(message)
        self.retry_in_s = retry_in_s


# grants and counters per tenant in; the counters not written out
SettleWrite = Callable[
    [Mapping[str, Grant], Mapping[str, Mapping[str, int]]], Mapping[str, Mapping[str, int]]
]


class RateGate(Protocol):
    """The consumer-side token bucket (``breakwater.aws.buckets.LeasedTokenBucket``, purpose ``consumer``)."""

    def try_acquire_up_to(self, tenant: str, limits: BucketLimits, count: int) -> tuple[int, float]: ...


class LeaseGate(Protocol):
    """Per-tenant concurrency leases (``breakwater.aws.concurrency.ConcurrencyLeases``)."""

    def acquire_many(
        self,
        requests: Mapping[str, ConcurrencyLimits],
        expires_at_ms: int,
        floor_until: Mapping[str, int] | None = None,
    ) -> dict[str, Grant]: ...

    def renew(self, tenant: str, limits: ConcurrencyLimits, until_ms: int) -> bool: ...

    def carry(self, counters: Mapping[str, Mapping[str, int]]) -> None: ...

    def contended(self, tenant: str) -> bool: ...

    def carried_landed(self) -> set[str]: ...


@dataclass
class WorkerPorts:
    """Everything the worker needs from AWS, as plain callables and gates."""

    tenant_limits: Callable[[str], TierLimits]
    swept_at_ms: Callable[[str], int | None]
    # the keys of the moves that failed (their originals stay unacknowledged)
    send_moves: Callable[[list[Move]], set[str]]
    # gives back the batch's leases, adds its per-tenant counters and writes the COMPLETED records the
    # processor buffered; returns the counters it did not write (a raise: it wrote none of them)
    settle: SettleWrite
    record_oldest_age: Callable[[str, int, int], object]  # queue role, oldest age ms, now ms
    extend_visibility: Callable[[str, str, int], None]  # queue url, receipt handle, seconds
    process: Callable[[Envelope, WorkContext], dict[str, Any]]  # the idempotent processor
    # a tenant's lease and counters as soon as its messages are done, as ``settle`` writes them but
    # without the batch's COMPLETED records (None: ``settle`` does it)
    release: SettleWrite | None = None
    rate: RateGate | None = None
    leases: LeaseGate | None = None
    # The consumer tokens of a tenant whose leases are on its counters item (tenant, its bucket's limits,
    # the tokens wanted, its concurrency limits, the lease's expiry in epoch ms, a lapsing floor lease's
    # expiry or None), from a bucket kept on that item, with its floor lease taken in the bucket's write
    # when the bucket writes: the tokens taken, and FLOOR if the lease was taken so (None: lease it with
    # ``leases``). None: ``rate`` only.
    tokens_and_floor: (
        Callable[[str, BucketLimits, int, ConcurrencyLimits, int, int | None], tuple[int, Grant | None]]
        | None
    ) = None
    lock: Callable[[list[Envelope]], None] = lambda _envelopes: None  # idempotency locks, before processing
    flush_processed: Callable[[], None] = lambda: None  # idempotency records, after the batch
    # gives back the idempotency locks of messages that were locked but then not processed (held)
    unlock: Callable[[list[Envelope]], None] = lambda _envelopes: None
    # the processor's dependency is down until this epoch ms (the breaker opened): the controller
    # keeps the sideline drainers off meanwhile
    report_outage: Callable[[int], object] = lambda _until_ms: None
    register_context: Callable[[LambdaContext], None] = lambda _context: None
    clock_ms: Callable[[], int] = lambda: int(time.time() * 1000)
    monotonic: Callable[[], float] = time.monotonic

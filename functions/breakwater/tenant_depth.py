"""What the queues can hold of one tenant: the per-tenant side of the backlog's reconciliation.

SQS gives depths per queue, never per tenant, so the sum of every estimate can only be compared with
the total depth. That hides a phantom backlog on a small tenant beside a large real one: its excess
is well inside the total's tolerance, and a proportional scale takes little from it. But ingest puts
a tenant's messages only on its ``shard_size`` live queues (:func:`breakwater.routing.shard_for`),
and from there the workers move them only to the queues every tenant shares (surge, spillover,
backlog). So a tenant's messages are within the depth of its own live queues plus the shared ones;
each estimate is capped at that (``breakwater.backlog.evaluate``'s ceiling, with the same tolerance)
instead of at the total. A tenant whose live queues are not all shared with the large one (most
tenants: two share all of theirs with probability 1 / C(N, k)) loses its phantom in one run.

Pure: the depths are observed by the controller's ports.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

from breakwater.routing import shard_for


@dataclass(frozen=True)
class ObservedDepths:
    """Every message the queues hold: each live queue's (in ``LIVE_QUEUE_URLS`` order, as ingest
    routes over them) and the queues any tenant's messages may be moved to (surge, sideline)."""

    live: tuple[int, ...]
    shared: int

    def __post_init__(self) -> None:
        if self.shared < 0 or any(depth < 0 for depth in self.live):
            raise ValueError(f"queue depths must not be negative: {self}")

    @property
    def total(self) -> int:
        return sum(self.live) + self.shared


@lru_cache(maxsize=65_536)
def _live_queues(tenant: str, queue_count: int, shard_size: int) -> tuple[int, ...]:
    # A tenant evaluated every run (throttled ones are) hashes its queues once per container.
    return shard_for(tenant, queue_count, min(shard_size, queue_count))


def tenant_depth(tenant: str, live: Sequence[int], shared: int, shard_size: int | None) -> int | None:
    """The most messages of ``tenant`` the queues can hold: its live queues' depths plus the shared
    queues'; None when the live queues' depths or the shard size are not known (the total applies)."""
    if shard_size is None or not live:
        return None
    return sum(live[index] for index in _live_queues(tenant, len(live), shard_size)) + shared

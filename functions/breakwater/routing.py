"""Shuffle sharding: each tenant is hashed to k of the N live queues, and each message goes to the shortest.

Two tenants share all k queues with probability 1 / C(N, k), so one noisy tenant can fill its own
k queues but (almost) every other tenant keeps at least one queue it does not share with it
(Amazon Builders' Library, "Workload isolation using shuffle-sharding").
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence


def _score(tenant: str, index: int) -> bytes:
    return hashlib.sha256(f"{tenant}\x00{index}".encode()).digest()


def shard_for(tenant: str, queue_count: int, shard_size: int) -> tuple[int, ...]:
    """The k distinct queue indexes of ``tenant``: deterministic, evenly spread, stable as N grows.

    Rendezvous (highest-random-weight) hashing: score every queue by a hash of (tenant, queue) and
    keep the k best. Adding a queue moves a tenant only if the new queue beats one of its k.
    """
    if queue_count < 1:
        raise ValueError(f"queue_count must be >= 1, got {queue_count}")
    if not 1 <= shard_size <= queue_count:
        raise ValueError(f"shard_size must be between 1 and queue_count ({queue_count}), got {shard_size}")
    ranked = sorted(range(queue_count), key=lambda index: _score(tenant, index), reverse=True)
    return tuple(ranked[:shard_size])


def choose_queue(candidates: Sequence[int], depths: Mapping[int, int]) -> int:
    """The candidate with the smallest known depth; ties (and unknown depths) keep the tenant's own order."""
    if not candidates:
        raise ValueError("a tenant needs at least one candidate queue")
    # the first of the shallowest, in the tenant's order (a loop: this runs for every message sent)
    best = candidates[0]
    least = depths.get(best, 0)
    for index in candidates:
        depth = depths.get(index, 0)
        if depth < least:
            best, least = index, depth
    return best


def full_overlap_probability(queue_count: int, shard_size: int) -> float:
    """Chance that two tenants are hashed to exactly the same k queues."""
    return 1.0 / math.comb(queue_count, shard_size)


class QueueDepths:
    """Cached depth per queue: refreshed at most every ``refresh_seconds`` per queue, plus local sends.

    Choosing the shortest candidate needs only a rough depth, so a probe per queue per interval
    (not per request) is enough; counting this container's own sends since the probe keeps
    consecutive sends from all piling onto the same queue between probes.
    """

    def __init__(self, refresh_seconds: float) -> None:
        self.refresh_seconds = refresh_seconds
        self._observed: dict[int, int] = {}
        self._sent: dict[int, int] = {}
        self._refreshed_at: dict[int, float] = {}

    def is_stale(self, index: int, now: float) -> bool:
        refreshed = self._refreshed_at.get(index)
        return refreshed is None or now - refreshed >= self.refresh_seconds or now < refreshed

    def observe(self, index: int, depth: int | None, now: float) -> None:
        """Record a probe (``None``: it failed; keep the estimate, do not retry before the interval)."""
        if depth is not None:
            self._observed[index] = depth
            self._sent[index] = 0
        self._refreshed_at[index] = now

    def record_send(self, index: int) -> None:
        self._sent[index] = self._sent.get(index, 0) + 1

    def depth(self, index: int) -> int:
        return self._observed.get(index, 0) + self._sent.get(index, 0)

    def snapshot(self, indexes: Sequence[int]) -> dict[int, int]:
        observed, sent = self._observed, self._sent
        return {index: observed.get(index, 0) + sent.get(index, 0) for index in indexes}

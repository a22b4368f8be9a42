"""A tenant's backlog estimate, kept honest by what the queues show, and the shards of changed tenants.

The estimate is counter arithmetic over the ``tenant#<id>``/``counters`` item: what was accepted and
has not left the system yet. Counters drift: a container that dies loses the tallies it had not
written yet, a write that succeeded but looked failed is retried and counted twice, a message that
leaves through a dead-letter queue is counted only if its worker saw its last receive. Left alone,
a drifted estimate never comes back, and a tenant past the backlog target stays throttled for good.
So the controller keeps a per-tenant ``backlog_offset`` that it corrects with what it can observe:

- **floor**: a backlog is never negative. An estimate below 0 is known to be wrong by exactly that
  much, and the offset absorbs it (lost ``accepted`` counts, ``processed`` counted twice).
- **ceiling**: no tenant holds more messages than all the queues together. An estimate above the
  observed total depth (plus the tolerance) is cut down to it.
- **reconciliation**: the sum of every tenant's estimate against the observed total depth of the
  live, surge and sideline queues. When the sum is over the depth by more than the tolerance in two
  runs in a row, every estimate is scaled so that the sum comes down by that excess. The scale is
  recorded once, as a running logarithm (``scale_log``), and each tenant applies what accrued since
  its own last evaluation (its ``estimate_mark``) the next time the controller looks at it, so a
  reconciliation costs one write whatever the number of tenants. The sum itself is kept per shard
  by the controller (a ledger updated with each tenant's change), never recounted.

The sum is corrected only downwards: an estimate below the truth throttles nobody, and the depth
also holds messages whose ``accepted`` count has not been flushed yet. Within two runs of a drift the
sum is back within the tolerance of the depth, and each estimate always lies between 0 and the depth
plus the tolerance.

Changed tenants: every counter write also sets ``dirty_shard`` (:func:`shard_of` the tenant) on the
counters item. A sparse index over that attribute lists the tenants that changed, by shard, so the
controller reads those and no other; it removes the marker when it is done with a tenant (unless the
tenant is throttled, which it looks at every run until released). Pure: no AWS here.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any, NamedTuple

COUNTER_NAMES = (
    "accepted",
    "throttled",
    "processed",
    "dropped",
    "sidelined",
    "spilled",
    "deferred",
    "failed",
    "archived",
    "replayed",
    "dead_lettered",
    "redriven",
)
"""Attributes of the ``tenant#<id>``/``counters`` item, each a monotonically increasing ADD counter."""

# What takes a message out of the system, and what brings one back.
LEAVING = ("processed", "dropped", "archived", "dead_lettered")
RETURNING = ("replayed", "redriven")

DIRTY_SHARDS = 32
"""Shards of the changed-tenants index: writers spread over as many index partitions, and the controller
can split its work by them. Changing it strands the markers written under the old count until the
tenants change again; the controller still finds them if it reads every shard number ever used."""

# A reconciliation never scales by less than this: the logarithm stays finite when the queues are empty.
MIN_SCALE = 1e-12


def shard_of(tenant: str) -> int:
    """The tenant's shard: stable across processes and releases (not Python's salted ``hash``)."""
    return zlib.crc32(tenant.encode()) % DIRTY_SHARDS


def shard_key(shard: int) -> str:
    """The ``dirty_shard`` value (the index's partition key) of a shard."""
    return f"{shard:02d}"


def shard_groups(invocations: int, shards: int = DIRTY_SHARDS) -> list[list[int]]:
    """The shards split over ``invocations`` invocations, round robin (no more groups than shards)."""
    count = max(1, min(invocations, shards))
    return [list(range(first, shards, count)) for first in range(count)]


def _number(counters: Mapping[str, Any], name: str) -> float:
    return float(counters.get(name, 0) or 0)


def raw_backlog(counters: Mapping[str, Any]) -> float:
    """accepted - processed - dropped - archived - dead_lettered + replayed + redriven, uncorrected.

    Moves (sideline, spill, defer) keep a message in the system and do not count; failures are
    retried, so they do not either. An archived message has left; a replay brings it back and, once
    it finishes, the worker counts it both ``processed`` and ``replayed``, which gives back what
    ``archived`` took. ``dead_lettered`` and ``redriven`` do the same for the dead-letter queues. May
    be negative when counts were lost: :func:`evaluate` corrects that.
    """
    # the sums written out (the same additions in the same order): this runs for every changed tenant
    get = counters.get
    leaving = 0.0
    for name in LEAVING:
        leaving += float(get(name, 0) or 0)
    returning = 0.0
    for name in RETURNING:
        returning += float(get(name, 0) or 0)
    return float(get("accepted", 0) or 0) - leaving + returning


def backlog_estimate(counters: Mapping[str, Any], offset: float = 0.0) -> int:
    """The raw estimate plus the controller's correction, never below 0."""
    return max(0, int(raw_backlog(counters) + offset))


def tolerance(depth: float, minimum: float, fraction: float) -> float:
    """How far an estimate may be off before it is corrected: counts lag, SQS depths are approximate."""
    return max(minimum, fraction * depth)


def carried(estimate: float, mark: float, scale_log: float) -> float:
    """An estimate stored at ``mark``, scaled by every reconciliation since (``scale_log`` only falls)."""
    if scale_log < mark:
        return estimate * math.exp(scale_log - mark)
    return estimate  # no reconciliation since: a scale of exactly 1, no exponential to compute


class Correction(StrEnum):
    NONE = "none"
    FLOOR = "floor"  # below 0: counts were lost
    CEILING = "ceiling"  # above everything the queues hold


class StoredEstimate(NamedTuple):
    """What the controller wrote on the counters item at its last evaluation of the tenant.

    This, :class:`Estimate` and :class:`Ledger` are named tuples, not frozen dataclasses: the controller
    builds them for every changed tenant of every run, and a frozen dataclass costs several times as
    much to build (each field set through ``object``).
    """

    estimate: float = 0.0  # the corrected estimate then, as the shard's ledger counts it
    mark: float = 0.0  # the scale_log it was computed at
    offset: float = 0.0  # backlog_offset

    @classmethod
    def from_item(cls, item: Mapping[str, Any]) -> StoredEstimate | None:
        if "estimate" not in item:
            return None  # first sight (or a counters item the controller never wrote)
        return cls(
            estimate=float(item["estimate"]),
            mark=float(item.get("estimate_mark", 0) or 0),
            offset=float(item.get("backlog_offset", 0) or 0),
        )


class Estimate(NamedTuple):
    """A tenant's corrected estimate, what to store, and what it changes in its shard's ledger."""

    backlog: int  # what the multiplier decision uses
    stored: StoredEstimate
    ledger_delta: float  # new estimate minus the previous one as the ledger holds it now
    correction: Correction


@dataclass(frozen=True)
class DriftLimits:
    minimum: float = 10.0
    fraction: float = 0.05


def evaluate(
    counters: Mapping[str, Any],
    previous: StoredEstimate | None,
    *,
    depth: float,
    scale_log: float,
    limits: DriftLimits,
) -> Estimate:
    """The tenant's estimate now: its counters, its offset, the reconciliations since, floor and ceiling.

    ``depth`` is the observed total of the live, surge and sideline queues; ``scale_log`` the running
    logarithm of every reconciliation's scale.
    """
    raw = raw_backlog(counters)
    if previous is None:
        offset, before = 0.0, 0.0
    else:
        before = carried(previous.estimate, previous.mark, scale_log)
        # A reconciliation scaled what the ledger held for this tenant; the offset takes that on.
        offset = previous.offset - (previous.estimate - before)
    estimate = raw + offset
    correction = Correction.NONE
    if estimate < 0:
        offset, estimate, correction = offset - estimate, 0.0, Correction.FLOOR
    ceiling = depth + tolerance(depth, limits.minimum, limits.fraction)
    if estimate > ceiling:
        offset, estimate, correction = offset - (estimate - ceiling), ceiling, Correction.CEILING
    return Estimate(
        backlog=int(estimate),
        stored=StoredEstimate(estimate=estimate, mark=scale_log, offset=offset),
        ledger_delta=estimate - before,
        correction=correction,
    )


class Ledger(NamedTuple):
    """A shard's sum of its tenants' stored estimates, as of ``mark``."""

    total: float = 0.0
    mark: float = 0.0

    def at(self, scale_log: float) -> float:
        return carried(self.total, self.mark, scale_log)


@dataclass(frozen=True)
class RunState:
    """What one controller run leaves the next: the running logarithm of the reconciliations' scales,
    the last run's excess, and the shard to start from (where a run out of time stopped)."""

    scale_log: float = 0.0
    excess: float = 0.0
    resume_shard: int = 0


@dataclass(frozen=True)
class Reconciliation:
    total_estimate: float
    depth: float
    tolerance: float
    scale: float  # 1.0: nothing to correct
    state: RunState  # what the next run starts from

    @property
    def drift(self) -> float:
        return self.total_estimate - self.depth


def reconcile(
    ledgers: Sequence[Ledger], depth: float, previous: RunState, limits: DriftLimits
) -> Reconciliation:
    """Compare the sum of all estimates with the observed depth; past the tolerance, scale them down.

    Only an excess seen in two runs in a row is taken away, and only as much as both saw: counters
    and depths are read moments apart, so a backlog that grows fast looks like a small excess for one
    run, while drift stays. A drift is gone within two runs of appearing.
    """
    total = sum(ledger.at(previous.scale_log) for ledger in ledgers)
    allowed = tolerance(depth, limits.minimum, limits.fraction)
    excess = max(0.0, total - depth)
    if excess <= allowed:
        return Reconciliation(total, depth, allowed, 1.0, replace(previous, excess=0.0))
    if previous.excess <= allowed:  # first sight: remembered, not corrected yet
        return Reconciliation(total, depth, allowed, 1.0, replace(previous, excess=excess))
    scale = max(MIN_SCALE, (total - min(excess, previous.excess)) / total)
    # What was taken away is not seen again next run.
    after = replace(previous, scale_log=previous.scale_log + math.log(scale), excess=0.0)
    return Reconciliation(total, depth, allowed, scale, after)


# Every queue a worker reads has its own dead-letter queue, named the queue's name and this suffix
# (the stack names both): a worker dead-letters a message by hand there (:func:`dead_letter_queue_url`).
DEAD_LETTER_SUFFIX = "-dlq"


def dead_letter_queue_url(queue_url: str) -> str:
    """The URL of the dead-letter queue of the (standard) queue at ``queue_url``."""
    return queue_url + DEAD_LETTER_SUFFIX


def dead_letters_by_hand(failed_receives: int | None, receive_count: int, max_receive_count: int) -> bool:
    """Whether a message that fails on this receive must be sent to its dead-letter queue by the worker.

    SQS dead-letters after ``max_receive_count`` receives *from one queue*; a message moved between
    failures (spilled, deferred, held) starts that count again on its new queue, and carries the
    receives it failed before in ``failed_receives``. Once those and this queue's reach the limit,
    the worker moves it itself; a message never moved is left to SQS (:func:`will_dead_letter`).
    """
    carried = failed_receives or 0
    return carried > 0 and carried + receive_count >= max_receive_count


def will_dead_letter(receive_count: int, max_receive_count: int) -> bool:
    """A message that fails on this receive goes to its dead-letter queue (SQS moves it, nobody counts).

    The worker counts it ``dead_lettered`` then, so it leaves the estimate when it leaves the queue.
    """
    return receive_count >= max_receive_count

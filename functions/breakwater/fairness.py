"""Per-tenant fairness: token buckets whose tokens are leased in chunks.

The shared bucket (one item per tenant and purpose in the state table) is the source of truth; a
container leases a chunk of tokens in one conditional write and spends them locally, so the
throttle costs one DynamoDB call per chunk instead of one per request. A lease is bounded (a
share of the burst, and it expires), so limits hold across any number of concurrent containers:
every admitted request spent a token that was taken from the shared bucket exactly once.
Everything here is pure; the clock is injected.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

_EPSILON = 1e-4  # tokens; epoch-second floats carry ~1e-7 s of rounding


@dataclass(frozen=True)
class BucketLimits:
    """Refill ``rate`` tokens per second up to ``burst`` tokens."""

    rate: float
    burst: float

    def __post_init__(self) -> None:
        if self.rate <= 0:
            raise ValueError(f"rate must be > 0, got {self.rate}")
        if self.burst < 1:
            raise ValueError(f"burst must be >= 1, got {self.burst}")

    def scaled(self, multiplier: float) -> BucketLimits:
        """The limits after backpressure or organic growth scaled the rate (the burst never drops below 1)."""
        return BucketLimits(rate=self.rate * multiplier, burst=max(1.0, self.burst * min(1.0, multiplier)))


class BucketState(NamedTuple):
    """A bucket as stored: ``tokens`` as of ``updated_at`` (epoch seconds).

    A named tuple, not a frozen dataclass: one is built for every lease asked, and a tuple costs
    a third less to build.
    """

    tokens: float
    updated_at: float

    @classmethod
    def full(cls, limits: BucketLimits, now: float) -> BucketState:
        return cls(tokens=limits.burst, updated_at=now)


def refill(state: BucketState, limits: BucketLimits, now: float) -> BucketState:
    """Tokens accrued since the last update, capped at the burst. Time never runs backwards."""
    elapsed = max(0.0, now - state.updated_at)
    tokens = min(limits.burst, state.tokens + elapsed * limits.rate)
    return BucketState(tokens=tokens, updated_at=max(now, state.updated_at))


def is_full(state: BucketState, limits: BucketLimits, now: float) -> bool:
    """Whether a bucket left in ``state`` has refilled to its burst by ``now``."""
    return refill(state, limits, now).tokens >= limits.burst - _EPSILON


def full_at(state: BucketState, limits: BucketLimits) -> float:
    """When a bucket left in ``state`` is full again at ``limits`` (epoch seconds)."""
    return state.updated_at + max(0.0, limits.burst - state.tokens) / limits.rate


def lease_size(limits: BucketLimits, lease_seconds: float, max_fraction: float) -> int:
    """Tokens a container asks for at once: ``lease_seconds`` of rate, at most ``max_fraction`` of the burst.

    Bounding the share of the burst keeps one container from starving the others of a small bucket.
    """
    wanted = limits.rate * lease_seconds
    cap = limits.burst * max_fraction
    return max(1, math.floor(min(wanted, cap)))


DEMAND_SHARE = 0.5
"""A lease holds this share of what the container expects to spend before it expires: arrivals are
random, and a lease sized to the whole expectation often expires with tokens left, forfeited."""


RECENT_DEMAND_SECONDS = 10.0
"""The window of :meth:`DemandMeter.recent_rate`: a trickle's rate, which a one-second window sees as
0 or 1, estimated over about this long."""


@dataclass
class DemandMeter:
    """Requests one container saw for one tenant: the last whole second and the current one.

    Lambda spreads a tenant's requests over every warm container, so each container sees only its
    share; the meter tells a container how much of the tenant's rate it actually needs.
    """

    second: int = -1
    current: float = 0.0
    previous: float = 0.0
    first: int | None = None  # the first second this container saw the tenant
    # Requests over the last RECENT_DEMAND_SECONDS or so, decayed exponentially: a trickle's rate,
    # which a one-second window sees as 0 or 1
    recent: float = 0.0
    recent_at: float = 0.0

    def observe(self, now: float, count: float = 1.0) -> None:
        self._roll(now)
        if self.first is None:
            self.first = self.second
            self.recent_at = now
        self.current += count
        self.recent = self._recent(now) + count
        self.recent_at = max(now, self.recent_at)

    def recent_rate(self, now: float) -> float:
        """Requests per second over about the last :data:`RECENT_DEMAND_SECONDS` (an exponentially
        weighted count; it starts at zero, so a container new to a tenant underestimates it)."""
        return self._recent(now) / RECENT_DEMAND_SECONDS

    def _recent(self, now: float) -> float:
        if now <= self.recent_at:
            return self.recent
        return self.recent * math.exp((self.recent_at - now) / RECENT_DEMAND_SECONDS)

    def own_rate(self, now: float) -> float:
        """Requests per second this container sees: the last second's (in its first second, the requests
        so far), or the recent rate if higher (a trickle's last second is often empty)."""
        last_second = self.rate(now)
        return max(self.current if last_second is None else last_second, self.recent_rate(now))

    def rate(self, now: float) -> float | None:
        """Requests per second over the last second (the previous second weighted by how much of it
        is still inside the window, plus the current one); None until a whole second was seen, so a
        container new to a tenant leases as usual instead of growing its lease one write at a time."""
        self._roll(now)
        if self.first is None or self.second <= self.first:
            return None
        into = now - math.floor(now)
        return self.previous * (1.0 - into) + self.current

    def _roll(self, now: float) -> None:
        second = math.floor(now)
        if second == self.second:
            return
        self.previous = self.current if second == self.second + 1 else 0.0
        self.current = 0.0
        self.second = second


def demand_lease_size(usual: int, demand_per_second: float, lease_seconds: float) -> int:
    """The tokens to lease: what the container will surely spend before the lease expires, at most ``usual``.

    A lease's unspent tokens are forfeited when it expires; a container leasing the usual chunk for
    a trickle of requests takes tokens the tenant's other containers then lack. Sizing each lease
    to the container's own demand keeps admission at the tenant's rate however many containers
    share it, at the cost of more, smaller leases where each container sees little traffic.
    """
    wanted = math.floor(demand_per_second * lease_seconds * DEMAND_SHARE)
    return max(1, min(usual, wanted))


CONTENDED_ASKS_PER_S = 200
"""Asks a second of one tenant's bucket item, at most, from all the containers that share a contended
bucket (each paced by :func:`contended_ask_interval_s`): a tenant over its rate with its messages spread
over a large fleet otherwise asks once per container batch, and its item would pass a partition's
write limit. A paced container's copy of the item is stale by the time it asks again, so an ask whose
lease is no longer all there costs a failed conditional write before the one that takes what is left:
at most about twice this many writes a second, under half a partition's limit."""


def contended_ask_interval_s(containers: int) -> float:
    """How long a container waits between its asks of a contended bucket (an ask refused, or granted
    less than the container's copy promised), given how many containers may ask it at once: together
    they ask at most :data:`CONTENDED_ASKS_PER_S` times a second. A lease taken then is sized to what
    the container will spend until its next ask."""
    return max(containers, 0) / CONTENDED_ASKS_PER_S


def paced_lease_size(sized: int, burst: float, demand_per_second: float | None, interval_s: float) -> int:
    """A contended container's lease when its asks are paced ``interval_s`` apart: what it expects to
    spend until the next ask (all of it, not :data:`DEMAND_SHARE`: it cannot come back sooner), at most
    the burst, or the lease ``sized`` as usual if larger."""
    if demand_per_second is None:
        return sized
    return max(sized, min(math.floor(burst), math.ceil(demand_per_second * interval_s)))


QUIET_LEASE_SECONDS = 60.0
"""How long a quiet lease lasts: the horizon over which a container sizes it to the tenant's trickle.
Longer than :data:`RECENT_DEMAND_SECONDS`: a tenant spread over many containers is seen by each only
every so often, and over a short horizon a container expects one of its requests (a one-token lease,
a write per request) where over a longer one it expects a few."""

QUIET_MAX_FRACTION = 0.5
"""A quiet lease holds at most this share of the burst (or the usual lease, if larger)."""


def quiet_lease_size(usual: int, recent_per_second: float, burst: float) -> int:
    """Tokens for a quiet lease: what the container expects to spend over :data:`QUIET_LEASE_SECONDS`.

    A container that sees a tenant less than a few times a second gets a one-token lease from
    :func:`demand_lease_size`, so each of that tenant's requests costs a shared-bucket write. When
    the bucket is full (the tenant left its last burst's worth of refill unspent) the container may
    instead lease what it expects to spend over the longer horizon, for that long: unspent tokens
    of a full bucket are forfeited from refill the tenant was not using, and every admitted request
    still spent a token taken from the shared bucket exactly once, so the limits hold as before.
    Capped at :data:`QUIET_MAX_FRACTION` of the burst, or ``usual`` if larger: a quiet lease is taken
    from a full bucket only, so a tenant using its rate takes none, and one that wakes up still finds
    the rest of its burst in the bucket. 0 or 1 means no quiet lease is worth taking.
    """
    cap = max(usual, math.floor(burst * QUIET_MAX_FRACTION))
    return min(cap, math.floor(recent_per_second * QUIET_LEASE_SECONDS))


class LeaseDecision(NamedTuple):
    """Outcome of trying to take a lease from the shared bucket (a named tuple, as :class:`BucketState`)."""

    granted: int
    state: BucketState
    retry_after: float  # seconds until ``wanted`` tokens would be available; 0 when granted

    @property
    def ok(self) -> bool:
        return self.granted > 0


def take_lease(state: BucketState, limits: BucketLimits, now: float, wanted: int) -> LeaseDecision:
    """Take up to ``wanted`` whole tokens from the bucket; grant what is there (at least one) or nothing."""
    # :func:`refill` written out: this runs for every request, and the branches cost less than the
    # calls of min and max (the same values: time never runs backwards, the burst caps the tokens)
    tokens, updated_at = state.tokens, state.updated_at
    if now > updated_at:
        tokens += (now - updated_at) * limits.rate
        updated_at = now
    if tokens > limits.burst:
        tokens = limits.burst
    # A hair of tolerance: waiting exactly ``retry_after`` must yield the promised token despite rounding.
    available = math.floor(tokens + _EPSILON)
    granted = wanted if wanted <= available else available
    # (granted, state, retry_after) and (tokens, updated_at) by position
    if granted >= 1:
        left = tokens - granted
        return LeaseDecision(granted, BucketState(left if left > 0.0 else 0.0, updated_at), 0.0)
    # Come back when a whole lease is there, not after every single token: a throttled tenant then
    # costs one shared-bucket write per lease instead of one per admitted request.
    missing = max(1.0, min(float(wanted), limits.burst)) - tokens
    return LeaseDecision(0, BucketState(tokens, updated_at), max(missing / limits.rate, 0.001))


CONTENTION_GROWTH = 2.0
"""A lost probe (a call that found fewer tokens than the container's copy promised) doubles the backoff."""
CONTENTION_DECAY = 0.9
"""A lease the table granted, leaving the bucket short of another such lease, shrinks the backoff so."""
MAX_CONTENTION_BACKOFF_S = 10.0
"""The longest a container backs off for contention alone: however hard a tenant floods, each of its
containers then asks its bucket item at most about once per this many seconds."""
BACKOFF_REQUESTS = 16.0
"""Beyond the bucket's refill from empty, a container backs off at most this many of its own requests'
worth of time: a backoff sized in requests follows the tenant's spread over containers (the more
containers share its requests, the fewer each sees and the longer each must wait), where a cap in
seconds alone is either too short for many containers or too long for a few."""
REFUSAL_JITTER = 0.2
"""A local refusal lasts up to this share longer, at random, so containers do not come back at once."""


def backoff_cap(limits: BucketLimits, own_rate: float) -> float:
    """The longest contention backoff for a container that sees ``own_rate`` of the tenant's requests
    per second: the bucket's refill from empty, or :data:`BACKOFF_REQUESTS` of its own requests if
    longer, never more than :data:`MAX_CONTENTION_BACKOFF_S`."""
    by_requests = BACKOFF_REQUESTS / own_rate if own_rate > 0 else MAX_CONTENTION_BACKOFF_S
    return min(MAX_CONTENTION_BACKOFF_S, max(limits.burst / limits.rate, by_requests))


def contention_backoff(previous: float, refill_wait: float, shared: float, cap: float) -> float:
    """The backoff after a lost probe: twice the previous one, the refill or the one the tenant's other
    containers last used (``shared``), whichever is longest, at most ``cap`` (:func:`backoff_cap`).

    A lost probe proves other containers take this tenant's tokens as they refill. If each came back
    when its own copy says the tokens are there, all of them would, and all but one would lose again:
    each lost probe is a write on the tenant's item. Doubling per lost probe and shrinking per won one
    (:func:`relaxed_backoff`; multiplicative increase, gentle decrease) settles where about
    ln(1/decay) / (ln 2 + ln(1/decay)) of the probes are lost, whatever the number of containers;
    tokens nobody takes meanwhile stay in the shared bucket for the next probe.
    """
    return min(cap, CONTENTION_GROWTH * max(previous, refill_wait, shared))


def relaxed_backoff(backoff: float, left: float | None, limits: BucketLimits) -> float:
    """The backoff after the table granted a lease that left ``left`` tokens in the bucket (None: not
    known): halved if the bucket is still half full (the tenant's containers ask too seldom, and would
    let its refill overflow), else shrunk gently."""
    if left is not None and left >= limits.burst / 2:
        return backoff / 2
    return backoff * CONTENTION_DECAY


def local_refusal_seconds(refill_wait: float, backoff: float, uniform: float) -> float:
    """How long a container refuses a tenant locally: until the bucket holds the tokens it asks for
    again. A container that has lost probes to others (``backoff`` > 0) waits its backoff if longer,
    stretched by up to :data:`REFUSAL_JITTER` (``uniform`` in [0, 1)) so the containers refused
    together do not all ask again at the same instant; one that has not is alone with the tenant as
    far as it knows, and comes back exactly when its tokens are there."""
    if backoff <= 0:
        return refill_wait
    return max(refill_wait, backoff) * (1.0 + REFUSAL_JITTER * uniform)


@dataclass
class LocalLease:
    """Tokens a container holds; unspent tokens are forfeited when the lease expires (never carried)."""

    tokens: int = 0
    expires_at: float = 0.0
    blocked_until: float = 0.0  # after a refused lease, do not ask the shared bucket again before this
    backoff: float = 0.0  # seconds; grows with lost probes, shrinks with granted leases (contention_backoff)

    def spend_up_to(self, count: int, now: float) -> int:
        """Spend up to ``count`` held tokens; how many were spent (none once the lease expired)."""
        if now >= self.expires_at:
            self.tokens = 0
            return 0
        spent = min(count, self.tokens)
        self.tokens -= spent
        return spent

    def grant(self, tokens: int, now: float, ttl: float, backoff: float = 0.0) -> None:
        """A lease from the table; ``backoff``: the contention backoff after it (:func:`relaxed_backoff`).

        A contended container paces its asks whatever their outcome: one that asked again as soon as
        it had spent a won lease would lose about every other ask.
        """
        self.tokens = tokens
        self.expires_at = now + ttl
        self.backoff = backoff
        self.blocked_until = now + backoff

    def refuse(self, now: float, retry_after: float) -> None:
        self.tokens = 0
        self.blocked_until = now + retry_after

    def is_blocked(self, now: float) -> bool:
        return now < self.blocked_until


def retry_after_header(seconds: float) -> str:
    """``Retry-After`` takes whole seconds; never advertise 0 for a throttled request."""
    return str(max(1, math.ceil(seconds)))

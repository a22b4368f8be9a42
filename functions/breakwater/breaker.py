"""A worker container's circuit breaker on the processor's dependency.

When the processor raises :class:`breakwater.processor.DependencyUnavailableError`, retrying the
message at once only burns its receive count: after ``maxReceiveCount`` receives SQS moves it to the
dead-letter queue, although nothing is wrong with it. The breaker opens instead: while it is open the
worker does not call the processor and moves the messages it receives out of the way (the live
worker sidelines them, a sideline drainer defers them in its own queue), each a new message whose
receive count starts again. When the open window has passed, the next message is a probe
(half-open): success closes the breaker, another outage opens it again for twice as long, up to
``max_s``.

Everything here is pure; ``now`` (seconds, monotonic or epoch) is passed in.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum


class BreakerState(StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


@dataclass
class CircuitBreaker:
    """Opens for ``base_s`` on an outage, doubling with each outage in a row, never past ``max_s``."""

    base_s: float
    max_s: float
    outages_in_a_row: int = 0
    open_until: float = 0.0

    def __post_init__(self) -> None:
        if self.base_s <= 0 or self.max_s < self.base_s:
            raise ValueError(f"need 0 < base_s <= max_s, got base_s={self.base_s}, max_s={self.max_s}")

    def state(self, now: float) -> BreakerState:
        if self.outages_in_a_row == 0:
            return BreakerState.CLOSED
        return BreakerState.OPEN if now < self.open_until else BreakerState.HALF_OPEN

    def allows(self, now: float) -> bool:
        """Whether the processor may be called now (closed, or half-open: a probe)."""
        # :meth:`state` is not OPEN, without building the state: asked before every message
        return self.outages_in_a_row == 0 or now >= self.open_until

    def record_success(self) -> bool:
        """The dependency answered; True if that closed the breaker."""
        was_open = self.outages_in_a_row > 0
        self.outages_in_a_row = 0
        self.open_until = 0.0
        return was_open

    def record_outage(self, now: float) -> float:
        """The dependency is down: open (again) from ``now``; returns when the window ends."""
        window = min(self.max_s, self.base_s * 2 ** min(self.outages_in_a_row, 30))
        self.outages_in_a_row += 1
        self.open_until = now + window
        return self.open_until

    def retry_in_s(self, now: float) -> int:
        """Whole seconds until the next probe (at least 1): how long a held message should wait."""
        return max(1, math.ceil(self.open_until - now))

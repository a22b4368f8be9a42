"""Per-tenant counts kept in memory and flushed in aggregate.

The controller's backlog estimate only needs totals, so ingest adds to a local tally and writes it
at most once per interval per tenant (one DynamoDB ADD), never once per request. A timer and the
container's shutdown flush what no later request would (``breakwater.aws.front_door``); a count lost
anyway (a container killed outright) is corrected by the controller's reconciliation of the estimate
with the queues it observes.
"""

from __future__ import annotations

import threading
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping


class CounterBuffer:
    """Tallies per tenant; :meth:`take_due` hands them out once ``interval`` seconds have passed.

    Safe to share between the request thread and a flushing timer thread.
    """

    def __init__(self, interval: float, clock: Callable[[], float]) -> None:
        if interval < 0:
            raise ValueError(f"interval must be >= 0, got {interval}")
        self._interval = interval
        self._clock = clock
        self._counts: dict[str, Counter[str]] = defaultdict(Counter)
        self._since: float | None = None
        self._lock = threading.Lock()

    @property
    def interval(self) -> float:
        return self._interval

    def add(self, tenant: str, name: str, value: int = 1) -> None:
        with self._lock:
            if self._since is None:
                self._since = self._clock()
            self._counts[tenant][name] += value

    def take_due(self) -> dict[str, dict[str, int]]:
        """The tallies if the oldest is at least ``interval`` old (and resets them); else nothing."""
        with self._lock:
            if self._since is None or self._clock() - self._since < self._interval:
                return {}
            return self._take()

    def take_all(self) -> dict[str, dict[str, int]]:
        with self._lock:
            return self._take()

    def _take(self) -> dict[str, dict[str, int]]:
        taken = {tenant: dict(counts) for tenant, counts in self._counts.items() if counts}
        self._counts.clear()
        self._since = None
        return taken

    def restore(self, taken: Mapping[str, Mapping[str, int]]) -> None:
        """Put back tallies whose flush failed, so they go out with the next one."""
        for tenant, counts in taken.items():
            for name, value in counts.items():
                self.add(tenant, name, value)

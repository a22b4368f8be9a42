"""SQS fair queues, as AWS documents them: which message groups are noisy, and the order receives take.

Shared by the embedded AWS (``local/emulator/moto_patches/sqs_fair.py``) and the simulator
(``sim/sqs.py``): the documented figures and the rule that decides the noisy groups live here once;
the bookkeeping that feeds the rule is each one's own (the simulator's is incremental, on its own
deques, for a thousand tenants; the emulator's reads moto's messages, see :class:`FairQueue`).

The documented rules ("How Amazon SQS fair queues work", Amazon SQS Developer Guide,
https://docs.aws.amazon.com/AWSSimpleQueueService/latest/SQSDeveloperGuide/sqs-fair-queues-detailed.html):

- Tenants: "Fair queues identify tenants by the MessageGroupId property on each message. [...] Each
  message without a MessageGroupId is treated as belonging to its own distinct tenant."
- Detection: "A tenant is marked as a noisy neighbor when either of the following is true: Concurrency
  share: the tenant accounts for more than 10% of in-flight messages in the queue and has at least 30
  of its own messages in flight. Processing time share: the tenant's recent share of total consumer
  processing time exceeds 10%." The thresholds "are approximate".
- Order: once a tenant is noisy, consumers receive quiet tenants' messages whenever any is available;
  noisy tenants' messages are neither dropped nor throttled, and are received as usual when no quiet
  message waits; with several noisy tenants, the one with the fewest in-flight messages goes first.
- Quiet again: a tenant stops being noisy when its backlog is fully consumed, or when it has sent no
  message for 5 consecutive minutes.

And the metrics ("Available CloudWatch metrics for Amazon SQS", same guide,
https://docs.aws.amazon.com/AWSSimpleQueueService/latest/SQSDeveloperGuide/sqs-available-cloudwatch-metrics.html):
``ApproximateNumberOfNoisyGroups`` is "the number of message groups that are considered noisy in a
fair queue"; "each QuietGroup metric is a subset of the equivalent standard queue-level Approximate
metric, but excludes messages from noisy neighbor groups".

What this model decides beyond the text (AWS does not say): "recent" processing time decays
exponentially over :data:`PROCESSING_WINDOW_S`; a message's processing time runs from its receive to
its delete or to the end of its visibility timeout; the noisy set is re-evaluated at most every
:data:`NOISY_REFRESH_S` (AWS's detection is approximate and distributed); a noisy tenant stays noisy
until one of the two documented ways out, even if its shares fall meanwhile (the text's "until [its]
shares fall to levels comparable to quiet tenants" has no figure); the backlog that must be consumed
is the tenant's visible messages. A message without a group is its own tenant: it counts in the
queue's in-flight total and processing time, but it can never be held back, since a tenant of one
message has no backlog once that message is received.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Collection, Hashable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TypeVar

NOISY_SHARE = 0.10  # share of in-flight messages or of recent processing time
NOISY_MIN_IN_FLIGHT = 30  # ... and at least this many in flight for the in-flight share to count
NOISY_IDLE_S = 300.0  # a noisy group that sent nothing for 5 minutes is quiet again
PROCESSING_WINDOW_S = 60.0  # "recent" processing time: an exponential window (AWS does not say how long)
NOISY_REFRESH_S = 1.0  # how often the noisy set is re-evaluated (AWS: "approximate", a distributed system)

G = TypeVar("G", bound=Hashable)
M = TypeVar("M")


def noisy_groups(
    now: float,
    *,
    in_flight: Mapping[G, int],
    total_in_flight: int,
    processing_s: Mapping[G, float],
    total_processing_s: float,
    previously_noisy: Iterable[G],
    backlog: Callable[[G], int],
    last_sent: Callable[[G], float],
) -> set[G]:
    """The groups noisy at ``now``: over either documented share, or noisy before, and not yet quiet again.

    ``in_flight`` and ``processing_s`` may hold only the candidates (groups that could pass); the
    totals are the whole queue's, messages without a group included.
    """
    noisy = {
        group
        for group, held in in_flight.items()
        if held >= NOISY_MIN_IN_FLIGHT and held > NOISY_SHARE * total_in_flight
    }
    if total_processing_s > 0:
        over = NOISY_SHARE * total_processing_s
        noisy.update(group for group, spent in processing_s.items() if spent > over)
    noisy.update(previously_noisy)
    # Either documented way out ends it, whatever the shares say: with nothing waiting there is nothing
    # to put behind the others, and a tenant silent for 5 minutes is forgiven.
    return {group for group in noisy if backlog(group) > 0 and now - last_sent(group) < NOISY_IDLE_S}


def receive_order(
    messages: Iterable[M],
    group_of: Callable[[M], G | None],
    noisy: Collection[G],
    in_flight: Mapping[G, int],
) -> Iterator[M]:
    """``messages`` (oldest first) in the order a receive takes them: quiet tenants' first, as they come.

    Noisy groups' messages are held back while the walk goes on, then follow, the noisy group with the
    fewest in flight first (ties: the group met first), each group's oldest first. Lazy: a receive
    that stops after ten quiet messages reads no further.
    """
    held: dict[G, list[M]] = {}
    for message in messages:
        group = group_of(message)
        if group is not None and group in noisy:
            held.setdefault(group, []).append(message)
        else:
            yield message
    for group in sorted(held, key=lambda g: in_flight.get(g, 0)):
        yield from held[group]


@dataclass(frozen=True)
class QueueSnapshot:
    """What a queue holds at one instant, by group (messages without a group counted in the totals only)."""

    in_flight: Mapping[Hashable, int]
    visible: Mapping[Hashable, int]
    total_in_flight: int


class RecentProcessingTime:
    """Consumer processing time per group and in all, each second weighing less as it ages (``window_s``)."""

    def __init__(self, window_s: float = PROCESSING_WINDOW_S) -> None:
        if window_s <= 0:
            raise ValueError(f"the processing-time window must be positive, not {window_s}")
        self.window_s = window_s
        self._by_group: dict[Hashable, tuple[float, float]] = {}  # group -> (seconds, as of)
        self._total = (0.0, 0.0)

    def _decayed(self, amount: tuple[float, float], now: float) -> float:
        seconds, at = amount
        return seconds * math.exp(-max(0.0, now - at) / self.window_s)

    def add(self, group: Hashable | None, seconds: float, now: float) -> None:
        """A message of ``group`` (``None``: no group) took ``seconds`` of a consumer, ending at ``now``."""
        if seconds < 0:
            raise ValueError(f"processing time cannot be negative: {seconds}")
        self._total = (self._decayed(self._total, now) + seconds, now)
        if group is not None:
            self._by_group[group] = (self._decayed(self._by_group.get(group, (0.0, now)), now) + seconds, now)

    def shares(self, now: float) -> tuple[dict[Hashable, float], float]:
        """(recent seconds per group, recent seconds in all) as of ``now``; forgotten groups dropped."""
        total = self._decayed(self._total, now)
        by_group: dict[Hashable, float] = {}
        for group, amount in list(self._by_group.items()):
            seconds = self._decayed(amount, now)
            if seconds < 1e-9 * max(total, 1e-9):  # too old to weigh in any share: forget it
                del self._by_group[group]
            else:
                by_group[group] = seconds
        return by_group, total


class FairQueue:
    """One standard queue's fair-queue state: groups' last sends, recent processing time, the noisy set.

    Pure (no moto, no clock of its own: every call is given ``now``, in seconds) and thread-safe, since
    moto's server answers requests on several threads. The caller reports sends and finished
    processing as they happen, and a :class:`QueueSnapshot` when :meth:`due` says the noisy set is
    to be re-evaluated.
    """

    def __init__(self, refresh_s: float = NOISY_REFRESH_S, window_s: float = PROCESSING_WINDOW_S) -> None:
        self.refresh_s = refresh_s
        self._lock = threading.Lock()
        self._last_sent: dict[Hashable, float] = {}
        self._processing = RecentProcessingTime(window_s)
        self._noisy: frozenset[Hashable] = frozenset()
        self._in_flight: Mapping[Hashable, int] = {}
        self._refreshed_at = -math.inf

    def sent(self, group: Hashable, now: float) -> None:
        with self._lock:
            self._last_sent[group] = max(now, self._last_sent.get(group, -math.inf))

    def finished(self, group: Hashable | None, seconds: float, now: float) -> None:
        """A received message was deleted, or its visibility timeout ended, ``seconds`` after its receive."""
        with self._lock:
            self._processing.add(group, max(0.0, seconds), now)

    def due(self, now: float) -> bool:
        return now - self._refreshed_at >= self.refresh_s

    def refresh(self, now: float, snapshot: QueueSnapshot) -> frozenset[Hashable]:
        """Re-evaluate the noisy groups on ``snapshot`` (taken at ``now``); returns them."""
        with self._lock:
            processing, total_processing = self._processing.shares(now)
            self._noisy = frozenset(
                noisy_groups(
                    now,
                    in_flight=snapshot.in_flight,
                    total_in_flight=snapshot.total_in_flight,
                    processing_s=processing,
                    total_processing_s=total_processing,
                    previously_noisy=self._noisy,
                    backlog=lambda group: snapshot.visible.get(group, 0),
                    last_sent=lambda group: self._last_sent.get(group, -math.inf),
                )
            )
            self._in_flight = dict(snapshot.in_flight)
            self._refreshed_at = now
            return self._noisy

    @property
    def noisy(self) -> frozenset[Hashable]:
        """The noisy groups as of the last :meth:`refresh`."""
        return self._noisy

    def order(self, messages: Iterable[M], group_of: Callable[[M], Hashable | None]) -> Iterator[M]:
        """``messages`` in receive order (see :func:`receive_order`), by the last refresh's noisy set."""
        noisy, in_flight = self._noisy, self._in_flight
        if not noisy:
            return iter(messages)
        return receive_order(messages, group_of, noisy, in_flight)

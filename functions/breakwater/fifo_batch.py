"""The FIFO worker's batch: in order per group, and a circuit breaker that holds groups through an outage.

A record that fails stops its group for the rest of the batch (the later records of the group are
returned unprocessed, so SQS redelivers the group in order) while other groups go on, as
``SqsFifoPartialProcessor(skip_group_on_error=True)`` did.

When the processor raises :class:`breakwater.processor.DependencyUnavailableError` the breaker opens
(:class:`breakwater.breaker.CircuitBreaker`, the live worker's): that record, the rest of its group,
and every record received while the breaker is open are *held*, not failed. A FIFO message cannot be
sidelined to another queue without breaking its group's order, so a hold keeps it where it is: it is
returned unprocessed (SQS then keeps its group's later messages back) with its visibility changed to
about the breaker's next probe, so the group is not received again, and does not spend a receive,
before the dependency may be back. Each receive still counts towards ``maxReceiveCount``, so the hold
also grows with the message's receive count (the back-off survives a change of container), and a
message with at most one receive to spare is held for the longest the policy allows; when a probe
closes the breaker, the messages this container held come back at once.

Ports only; :mod:`breakwater.aws.fifo_worker_ports` wires SQS and DynamoDB.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from breakwater.breaker import CircuitBreaker
from breakwater.envelope import Envelope
from breakwater.fifo_consumer import FifoConsumer
from breakwater.observability import logger
from breakwater.ordered import OrderedMessage, Outcome, deduplication_id
from breakwater.processor import DependencyUnavailableError

# SQS keeps a message in flight at most 12 hours from its receive; the hold is asked for within the
# invocation, so it leaves room for the longest Lambda timeout.
MAX_HOLD_S = 43_200 - 900
# Messages whose early return on the breaker's close a container remembers; older ones simply come
# back when their hold ends.
MAX_REMEMBERED_HOLDS = 1_000


@dataclass(frozen=True)
class FifoRecord:
    """What the batch needs of one SQS record of a FIFO queue."""

    message_id: str
    receipt_handle: str
    queue_url: str
    group_id: str | None
    receive_count: int
    body: str


@dataclass(frozen=True)
class HeldMessage:
    queue_url: str
    receipt_handle: str


class VisibilityPort:
    """Changes the visibility of in-flight messages (``ChangeMessageVisibilityBatch`` per queue).

    ``hold`` returns the messages whose change failed (they come back at the queue's visibility timeout).
    """

    def hold(self, messages: Sequence[HeldMessage], seconds: int) -> list[HeldMessage]:
        raise NotImplementedError


@dataclass(frozen=True)
class OutageHolds:
    """How long a held message stays hidden.

    ``base_s``/``max_s``: a message received again is held ``base_s * 2**(receives - 2)``, never past
    ``max_s``, and never shorter than the breaker's own wait (all a first receive waits for).
    ``max_receive_count`` (the queues' redrive policy) and ``last_hold_s``: a message with at most one
    receive to spare is held ``last_hold_s``, so an outage longer than the back-off spends its last
    receives as slowly as SQS allows.
    """

    base_s: float
    max_s: float
    max_receive_count: int | None = None
    last_hold_s: int = MAX_HOLD_S

    def __post_init__(self) -> None:
        if self.base_s <= 0 or self.max_s < self.base_s:
            raise ValueError(f"need 0 < base_s <= max_s, got base_s={self.base_s}, max_s={self.max_s}")
        if not 1 <= self.last_hold_s <= MAX_HOLD_S:
            raise ValueError(f"last_hold_s must be in 1..{MAX_HOLD_S}, got {self.last_hold_s}")
        if self.max_receive_count is not None and self.max_receive_count < 1:
            raise ValueError(f"max_receive_count must be >= 1, got {self.max_receive_count}")

    def seconds(self, receive_count: int, breaker_wait_s: int) -> int:
        if self.max_receive_count is not None and self.max_receive_count - receive_count <= 1:
            return self.last_hold_s
        # A first receive waits for this container's probe; a message received again has been held
        # before, perhaps by another container whose breaker knew more, so it backs off on its own.
        backoff = 0.0 if receive_count < 2 else min(self.max_s, self.base_s * 2 ** min(receive_count - 2, 30))
        return int(min(MAX_HOLD_S, max(breaker_wait_s, backoff)))


@dataclass
class BatchReport:
    """The batch's failures (returned as batch item failures), outcomes, holds and outages."""

    failures: list[str] = field(default_factory=list)
    outcomes: Counter[Outcome] = field(default_factory=Counter)
    held: int = 0
    outages: int = 0
    failed: int = 0


class FifoBatchWorker:
    """One per container. ``breaker`` None: an outage is a failure like any other (no breaker).

    ``report_outage`` receives when (epoch ms) the breaker's window ends, as the live worker reports
    it; ``monotonic`` (s) drives the breaker, ``clock_ms`` (epoch ms) the messages' expiry.
    """

    def __init__(
        self,
        consumer: FifoConsumer,
        *,
        visibility: VisibilityPort,
        monotonic: Callable[[], float],
        clock_ms: Callable[[], int],
        breaker: CircuitBreaker | None = None,
        holds: OutageHolds | None = None,
        report_outage: Callable[[int], object] = lambda _until_ms: None,
    ) -> None:
        if (breaker is None) != (holds is None):
            raise ValueError("the breaker needs its hold policy (holds), and the hold policy its breaker")
        self.consumer = consumer
        self.visibility = visibility
        self.monotonic = monotonic
        self.clock_ms = clock_ms
        self.breaker = breaker
        self.holds = holds
        self.report_outage = report_outage
        self._remembered: list[HeldMessage] = []

    def handle(self, records: Sequence[FifoRecord]) -> BatchReport:
        try:
            return self._handle(records)
        finally:  # the tenants' slots of what was consumed, one write per tenant
            self.consumer.flush(self.clock_ms())

    def _handle(self, records: Sequence[FifoRecord]) -> BatchReport:
        report = BatchReport()
        failed_groups: set[str] = set()  # the rest of each comes back unprocessed, in order
        held_groups: set[str] = set()  # the rest of each is held with it
        held: dict[int, list[FifoRecord]] = {}
        for record in records:
            group = record.group_id or ""
            if group in held_groups:
                self._add_hold(held, record)
                continue
            if group in failed_groups:
                report.failures.append(record.message_id)
                continue
            if self.breaker is not None and not self.breaker.allows(self.monotonic()):
                held_groups.add(group)
                self._add_hold(held, record)
                continue
            try:
                outcome = self._consume(record)
            except DependencyUnavailableError as exc:
                if self.breaker is None:
                    self._fail(record, exc, report, failed_groups)
                    continue
                self._trip(exc, report)
                held_groups.add(group)
                self._add_hold(held, record)
                continue
            except Exception as exc:
                self._fail(record, exc, report, failed_groups)
                continue
            report.outcomes[outcome] += 1
            if self.breaker is not None and self.breaker.record_success():
                logger.info("dependency available again: circuit closed")
                self._return_remembered()
        for records_held in held.values():
            report.held += len(records_held)
            report.failures.extend(each.message_id for each in records_held)
        self._hold(held)
        order = {record.message_id: index for index, record in enumerate(records)}
        report.failures.sort(key=order.__getitem__)
        return report

    # -- processing ------------------------------------------------------------------------------------

    def _consume(self, record: FifoRecord) -> Outcome:
        envelope = Envelope.from_json(record.body)
        message = OrderedMessage(
            envelope=envelope,
            group_id=record.group_id or envelope.tenant,
            dedup_id=deduplication_id(envelope),
            owner=f"{record.message_id}:{record.receive_count}",
        )
        return self.consumer.consume(message, self.clock_ms())

    def _fail(self, record: FifoRecord, exc: Exception, report: BatchReport, failed_groups: set[str]) -> None:
        logger.warning(
            "record failed: its group waits",
            extra={"message_id": record.message_id, "group_id": record.group_id, "error": str(exc)},
        )
        report.failed += 1
        report.failures.append(record.message_id)
        failed_groups.add(record.group_id or "")

    # -- the breaker -------------------------------------------------------------------------------------

    def _trip(self, exc: Exception, report: BatchReport) -> None:
        """Open the breaker on an outage and say so where the controller reads it."""
        assert self.breaker is not None
        now = self.monotonic()
        window_ms = int((self.breaker.record_outage(now) - now) * 1000)
        report.outages += 1
        logger.warning(
            "dependency unavailable: circuit open", extra={"error": str(exc), "open_ms": window_ms}
        )
        try:
            self.report_outage(self.clock_ms() + window_ms)
        except Exception as report_exc:  # the held groups wait all the same
            logger.warning("outage report failed", extra={"error": str(report_exc)})

    def _add_hold(self, held: dict[int, list[FifoRecord]], record: FifoRecord) -> None:
        assert self.breaker is not None and self.holds is not None
        wait_s = self.breaker.retry_in_s(self.monotonic())
        held.setdefault(self.holds.seconds(record.receive_count, wait_s), []).append(record)

    def _hold(self, held: dict[int, list[FifoRecord]]) -> None:
        for seconds, records in held.items():
            messages = [HeldMessage(each.queue_url, each.receipt_handle) for each in records]
            try:
                failed = self.visibility.hold(messages, seconds)
            except Exception as exc:  # they come back at the queue's visibility timeout instead
                logger.warning("hold failed", extra={"error": str(exc), "messages": len(messages)})
                continue
            if failed:
                logger.warning("hold failed", extra={"messages": len(failed)})
            kept = [each for each in messages if each not in failed]
            self._remembered = (self._remembered + kept)[-MAX_REMEMBERED_HOLDS:]

    def _return_remembered(self) -> None:
        """The breaker closed: what this container held comes back now instead of at its hold's end.

        A hold that already ended (its receipt handle is stale) fails harmlessly.
        """
        remembered, self._remembered = self._remembered, []
        if not remembered:
            return
        try:
            self.visibility.hold(remembered, 0)
        except Exception as exc:  # they come back when their holds end
            logger.warning("early return of held messages failed", extra={"error": str(exc)})

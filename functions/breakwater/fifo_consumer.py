"""The FIFO worker's consumer: one record in, exactly-once processing, then its group's slot released.

Ports only (the write-ahead store, the group counters, the side effect); the AWS adapters are wired
in :func:`breakwater.aws.fifo_worker_ports.build_fifo_consumer`.
"""

from __future__ import annotations

from collections import Counter

from aws_lambda_powertools.utilities.data_classes.sqs_event import SQSRecord

from breakwater.envelope import Envelope
from breakwater.ordered import (
    BacklogWindow,
    OrderedMessage,
    Outcome,
    SideEffect,
    TenantBacklogs,
    WriteAheadStore,
    deduplication_id,
    process_exactly_once,
)


def ordered_message(record: SQSRecord) -> OrderedMessage:
    """The record's envelope, its group and its deduplication id; the owner is unique per delivery.

    The exactly-once record is keyed on the envelope's own deduplication id, the one ingest sent it
    under, not on the one SQS delivered it with: a message moved to a FIFO DLQ, or redriven from one,
    arrives under another, and must still find the record of its first processing.
    """
    envelope = Envelope.from_json(record.body)
    attributes = record.attributes
    return OrderedMessage(
        envelope=envelope,
        group_id=attributes.message_group_id or envelope.tenant,
        dedup_id=deduplication_id(envelope),
        owner=f"{record.message_id}:{attributes.approximate_receive_count}",
    )


class FifoConsumer:
    """``backlogs`` and ``window`` (the same :class:`BacklogWindow` as the ingest's) turn the release
    on; without them the group bound is off and nothing is released. ``tenants`` adds the per-tenant
    counts over all of a tenant's groups. Releases are given back a batch at a time (:meth:`flush`):
    one write per group and one per tenant per batch, whatever the number of its messages."""

    def __init__(
        self,
        store: WriteAheadStore,
        side_effect: SideEffect,
        *,
        backlogs: TenantBacklogs | None = None,
        window: BacklogWindow | None = None,
        tenants: TenantBacklogs | None = None,
    ) -> None:
        if (backlogs is None) != (window is None):
            raise ValueError("the group release needs both its counters (backlogs) and the window")
        if tenants is not None and window is None:
            raise ValueError("the tenant release needs the window")
        self.store = store
        self.side_effect = side_effect
        self.backlogs = backlogs
        self.window = window
        self.tenants = tenants
        self._group_releases: Counter[tuple[str, int]] = Counter()
        self._tenant_releases: Counter[tuple[str, int]] = Counter()

    def consume(self, message: OrderedMessage, now_ms: int) -> Outcome:
        """Process once; every outcome means the message leaves the queue, so each releases its slots.

        A processed message, a duplicate (a later copy that was admitted and queued too) and an
        expired drop all free their group's and tenant's slots at the next :meth:`flush`. A failure
        raises before: the message stays in the queue and still counts.
        """
        outcome = process_exactly_once(message, self.store, self.side_effect, now_ms)
        if self.window is not None:
            generation = self.window.generation(message.envelope.enqueued_at)
            if self.backlogs is not None:
                self._group_releases[(message.group_id, generation)] += 1
            if self.tenants is not None:
                self._tenant_releases[(message.envelope.tenant, generation)] += 1
        return outcome

    def flush(self, now_ms: int) -> int:
        """Give back the slots of what was consumed since the last flush (how many, groups and tenants).

        A release that cannot be written is lost (the counters never raise): its count stays one too
        high until its generation ages out, which refuses early at worst.
        """
        released = 0
        for counters, pending in (
            (self.backlogs, self._group_releases),
            (self.tenants, self._tenant_releases),
        ):
            if counters is None:
                continue
            for (counted_id, generation), count in sorted(pending.items()):
                released += counters.release_many(counted_id, generation, count, now_ms)
        self._group_releases, self._tenant_releases = Counter(), Counter()
        return released

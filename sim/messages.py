"""One simulated message: the envelope's fields the policies read, plus what SQS keeps about it.

A plain object with slots, not the pydantic envelope: a seed-scale run holds millions of them, and
``breakwater.sideline.decide`` reads them through its ``DecisionSubject`` Protocol, which the real
envelope satisfies too. A message as ingest stored it is never a replay and was never moved, so its
``origin``, ``attempt``, ``replay_run`` and ``failed_receives`` are the class's; a moved copy
(:class:`MovedMessage`) carries its own.
"""

from __future__ import annotations

from breakwater.envelope import Origin


class Message:
    """A Breakwater envelope as far as the rules read it, and its SQS bookkeeping."""

    __slots__ = (
        "enqueued_at",
        "expires_at",
        "group",
        "poison",
        "receive_count",
        "received_at",
        "tenant",
        "work_ms",
    )

    origin: Origin = Origin.LIVE
    attempt: int = 0
    replay_run: str | None = None
    # receives that ended unprocessed on the queues the message was moved off (None: none), as the
    # envelope carries them: a move starts SQS's receive count again
    failed_receives: int | None = None

    def __init__(
        self,
        tenant: int,
        enqueued_at: int,
        group: int | None,
        expires_at: int | None,
        work_ms: float,
        poison: bool,
    ) -> None:
        self.tenant = tenant  # index into the scenario's tenant names (an int keeps the message small)
        self.group = group  # MessageGroupId (the tenant) or None
        self.enqueued_at = enqueued_at  # epoch ms of the virtual clock, stamped by ingest
        self.expires_at = expires_at
        self.work_ms = work_ms
        self.poison = poison  # fails every time it is processed
        self.receive_count = 0  # ApproximateReceiveCount in the queue it sits in now
        self.received_at = 0.0  # virtual seconds of the last receive

    def age_ms(self, now_ms: int) -> int:
        age = now_ms - self.enqueued_at
        return age if age > 0 else 0

    def is_expired(self, now_ms: int) -> bool:
        return self.expires_at is not None and now_ms >= self.expires_at

    def moved(self, origin: Origin, attempt: int, failed_receives: int | None = None) -> MovedMessage:
        """The copy a move sends: same message (id, ``enqueued_at``), new queue role, receive count 0;
        its ``failed_receives`` this one's unless given (0: none), as ``Envelope.moved`` sets them."""
        copy = MovedMessage(
            self.tenant, self.enqueued_at, self.group, self.expires_at, self.work_ms, self.poison
        )
        copy.origin = origin
        copy.attempt = attempt
        copy.replay_run = self.replay_run
        copy.failed_receives = self.failed_receives if failed_receives is None else failed_receives or None
        return copy


class MovedMessage(Message):
    """A message a worker moved (sidelined, spilled, deferred, held): its role, attempt and failed
    receives are its own."""

    __slots__ = ("attempt", "failed_receives", "origin", "replay_run")

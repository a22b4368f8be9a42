"""One simulated message: the envelope's fields the policies read, plus what SQS keeps about it.

A plain object with slots, not the pydantic envelope: a seed-scale run holds millions of them, and
``breakwater.sideline.decide`` reads them through its ``DecisionSubject`` Protocol, which the real
envelope satisfies too. A message as ingest stored it is never a replay and was never moved, so its
``origin``, ``attempt`` and ``replay_run`` are the class's; a moved copy (:class:`MovedMessage`)
carries its own.
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

    def moved(self, origin: Origin, attempt: int) -> MovedMessage:
        """The copy a move sends: same message (id, ``enqueued_at``), new queue role, receive count 0."""
        copy = MovedMessage(
            self.tenant, self.enqueued_at, self.group, self.expires_at, self.work_ms, self.poison
        )
        copy.origin = origin
        copy.attempt = attempt
        copy.replay_run = self.replay_run
        return copy


class MovedMessage(Message):
    """A message a worker moved (sidelined, spilled, deferred, held): its role and attempt are its own."""

    __slots__ = ("attempt", "origin", "replay_run")

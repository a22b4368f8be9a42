"""The operator's replay of the archive in virtual time, as the embedded demo runs it after the load.

The archiver parks a sideline queue's waiting messages in S3; an operator replays them with the Glue
job (``glue_jobs/replay_backlog.py``) once the system has drained back, as ``local/scenarios/demo.py``
(``park_and_replay``) does once its load has drained. Here the load goes on after the event, so the
replay starts at the first check (every ``scenario.sample_s``) after the event's end at which the
archive holds messages, the sideline queues hold nothing (the archiver has nothing left to park) and
the live queues (with surge) hold no more than the most they held at a check before the event; if
that check never comes, nothing is replayed. It is one run over what the archive holds then, as the
job reads the archive once: what the archiver parks after it started stays parked.

What it sends is the job's (``glue_jobs.replay_save``): each parked message not expired, in the job's
order (every tenant's oldest first, then every tenant's second, ...), re-homed with ``origin=replay``
and ``replay_run`` set, to a live queue chosen by ingest's routing (the tenant's shuffle shard, the
shortest by a depth cache that probes every live queue once per ``DEPTH_REFRESH_SECONDS``), in a
SendMessageBatch of up to ten per queue, paced at ``archive.replay_target_rate`` messages per second
(the job's default, which the stack passes as ``--target_rate``). One sender holds that rate: the job
splits it over its tasks so that together they hold it. The workers count a replayed message
``replayed`` when it finishes, as the real worker does.

Billed in the run's meter: an S3 GET per object the archiver wrote before the replay started and a
LIST per thousand of them, the GetQueueAttributes probes and the SendMessageBatch calls. Glue's
DPU-hours are not priced.
"""

from __future__ import annotations

from collections.abc import Generator, Mapping, Sequence

import simpy

from breakwater.envelope import Origin
from breakwater.routing import QueueDepths, choose_queue
from breakwater.sqs_batches import MAX_BATCH_ENTRIES
from breakwater_cdk.config import ArchiveConfig
from sim.billing import Meter
from sim.messages import Message
from sim.scenarios import Scenario
from sim.sqs import SqsQueue

# the job's sender's depth cache (``glue_jobs.replay_save``; importing it would load pyspark: a test
# keeps the two equal)
DEPTH_REFRESH_SECONDS = 5.0
RUN_ID = "sim"  # the replay's ``replay_run``: one run per simulation
LIST_PAGE_KEYS = 1000  # keys one ListObjectsV2 page returns
CATCH_UP_S = 1.0  # the job's pacer makes up at most this much of a late send (``replay_save.Pacer``)


def replay_order(messages: Sequence[Message]) -> list[Message]:
    """The job's order (``replay_transforms.interleave``): every tenant's oldest message, then every
    tenant's second, ... (ties by tenant), so one tenant's large backlog takes one turn per round."""
    by_tenant: dict[int, list[Message]] = {}
    for message in messages:
        by_tenant.setdefault(message.tenant, []).append(message)
    ranked: list[tuple[int, int, Message]] = []
    for tenant, own in by_tenant.items():
        own.sort(key=lambda message: message.enqueued_at)
        ranked.extend((rank, tenant, message) for rank, message in enumerate(own))
    ranked.sort(key=lambda entry: (entry[0], entry[1]))
    return [message for _, _, message in ranked]


class ArchiveReplay:
    """The archive the archiver parks into, and the operator's one replay run of it."""

    def __init__(
        self,
        env: simpy.Environment,
        scenario: Scenario,
        live: Sequence[SqsQueue],
        by_role: Mapping[Origin, SqsQueue],
        shards: Sequence[tuple[int, ...]],
        archive: ArchiveConfig,
        meter: Meter,
    ) -> None:
        """``live``: the queues the replay sends to; ``by_role``: the surge and sideline queues (with the
        live ones, their depths say the system drained back); ``shards``: each tenant's live queues."""
        self.env = env
        self.scenario = scenario
        self.live = live
        self.watched_live = [*live, by_role[Origin.SURGE]]
        self.watched_sideline = [by_role[Origin.SPILLOVER], by_role[Origin.BACKLOG]]
        self.shards = shards
        self.target_rate = archive.replay_target_rate  # validated > 0 by the config
        self.max_messages_per_object = archive.max_messages_per_object
        self.meter = meter
        self.parked: list[Message] = []  # in the archive, not (yet) replayed
        self.objects = 0  # the archive's objects, as the archiver wrote them
        self.started_s: float | None = None
        self.sent = 0
        self._unsent: list[Message] = []  # taken by the run: expired (left in the archive) or to send
        self._next = 0  # the first of ``_unsent`` not routed yet
        self._expired = 0  # the first ``_expired`` of ``_unsent`` are expired
        self._batches: dict[int, list[Message]] = {}  # routed, not sent yet, by live queue
        self._depths = QueueDepths(DEPTH_REFRESH_SECONDS)
        self._probe_at = 0.0  # when the live queues' depths are stale again

    def park(self, messages: list[Message]) -> int:
        """What one archiver run writes: ``messages``, in how many objects (returned)."""
        objects = -(-len(messages) // self.max_messages_per_object)
        self.parked.extend(messages)
        self.objects += objects
        return objects

    def remaining(self) -> list[Message]:
        """Every parked message not sent back (for the unserved record at the run's end)."""
        batched = [message for batch in self._batches.values() for message in batch]
        return [*self.parked, *self._unsent[: self._expired], *batched, *self._unsent[self._next :]]

    def run(self) -> Generator[simpy.Event, object, None]:
        """Wait for the event's end and the drain (see the module), then replay what is parked."""
        env, scenario = self.env, self.scenario
        check = scenario.sample_s
        before = 0  # the most the live queues held at a check before the event
        while env.now < scenario.event_start_s:
            before = max(before, self._depth(self.watched_live))
            yield env.timeout(min(check, scenario.event_start_s - env.now))
        if env.now < scenario.event_end_s:
            yield env.timeout(scenario.event_end_s - env.now)
        while not (self.parked and self._drained(before)):
            yield env.timeout(check)
        yield from self._replay()

    def _depth(self, queues: Sequence[SqsQueue]) -> int:
        return sum(queue.depth for queue in queues)

    def _drained(self, before: int) -> bool:
        return self._depth(self.watched_sideline) == 0 and self._depth(self.watched_live) <= before

    def _replay(self) -> Generator[simpy.Event, object, None]:
        env, meter = self.env, self.meter
        self.started_s = env.now
        taken, self.parked = self.parked, []
        if not taken:
            return
        # the job reads every object of the archive (listed a page at a time); what expired is not sent
        meter.s3_gets += self.objects
        meter.s3_puts += -(-self.objects // LIST_PAGE_KEYS)  # ListObjectsV2 is billed as a PUT
        now_ms = int(env.now * 1000)
        expired = [message for message in taken if message.is_expired(now_ms)]
        fresh = [message for message in taken if not message.is_expired(now_ms)]
        self._unsent = [*expired, *replay_order(fresh)]
        self._expired = self._next = len(expired)
        interval = 1.0 / self.target_rate
        due = env.now  # the pacer's next slot
        while self._next < len(self._unsent) or self._batches:
            if self._next < len(self._unsent):
                message = self._unsent[self._next]
                self._next += 1
                index = self._route(message)
                batch = self._batches.setdefault(index, [])
                batch.append(message)
                if len(batch) < MAX_BATCH_ENTRIES:
                    continue
            else:  # the last batches, each short of ten
                index = next(iter(self._batches))
            count = len(self._batches[index])
            if due > env.now:
                yield env.timeout(due - env.now)
            due = max(due, env.now - CATCH_UP_S) + count * interval
            self._send(index, self._batches.pop(index))

    def _route(self, message: Message) -> int:
        """Ingest's routing, as the job's sender does it: every live queue probed when its depth is
        stale (they all are at once: the sender probes them together)."""
        now, depths = self.env.now, self._depths
        if now >= self._probe_at:
            for index, queue in enumerate(self.live):
                depths.observe(index, queue.visible_count, now)  # ApproximateNumberOfMessages
            self.meter.sqs(0, len(self.live))  # a GetQueueAttributes each
            self._probe_at = now + DEPTH_REFRESH_SECONDS
        candidates = self.shards[message.tenant]
        return choose_queue(candidates, depths.snapshot(candidates))

    def _send(self, index: int, batch: list[Message]) -> None:
        """One SendMessageBatch: each message re-homed as the job's ``envelope_body`` does."""
        queue = self.live[index]
        for message in batch:
            copy = message.moved(Origin.REPLAY, message.attempt)
            copy.replay_run = RUN_ID
            queue.send(copy)
        self.meter.sqs_batches(len(batch))
        self.sent += len(batch)

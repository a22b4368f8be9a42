"""What the archiver parks, an operator replays once the event has ended and the queues drained back:
the replay job's envelopes (``origin=replay``, ``replay_run`` set) into the live queues, at its rate;
what the replay does not reach stays unserved."""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np

import sim  # noqa: F401
from breakwater.envelope import Origin
from sim.config import blueprint, load_context, setups
from sim.messages import Message
from sim.replay import DEPTH_REFRESH_SECONDS, RUN_ID, replay_order
from sim.scenarios import Scenario
from sim.system import Recording, System
from sim.worker import Costs, Outcome

REPLAY_RATE = 8.0


def config(consumer_rate: float) -> dict[str, Any]:
    """A small fleet; the subject's flood passes the front door far past its consumer rate, so its
    sideline is archived within the event. The consumer bucket's burst (a second of its rate) takes
    a whole SendMessageBatch of the replay's, so the replayed work is not spilled again."""
    return {
        "worker": {"max_concurrency": 2},
        "tiers": {
            "standard": {
                "rate": 20,
                "burst": 40,
                "consumer_rate": consumer_rate,
                "concurrency": 4,
                "concurrency_floor": 1,
            }
        },
        "sideline": {"archive_age_seconds": 60, "archive_depth": 20},
        "archive": {"replay_target_rate": REPLAY_RATE},
    }


def flood(subject_rate: float = 0.2, event_s: float = 60.0, after_s: float = 600.0) -> Scenario:
    return Scenario(
        kind="noisy",
        tenants=("noisy", "quiet-1", "quiet-2"),
        rates=(subject_rate, 1.0, 1.0),
        work_ms=(100.0, 100.0, 100.0),
        baseline_s=60.0,
        event_s=event_s,
        after_s=after_s,
        event_rate=200.0,
    )


class Watched:
    """A Breakwater run, with what its archiver parked and every message processed successfully."""

    def __init__(self, scenario: Scenario, override: dict[str, Any]) -> None:
        setup = setups(blueprint(load_context(), [override]), same_fleet=False)["breakwater"]
        self.system = System(scenario, setup, Costs())
        self.parked: list[Message] = []
        self.processed: list[Message] = []
        replay, system = self.system.replay, self.system
        assert replay is not None
        park, process = replay.park, system.process

        def parking(messages: list[Message]) -> int:
            self.parked.extend(messages)
            return park(messages)

        def processing(message: Message, at_s: float) -> tuple[Outcome, float]:
            outcome, spent_s = process(message, at_s)
            if outcome == "ok":
                self.processed.append(message)
            return outcome, spent_s

        replay.park = parking  # type: ignore[method-assign]
        system.process = processing  # type: ignore[method-assign]

    def run(self) -> Recording:
        return self.system.run()


def accounted(rec: Recording) -> bool:
    served, unserved = len(rec.served_tenant), len(rec.unserved_tenant)
    return served + unserved + rec.totals.get("dropped", 0) == rec.totals["accepted"]


def test_every_parked_message_is_replayed_after_the_drain_and_processed_once() -> None:
    scenario = flood()
    watched = Watched(scenario, config(consumer_rate=10))
    rec = watched.run()
    replay = watched.system.replay
    assert replay is not None and watched.parked
    # the sideline emptied after the event (the archiver parked what was past its budget)
    assert replay.started_s is not None and scenario.event_end_s <= replay.started_s
    replayed = [message for message in watched.processed if message.replay_run == RUN_ID]
    key = lambda message: (message.tenant, message.enqueued_at)  # noqa: E731 - a message's identity
    assert Counter(map(key, replayed)) == Counter(map(key, watched.parked))
    assert len({id(message) for message in replayed}) == len(replayed)  # each copy processed once
    assert rec.totals["replayed"] == rec.totals["archived"] == rec.totals["replay_sent"] == len(replayed)
    assert not rec.unserved_tenant and accounted(rec)
    # paced at the target rate: the last one could not have been sent sooner
    last_processed = max(watched.system.rec.served_at)
    assert last_processed >= replay.started_s + (len(replayed) - 10) / REPLAY_RATE
    # read from the archive (a GET per object the archiver wrote) and sent ten at a time
    assert rec.usage["s3.get_requests"] == replay.objects >= 1
    # replayed work is not a first attempt of fresh traffic: none of the event's is seen after the start
    enqueued, received = np.asarray(rec.first_enqueued), np.asarray(rec.first_received)
    assert not ((enqueued < scenario.event_end_s) & (received >= replay.started_s)).any()


def test_a_sideline_that_never_drains_is_never_replayed_and_what_is_parked_stays_unserved() -> None:
    # the subject goes on sending past its consumer rate after the event: its sideline never empties
    scenario = flood(subject_rate=4.0)
    watched = Watched(scenario, config(consumer_rate=2.5))
    rec = watched.run()
    replay = watched.system.replay
    assert replay is not None and watched.parked
    assert replay.started_s is None and rec.totals["replay_sent"] == 0
    left = replay.remaining()
    assert len(left) == len(watched.parked) and accounted(rec)
    assert len(rec.unserved_tenant) >= len(left)


def test_an_event_lasting_to_the_runs_end_is_never_replayed() -> None:
    scenario = flood(event_s=180.0, after_s=0.0)
    watched = Watched(scenario, config(consumer_rate=10))
    rec = watched.run()
    replay = watched.system.replay
    assert replay is not None and watched.parked
    assert replay.started_s is None and rec.totals["replay_sent"] == 0
    assert rec.totals.get("replayed", 0) == 0
    assert len(replay.remaining()) == len(watched.parked)
    assert not any(message.origin is Origin.REPLAY for message in watched.processed)
    assert accounted(rec)


def test_the_replay_order_interleaves_the_tenants_oldest_first() -> None:
    def message(tenant: int, enqueued_at: int) -> Message:
        return Message(tenant, enqueued_at, None, None, 1.0, False)

    parked = [message(0, 30), message(0, 10), message(0, 20), message(1, 50), message(2, 40), message(1, 5)]
    order = [(each.tenant, each.enqueued_at) for each in replay_order(parked)]
    assert order == [(0, 10), (1, 5), (2, 40), (0, 20), (1, 50), (0, 30)]


def test_the_depth_cache_refreshes_as_the_jobs_sender_does() -> None:
    from glue_jobs.replay_save import DEPTH_REFRESH_SECONDS as JOBS

    assert DEPTH_REFRESH_SECONDS == JOBS

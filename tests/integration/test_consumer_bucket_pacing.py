"""A contended consumer bucket shared by many containers: its item is asked at a bounded rate.

Workers ask a tenant's consumer bucket once per batch that holds its messages. A tenant over its
consumer rate, with its messages spread over a large fleet, would otherwise cost its item one write
per container batch: at the largest fleet the config accepts, more than a partition takes. Each
container asks a contended bucket at most once per ``contended_interval_s`` (the fleet's size over
``fairness.CONTENDED_ASKS_PER_S`` in the stack), leasing what it will spend until then.
"""

from __future__ import annotations

import random

import boto3
import pytest

from breakwater.aws.buckets import LeasedTokenBucket
from breakwater.fairness import BucketLimits, contended_ask_interval_s
from tests.integration.conftest import FakeClock

CONSUMER = BucketLimits(rate=20, burst=20)  # a consumer bucket: burst one second of the rate
CONTAINERS = 200
INTERVAL_S = 8.0  # 200 containers, each asking at most every 8 s on average: 25 asks a second
STEP_S = 0.01
SECONDS = 12.0
WARMUP_S = 2.0


def no_pause(_attempt: int) -> bool:
    return True  # the containers take turns on a simulated clock: nothing to wait for


class Writes:
    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.at: list[float] = []

    def __call__(self, **_: object) -> None:
        self.at.append(self.clock())


def run(state_table: str, clock: FakeClock, interval_s: float, offered_per_s: float) -> tuple[float, float]:
    """Batches of one message each, at ``offered_per_s``, each to a random container of the fleet:
    the item's writes a second and the messages admitted a second, after a warm-up."""
    client = boto3.client("dynamodb")
    writes = Writes(clock)
    client.meta.events.register("before-call.dynamodb.UpdateItem", writes)
    fleet = [
        LeasedTokenBucket(
            state_table,
            "consumer",
            clock,
            1.0,
            0.25,
            client=client,
            max_attempts=6,
            rng=random.Random(index),
            pause=no_pause,
            contended_interval_s=interval_s,
        )
        for index in range(CONTAINERS)
    ]
    rng = random.Random(7)
    start, admitted, due = clock(), 0, 0.0
    while clock() - start < SECONDS:
        due += offered_per_s * STEP_S
        while due >= 1:
            due -= 1
            taken, _ = rng.choice(fleet).try_acquire_up_to("acme", CONSUMER, 1)
            if clock() - start >= WARMUP_S:
                admitted += taken
        clock.advance(STEP_S)
    counted = [at for at in writes.at if at - start >= WARMUP_S]
    return len(counted) / (SECONDS - WARMUP_S), admitted / (SECONDS - WARMUP_S)


def test_a_contended_bucket_is_asked_at_most_once_per_interval_by_each_container(state_table, clock):
    writes_per_s, admitted_per_s = run(state_table, clock, INTERVAL_S, offered_per_s=400)

    # 200 containers, each about every 8 s; an ask whose stale copy promised more than is left
    # costs a failed conditional write before the one that takes the rest
    assert writes_per_s <= 2 * CONTAINERS / INTERVAL_S
    # and the tenant still gets its rate: the leases last until their holders may ask again, and the
    # pacing is jittered, so the fleet does not come back at once while the bucket overflows
    assert admitted_per_s == pytest.approx(CONSUMER.rate, rel=0.1)


def test_unpaced_the_same_load_asks_the_item_per_batch(state_table, clock):
    """The behaviour pacing bounds: without it, refused containers come back as the bucket refills."""
    writes_per_s, admitted_per_s = run(state_table, clock, 0.0, offered_per_s=400)

    assert writes_per_s > 2 * CONTAINERS / INTERVAL_S
    assert admitted_per_s == pytest.approx(CONSUMER.rate, rel=0.1)


def test_a_tenant_under_its_rate_is_not_paced(state_table, clock):
    paced = run(state_table, clock, INTERVAL_S, offered_per_s=10)
    unpaced = run(state_table, clock, 0.0, offered_per_s=10)

    assert paced[1] == pytest.approx(10, rel=0.05)  # every message of a tenant within its rate
    assert paced == pytest.approx(unpaced, rel=0.05)  # the same writes and admissions as without it


def test_the_interval_spreads_the_fleet_over_the_asks_budget():
    assert contended_ask_interval_s(1000) == pytest.approx(5.0)  # 1,000 containers: 200 asks a second
    assert contended_ask_interval_s(40) == pytest.approx(0.2)

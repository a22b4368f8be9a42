"""The simulator's consumer buckets pace a contended tenant's asks as the runtime's leased buckets do.

A tenant over its consumer rate, its messages spread over a large fleet, is asked about once per
``interval_s`` by each container (``breakwater.fairness.contended_ask_interval_s``); each lease lasts
until its holder may ask again. A tenant within its rate is asked as before. Virtual time only.
"""

from __future__ import annotations

import random

import pytest

import sim  # noqa: F401
from breakwater.settings import TierLimits
from local.aws_limits import AwsLimits
from sim.dynamodb import StateTable
from sim.gates import ConsumerBuckets

LIMITS = TierLimits(rate=50, burst=100, consumer_rate=20, concurrency=2, concurrency_floor=1)
CONTAINERS = 200
INTERVAL_S = 8.0  # 200 containers about every 8 s: 25 asks a second
SECONDS, WARMUP_S, STEP_S = 30.0, 5.0, 0.01


def run(interval_s: float, offered_per_s: float) -> tuple[float, float, float]:
    """One message a batch at ``offered_per_s``, each to a random container: the bucket's writes a
    second, the messages admitted a second, and the most writes in one second, after a warm-up (every
    container's first ask, before any was found contended, is not paced)."""
    buckets = ConsumerBuckets(
        lambda _t: LIMITS, StateTable(["t0"], AwsLimits()), interval_s=interval_s, seed=1
    )
    rng = random.Random(7)
    now, due, admitted = 0.0, 0.0, 0
    per_second = [0] * int(SECONDS)
    while now < SECONDS:
        due += offered_per_s * STEP_S
        while due >= 1:
            due -= 1
            before = buckets.writes
            taken = buckets.try_acquire_up_to(0, 1, now, holder=f"c{rng.randrange(CONTAINERS)}")
            per_second[int(now)] += buckets.writes - before
            if now >= WARMUP_S:
                admitted += taken
        now += STEP_S
    counted = per_second[int(WARMUP_S) :]
    return sum(counted) / len(counted), admitted / (SECONDS - WARMUP_S), max(counted)


def test_a_contended_bucket_is_asked_about_once_per_interval_by_each_container():
    writes_per_s, admitted_per_s, peak = run(INTERVAL_S, offered_per_s=400)

    # an ask whose lease is no longer all there costs two writes (the failed one, then the rest)
    assert writes_per_s <= 2 * CONTAINERS / INTERVAL_S
    assert peak <= 3 * CONTAINERS / INTERVAL_S  # the jitter bunches asks in some seconds, not many
    assert admitted_per_s == pytest.approx(LIMITS.consumer_rate, rel=0.1)


def test_unpaced_the_same_load_asks_the_item_far_more():
    writes_per_s, admitted_per_s, _ = run(0.0, offered_per_s=400)

    assert writes_per_s > 4 * CONTAINERS / INTERVAL_S
    assert admitted_per_s == pytest.approx(LIMITS.consumer_rate, rel=0.1)


def test_a_tenant_within_its_rate_is_asked_as_before():
    assert run(INTERVAL_S, offered_per_s=10) == run(0.0, offered_per_s=10)

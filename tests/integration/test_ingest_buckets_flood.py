"""A flooding tenant against its leased token bucket on moto, many containers, a simulated clock.

A refusal the container can decide itself costs no call; the tenant's containers together ask its
bucket item about once per admitted lease however hard it floods; a tenant just over its rate still
gets its rate whatever the number of containers its requests are spread over.
"""

from __future__ import annotations

import random

import boto3
import pytest

from breakwater.aws.buckets import LeasedTokenBucket
from breakwater.fairness import REFUSAL_JITTER, BucketLimits
from tests.integration.conftest import FakeClock

SMALL = BucketLimits(rate=10, burst=20)


class UpdateCounter:
    """UpdateItem calls on the client, and how many failed their condition (a lost probe)."""

    def __init__(self, client) -> None:
        self.calls = 0
        self.lost = 0
        client.meta.events.register("before-call.dynamodb.*", self._before)
        client.meta.events.register("after-call.dynamodb.UpdateItem", self._after)

    def _before(self, **_: object) -> None:
        self.calls += 1

    def _after(self, parsed=None, **_: object) -> None:
        if ((parsed or {}).get("Error") or {}).get("Code") == "ConditionalCheckFailedException":
            self.lost += 1


@pytest.fixture
def counted():
    client = boto3.client("dynamodb")
    return client, UpdateCounter(client)


def gates(state_table, clock, client, count, purpose="ingest"):
    return [
        LeasedTokenBucket(state_table, purpose, clock, 1.0, 0.25, client=client, rng=random.Random(i))
        for i in range(count)
    ]


def flood(
    containers, clock: FakeClock, counter, *, per_second, seconds, warmup, limits=SMALL, seed=1, regular=False
):
    """Poisson (``regular``: evenly spaced) requests spread at random over ``containers``: what was
    admitted, the calls and the lost probes, after ``warmup`` seconds."""
    rng = random.Random(seed)
    start, admitted, calls, lost = clock.now, 0, 0, 0
    while True:
        clock.advance(1 / per_second if regular else rng.expovariate(per_second))
        if clock.now - start > seconds + 1e-9:
            break
        before = (counter.calls, counter.lost)
        ok = rng.choice(containers).try_acquire("acme", limits)[0]
        if clock.now - start >= warmup:
            admitted += ok
            calls += counter.calls - before[0]
            lost += counter.lost - before[1]
    return admitted, calls, lost


def test_a_tenant_flooding_at_five_times_its_rate_costs_about_one_write_per_admitted_request(
    state_table, clock, counted
):
    client, counter = counted
    containers = gates(state_table, clock, client, 100)

    admitted, calls, lost = flood(containers, clock, counter, per_second=50, seconds=60, warmup=10)

    assert admitted == pytest.approx(10 * 50, rel=0.05)  # its rate, no more
    # Every request to a container that does not know the bucket is empty would be a write, most of
    # them lost: five per admitted request. Refused containers wait out their backoff instead.
    assert calls <= 1.4 * admitted
    assert lost <= 0.4 * admitted


@pytest.mark.parametrize("count", [1, 10, 40, 100])
def test_a_tenant_just_over_its_rate_gets_its_rate_at_any_container_count(state_table, clock, counted, count):
    client, counter = counted
    containers = gates(state_table, clock, client, count)

    # from the first request: every container's first sight of the tenant counts
    admitted, _, _ = flood(containers, clock, counter, per_second=11, seconds=30, warmup=0, regular=True)

    beyond_burst = (admitted - SMALL.burst) / 30
    assert 9.5 <= beyond_burst <= SMALL.rate  # within a few percent of its rate of 10/s


def test_a_container_refused_after_a_lost_probe_asks_nothing_until_its_refusal_ends(
    state_table, clock, counted
):
    client, counter = counted
    drainer, refused = gates(state_table, clock, client, 2)
    assert refused.try_acquire("acme", SMALL)[0]  # its copy: the bucket less one lease
    while drainer.try_acquire("acme", SMALL)[0]:
        pass  # another container takes everything left
    for _ in range(4):
        refused.try_acquire("acme", SMALL)  # the rest of its own lease
    calls, lost = counter.calls, counter.lost

    ok, retry_after = refused.try_acquire("acme", SMALL)  # its copy promises tokens; the table has none
    assert not ok and counter.calls == calls + 1 and counter.lost == lost + 1

    # the refill it can compute from the returned item brings a token back within a tenth of a second,
    # but others took the last ones: it refuses locally, with no call, until its backoff ends
    assert retry_after > 1 / SMALL.rate
    for _ in range(100):
        clock.advance(retry_after / 101)
        assert not refused.try_acquire("acme", SMALL)[0]
    assert counter.calls == calls + 1
    clock.advance(retry_after / 100)
    assert refused.try_acquire("acme", SMALL)[0]  # the bucket refilled meanwhile: one call, a lease
    assert counter.calls == calls + 2


def test_a_lost_probe_starts_from_the_backoff_the_tenants_other_containers_stored(
    state_table, clock, counted
):
    client, _ = counted
    (newcomer,) = gates(state_table, clock, client, 1)
    client.put_item(  # a bucket whose last lease was taken by a container backing off 3 s
        TableName=state_table,
        Item={
            "pk": {"S": "tenant#acme"},
            "sk": {"S": "bucket#ingest"},
            "tokens": {"N": "0"},
            "updated_at": {"N": str(clock.now)},
            "full_at": {"N": str(clock.now + 2)},
            "version": {"N": "40"},
            "backoff": {"N": "3"},
        },
    )

    ok, retry_after = newcomer.try_acquire("acme", SMALL)  # its first look: the bucket is empty

    # not the tenth of a second until the next token, nor twice it: twice the stored backoff (jittered)
    assert not ok and 2 * 3 <= retry_after <= 2 * 3 * (1 + REFUSAL_JITTER)


def test_a_granted_lease_stores_the_containers_backoff_for_the_others(state_table, clock, counted):
    client, counter = counted
    containers = gates(state_table, clock, client, 20)
    flood(containers, clock, counter, per_second=50, seconds=20, warmup=0)

    key = {"pk": {"S": "tenant#acme"}, "sk": {"S": "bucket#ingest"}}
    assert float(client.get_item(TableName=state_table, Key=key)["Item"]["backoff"]["N"]) > 0


def test_a_premium_tenant_flooding_keeps_its_item_far_below_a_partitions_write_limit(
    state_table, clock, counted
):
    client, counter = counted
    premium = BucketLimits(rate=500, burst=1000)  # cdk.json's premium tier
    containers = gates(state_table, clock, client, 40)

    admitted, calls, lost = flood(
        containers, clock, counter, per_second=2500, seconds=20, warmup=5, limits=premium, regular=True
    )

    assert admitted == pytest.approx(500 * 15, rel=0.05)
    # leases of many tokens, and a lease cut short by others paces the next ask rather than asking again
    assert calls / 15 <= 100  # write units per second on the item, of a partition's 1,000
    assert lost <= calls / 2

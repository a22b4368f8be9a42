"""The leased token bucket against moto: limits hold across containers, races and refusals are cheap."""

from __future__ import annotations

import random

import boto3
import pytest

from breakwater.aws.buckets import LeasedTokenBucket
from breakwater.fairness import REFUSAL_JITTER, BucketLimits
from tests.integration.conftest import FakeClock

LIMITS = BucketLimits(rate=10, burst=20)


class CallCounter:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def __call__(self, event_name: str, **_: object) -> None:
        self.calls.append(event_name.rsplit(".", 1)[-1])


@pytest.fixture
def counted_client():
    client = boto3.client("dynamodb")
    counter = CallCounter()
    client.meta.events.register("before-call.dynamodb.*", counter)
    return client, counter


def bucket(state_table, clock, client, purpose="ingest", lease_seconds=1.0, max_fraction=0.25, demand=True):
    return LeasedTokenBucket(
        state_table,
        purpose,
        clock,
        lease_seconds,
        max_fraction,
        client=client,
        size_to_demand=demand,
        rng=random.Random(0),
    )


def jittered(seconds):
    """What a local refusal of ``seconds`` may last once jittered."""
    return pytest.approx(seconds * (1 + REFUSAL_JITTER / 2), rel=REFUSAL_JITTER / 2 + 1e-9)


def fixed(state_table, clock, client):
    """A gate that always leases the usual chunk: for tests of the writes, not of the lease's size."""
    return bucket(state_table, clock, client, demand=False)


def admitted(gate, tenant, count, limits=LIMITS):
    return sum(gate.try_acquire(tenant, limits)[0] for _ in range(count))


def test_one_update_per_lease_and_none_while_throttled(state_table, clock: FakeClock, counted_client):
    client, counter = counted_client
    gate = bucket(state_table, clock, client)

    assert admitted(gate, "acme", 100) == 20  # the burst, in leases of 5 (a quarter of it)
    # Four leases; the returned item already says the bucket is empty, so refusals are decided locally.
    assert counter.calls == ["UpdateItem"] * 4

    ok, retry_after = gate.try_acquire("acme", LIMITS)
    assert not ok and retry_after == pytest.approx(0.5)  # until a whole lease of 5 has refilled
    clock.advance(retry_after)
    assert admitted(gate, "acme", 10) == 5  # one lease of five
    assert len(counter.calls) == 5


def test_limits_hold_across_containers_and_a_lost_race_costs_one_call(state_table, clock, counted_client):
    client, counter = counted_client
    containers = [bucket(state_table, clock, client) for _ in range(3)]

    total = 0
    for _ in range(10):  # 10 s at 10/s plus the burst of 20
        for _ in range(20):
            for gate in containers:
                total += gate.try_acquire("acme", LIMITS)[0]
        clock.advance(1.0)
    assert total <= 20 + 10 * 10
    assert total >= 80  # but the containers do share the bucket, not starve it

    item = client.get_item(
        TableName=state_table, Key={"pk": {"S": "tenant#acme"}, "sk": {"S": "bucket#ingest"}}
    )
    assert int(item["Item"]["version"]["N"]) >= 1
    assert counter.calls.count("GetItem") == 1 and set(counter.calls) == {"UpdateItem", "GetItem"}


def test_lost_race_is_retried_from_the_returned_item(state_table, clock, counted_client):
    client, counter = counted_client
    first, second = bucket(state_table, clock, client), bucket(state_table, clock, client)
    assert first.try_acquire("acme", LIMITS)[0]  # creates the bucket: 20 - 5 = 15 left
    counter.calls.clear()

    assert second.try_acquire("acme", LIMITS)[0]  # believes it is new: one failed write, one good one

    assert counter.calls == ["UpdateItem", "UpdateItem"]
    item = client.get_item(
        TableName=state_table, Key={"pk": {"S": "tenant#acme"}, "sk": {"S": "bucket#ingest"}}
    )
    # new to the tenant and the bucket is not full: it leases what its one request needs, not the
    # usual five it would forfeit
    assert float(item["Item"]["tokens"]["N"]) == pytest.approx(14)
    assert item["Item"]["version"]["N"] == "2"


def test_the_controller_multiplier_scales_the_rate(state_table, clock, counted_client):
    client, _ = counted_client
    client.put_item(
        TableName=state_table,
        Item={"pk": {"S": "tenant#acme"}, "sk": {"S": "bucket#consumer"}, "multiplier": {"N": "0.5"}},
    )
    gate = bucket(state_table, clock, client, purpose="consumer", max_fraction=1.0)

    burst = admitted(gate, "acme", 100)  # the first lease learns the multiplier
    clock.advance(10.0)
    refilled = admitted(gate, "acme", 100)

    assert gate.multiplier("acme") == 0.5
    assert burst <= 20
    assert refilled == 10  # 10 s at 5/s (half of 10/s), capped at the halved burst of 10
    assert (
        client.get_item(
            TableName=state_table, Key={"pk": {"S": "tenant#acme"}, "sk": {"S": "bucket#ingest"}}
        ).get("Item")
        is None
    )


def test_an_unavailable_table_fails_open_with_a_bounded_local_lease(clock, counted_client):
    client, counter = counted_client
    gate = bucket("no-such-table", clock, client)

    assert admitted(gate, "acme", 100) == 20  # the burst, leased from the container's own view
    assert counter.calls.count("UpdateItem") == 4  # one failed call per lease, none per refusal


def _item(client, state_table, purpose="ingest"):
    return client.get_item(
        TableName=state_table, Key={"pk": {"S": "tenant#acme"}, "sk": {"S": f"bucket#{purpose}"}}
    )["Item"]


def test_a_full_bucket_is_leased_with_one_write_whatever_others_wrote(state_table, clock, counted_client):
    client, counter = counted_client
    first, second = fixed(state_table, clock, client), fixed(state_table, clock, client)
    assert first.try_acquire("acme", LIMITS)[0]  # a new bucket: one write, 20 - 5 left
    clock.advance(2.0)  # full again
    assert second.try_acquire("acme", LIMITS)[0]
    clock.advance(2.0)
    counter.calls.clear()

    # first's copy is two writes old, but it says the bucket is full by now: no lost race
    assert first.try_acquire("acme", LIMITS)[0]

    assert counter.calls == ["UpdateItem"]
    item = _item(client, state_table)
    assert item["version"]["N"] == "3"
    assert float(item["tokens"]["N"]) == pytest.approx(15)
    assert float(item["full_at"]["N"]) == pytest.approx(clock.now + 0.5)  # 5 tokens at 10/s


def test_the_full_bucket_write_is_refused_when_the_bucket_is_not_full(state_table, clock, counted_client):
    client, counter = counted_client
    first, second = fixed(state_table, clock, client), fixed(state_table, clock, client)
    assert first.try_acquire("acme", LIMITS)[0]
    clock.advance(2.0)
    assert admitted(second, "acme", 20) == 20  # drains the refilled bucket in four leases
    counter.calls.clear()

    # first's copy says full, the table says empty: the condition fails, nothing is admitted
    ok, retry_after = first.try_acquire("acme", LIMITS)

    # a lost probe: first backs off beyond the refill (2 x its own request interval here, 1 s)
    assert not ok and retry_after == jittered(2 * 1.0)
    assert counter.calls == ["UpdateItem"]
    assert float(_item(client, state_table)["tokens"]["N"]) == pytest.approx(0)


def test_the_full_bucket_write_respects_a_new_multiplier(state_table, clock, counted_client):
    client, counter = counted_client
    gate = fixed(state_table, clock, client)
    assert gate.try_acquire("acme", LIMITS)[0]  # multiplier 1 as far as this container knows
    client.update_item(  # the controller halves the rate (breakwater.aws.controller_ports.set_multiplier)
        TableName=state_table,
        Key={"pk": {"S": "tenant#acme"}, "sk": {"S": "bucket#ingest"}},
        UpdateExpression="SET multiplier = :m",
        ExpressionAttributeValues={":m": {"N": "0.5"}},
    )
    clock.advance(10.0)
    counter.calls.clear()

    assert gate.try_acquire("acme", LIMITS)[0]

    # the full-bucket write is refused (multiplier 1 assumed), the versioned one leases at 5/s, burst 10
    assert counter.calls == ["UpdateItem", "UpdateItem"]
    assert gate.multiplier("acme") == 0.5
    assert float(_item(client, state_table)["tokens"]["N"]) == pytest.approx(10 - 2)  # a lease of 2.5 -> 2


def test_a_bucket_written_before_full_at_takes_the_versioned_write(state_table, clock, counted_client):
    client, counter = counted_client
    client.put_item(
        TableName=state_table,
        Item={
            "pk": {"S": "tenant#acme"},
            "sk": {"S": "bucket#ingest"},
            "tokens": {"N": "20"},
            "updated_at": {"N": str(clock.now - 60)},
            "version": {"N": "7"},
        },
    )
    gate = bucket(state_table, clock, client)
    counter.calls.clear()

    assert gate.try_acquire("acme", LIMITS)[0]

    assert counter.calls == [
        "UpdateItem",
        "UpdateItem",
    ]  # the full-bucket write refused, then the versioned one
    item = _item(client, state_table)
    assert item["version"]["N"] == "8" and "full_at" in item


def test_a_lost_race_backs_off_and_a_grant_paces_the_next_ask(state_table, clock, counted_client):
    client, counter = counted_client
    first, second = fixed(state_table, clock, client), fixed(state_table, clock, client)
    assert second.try_acquire("acme", LIMITS)[0]  # 15 left, second's copy says so
    assert admitted(first, "acme", 15) == 15  # first empties it; second does not know
    assert admitted(second, "acme", 4) == 4  # second's own lease

    ok, retry_after = second.try_acquire("acme", LIMITS)  # its copy: 15 tokens; the table: none

    assert not ok and retry_after == jittered(2 * 0.5)  # a lost probe, then refused: twice a refill
    ok, plain = first.try_acquire("acme", LIMITS)
    assert not ok and plain == pytest.approx(0.5)  # refused from its own copy: no race, no backoff
    calls = len(counter.calls)
    assert admitted(second, "acme", 50) == 0 and len(counter.calls) == calls  # refused locally, no call
    clock.advance(retry_after)
    assert second.try_acquire("acme", LIMITS)[0]  # 10 tokens by now: a lease of 5
    assert admitted(first, "acme", 5) == 5  # first takes the other 5
    assert admitted(second, "acme", 4) == 4

    ok, retry_after = second.try_acquire("acme", LIMITS)

    # the won lease left the bucket near empty, so the backoff shrank gently and paces the next ask
    assert not ok and retry_after == pytest.approx(0.9 * 2 * 0.5, rel=0.01)


def test_a_stale_copy_of_a_bucket_that_is_not_full_leases_with_one_write(state_table, clock, counted_client):
    client, counter = counted_client
    first, second = bucket(state_table, clock, client), fixed(state_table, clock, client)
    assert admitted(first, "acme", 5) == 5  # a new bucket: 15 left, first's copy says so
    assert admitted(second, "acme", 5) == 5  # 10 left; first does not know
    counter.calls.clear()

    # first's copy is one write old and says 15; 10 are left, enough for a lease of 5: no lost race
    assert first.try_acquire("acme", LIMITS)[0]

    assert admitted(first, "acme", 4) == 4  # the rest of the lease is spent locally
    assert counter.calls == ["UpdateItem"]
    item = _item(client, state_table)
    assert item["version"]["N"] == "3"
    assert float(item["full_at"]["N"]) == pytest.approx(clock.now + 1.5)  # 15 tokens short at 10/s


def test_the_relative_write_is_refused_when_the_tokens_are_gone(state_table, clock, counted_client):
    client, counter = counted_client
    first, second = bucket(state_table, clock, client), bucket(state_table, clock, client)
    assert admitted(first, "acme", 5) == 5  # 15 left
    assert admitted(second, "acme", 15) == 15  # second takes them all
    before = _item(client, state_table)
    counter.calls.clear()

    ok, _ = first.try_acquire("acme", LIMITS)  # its copy says 15; the table says none

    assert not ok
    assert counter.calls == ["UpdateItem"]  # the condition failed; the returned item settles it
    assert _item(client, state_table) == before  # nothing taken


def test_relative_writes_from_many_containers_never_exceed_the_limits(state_table, clock, counted_client):
    import random

    client, _ = counted_client
    rng = random.Random(7)
    containers = [bucket(state_table, clock, client, purpose="consumer") for _ in range(6)]
    limits = BucketLimits(rate=5, burst=5)
    start, total, requests = clock.now, 0, 0
    while clock.now - start < 30:
        clock.advance(rng.expovariate(12))  # 12 requests/s against a rate of 5: always contended
        requests += 1
        total += containers[rng.randrange(len(containers))].try_acquire("acme", limits)[0]

    elapsed = clock.now - start
    assert total <= limits.burst + limits.rate * elapsed + 1e-9
    assert total >= 0.8 * limits.rate * elapsed  # the containers share the bucket, they do not starve it


def test_requests_waiting_together_take_their_tokens_in_one_lease(state_table, clock, counted_client):
    client, counter = counted_client
    gate = bucket(state_table, clock, client, purpose="consumer")
    limits = BucketLimits(rate=5, burst=5)  # the usual lease: a quarter of the burst, 1 token

    assert gate.try_acquire_up_to("acme", limits, 4) == (4, 0.0)
    assert counter.calls == ["UpdateItem"]  # four tokens in one write
    assert gate.try_acquire_up_to("acme", limits, 3) == (1, 0.0)  # the one token left, in one more write
    assert counter.calls == ["UpdateItem", "UpdateItem"]
    taken, retry_after = gate.try_acquire_up_to("acme", limits, 2)
    assert taken == 0 and retry_after > 0
    assert len(counter.calls) == 2  # refused from the copy the last write returned: no call
    clock.advance(10)
    assert gate.try_acquire_up_to("acme", limits, 9) == (5, 0.0)  # never more than the burst


STANDARD = BucketLimits(rate=50, burst=100)  # cdk.json's standard tier


def _admission(state_table, clock, client, *, containers, per_second, seconds=20.0, seed=7):
    """A tenant's requests spread at random over ``containers`` gates sharing one table's bucket, as
    Lambda spreads them over warm containers; the admitted rate over the last ``seconds - 2`` s."""
    import random

    rng = random.Random(seed)
    gates = [bucket(state_table, clock, client) for _ in range(containers)]
    start, admitted_late, interval = clock.now, 0, 1.0 / per_second
    while clock.now - start < seconds:
        clock.advance(rng.expovariate(1.0 / interval))
        ok = rng.choice(gates).try_acquire("acme", STANDARD)[0]
        if ok and clock.now - start >= 2.0:  # past the first lease of every container
            admitted_late += 1
    return admitted_late / (seconds - 2.0)


@pytest.mark.parametrize("containers", [1, 10, 40, 100])
def test_a_tenant_under_its_rate_is_admitted_whatever_the_container_count(
    state_table, clock, counted_client, containers
):
    client, _ = counted_client
    rate = _admission(state_table, clock, client, containers=containers, per_second=45)
    assert rate == pytest.approx(45, rel=0.06)  # Poisson arrivals: the offered rate itself varies


@pytest.mark.parametrize("containers", [1, 40, 100])
def test_a_tenant_over_its_rate_gets_its_rate_and_no_more(state_table, clock, counted_client, containers):
    client, _ = counted_client
    rate = _admission(state_table, clock, client, containers=containers, per_second=100)
    assert 0.9 * STANDARD.rate <= rate <= STANDARD.rate + STANDARD.burst / 18


def _trickle(gates, clock, *, per_second, seconds, limits=STANDARD, seed=3):
    """A tenant's Poisson requests at ``per_second`` spread at random over ``gates``: how many were
    admitted and how many were offered."""
    import random

    rng = random.Random(seed)
    start, offered, admitted_count = clock.now, 0, 0
    while clock.now - start < seconds:
        clock.advance(rng.expovariate(per_second))
        offered += 1
        admitted_count += rng.choice(gates).try_acquire("acme", limits)[0]
    return admitted_count, offered


@pytest.mark.parametrize("containers", [1, 2])
def test_a_trickle_takes_quiet_leases_far_fewer_writes_than_requests(
    state_table, clock, counted_client, containers
):
    client, counter = counted_client
    gates = [bucket(state_table, clock, client) for _ in range(containers)]

    admitted_count, offered = _trickle(gates, clock, per_second=1.0, seconds=300)

    assert admitted_count == offered  # far under its limits: every request admitted
    # A container that sees the tenant less than a few times a second would write once per request
    # with one-second leases; from a full bucket it leases what it expects over the quiet horizon.
    assert counter.calls.count("UpdateItem") < 0.6 * offered


def test_a_quiet_lease_never_lets_a_tenant_past_its_limits(state_table, clock, counted_client):
    client, _ = counted_client
    limits = BucketLimits(rate=2, burst=4)  # a small bucket, so a trickle's quiet leases matter
    gates = [bucket(state_table, clock, client) for _ in range(3)]
    start = clock.now

    quiet, _ = _trickle(gates, clock, per_second=1.0, seconds=60, limits=limits)  # quiet leases taken
    burst, _ = _trickle(gates, clock, per_second=40.0, seconds=20, limits=limits, seed=4)  # then a flood

    assert quiet + burst <= limits.burst + limits.rate * (clock.now - start) + 1e-9
    assert burst >= 0.8 * limits.rate * 20  # and the flood still gets its rate

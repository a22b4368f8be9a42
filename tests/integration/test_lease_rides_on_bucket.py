"""A tenant's floor lease taken in its consumer bucket's write (both on its counters item), against moto:
one write where the bucket and the lease took two, and each refusal told apart."""

from __future__ import annotations

import time
from typing import Any

import boto3
import pytest

from breakwater.aws.buckets import LeasedTokenBucket
from breakwater.aws.concurrency import ConcurrencyLeases
from breakwater.aws.counters import merged_update
from breakwater.aws.worker_ports import CONSUMER_ON_COUNTERS
from breakwater.concurrency import ConcurrencyLimits, Grant
from breakwater.fairness import BucketLimits
from tests.integration import worker_fixtures
from tests.integration.test_worker_leases_and_locks import (
    CountingClient,
    refuse_the_next_update_as_held_by_a_transaction,
)
from tests.integration.worker_fixtures import REGION, STATE_TABLE, WorkerWorld, floor_slot, lease_holders

world = worker_fixtures.world  # the fixture

LIMITS = ConcurrencyLimits(floor=1, ceiling=4)
BUCKET = BucketLimits(rate=5, burst=10)
FAR = 10**13


def _counters(world: WorkerWorld, tenant: str, **attributes: dict[str, Any]) -> None:
    """The tenant's counters item as ingest and an earlier release leave it, with ``attributes``."""
    world.put(
        {
            "pk": {"S": f"tenant#{tenant}"},
            "sk": {"S": "counters"},
            "accepted": {"N": "7"},
            "leases": {"M": {}},
            "version": {"N": "3"},
            **attributes,
        }
    )


def _gates(client: CountingClient, now: float | None = None) -> tuple[LeasedTokenBucket, ConcurrencyLeases]:
    clock = (lambda: now) if now is not None else time.time
    bucket = LeasedTokenBucket(
        STATE_TABLE,
        "consumer",
        clock,
        1.0,
        0.25,
        client=client,  # type: ignore[arg-type]
        size_to_demand=False,
        shared_item=CONSUMER_ON_COUNTERS,
    )
    return bucket, ConcurrencyLeases(client, STATE_TABLE, "me")  # type: ignore[arg-type]


def test_the_floor_lease_rides_on_the_bucket_s_lease_write(world: WorkerWorld) -> None:
    client = CountingClient(boto3.client("dynamodb", region_name=REGION))
    _counters(world, "acme")
    bucket, leases = _gates(client)

    rider = leases.floor_rider("acme", LIMITS, FAR)
    assert rider is not None
    taken, _ = bucket.try_acquire_up_to("acme", BUCKET, 2, on_counters=True, rider=rider)

    assert taken == 2 and rider.landed
    assert client.calls == ["update_item"]  # the tokens and the lease in one write
    item = world.item("tenant#acme", "counters")
    assert item["leases"] == {"#0": {"exp": FAR, "h": "me"}}
    assert item["version"] == 4  # the leases' version moved, as any lease write moves it
    assert item["consumer_version"] == 1 and "consumer_full_at" in item  # the bucket, beside the counters
    assert item["accepted"] == 7
    assert world.item("tenant#acme", "bucket#consumer") == {}  # no item of its own
    # the lease is held as acquire_many holds it: given back where it was taken
    release = leases.release_update("acme", Grant.FLOOR)
    assert release is not None and release["Key"]["sk"] == {"S": "counters"}


def test_a_floor_taken_refuses_the_rider_and_the_bucket_is_written_alone(world: WorkerWorld) -> None:
    client = CountingClient(boto3.client("dynamodb", region_name=REGION))
    _counters(world, "acme", leases={"M": {"#0": floor_slot("other", FAR)}})
    bucket, leases = _gates(client)

    rider = leases.floor_rider("acme", LIMITS, FAR)
    assert rider is not None
    taken, _ = bucket.try_acquire_up_to("acme", BUCKET, 1, on_counters=True, rider=rider)

    assert taken == 1 and rider.refused and not rider.landed
    assert client.calls == ["update_item", "update_item"]  # the joint write failed, the bucket's alone
    item = world.item("tenant#acme", "counters")
    assert lease_holders(item["leases"]) == {"other"} and item["consumer_version"] == 1
    # found at its floor: the next batch reads first rather than try a rider (or a blind write) again
    assert leases.floor_rider("acme", LIMITS, FAR) is None
    assert leases.acquire_many({"acme": LIMITS}, FAR) == {"acme": Grant.BURST}


def test_a_bucket_without_the_tokens_refuses_and_takes_no_lease(world: WorkerWorld) -> None:
    client = CountingClient(boto3.client("dynamodb", region_name=REGION))
    now = time.time()
    # empty, full again only in two seconds: no token now
    empty = {"N": f"{now + 2.0:.6f}"}
    _counters(
        world,
        "acme",
        consumer_tokens={"N": "0"},
        consumer_updated_at={"N": f"{now:.6f}"},
        consumer_full_at=empty,
        consumer_version={"N": "5"},
    )
    bucket, leases = _gates(client, now=now)

    rider = leases.floor_rider("acme", LIMITS, FAR)
    assert rider is not None
    taken, retry_after = bucket.try_acquire_up_to("acme", BUCKET, 1, on_counters=True, rider=rider)

    assert taken == 0 and retry_after > 0
    assert not rider.landed
    assert world.item("tenant#acme", "counters")["leases"] == {}  # no lease for tokens it did not get


def test_a_call_that_spends_its_local_lease_writes_nothing_and_carries_no_lease(world: WorkerWorld) -> None:
    client = CountingClient(boto3.client("dynamodb", region_name=REGION))
    _counters(world, "acme")
    bucket, leases = _gates(client)
    bucket.try_acquire_up_to("acme", BUCKET, 1, on_counters=True)  # leases more than the one it spends
    client.calls.clear()

    rider = leases.floor_rider("acme", LIMITS, FAR)
    assert rider is not None
    taken, _ = bucket.try_acquire_up_to("acme", BUCKET, 1, on_counters=True, rider=rider)

    assert taken == 1 and client.calls == [] and not rider.landed  # the worker leases it on its own


def test_a_tenant_whose_leases_are_on_shards_gets_no_rider(world: WorkerWorld) -> None:
    client = CountingClient(boto3.client("dynamodb", region_name=REGION))
    _bucket, leases = _gates(client)

    assert leases.floor_rider("big", ConcurrencyLimits(floor=4, ceiling=200), FAR) is None
    assert leases.floor_rider("none", ConcurrencyLimits(floor=0, ceiling=4), FAR) is None


def test_conditional_updates_merge_only_when_asked_and_both_conditions_must_hold() -> None:
    key = {"pk": {"S": "tenant#acme"}, "sk": {"S": "counters"}}
    first = {
        "TableName": "t",
        "Key": key,
        "UpdateExpression": "SET #a = :a",
        "ConditionExpression": "#a < :a",
        "ExpressionAttributeNames": {"#a": "a"},
        "ExpressionAttributeValues": {":a": {"N": "1"}},
        "ReturnValues": "ALL_NEW",
    }
    second = {
        "TableName": "t",
        "Key": key,
        "UpdateExpression": "SET #b = :b ADD version :one",
        "ConditionExpression": "attribute_exists(#b)",
        "ExpressionAttributeNames": {"#b": "b"},
        "ExpressionAttributeValues": {":b": {"N": "2"}, ":one": {"N": "1"}},
    }
    with pytest.raises(ValueError, match="conditional"):
        merged_update(first, second)

    merged = merged_update(first, second, conditional=True)

    assert merged["UpdateExpression"] == "SET #a = :a, #b = :b ADD version :one"
    assert merged["ConditionExpression"] == "(#a < :a) AND (attribute_exists(#b))"
    assert merged["ReturnValues"] == "ALL_NEW"
    assert merged["ExpressionAttributeNames"] == {"#a": "a", "#b": "b"}


def test_a_bucket_write_refused_while_a_burst_lease_s_transaction_holds_the_item_is_made_again(
    world: WorkerWorld,
) -> None:
    client = boto3.client("dynamodb", region_name=REGION)
    _counters(world, "acme")
    bucket, leases = _gates(CountingClient(client))
    refused = refuse_the_next_update_as_held_by_a_transaction(client)
    rider = leases.floor_rider("acme", LIMITS, FAR)
    assert rider is not None

    taken, _ = bucket.try_acquire_up_to("acme", BUCKET, 1, on_counters=True, rider=rider)

    # made again, not answered from the container's own view (which would admit past the rate)
    assert taken == 1 and refused and rider.landed
    item = world.item("tenant#acme", "counters")
    assert item["consumer_version"] == 1 and lease_holders(item["leases"]) == {"me"}

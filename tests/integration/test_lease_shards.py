"""A big tenant's leases spread over lease shards (``tenant#<id>``/``lease#<k>``), against moto: no item
holds more than one shard's leases, the release goes where the lease is, a full shard sends a container
to its second one, and a lost one-write floor is read again only after a pause."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any, cast

import boto3
import pytest
from botocore.config import Config

from breakwater.aws.concurrency import ConcurrencyLeases
from breakwater.aws.worker_ports import build_worker_ports
from breakwater.concurrency import (
    LEASE_SHARD_PLACES,
    ConcurrencyLimits,
    Grant,
    lease_shard_count,
    lease_shard_of,
    second_lease_shard,
    shard_limits,
)
from breakwater.settings import WorkerSettings
from local.aws_limits import AwsLimits
from local.emulator import moto_patches
from local.emulator.moto_patches.limits import Enforcement, limits_enforced
from tests.integration import worker_fixtures
from tests.integration.test_worker_leases_and_locks import CountingClient
from tests.integration.worker_fixtures import REGION, STATE_TABLE, WorkerWorld, floor_slot

world = worker_fixtures.world  # the fixture

CALLERS = 50
FAR = 10**13
TENANT = "big"


def _lease(holder: str) -> dict[str, Any]:
    return {holder: {"M": {"exp": {"N": str(FAR)}, "burst": {"BOOL": True}}}}


def _fill(world: WorkerWorld, tenant: str, sk: str, count: int) -> None:
    """An item holding ``count`` live leases of other containers: its floor's one slot, then bursts."""
    leases: dict[str, Any] = {}
    for index in range(count):
        holder = f"other-{sk}-{index}"
        leases |= {"#0": floor_slot(holder, FAR)} if index == 0 else _lease(holder)
    world.put(
        {"pk": {"S": f"tenant#{tenant}"}, "sk": {"S": sk}, "leases": {"M": leases}, "version": {"N": "1"}}
    )


def _leases_by_item(world: WorkerWorld, tenant: str) -> dict[str, dict[str, Any]]:
    """The tenant's items that hold a map of leases: sort key -> that map, by holder (a floor slot's too)."""
    items = world.dynamodb.query(
        TableName=STATE_TABLE,
        KeyConditionExpression="pk = :pk",
        ExpressionAttributeValues={":pk": {"S": f"tenant#{tenant}"}},
        ConsistentRead=True,
    )["Items"]
    return {
        item["sk"]["S"]: {
            (value["M"]["h"]["S"] if key.startswith("#") else key): value
            for key, value in item["leases"]["M"].items()
        }
        for item in items
        if "leases" in item
    }


@pytest.fixture
def enforced(world: WorkerWorld) -> Iterator[Enforcement]:
    with (
        moto_patches.installed(),  # the embedded AWS's arrangement: moto's item operations serialized
        limits_enforced(AwsLimits(), clock=lambda: 0.0, sleep=lambda _s: None) as enforcement,
    ):
        yield enforcement


@pytest.mark.parametrize(
    "limits",
    [
        ConcurrencyLimits(floor=20, ceiling=100),  # 7 shards: room for every container
        ConcurrencyLimits(floor=20, ceiling=40),  # 3 shards: more containers than the ceiling
    ],
)
def test_fifty_containers_lease_a_big_tenant_in_its_shards_and_give_back_where_they_took(
    world: WorkerWorld, enforced: Enforcement, limits: ConcurrencyLimits
) -> None:
    settings = WorkerSettings.from_env(world.environment())
    dynamodb = boto3.client(
        "dynamodb", region_name=REGION, config=Config(retries={"mode": "standard", "max_attempts": 1})
    )
    ports = [
        build_worker_ports(
            settings, lambda envelope, work: {}, dynamodb=dynamodb, sqs=world.sqs, container_id=f"c{i}"
        )
        for i in range(CALLERS)
    ]
    grants: list[Grant] = [Grant.REFUSED] * CALLERS
    taken = threading.Barrier(CALLERS)
    failures: list[BaseException] = []
    held: dict[str, dict[str, Any]] = {}

    def container(index: int) -> None:
        try:
            leases = ports[index].leases
            assert leases is not None
            grants[index] = leases.acquire_many({TENANT: limits}, FAR)[TENANT]
            if taken.wait() == 0:  # one of them looks at the items while every lease is held
                held.update(_leases_by_item(world, TENANT))
            taken.wait()
            release = ports[index].release
            assert release is not None
            counters = {"processed": 1} if grants[index] is not Grant.REFUSED else {}
            assert release({TENANT: grants[index]}, {TENANT: counters}) == {}
        except BaseException as exc:
            failures.append(exc)
            taken.abort()

    threads = [threading.Thread(target=container, args=(index,)) for index in range(CALLERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)

    assert failures == []
    shards = lease_shard_count(limits)
    granted = [index for index, grant in enumerate(grants) if grant is not Grant.REFUSED]
    assert held.keys() <= {f"lease#{shard}" for shard in range(shards)}  # the counters item holds none
    for shard in range(shards):
        assert (
            len(held.get(f"lease#{shard}", {})) <= shard_limits(limits, shard).ceiling <= LEASE_SHARD_PLACES
        )
    assert sorted(holder for leases in held.values() for holder in leases) == sorted(f"c{i}" for i in granted)
    assert (
        limits.floor <= len(granted) <= min(CALLERS, limits.ceiling)
    )  # the floor always, never past the ceiling
    # every lease taken in the container's own shard or its second one, and given back there
    for sk, leases in held.items():
        for holder in leases:
            own = lease_shard_of(TENANT, holder, shards)
            assert sk in {f"lease#{own}", f"lease#{second_lease_shard(TENANT, holder, shards)}"}
    assert all(leases == {} for leases in _leases_by_item(world, TENANT).values())
    assert world.item(f"tenant#{TENANT}", "counters")["processed"] == len(granted)
    throttled = {item: stats.throttled for item, stats in enforced.dynamodb.stats.items() if stats.throttled}
    assert throttled == {}


def test_a_container_whose_own_shard_is_full_leases_in_its_second_and_is_refused_only_when_both_are(
    world: WorkerWorld,
) -> None:
    limits = ConcurrencyLimits(floor=3, ceiling=48)  # 3 shards of 16 places
    holder = "me"
    own = lease_shard_of(TENANT, holder, 3)
    second = second_lease_shard(TENANT, holder, 3)
    assert second is not None
    third = ({0, 1, 2} - {own, second}).pop()
    _fill(world, TENANT, f"lease#{own}", 16)
    client = boto3.client("dynamodb", region_name=REGION)
    leases = ConcurrencyLeases(client, STATE_TABLE, holder)

    assert leases.acquire_many({TENANT: limits}, FAR) == {TENANT: Grant.FLOOR}  # the second shard's floor
    assert _leases_by_item(world, TENANT)[f"lease#{second}"].keys() == {holder}
    release = leases.release_update(TENANT, Grant.FLOOR)
    assert release is not None and release["Key"]["sk"] == {"S": f"lease#{second}"}
    client.update_item(**release)
    leases.released(TENANT)

    _fill(world, TENANT, f"lease#{second}", 16)
    assert leases.acquire_many({TENANT: limits}, FAR) == {TENANT: Grant.REFUSED}
    assert leases.acquire(TENANT, limits, FAR) is Grant.REFUSED
    assert holder not in str(_leases_by_item(world, TENANT))  # the third shard is not tried
    assert f"lease#{third}" not in _leases_by_item(world, TENANT)


def test_a_sharded_tenant_s_release_and_counters_are_two_writes_a_small_tenant_s_one(
    world: WorkerWorld,
) -> None:
    client = CountingClient(boto3.client("dynamodb", region_name=REGION))
    settings = WorkerSettings.from_env(world.environment())
    ports = build_worker_ports(
        settings, lambda envelope, work: {}, dynamodb=cast(Any, client), sqs=world.sqs, container_id="me"
    )
    assert ports.leases is not None and ports.release is not None
    small, big = ConcurrencyLimits(floor=1, ceiling=16), ConcurrencyLimits(floor=10, ceiling=1000)
    grants = ports.leases.acquire_many({"small": small, TENANT: big}, FAR)
    assert grants == {"small": Grant.FLOOR, TENANT: Grant.FLOOR}
    assert _leases_by_item(world, "small").keys() == {"counters"}
    own = f"lease#{lease_shard_of(TENANT, 'me', lease_shard_count(big))}"
    assert _leases_by_item(world, TENANT).keys() == {own}
    client.calls.clear()

    assert ports.release(grants, {"small": {"processed": 2}, TENANT: {"processed": 3}}) == {}

    assert client.calls == ["update_item"] * 3  # small: one; big: its shard, then its counters
    assert world.item("tenant#small", "counters")["processed"] == 2
    assert world.item("tenant#small", "counters")["leases"] == {}
    assert world.item(f"tenant#{TENANT}", own)["leases"] == {}
    assert "leases" not in world.item(f"tenant#{TENANT}", "counters")
    assert world.item(f"tenant#{TENANT}", "counters")["processed"] == 3


def test_a_floor_lost_to_a_race_after_the_read_is_read_again_only_after_a_pause(world: WorkerWorld) -> None:
    client = CountingClient(boto3.client("dynamodb", region_name=REGION))
    pauses: list[int] = []

    def pause(attempt: int) -> bool:
        pauses.append(attempt)
        return True

    leases = ConcurrencyLeases(client, STATE_TABLE, "me", pause=pause)  # type: ignore[arg-type]
    _fill(world, "acme", "counters", 0)  # the read finds the floor free
    client.before_write = lambda: _fill(world, "acme", "counters", 1)  # another container takes it first

    assert leases.acquire("acme", ConcurrencyLimits(floor=1, ceiling=1), FAR) is Grant.REFUSED

    assert pauses == [0]  # the lost one-write floor paused before the second read
    assert client.calls == ["get_item", "update_item", "get_item"]

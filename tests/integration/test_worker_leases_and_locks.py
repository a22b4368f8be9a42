"""The batch's concurrency leases (on the tenant's counters item, one conditional write per tenant) and
idempotency locks (one conditional put per message, no transaction), and the floors when several
containers contend for a small burst pool, against moto."""

from __future__ import annotations

from typing import Any

import boto3
from botocore.exceptions import ClientError

from breakwater.aws.concurrency import POOL_PK, POOL_SK, ConcurrencyLeases
from breakwater.aws.idempotency import IdempotentProcessor
from breakwater.aws.worker_ports import build_worker_ports
from breakwater.concurrency import ConcurrencyLimits, Grant, home_slot
from breakwater.envelope import Envelope, Origin
from breakwater.processor import WorkContext
from breakwater.settings import WorkerSettings
from breakwater.worker import Worker, WorkerOptions
from tests.integration import worker_fixtures
from tests.integration.worker_fixtures import (
    IDEMPOTENCY_TABLE,
    REGION,
    STATE_TABLE,
    FakeLambdaContext,
    WorkerWorld,
    floor_slot,
    lease_holders,
    make_envelope,
)

world = worker_fixtures.world  # the fixture

LIMITS = ConcurrencyLimits(floor=1, ceiling=1)
FAR = 10**13


class CountingClient:
    """The moto client, counting calls per operation; ``before_write`` runs before the next UpdateItem."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self.calls: list[str] = []
        self.before_write: Any = None

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._client, name)

        def call(**kwargs: Any) -> Any:
            self.calls.append(name)
            if name == "update_item" and self.before_write is not None:
                hook, self.before_write = self.before_write, None
                hook()
            return method(**kwargs)

        return call


def refuse_the_next_update_as_held_by_a_transaction(client: Any) -> list[str]:
    """The client's next UpdateItem is refused as while another container's burst lease's transaction
    holds the item for a moment; the list gets its UpdateExpression."""
    refused: list[str] = []

    def held_by_a_transaction(params: dict[str, Any], **_: Any) -> None:
        if not refused:
            refused.append(params["UpdateExpression"])
            raise ClientError({"Error": {"Code": "TransactionConflictException"}}, "UpdateItem")

    client.meta.events.register("provide-client-params.dynamodb.UpdateItem", held_by_a_transaction)
    return refused


def _leases(client: CountingClient) -> ConcurrencyLeases:
    return ConcurrencyLeases(client, STATE_TABLE, "me")  # type: ignore[arg-type]


def _idempotent(client: CountingClient) -> IdempotentProcessor:
    def process(envelope: Envelope, work: WorkContext) -> dict[str, Any]:
        return {"id": envelope.id}

    idempotent = IdempotentProcessor(process, IDEMPOTENCY_TABLE, 3600, client=client)  # type: ignore[arg-type]
    idempotent.register_context(FakeLambdaContext())  # type: ignore[arg-type]
    return idempotent


def _statuses(world: WorkerWorld) -> list[str]:
    return [item["status"]["S"] for item in world.dynamodb.scan(TableName=IDEMPOTENCY_TABLE)["Items"]]


def _hold(world: WorkerWorld, tenant: str, version: int = 1) -> None:
    world.put(
        {
            "pk": {"S": f"tenant#{tenant}"},
            "sk": {"S": "counters"},
            "leases": {"M": {"#0": floor_slot("other", FAR)}},
            "version": {"N": str(version)},
        }
    )


def _released(world: WorkerWorld, tenant: str, leases: dict[str, Any] | None = None) -> None:
    """The tenant's item as a release leaves it: counters and an empty map of leases (or those given)."""
    world.put(
        {
            "pk": {"S": f"tenant#{tenant}"},
            "sk": {"S": "counters"},
            "processed": {"N": "3"},
            "writes": {"N": "2"},
            "leases": {"M": leases or {}},
            "version": {"N": "4"},
        }
    )


def test_a_batch_takes_each_floor_in_one_write_and_reads_only_the_tenants_it_missed(
    world: WorkerWorld,
) -> None:
    client = CountingClient(boto3.client("dynamodb", region_name=REGION))
    _hold(world, "busy")
    _released(world, "globex")

    grants = _leases(client).acquire_many({"acme": LIMITS, "globex": LIMITS, "busy": LIMITS}, FAR)

    assert grants == {"acme": Grant.FLOOR, "globex": Grant.FLOOR, "busy": Grant.REFUSED}
    # a write without reading each (acme has no item yet, busy's floor is taken: those two fail), one
    # read of the two missed, then acme's item gets its map of leases and its lease; no transaction: a
    # lease in one costs two write units
    assert client.calls == [
        "update_item",
        "update_item",
        "update_item",
        "batch_get_item",
        "update_item",
        "update_item",
    ]
    globex = world.item("tenant#globex", "counters")
    assert globex["leases"] == {"#0": {"exp": FAR, "h": "me"}}  # its floor's only slot, naming its holder
    assert (globex["processed"], globex["writes"], globex["version"]) == (3, 2, 5)  # the counters stay
    assert lease_holders(world.item("tenant#acme", "counters")["leases"]) == {"me"}


def test_a_one_tenant_batch_takes_its_floor_lease_in_one_write_without_a_read(world: WorkerWorld) -> None:
    client = CountingClient(boto3.client("dynamodb", region_name=REGION))
    _released(world, "acme")

    assert _leases(client).acquire_many({"acme": LIMITS}, FAR) == {"acme": Grant.FLOOR}

    assert client.calls == ["update_item"]  # no read
    item = world.item("tenant#acme", "counters")
    assert item["leases"] == {"#0": {"exp": FAR, "h": "me"}}
    assert item["version"] == 5  # a read-then-write of another container made meanwhile fails
    assert item["processed"] == 3


def test_locks_are_a_conditional_put_each_and_a_duplicate_is_left_to_the_per_call_path(
    world: WorkerWorld,
) -> None:
    client = CountingClient(boto3.client("dynamodb", region_name=REGION))
    idempotent = _idempotent(client)
    done, fresh = make_envelope("acme"), make_envelope("acme")
    idempotent.lock([done])
    idempotent(done, WorkContext())
    idempotent.flush()
    client.calls.clear()

    idempotent.lock([done, fresh])

    assert client.calls == ["put_item", "put_item"]  # the done one's is refused by its record
    assert sorted(_statuses(world)) == ["COMPLETED", "INPROGRESS"]
    idempotent.lock([fresh])  # held already: nothing more is written
    assert client.calls == ["put_item", "put_item"]
    assert idempotent(fresh, WorkContext()) == {"id": fresh.id}
    assert idempotent(done, WorkContext()) == {"id": done.id}  # the per-call path answers "done"
    idempotent.flush()
    assert _statuses(world) == ["COMPLETED", "COMPLETED"]


def test_the_lease_goes_back_with_the_batch_s_counters_in_one_write(world: WorkerWorld) -> None:
    client = CountingClient(boto3.client("dynamodb", region_name=REGION))
    settings = WorkerSettings.from_env(world.environment())
    ports = build_worker_ports(
        settings,
        lambda envelope, work: {},
        dynamodb=client,
        sqs=world.sqs,
        container_id="me",  # type: ignore[arg-type]
    )
    _released(world, "acme")
    assert ports.leases is not None
    grants = ports.leases.acquire_many({"acme": LIMITS}, FAR)
    client.calls.clear()

    assert ports.settle(grants, {"acme": {"processed": 2}}) == {}

    assert client.calls == ["update_item"]
    item = world.item("tenant#acme", "counters")
    assert (item["leases"], item["processed"], item["writes"]) == ({}, 5, 3)
    assert item["dirty_shard"]  # marked for the controller, as every counter write does


def test_a_write_refused_while_a_burst_lease_s_transaction_holds_the_item_is_made_again(
    world: WorkerWorld,
) -> None:
    client = boto3.client("dynamodb", region_name=REGION)
    settings = WorkerSettings.from_env(world.environment())
    ports = build_worker_ports(
        settings, lambda envelope, work: {}, dynamodb=client, sqs=world.sqs, container_id="me"
    )
    _released(world, "acme")
    assert ports.leases is not None
    grants = ports.leases.acquire_many({"acme": LIMITS}, FAR)
    refused = refuse_the_next_update_as_held_by_a_transaction(client)

    assert ports.settle(grants, {"acme": {"processed": 1}}) == {}

    assert refused and "writes :one" in refused[0]
    item = world.item("tenant#acme", "counters")
    assert (item["leases"], item["processed"]) == ({}, 4)


def test_a_tenant_at_its_floor_is_read_and_read_first_for_a_while(world: WorkerWorld) -> None:
    client = CountingClient(boto3.client("dynamodb", region_name=REGION))
    leases = _leases(client)
    _hold(world, "busy")  # another container's live lease: the floor (and the ceiling) of 1 is taken

    assert leases.acquire_many({"busy": LIMITS}, FAR) == {"busy": Grant.REFUSED}
    assert client.calls == ["update_item", "batch_get_item"]  # refused, read: nothing to write

    client.calls.clear()
    assert leases.acquire_many({"busy": LIMITS}, FAR) == {"busy": Grant.REFUSED}
    assert client.calls == ["batch_get_item"]  # crowded: read first
    assert lease_holders(world.item("tenant#busy", "counters")["leases"]) == {"other"}


def test_a_lapsed_floor_lease_is_taken_over_in_one_write_without_a_read(world: WorkerWorld) -> None:
    client = CountingClient(boto3.client("dynamodb", region_name=REGION))
    _released(world, "acme", {"#0": floor_slot("gone", 1)})  # a lease left to lapse (or a crash's)

    assert _leases(client).acquire_many({"acme": LIMITS}, FAR) == {"acme": Grant.FLOOR}

    assert client.calls == ["update_item"]
    assert world.item("tenant#acme", "counters")["leases"] == {"#0": {"exp": FAR, "h": "me"}}


def test_a_floor_write_refused_in_one_slot_is_made_once_more_in_a_slot_it_saw_open(
    world: WorkerWorld,
) -> None:
    client = CountingClient(boto3.client("dynamodb", region_name=REGION))
    holder = "me"  # its home slot is taken; the other slot of the floor of 2 is free
    home = home_slot(holder, 2)
    _released(world, "acme", {f"#{home}": floor_slot("other", FAR)})

    limits = ConcurrencyLimits(floor=2, ceiling=2)
    assert _leases(client).acquire_many({"acme": limits}, FAR) == {"acme": Grant.FLOOR}

    assert client.calls == ["update_item", "update_item"]  # no read: the refusal showed the open slot
    assert world.item("tenant#acme", "counters")["leases"] == {
        f"#{home}": {"exp": FAR, "h": "other"},
        f"#{1 - home}": {"exp": FAR, "h": "me"},
    }


def test_a_lease_that_loses_a_race_is_acquired_again_on_its_own(world: WorkerWorld) -> None:
    client = CountingClient(boto3.client("dynamodb", region_name=REGION))
    leases = _leases(client)
    _hold(world, "globex")
    assert leases.acquire_many({"globex": LIMITS}, FAR) == {"globex": Grant.REFUSED}  # now read first
    _released(world, "globex")  # its holder gave it back
    _released(world, "acme")
    client.calls.clear()

    def then(hook: Any) -> Any:
        return lambda: setattr(client, "before_write", hook)

    # before the second write (globex's after its read) another container takes globex's floor
    client.before_write = then(lambda: _hold(world, "globex", version=7))

    grants = leases.acquire_many({"globex": LIMITS, "acme": LIMITS}, FAR)

    assert grants == {"acme": Grant.FLOOR, "globex": Grant.REFUSED}
    assert client.calls == ["update_item", "batch_get_item", "update_item", "get_item"]
    assert lease_holders(world.item("tenant#globex", "counters")["leases"]) == {"other"}


# -- floors under contention: several containers, one state table, a small burst pool --------------------
NOISY = ConcurrencyLimits(floor=1, ceiling=6)
QUIET = ConcurrencyLimits(floor=2, ceiling=6)


def _pool(world: WorkerWorld) -> set[str]:
    return set(world.item(POOL_PK, POOL_SK).get("leases", {}))


def _holders(world: WorkerWorld, tenant: str) -> set[str]:
    return lease_holders(world.item(f"tenant#{tenant}", "counters").get("leases", {}))


def test_a_noisy_tenant_gets_no_burst_beyond_the_pool_and_a_quiet_one_always_its_floor(
    world: WorkerWorld,
) -> None:
    client = boto3.client("dynamodb", region_name=REGION)
    containers = [ConcurrencyLeases(client, STATE_TABLE, f"c{index}", burst_capacity=1) for index in range(6)]

    # every container asks for the noisy tenant first: its floor, then the pool's one slot, then nothing
    noisy = [container.acquire_many({"noisy": NOISY}, FAR)["noisy"] for container in containers]
    assert noisy == [Grant.FLOOR, Grant.BURST, *[Grant.REFUSED] * 4]
    assert _pool(world) == {"noisy#c1"}

    # with the pool taken, the quiet tenant still gets its whole floor, alone or beside the noisy one
    assert containers[2].acquire_many({"quiet": QUIET}, FAR) == {"quiet": Grant.FLOOR}
    assert containers[3].acquire_many({"noisy": NOISY, "quiet": QUIET}, FAR) == {
        "noisy": Grant.REFUSED,
        "quiet": Grant.FLOOR,
    }
    assert containers[4].acquire_many({"quiet": QUIET}, FAR) == {"quiet": Grant.REFUSED}  # a burst: no room
    assert _holders(world, "noisy") == {"c0", "c1"}
    assert _holders(world, "quiet") == {"c2", "c3"}

    # the noisy tenant's burst lease goes back with its batch: the slot goes to whoever asks next
    containers[1].release("noisy", Grant.BURST)
    assert _pool(world) == set()
    assert containers[4].acquire_many({"quiet": QUIET}, FAR) == {"quiet": Grant.BURST}
    assert containers[5].acquire_many({"noisy": NOISY}, FAR) == {"noisy": Grant.REFUSED}
    assert _pool(world) == {"quiet#c4"}


class _Discard:
    """A metrics sink that keeps nothing: the containers here are not measured."""

    def add_dimension(self, name: str, value: str) -> None: ...

    def add_metric(self, name: str, unit: Any, value: float, resolution: Any = 60) -> None: ...

    def add_metadata(self, key: str, value: Any) -> None: ...

    def flush_metrics(self, raise_on_empty_metrics: bool = False) -> None: ...


def test_workers_of_several_containers_keep_the_quiet_tenant_s_floor_while_the_pool_is_taken(
    world: WorkerWorld,
) -> None:
    """Three containers in one another's batches (each holds its leases while the next one runs)."""
    noisy = [make_envelope("noisy") for _ in range(3)]
    quiet = make_envelope("quiet")
    for envelope in (*noisy, quiet):
        world.send("live-0", envelope)
    received = {Envelope.from_json(m["Body"]).id: m for m in world.receive(world.urls["live-0"])}
    url = world.urls["live-0"]
    batches = [
        world.event(url, [received[noisy[0].id]]),
        world.event(url, [received[noisy[1].id]]),
        world.event(url, [received[noisy[2].id], received[quiet.id]]),
    ]
    worked: list[str] = []
    seen_while_quiet_ran: dict[str, set[str]] = {}

    def process(envelope: Envelope, work: WorkContext) -> dict[str, Any]:
        worked.append(envelope.tenant)
        if envelope.id == noisy[0].id:  # container 0 holds the noisy floor lease meanwhile
            workers[1].handle(batches[1], FakeLambdaContext())  # type: ignore[arg-type]
        elif envelope.id == noisy[1].id:  # container 1 holds the pool's only slot meanwhile
            workers[2].handle(batches[2], FakeLambdaContext())  # type: ignore[arg-type]
        elif envelope.id == quiet.id:
            seen_while_quiet_ran.update(
                pool=_pool(world), noisy=_holders(world, "noisy"), quiet=_holders(world, "quiet")
            )
        return {"id": envelope.id}

    settings = WorkerSettings.from_env(world.environment(concurrency_burst_slots=1))
    dynamodb = boto3.client("dynamodb", region_name=REGION)
    workers = [
        Worker(
            WorkerOptions.from_settings(settings),
            build_worker_ports(settings, process, dynamodb=dynamodb, sqs=world.sqs, container_id=f"c{index}"),
            metrics=_Discard(),
        )
        for index in range(3)
    ]

    first = workers[0].handle(batches[0], FakeLambdaContext())  # type: ignore[arg-type]

    assert first == {"batchItemFailures": []}
    assert sorted(worked) == ["noisy", "noisy", "quiet"]
    assert seen_while_quiet_ran == {"pool": {"noisy#c1"}, "noisy": {"c0", "c1"}, "quiet": {"c2"}}
    # the noisy tenant's third message waits in the surge queue for a slot
    assert [(e.id, e.origin) for e in world.bodies("surge")] == [(noisy[2].id, Origin.SURGE)]
    assert world.item("tenant#noisy", "counters")["deferred"] == 1
    assert world.item("tenant#quiet", "counters")["processed"] == 1
    assert _pool(world) == set() and _holders(world, "noisy") == _holders(world, "quiet") == set()

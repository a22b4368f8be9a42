"""The batch's concurrency leases and idempotency locks go out in one transaction, and the floors hold
when several containers contend for a small burst pool, against moto."""

from __future__ import annotations

from typing import Any

import boto3

from breakwater.aws.concurrency import POOL_PK, POOL_SK, ConcurrencyLeases
from breakwater.aws.idempotency import IdempotentProcessor
from breakwater.aws.worker_ports import LeasesAndLocks, build_worker_ports
from breakwater.concurrency import ConcurrencyLimits, Grant
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
    make_envelope,
)

world = worker_fixtures.world  # the fixture

LIMITS = ConcurrencyLimits(floor=1, ceiling=1)
FAR = 10**13


class CountingClient:
    """The moto client, counting calls per operation; ``before_transact`` runs before each transaction."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self.calls: list[str] = []
        self.before_transact: Any = None

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._client, name)

        def call(**kwargs: Any) -> Any:
            self.calls.append(name)
            if name == "transact_write_items" and self.before_transact is not None:
                hook, self.before_transact = self.before_transact, None
                hook()
            return method(**kwargs)

        return call


def _gate(client: CountingClient) -> tuple[LeasesAndLocks, IdempotentProcessor]:
    def process(envelope: Envelope, work: WorkContext) -> dict[str, Any]:
        return {"id": envelope.id}

    idempotent = IdempotentProcessor(process, IDEMPOTENCY_TABLE, 3600, client=client)  # type: ignore[arg-type]
    idempotent.register_context(FakeLambdaContext())  # type: ignore[arg-type]
    leases = ConcurrencyLeases(client, STATE_TABLE, "me")  # type: ignore[arg-type]
    return LeasesAndLocks(leases, idempotent), idempotent


def _statuses(world: WorkerWorld) -> list[str]:
    return [item["status"]["S"] for item in world.dynamodb.scan(TableName=IDEMPOTENCY_TABLE)["Items"]]


def _hold(world: WorkerWorld, tenant: str, version: int = 1) -> None:
    world.put(
        {
            "pk": {"S": f"tenant#{tenant}"},
            "sk": {"S": "concurrency"},
            "leases": {"M": {"other": {"M": {"exp": {"N": str(FAR)}, "burst": {"BOOL": False}}}}},
            "version": {"N": str(version)},
        }
    )


def test_leases_and_the_locks_of_granted_tenants_are_one_transaction(world: WorkerWorld) -> None:
    client = CountingClient(boto3.client("dynamodb", region_name=REGION))
    gate, idempotent = _gate(client)
    _hold(world, "busy")
    envelopes = [make_envelope("acme"), make_envelope("globex"), make_envelope("busy")]

    grants = gate.acquire_many({"acme": LIMITS, "globex": LIMITS, "busy": LIMITS}, FAR, envelopes)

    assert grants == {"acme": Grant.FLOOR, "globex": Grant.FLOOR, "busy": Grant.REFUSED}
    assert client.calls == ["batch_get_item", "transact_write_items"]
    assert _statuses(world) == ["INPROGRESS", "INPROGRESS"]  # none for the refused tenant's message
    idempotent.lock(envelopes[:2])  # already held: nothing more is written
    assert client.calls == ["batch_get_item", "transact_write_items"]
    assert [idempotent(envelope, WorkContext()) for envelope in envelopes[:2]] == [
        {"id": envelope.id} for envelope in envelopes[:2]
    ]
    idempotent.flush()
    assert _statuses(world) == ["COMPLETED", "COMPLETED"]


def test_a_lock_whose_record_exists_is_dropped_and_the_rest_written_again(world: WorkerWorld) -> None:
    client = CountingClient(boto3.client("dynamodb", region_name=REGION))
    gate, idempotent = _gate(client)
    done, fresh = make_envelope("acme"), make_envelope("acme")
    idempotent.lock([done])
    idempotent(done, WorkContext())
    idempotent.flush()
    client.calls.clear()

    grants = gate.acquire_many({"acme": LIMITS}, FAR, [done, fresh])

    assert grants == {"acme": Grant.FLOOR}
    # one tenant, no item yet: the floor lease without a read is refused (nothing to count), then
    # the read, the transaction with both locks (refused by the done one), and again without it
    assert client.calls == [
        "transact_write_items",
        "batch_get_item",
        "transact_write_items",
        "transact_write_items",
    ]
    assert sorted(_statuses(world)) == ["COMPLETED", "INPROGRESS"]
    assert world.item("tenant#acme", "concurrency")["leases"].keys() == {"me"}


def _released(world: WorkerWorld, tenant: str, leases: dict[str, Any] | None = None) -> None:
    """The tenant's item as a release leaves it: an empty map of leases (or the ones given)."""
    world.put(
        {
            "pk": {"S": f"tenant#{tenant}"},
            "sk": {"S": "concurrency"},
            "leases": {"M": leases or {}},
            "version": {"N": "4"},
        }
    )


def test_a_one_tenant_batch_takes_its_floor_lease_and_locks_in_one_write(world: WorkerWorld) -> None:
    client = CountingClient(boto3.client("dynamodb", region_name=REGION))
    gate, idempotent = _gate(client)
    _released(world, "acme")
    envelopes = [make_envelope("acme"), make_envelope("acme")]

    grants = gate.acquire_many({"acme": LIMITS}, FAR, envelopes)

    assert grants == {"acme": Grant.FLOOR}
    assert client.calls == ["transact_write_items"]  # no read
    item = world.item("tenant#acme", "concurrency")
    assert item["leases"] == {"me": {"exp": FAR, "burst": False}}
    assert item["version"] == 5  # a read-then-write of another container made meanwhile fails
    assert _statuses(world) == ["INPROGRESS", "INPROGRESS"]
    idempotent.lock(envelopes)  # already held
    assert client.calls == ["transact_write_items"]


def test_a_lock_whose_record_exists_is_dropped_from_the_write_without_read(world: WorkerWorld) -> None:
    client = CountingClient(boto3.client("dynamodb", region_name=REGION))
    gate, idempotent = _gate(client)
    _released(world, "acme")
    done, fresh = make_envelope("acme"), make_envelope("acme")
    idempotent.lock([done])
    idempotent(done, WorkContext())
    idempotent.flush()
    client.calls.clear()

    assert gate.acquire_many({"acme": LIMITS}, FAR, [done, fresh]) == {"acme": Grant.FLOOR}

    assert client.calls == ["transact_write_items", "transact_write_items"]
    assert sorted(_statuses(world)) == ["COMPLETED", "INPROGRESS"]


def test_a_tenant_at_its_floor_is_read_and_read_first_for_a_while(world: WorkerWorld) -> None:
    client = CountingClient(boto3.client("dynamodb", region_name=REGION))
    gate, _ = _gate(client)
    _hold(world, "busy")  # another container's live lease: the floor (and the ceiling) of 1 is taken

    assert gate.acquire_many({"busy": LIMITS}, FAR, [make_envelope("busy")]) == {"busy": Grant.REFUSED}
    assert client.calls == ["transact_write_items", "batch_get_item"]  # refused, read: nothing to write

    client.calls.clear()
    assert gate.acquire_many({"busy": LIMITS}, FAR, [make_envelope("busy")]) == {"busy": Grant.REFUSED}
    assert client.calls == ["batch_get_item"]  # crowded: read first
    assert world.item("tenant#busy", "concurrency")["leases"].keys() == {"other"}


def test_an_expired_lease_counts_until_the_read_path_drops_it(world: WorkerWorld) -> None:
    client = CountingClient(boto3.client("dynamodb", region_name=REGION))
    gate, _ = _gate(client)
    _released(world, "acme", {"crashed": {"M": {"exp": {"N": "1"}, "burst": {"BOOL": False}}}})

    assert gate.acquire_many({"acme": LIMITS}, FAR, [make_envelope("acme")]) == {"acme": Grant.FLOOR}

    assert client.calls == ["transact_write_items", "batch_get_item", "transact_write_items"]
    assert world.item("tenant#acme", "concurrency")["leases"].keys() == {"me"}


def test_a_lease_that_loses_a_race_falls_back_to_one_tenant_at_a_time_without_locks(
    world: WorkerWorld,
) -> None:
    client = CountingClient(boto3.client("dynamodb", region_name=REGION))
    gate, idempotent = _gate(client)
    envelopes = [make_envelope("acme"), make_envelope("globex")]
    client.before_transact = lambda: _hold(world, "globex", version=7)  # another container wrote first

    grants = gate.acquire_many({"acme": LIMITS, "globex": LIMITS}, FAR, envelopes)

    assert grants == {"acme": Grant.FLOOR, "globex": Grant.REFUSED}
    assert _statuses(world) == []  # nothing rode along; the worker locks what it admits
    idempotent.lock(envelopes[:1])
    assert _statuses(world) == ["INPROGRESS"]


# -- floors under contention: several containers, one state table, a small burst pool --------------------
NOISY = ConcurrencyLimits(floor=1, ceiling=6)
QUIET = ConcurrencyLimits(floor=2, ceiling=6)


def _pool(world: WorkerWorld) -> set[str]:
    return set(world.item(POOL_PK, POOL_SK).get("leases", {}))


def _holders(world: WorkerWorld, tenant: str) -> set[str]:
    return set(world.item(f"tenant#{tenant}", "concurrency").get("leases", {}))


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

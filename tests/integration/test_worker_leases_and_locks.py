"""The batch's concurrency leases and idempotency locks go out in one transaction, against moto."""

from __future__ import annotations

from typing import Any

import boto3

from breakwater.aws.concurrency import ConcurrencyLeases
from breakwater.aws.idempotency import IdempotentProcessor
from breakwater.aws.worker_ports import LeasesAndLocks
from breakwater.concurrency import ConcurrencyLimits, Grant
from breakwater.envelope import Envelope
from breakwater.processor import WorkContext
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

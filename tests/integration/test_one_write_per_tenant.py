"""One DynamoDB write per tenant per batch on the live path (the real worker against moto): once a
container knows how long its messages take, a tenant's consumer tokens, floor lease and the counters
its messages will count are one write of its counters item, and its lease lapses instead of being
given back; none is lost."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import pytest

from breakwater import processor
from breakwater.processor import WorkContext
from tests.integration import worker_fixtures
from tests.integration.worker_fixtures import STATE_TABLE, WorkerWorld, lease_holders, load, make_envelope

world = worker_fixtures.world  # the fixture

TENANTS = ("acme", "globex", "initech")


def _count_writes(handler: Any) -> Counter[str]:
    """The state table's writes by item pk, as the worker's DynamoDB client makes them."""
    writes: Counter[str] = Counter()

    def count(params: dict[str, Any], model: Any, **_: Any) -> None:
        if params.get("TableName") == STATE_TABLE:
            writes[params["Key"]["pk"]["S"]] += 1
        for entry in params.get("TransactItems", []):
            for write in entry.values():
                writes[write.get("Key", write.get("Item", {})).get("pk", {}).get("S", "?")] += 1

    client = handler.worker.ports.rate._client
    for operation in ("UpdateItem", "PutItem", "TransactWriteItems"):
        client.meta.events.register(f"provide-client-params.dynamodb.{operation}", count)
    return writes


def test_a_batch_writes_each_tenant_s_item_once_and_loses_no_counter(
    world: WorkerWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The worker's clocks move only as its messages take 50 ms each, whatever else the machine does,
    # so the container's estimate holds (a message over it would renew its lease: more writes).
    clock = {"ms": worker_fixtures.now_ms(), "s": time.monotonic()}

    def steady(envelope: Any, work: WorkContext) -> dict[str, Any]:
        clock["ms"] += 50
        clock["s"] += 0.05
        return {}

    monkeypatch.setattr(processor, "process", steady)
    handler = load(monkeypatch, "worker.handler", world.environment())
    handler.worker.ports.clock_ms = lambda: clock["ms"]
    handler.worker.ports.monotonic = lambda: clock["s"]
    writes = _count_writes(handler)
    for tenant in TENANTS:
        world.send("live-0", make_envelope(tenant))
    # the container's first batch: the tenants' items made, their leases given back
    assert world.deliver(handler, "live-0")[0] == {"batchItemFailures": []}

    for _ in range(3):
        writes.clear()
        for tenant in TENANTS:
            for _ in range(2):
                world.send("live-0", make_envelope(tenant))
        response, received = world.deliver(handler, "live-0")

        assert response == {"batchItemFailures": []} and len(received) == 6
        assert {tenant: writes[f"tenant#{tenant}"] for tenant in TENANTS} == dict.fromkeys(TENANTS, 1)
        for tenant in TENANTS:  # the lease is left to lapse, soon
            leases = world.item(f"tenant#{tenant}", "counters")["leases"]
            assert lease_holders(leases) == {handler.worker.ports.leases.holder}
            assert all(lease["exp"] < clock["ms"] + 1_000 for lease in leases.values())

    # the first batch's counters went with its releases, each next batch's with its floor leases
    for tenant in TENANTS:
        assert world.item(f"tenant#{tenant}", "counters")["processed"] == 7
    handler.worker.flush_kept_counters(force=True)  # nothing was kept
    for tenant in TENANTS:
        assert world.item(f"tenant#{tenant}", "counters")["processed"] == 7

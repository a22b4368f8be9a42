"""Processing idempotency per envelope id, against moto: the batch's locks and records are Powertools' own."""

from __future__ import annotations

import time
from typing import Any

import pytest
from aws_lambda_powertools.utilities.idempotency import (
    DynamoDBPersistenceLayer,
    IdempotencyConfig,
    idempotent_function,
)
from botocore.exceptions import ClientError

from breakwater import processor
from breakwater.aws.idempotency import KEY_PREFIX
from breakwater.processor import WorkContext
from tests.integration import worker_fixtures
from tests.integration.worker_fixtures import IDEMPOTENCY_TABLE, WorkerWorld, load, make_envelope

world = worker_fixtures.world  # the fixture


def _counting(calls: list[str], fail: set[str] | None = None) -> Any:
    def process(envelope: Any, work: WorkContext) -> dict[str, Any]:
        calls.append(envelope.id)
        if fail and envelope.id in fail:
            raise RuntimeError("boom")
        return {"done": envelope.id, "n": len(calls)}

    return process


def _records(world: WorkerWorld) -> list[dict[str, Any]]:
    return list(world.dynamodb.scan(TableName=IDEMPOTENCY_TABLE)["Items"])


def _powertools_layer(world: WorkerWorld) -> tuple[DynamoDBPersistenceLayer, IdempotencyConfig]:
    layer = DynamoDBPersistenceLayer(table_name=IDEMPOTENCY_TABLE, boto3_client=world.dynamodb)
    return layer, IdempotencyConfig(event_key_jmespath="id")


def test_a_processed_envelope_leaves_a_completed_powertools_record_that_powertools_honours(
    world: WorkerWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []
    monkeypatch.setattr(processor, "process", _counting(calls))
    envelope = make_envelope("acme")
    world.send("live-0", envelope)
    handler = load(monkeypatch, "worker.handler", world.environment())

    response, _ = world.deliver(handler, "live-0")

    assert response == {"batchItemFailures": []} and calls == [envelope.id]
    (record,) = _records(world)
    assert record["status"] == {"S": "COMPLETED"}
    assert record["id"]["S"].startswith(f"{KEY_PREFIX}#")
    assert int(record["expiration"]["N"]) > time.time() + 3600
    # Powertools' own decorator, on the same table and key prefix, finds the work done
    layer, config = _powertools_layer(world)

    @idempotent_function(
        data_keyword_argument="envelope", persistence_store=layer, config=config, key_prefix=KEY_PREFIX
    )
    def again(envelope: dict[str, Any]) -> dict[str, Any]:
        raise AssertionError("processed twice")

    assert again(envelope=envelope.model_dump(mode="json")) == {"done": envelope.id, "n": 1}


def test_an_envelope_done_in_an_earlier_batch_is_not_processed_again(
    world: WorkerWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []
    monkeypatch.setattr(processor, "process", _counting(calls))
    envelope, other = make_envelope("acme"), make_envelope("globex")
    handler = load(monkeypatch, "worker.handler", world.environment())
    world.send("live-0", envelope)
    world.deliver(handler, "live-0")

    world.send("live-0", envelope)  # a duplicate delivered later, next to a new message
    world.send("live-0", other)
    response, received = world.deliver(handler, "live-0")

    assert len(received) == 2 and response == {"batchItemFailures": []}
    assert calls == [envelope.id, other.id]
    assert {record["status"]["S"] for record in _records(world)} == {"COMPLETED"}


def test_a_failed_processing_releases_its_lock_so_the_retry_runs(
    world: WorkerWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []
    bad, good = make_envelope("acme"), make_envelope("acme")
    failing = {bad.id}
    monkeypatch.setattr(processor, "process", _counting(calls, failing))
    handler = load(monkeypatch, "worker.handler", world.environment())
    world.send("live-0", bad)
    world.send("live-0", good)

    response, received = world.deliver(handler, "live-0", requeue_failures=True)

    by_body = {message["MessageId"]: message["Body"] for message in received}
    assert [by_body[item["itemIdentifier"]] for item in response["batchItemFailures"]] == [bad.to_json()]
    assert len(_records(world)) == 1  # only the good one's; the failed one's lock is gone
    failing.clear()
    response, _ = world.deliver(handler, "live-0")
    assert response == {"batchItemFailures": []}
    assert sorted(calls) == sorted([bad.id, good.id, bad.id])
    assert len(_records(world)) == 2


def test_an_envelope_in_progress_elsewhere_is_failed_without_running(
    world: WorkerWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []
    monkeypatch.setattr(processor, "process", _counting(calls))
    busy, free = make_envelope("acme"), make_envelope("acme")
    layer, config = _powertools_layer(world)
    layer.configure(config, key_prefix=KEY_PREFIX)
    layer.save_inprogress(data=busy.model_dump(mode="json"), remaining_time_in_millis=3_600_000)
    assert _records(world)[0]["status"] == {"S": "INPROGRESS"}  # another worker's, for an hour
    handler = load(monkeypatch, "worker.handler", world.environment())
    world.send("live-0", busy)
    world.send("live-0", free)

    response, received = world.deliver(handler, "live-0")

    by_body = {message["MessageId"]: message["Body"] for message in received}
    assert [by_body[item["itemIdentifier"]] for item in response["batchItemFailures"]] == [busy.to_json()]
    assert calls == [free.id]


def _one_message_waiting(world: WorkerWorld, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, Any]:
    """A live queue holding one message of a tenant; the worker's handler and its DynamoDB client."""
    monkeypatch.setattr(processor, "process", _counting([]))
    world.send("live-0", make_envelope("acme"))
    handler = load(monkeypatch, "worker.handler", world.environment())
    return handler, handler.worker.ports.rate._client


def _record_writes(client: Any) -> list[tuple[str, list[str]]]:
    """Each write the client makes, in order: its operation and, for a transaction, its entries' kinds."""
    writes: list[tuple[str, list[str]]] = []

    def record(params: dict[str, Any], **_: Any) -> None:  # the API parameters of each write
        kinds = [next(iter(item)) for item in params.get("TransactItems", [])]
        writes.append(("TransactWriteItems", kinds))

    client.meta.events.register("provide-client-params.dynamodb.TransactWriteItems", record)
    for operation in ("BatchWriteItem", "UpdateItem", "PutItem"):
        client.meta.events.register(
            f"provide-client-params.dynamodb.{operation}",
            lambda operation=operation, **_: writes.append((operation, [])),
        )
    return writes


def test_a_batch_of_one_tenant_writes_no_transaction(
    world: WorkerWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An item in a transaction costs two write units, on its own one: the lease, the lock, the
    record and the release with the counters need no transaction."""
    handler, client = _one_message_waiting(world, monkeypatch)
    writes = _record_writes(client)

    response, _ = world.deliver(handler, "live-0")

    assert response == {"batchItemFailures": []}
    assert all(operation != "TransactWriteItems" for operation, _ in writes)
    operations = [operation for operation, _ in writes]
    # the consumer tokens and the concurrency lease, the lock, the lease's release with the counters
    # (one write, as soon as the tenant's last message is done), the queue's oldest age and the
    # COMPLETED record
    after_gate = operations[operations.index("PutItem") :]
    assert after_gate == ["PutItem", "UpdateItem", "UpdateItem", "BatchWriteItem"]
    assert operations.count("PutItem") == 1
    (stored,) = _records(world)
    assert stored["status"] == {"S": "COMPLETED"}
    item = world.item("tenant#acme", "counters")
    assert (item["processed"], item["leases"]) == (1, {})


def test_a_failed_counter_write_is_carried_to_the_next_batch(
    world: WorkerWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    handler, client = _one_message_waiting(world, monkeypatch)
    refused: list[int] = []

    def refuse_counters(params: dict[str, Any], **_: Any) -> None:  # throttled past the retries, say
        if "writes :one" in params["UpdateExpression"] and not refused:
            refused.append(1)
            raise ClientError({"Error": {"Code": "ThrottlingException"}}, "UpdateItem")

    client.meta.events.register("provide-client-params.dynamodb.UpdateItem", refuse_counters)

    response, _ = world.deliver(handler, "live-0")

    assert response == {"batchItemFailures": []} and refused == [1]
    (stored,) = _records(world)
    assert stored["status"] == {"S": "COMPLETED"}
    assert handler.worker.settlement.unsettled["acme"]["processed"] == 1  # added to the next batch's counters


def test_at_least_once_takes_no_lock_reads_the_records_and_records_after(
    world: WorkerWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs: list[str] = []
    monkeypatch.setattr(processor, "process", _counting(runs))
    message = make_envelope("acme")
    world.send("live-0", message)
    world.send("live-0", message)  # a copy, in the same batch
    handler = load(monkeypatch, "worker.handler", world.environment(processing_guarantee="at_least_once"))
    client = handler.worker.ports.rate._client
    writes = _record_writes(client)
    reads: list[bool] = []
    client.meta.events.register(
        "provide-client-params.dynamodb.BatchGetItem",
        lambda params, **_: reads.extend(
            spec.get("ConsistentRead", False) for spec in params["RequestItems"].values()
        ),
    )

    response, _ = world.deliver(handler, "live-0")

    assert response == {"batchItemFailures": []}
    assert runs == [message.id]  # the copy found the first's result
    assert all(operation != "PutItem" for operation, _ in writes)  # no INPROGRESS lock
    assert reads and all(reads)  # the records were read, consistently
    (stored,) = _records(world)
    assert stored["status"] == {"S": "COMPLETED"}

    world.send("live-0", message)  # a redelivery after the record was written
    world.deliver(handler, "live-0")
    assert runs == [message.id]


def test_a_copy_whose_lock_another_invocation_holds_waits_the_lock_out(
    world: WorkerWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Failing at the queue's pace would spend a receive per visibility timeout while a dead
    invocation's lock lasts; the copy stays hidden until that lock can have expired instead."""
    runs: list[str] = []
    monkeypatch.setattr(processor, "process", _counting(runs))
    message = make_envelope("acme")
    world.send("live-0", message)
    handler = load(monkeypatch, "worker.handler", world.environment())
    layer = handler.worker.ports.process.persistence
    held_for_ms = 40_000
    world.dynamodb.put_item(
        TableName=IDEMPOTENCY_TABLE,
        Item={
            layer.key_attr: {"S": layer.key_of(message)},
            layer.status_attr: {"S": "INPROGRESS"},
            layer.expiry_attr: {"N": str(int(time.time()) + 3600)},
            layer.in_progress_expiry_attr: {"N": str(int(time.time() * 1000) + held_for_ms)},
        },
    )
    hidden: list[int] = []
    monkeypatch.setattr(handler.worker.ports, "extend_visibility", lambda _url, _handle, s: hidden.append(s))

    response, received = world.deliver(handler, "live-0")

    assert response == {"batchItemFailures": [{"itemIdentifier": received[0]["MessageId"]}]}
    assert runs == []
    assert len(hidden) == 1 and held_for_ms / 1000 - 2 <= hidden[0] <= held_for_ms / 1000 + 1

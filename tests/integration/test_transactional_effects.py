"""A processor's DynamoDB effects handed to ``work.add_effect`` are written in one transaction with the
message's idempotency record (the inbox pattern): once, whatever copy of the message runs when, and
never for a message that fails. Against moto."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError

from breakwater.aws.idempotency import EffectsNotCommittedError, IdempotentProcessor
from breakwater.aws.write_ahead import DynamoWriteAheadStore
from breakwater.envelope import Envelope
from breakwater.observability import PowertoolsSettings
from breakwater.ordered import OrderedMessage, Outcome, process_exactly_once
from breakwater.processor import MAX_EFFECTS, TooManyEffectsError, WorkContext
from tests.integration import worker_fixtures
from tests.integration.worker_fixtures import (
    IDEMPOTENCY_TABLE,
    REGION,
    STATE_TABLE,
    FakeLambdaContext,
    WorkerWorld,
    make_envelope,
    now_ms,
)

world = worker_fixtures.world  # the fixture


def effect(envelope: Envelope, *, condition: str | None = None) -> dict[str, Any]:
    """One counter per message in the state table: how many times its effect was written."""
    update: dict[str, Any] = {
        "TableName": STATE_TABLE,
        "Key": {"pk": {"S": f"effect#{envelope.id}"}, "sk": {"S": "effect"}},
        "UpdateExpression": "ADD writes :one",
        "ExpressionAttributeValues": {":one": {"N": "1"}},
    }
    if condition:
        update["ConditionExpression"] = condition
    return {"Update": update}


def writes(world: WorkerWorld, envelope: Envelope) -> int:
    return int(world.item(f"effect#{envelope.id}", "effect").get("writes", 0))


def statuses(world: WorkerWorld) -> list[str]:
    return sorted(item["status"]["S"] for item in world.dynamodb.scan(TableName=IDEMPOTENCY_TABLE)["Items"])


def processor(
    body: Callable[[Envelope, WorkContext], None] | None = None,
    *,
    remaining_ms: int = 60_000,
    disabled: bool = False,
    locking: bool = True,
) -> tuple[IdempotentProcessor, list[str]]:
    runs: list[str] = []

    def process(envelope: Envelope, work: WorkContext) -> dict[str, Any]:
        runs.append(envelope.id)
        if body is not None:
            body(envelope, work)
        else:
            work.add_effect(effect(envelope))
        return {"id": envelope.id}

    idempotent = IdempotentProcessor(
        process,
        IDEMPOTENCY_TABLE,
        3600,
        client=boto3.client("dynamodb", region_name=REGION),
        powertools=PowertoolsSettings(idempotency_disabled=disabled),
        locking=locking,
    )
    idempotent.register_context(FakeLambdaContext(remaining_ms=remaining_ms))  # type: ignore[arg-type]
    return idempotent, runs


def test_the_effect_and_the_record_are_written_together_and_a_redelivery_writes_neither(
    world: WorkerWorld,
) -> None:
    first, runs = processor()
    message = make_envelope("acme")
    first.lock([message])  # the batch's lock, as the worker takes it
    first(message, WorkContext())

    assert writes(world, message) == 1
    assert statuses(world) == ["COMPLETED"]  # at once, not left for the batch's settle
    assert first.take_completed() == []

    second, _ = processor()  # another container, a redelivery of the same message
    second.lock([message])
    second(message, WorkContext())
    assert runs == [message.id]
    assert writes(world, message) == 1


def test_a_copy_that_ran_while_another_completed_writes_no_effect(world: WorkerWorld) -> None:
    """Two copies run at once (the first's lock expired under it): the first to commit wins."""
    message = make_envelope("acme")
    other, other_runs = processor()

    def slow_body(envelope: Envelope, work: WorkContext) -> None:
        other(envelope, WorkContext())  # meanwhile the other copy runs and commits
        work.add_effect(effect(envelope))

    # A lock that has expired already (no time left), as one of a worker that outlived its lock.
    first, first_runs = processor(slow_body, remaining_ms=0)
    first.lock([message])
    result = first(message, WorkContext())

    assert first_runs == [message.id] and other_runs == [message.id]
    assert result == {"id": message.id}
    assert writes(world, message) == 1
    assert statuses(world) == ["COMPLETED"]


def test_a_message_that_fails_after_adding_its_effect_writes_nothing_and_can_run_again(
    world: WorkerWorld,
) -> None:
    message = make_envelope("acme")

    def failing(envelope: Envelope, work: WorkContext) -> None:
        work.add_effect(effect(envelope))
        raise RuntimeError("the processor failed after its effect was planned")

    broken, _ = processor(failing)
    broken.lock([message])
    with pytest.raises(RuntimeError, match="planned"):
        broken(message, WorkContext())
    assert writes(world, message) == 0
    assert statuses(world) == []  # the lock was given back at once

    fixed, _ = processor()
    fixed.lock([message])
    fixed(message, WorkContext())
    assert writes(world, message) == 1


def test_an_effect_whose_condition_fails_fails_the_message_and_gives_its_lock_back(
    world: WorkerWorld,
) -> None:
    message = make_envelope("acme")

    def refused(envelope: Envelope, work: WorkContext) -> None:
        work.add_effect(effect(envelope, condition="attribute_exists(pk)"))  # no such item yet

    idempotent, _ = processor(refused)
    idempotent.lock([message])
    with pytest.raises(EffectsNotCommittedError, match="ConditionalCheckFailed"):
        idempotent(message, WorkContext())
    assert writes(world, message) == 0
    assert statuses(world) == []

    again, _ = processor()  # the retry is not kept waiting for the lock to expire
    again(message, WorkContext())
    assert writes(world, message) == 1


def test_effects_through_powertools_per_call_path_are_written_with_the_record(world: WorkerWorld) -> None:
    message = make_envelope("acme", dedup_key="order-7")
    idempotent, runs = processor()
    idempotent(message, WorkContext())  # no batch lock: Powertools takes it and writes the record
    idempotent(message, WorkContext())
    assert runs == [message.id]
    assert writes(world, message) == 1
    assert statuses(world) == ["COMPLETED"]


def test_with_idempotency_disabled_the_effects_are_still_written(world: WorkerWorld) -> None:
    message = make_envelope("acme")
    idempotent, _ = processor(disabled=True)
    idempotent(message, WorkContext())
    assert writes(world, message) == 1
    assert statuses(world) == []


def test_at_least_once_two_copies_may_both_run_but_the_effect_is_written_once(world: WorkerWorld) -> None:
    message = make_envelope("acme")
    other, other_runs = processor(locking=False)

    def racing(envelope: Envelope, work: WorkContext) -> None:
        other(envelope, WorkContext())  # no lock keeps the other copy out: it runs and commits first
        work.add_effect(effect(envelope))

    first, first_runs = processor(racing, locking=False)
    first.lock([message])  # without locks: reads the record (none yet)
    assert first(message, WorkContext()) == {"id": message.id}
    assert first_runs == [message.id] and other_runs == [message.id]  # processed twice ...
    assert writes(world, message) == 1  # ... the effect written once
    assert statuses(world) == ["COMPLETED"]

    later, later_runs = processor(locking=False)  # a redelivery after the record: not run at all
    later.lock([message])
    later(message, WorkContext())
    assert later_runs == []
    assert writes(world, message) == 1


def test_add_effect_refuses_what_one_transaction_cannot_take() -> None:
    work = WorkContext()
    with pytest.raises(ValueError, match="one Put, Update, Delete or ConditionCheck"):
        work.add_effect({"PutItem": {}})
    for _ in range(MAX_EFFECTS):
        work.add_effect({"ConditionCheck": {}})
    with pytest.raises(TooManyEffectsError):
        work.add_effect({"ConditionCheck": {}})


# -- the ordered consumer: the effects with the write-ahead record's completion ----------------------


def ordered(envelope: Envelope, owner: str) -> OrderedMessage:
    return OrderedMessage(
        envelope=envelope, group_id=f"{envelope.tenant}#g", dedup_id=envelope.id, owner=owner
    )


def test_an_ordered_message_s_effects_are_written_with_its_completion_once(world: WorkerWorld) -> None:
    store = DynamoWriteAheadStore(world.dynamodb, STATE_TABLE, lease_seconds=30, retention_seconds=3600)
    message = make_envelope("acme")

    def side_effect(envelope: Envelope) -> list[dict[str, Any]]:
        return [effect(envelope)]

    assert process_exactly_once(ordered(message, "a"), store, side_effect, now_ms()) is Outcome.PROCESSED
    assert process_exactly_once(ordered(message, "b"), store, side_effect, now_ms()) is Outcome.DUPLICATE
    assert writes(world, message) == 1
    assert world.item("acme#g", message.id)["state"] == "done"


def test_an_ordered_attempt_whose_claim_was_taken_over_writes_no_effect(world: WorkerWorld) -> None:
    store = DynamoWriteAheadStore(world.dynamodb, STATE_TABLE, lease_seconds=0, retention_seconds=3600)
    message = make_envelope("acme")

    def overtaken(envelope: Envelope) -> list[dict[str, Any]]:
        # this attempt's lease ran out meanwhile, and a redelivery took the claim and finished
        later = now_ms() + 1
        assert (
            process_exactly_once(ordered(envelope, "b"), store, lambda e: [effect(e)], later)
            is Outcome.PROCESSED
        )
        return [effect(envelope)]

    with pytest.raises(ClientError, match="TransactionCanceled"):
        process_exactly_once(ordered(message, "a"), store, overtaken, now_ms())
    assert writes(world, message) == 1
    assert world.item("acme#g", message.id)["owner"] == "b"


def test_a_commit_that_meets_another_transaction_is_retried_and_written_once(world: WorkerWorld) -> None:
    idempotent, runs = processor()
    message = make_envelope("acme")
    conflicts = [1]

    def conflict_once(**_: Any) -> None:
        if conflicts[0]:
            conflicts[0] -= 1
            reasons = [{"Code": "TransactionConflict"}, {"Code": "None"}]
            error = {"Error": {"Code": "TransactionCanceledException"}, "CancellationReasons": reasons}
            raise ClientError(error, "TransactWriteItems")  # type: ignore[arg-type]

    idempotent.persistence.client.meta.events.register(
        "before-call.dynamodb.TransactWriteItems", conflict_once
    )
    idempotent.lock([message])
    idempotent(message, WorkContext())

    assert conflicts == [0] and runs == [message.id]  # run once, its commit written on the second try
    assert writes(world, message) == 1
    assert statuses(world) == ["COMPLETED"]

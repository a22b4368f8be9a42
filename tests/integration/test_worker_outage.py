"""A dependency outage on moto: the live worker sidelines the batch, keeps no lock, tells the controller."""

from __future__ import annotations

from typing import Any

import pytest

from breakwater import processor
from breakwater.aws.health import read_dependency_down_until, record_dependency_down
from breakwater.processor import DependencyUnavailableError, WorkContext
from tests.integration import worker_fixtures
from tests.integration.worker_fixtures import IDEMPOTENCY_TABLE, STATE_TABLE, WorkerWorld, load, make_envelope

world = worker_fixtures.world  # the fixture


def _down(calls: list[str]) -> Any:
    def process(envelope: Any, work: WorkContext) -> dict[str, Any]:
        calls.append(envelope.id)
        raise DependencyUnavailableError("connection refused")

    return process


def test_an_outage_moves_the_batch_to_the_backlog_with_no_lock_left_and_reports_it(
    world: WorkerWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []
    monkeypatch.setattr(processor, "process", _down(calls))
    envelopes = [make_envelope(tenant) for tenant in ("acme", "globex", "initech")]
    for each in envelopes:
        world.send("live-0", each)
    handler = load(monkeypatch, "worker.handler", world.environment(outage_backoff_seconds=1))

    response, received = world.deliver(handler, "live-0")

    assert len(received) == 3 and response == {"batchItemFailures": []}
    assert len(calls) == 1  # the breaker opened on the first
    backlog = world.sqs.get_queue_attributes(
        QueueUrl=world.urls["backlog"],
        AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesDelayed"],
    )["Attributes"]
    assert sum(int(value) for value in backlog.values()) == 3
    assert world.dynamodb.scan(TableName=IDEMPOTENCY_TABLE)["Items"] == []  # every lock given back
    down_until = read_dependency_down_until(world.dynamodb, STATE_TABLE)
    assert down_until is not None


def test_the_dependency_report_keeps_the_latest_end(world: WorkerWorld) -> None:
    assert read_dependency_down_until(world.dynamodb, STATE_TABLE) is None
    assert record_dependency_down(world.dynamodb, STATE_TABLE, 2_000)
    assert not record_dependency_down(world.dynamodb, STATE_TABLE, 1_000)
    assert read_dependency_down_until(world.dynamodb, STATE_TABLE) == 2_000

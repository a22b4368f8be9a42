"""A slow message keeps its visibility while it is worked on, and is cancelled in time."""

from __future__ import annotations

import threading

import pytest

from tests.integration import worker_fixtures
from tests.integration.worker_fixtures import FakeLambdaContext, WorkerWorld, load, make_envelope

world = worker_fixtures.world  # the fixture
SLOW = "tests.integration.slow_processor.process"


def test_a_long_message_keeps_its_visibility_and_is_not_delivered_twice(
    world: WorkerWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = world.urls["live-0"]
    world.sqs.set_queue_attributes(QueueUrl=url, Attributes={"VisibilityTimeout": "2"})
    world.send("live-0", make_envelope("acme"))
    environment = world.environment(
        visibility_timeout_seconds=2, heartbeat_seconds=1, processor_handler=SLOW, slow_processor_seconds=3.5
    )
    handler = load(monkeypatch, "worker.handler", environment)
    seen: list[str] = []
    done = threading.Event()

    def other_consumer() -> None:  # polls the queue the whole time the work runs past the 2 s timeout
        while not done.is_set():
            seen.extend(m["MessageId"] for m in world.receive(url, visibility=30))
            done.wait(0.2)

    received = world.receive(url)  # the mapping's receive, with the queue's 2 s visibility timeout
    spy = threading.Thread(target=other_consumer)
    spy.start()
    try:
        response = handler.handler(world.event(url, received), FakeLambdaContext())
    finally:
        done.set()
        spy.join()

    assert len(received) == 1 and response == {"batchItemFailures": []}
    assert seen == []
    assert world.item("tenant#acme", "counters")["processed"] == 1


def test_work_is_cancelled_before_the_lambda_runs_out_and_the_message_comes_back(
    world: WorkerWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    envelope = make_envelope("acme")
    world.send("live-0", envelope)
    environment = world.environment(processor_handler=SLOW, slow_processor_seconds=30)
    handler = load(monkeypatch, "worker.handler", environment)

    # 3 s left and a 2 s safety margin: the work must stop after about 1 s, not run for 30 s
    response, received = world.deliver(handler, "live-0", context=FakeLambdaContext(remaining_ms=3_000))

    assert [item["itemIdentifier"] for item in response["batchItemFailures"]] == [received[0]["MessageId"]]
    again = world.receive(world.urls["live-0"])  # made visible at once: nobody else is working on it
    assert [m["Body"] for m in again] == [envelope.to_json()]
    assert world.dynamodb.scan(TableName="bw-idempotency")["Count"] == 0  # free to be processed again

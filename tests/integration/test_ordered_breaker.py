"""The FIFO worker's circuit breaker on moto: an outage holds groups in order, spends no receive before
the next probe and dead-letters nothing; the probe after the window closes it.

Time is simulated: the worker's clocks are injected, and the poller below plays Lambda's FIFO mapping
(receive, invoke, delete the successes, leave the failures in flight) with visibility ending on the
simulated clock: a message comes back when the hold the worker asked for (``ChangeMessageVisibility``,
observed on the worker's own SQS client) has passed, else at the queue's visibility timeout.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import boto3
import pytest
from moto import mock_aws

from breakwater.aws.fifo_worker_ports import build_fifo_worker
from breakwater.aws.health import read_dependency_down_until
from breakwater.envelope import Envelope, new_envelope_id
from breakwater.ordered import message_group_id
from breakwater.processor import DependencyUnavailableError
from tests.integration.conftest import create_table
from tests.integration.handlers import load_handler
from tests.integration.streaming_fixtures import (
    REGION,
    FakeLambdaContext,
    _sqs_record,
    create_fifo_queue,
    fifo_worker_environment,
    send_fifo,
)

WRITE_AHEAD_TABLE = "breakwater-write-ahead"
STATE_TABLE = "breakwater-state"
MAX_RECEIVE_COUNT = 3
QUEUE_VISIBILITY_S = 30
START_S = 1_800_000_000.0


@dataclass
class SimulatedTime:
    now_s: float = START_S

    def monotonic(self) -> float:
        return self.now_s

    def ms(self) -> int:
        return int(self.now_s * 1000)


@dataclass
class Dependency:
    """The processor's downstream: down until ``up_at_s`` (simulated), recording what it processed."""

    time: SimulatedTime
    up_at_s: float
    calls: int = 0
    done: list[str] = field(default_factory=list)

    def __call__(self, envelope: Envelope) -> None:
        self.calls += 1
        if self.time.now_s < self.up_at_s:
            raise DependencyUnavailableError("downstream refused the connection")
        self.done.append(f"{envelope.ordering_key}{envelope.payload['seq']}")


@dataclass
class Poller:
    """Lambda's FIFO mapping on the simulated clock (see the module's docstring)."""

    queue_url: str
    module: ModuleType
    time: SimulatedTime
    holds: dict[str, int] = field(default_factory=dict)  # receipt handle -> seconds the worker asked
    # message id -> (receipt handle, visible again at)
    in_flight: dict[str, tuple[str, float]] = field(default_factory=dict)
    receives: dict[str, int] = field(default_factory=dict)  # label -> receive count seen

    def observe(self, params: dict[str, Any], **_: Any) -> None:
        for entry in params["Entries"]:
            self.holds[entry["ReceiptHandle"]] = entry["VisibilityTimeout"]

    def poll(self) -> int:
        sqs = boto3.client("sqs", region_name=REGION)
        self._expire(sqs)
        messages = sqs.receive_message(
            QueueUrl=self.queue_url, MaxNumberOfMessages=10, MessageSystemAttributeNames=["All"]
        ).get("Messages", [])
        if not messages:
            return 0
        for message in messages:
            self.in_flight.pop(message["MessageId"], None)
            self.receives[_label(message)] = int(message["Attributes"]["ApproximateReceiveCount"])
        event = {"Records": [_sqs_record(m, self.queue_url) for m in messages]}
        response = self.module.handler(event, FakeLambdaContext())
        failed = {item["itemIdentifier"] for item in response["batchItemFailures"]}
        for message in messages:
            handle = message["ReceiptHandle"]
            if message["MessageId"] not in failed:
                sqs.delete_message(QueueUrl=self.queue_url, ReceiptHandle=handle)
                continue
            hold = self.holds.get(handle, QUEUE_VISIBILITY_S)
            if hold == 0:  # returned at once (the breaker closed): moto made it visible already
                continue
            self.in_flight[message["MessageId"]] = (handle, self.time.now_s + hold)
            # moto's visibility runs on the wall clock: keep it hidden until the simulated end.
            sqs.change_message_visibility(
                QueueUrl=self.queue_url, ReceiptHandle=handle, VisibilityTimeout=3600
            )
        return len(messages)

    def _expire(self, sqs: Any) -> None:
        for message_id, (handle, visible_at) in list(self.in_flight.items()):
            if visible_at <= self.time.now_s:
                del self.in_flight[message_id]
                sqs.change_message_visibility(
                    QueueUrl=self.queue_url, ReceiptHandle=handle, VisibilityTimeout=0
                )

    def run(self, until_s: float) -> None:
        """Poll until nothing is visible, then jump to the next end of a hold, until ``until_s``."""
        while self.time.now_s < until_s:
            while self.poll():
                pass
            ends = [visible_at for _, visible_at in self.in_flight.values()]
            if not ends:
                return
            self.time.now_s = max(self.time.now_s, min(min(ends), until_s))


def _label(message: Any) -> str:
    body = json.loads(message["Body"])
    return f"{body['ordering_key']}{body['payload']['seq']}"


def _send(queue_url: str, key: str, seq: int) -> None:
    envelope = Envelope(
        id=new_envelope_id(),
        tenant="acme",
        type="t",
        payload={"seq": seq},
        enqueued_at=int(START_S * 1000),
        ordering_key=key,
    )
    send_fifo(queue_url, envelope.to_json(), message_group_id("acme", key), envelope.id)


@pytest.fixture
def world(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, str, ModuleType]]:
    with mock_aws():
        queue_url, dlq_url = create_fifo_queue(
            "breakwater-ordered-0", max_receive_count=MAX_RECEIVE_COUNT, visibility_timeout=QUEUE_VISIBILITY_S
        )
        create_table(WRITE_AHEAD_TABLE)
        create_table(STATE_TABLE, ttl_attribute="ttl")
        module = load_handler(
            monkeypatch,
            "fifo_worker.handler",
            fifo_worker_environment(
                OUTAGE_BACKOFF_SECONDS="5",
                OUTAGE_BACKOFF_MAX_SECONDS="60",
                MAX_RECEIVE_COUNT=str(MAX_RECEIVE_COUNT),
                OUTAGE_LAST_HOLD_SECONDS="900",
            ),
        )
        yield queue_url, dlq_url, module


def _wire(module: ModuleType, dependency: Dependency, time: SimulatedTime, poller: Poller) -> None:
    """The handler's worker on the simulated clock, its holds observed on its own SQS client."""
    sqs = boto3.client("sqs", region_name=REGION)
    sqs.meta.events.register("provide-client-params.sqs.ChangeMessageVisibilityBatch", poller.observe)
    worker = build_fifo_worker(
        module.SETTINGS, dependency, sqs=sqs, monotonic=time.monotonic, clock_ms=time.ms
    )
    vars(module)["WORKER"] = worker  # the module's global, as a fresh container would build it


def test_an_outage_holds_the_groups_in_order_and_dead_letters_nothing(
    world: tuple[str, str, ModuleType],
) -> None:
    queue_url, dlq_url, module = world
    time = SimulatedTime()
    dependency = Dependency(time, up_at_s=START_S + 600)  # down for ten minutes
    poller = Poller(queue_url, module, time)
    _wire(module, dependency, time, poller)
    for key, seq in [("A", 1), ("B", 1), ("A", 2), ("A", 3), ("B", 2)]:
        _send(queue_url, key, seq)

    assert poller.poll() == 5
    # The first record met the outage: the breaker opened, nothing else reached the processor, and
    # every record was held until the probe (five seconds), none failed.
    assert dependency.calls == 1 and dependency.done == []
    assert sorted(poller.holds.values()) == [5] * 5
    down_until = read_dependency_down_until(boto3.client("dynamodb", region_name=REGION), STATE_TABLE)
    assert down_until == time.ms() + 5_000  # reported where the controller reads it, as the live worker

    poller.run(until_s=START_S + 1_000)
    # Receives were spent only at probes: never more than maxReceiveCount, so nothing went to the DLQ.
    assert max(poller.receives.values()) <= MAX_RECEIVE_COUNT
    sqs = boto3.client("sqs", region_name=REGION)
    assert "Messages" not in sqs.receive_message(QueueUrl=dlq_url, MaxNumberOfMessages=10)
    # Each group in its own order, every message once, after the dependency came back.
    assert [label for label in dependency.done if label[0] == "A"] == ["A1", "A2", "A3"]
    assert [label for label in dependency.done if label[0] == "B"] == ["B1", "B2"]
    # Only probes called the processor while it was down: one call per open window, not per message.
    assert dependency.calls - len(dependency.done) <= 3


def test_while_open_nothing_is_processed_and_a_successful_probe_closes_it(
    world: tuple[str, str, ModuleType],
) -> None:
    queue_url, _, module = world
    time = SimulatedTime()
    dependency = Dependency(time, up_at_s=START_S + 3)
    poller = Poller(queue_url, module, time)
    _wire(module, dependency, time, poller)
    _send(queue_url, "A", 1)
    poller.poll()  # the outage: open for five seconds
    assert module.WORKER.breaker.state(time.now_s).value == "open"
    _send(queue_url, "B", 1)
    time.now_s += 4  # the dependency is back, but the window has not passed: B is held, not processed
    poller.poll()
    assert dependency.calls == 1 and dependency.done == []
    time.now_s += 1  # the window has passed: B is the probe, succeeds, and closes the breaker
    poller.poll()
    assert dependency.done[0] == "A1" or dependency.done == ["B1"]
    assert module.WORKER.breaker.state(time.now_s).value == "closed"
    poller.run(until_s=time.now_s + 10)
    assert sorted(dependency.done) == ["A1", "B1"]

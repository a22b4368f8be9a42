"""botocore clients: standard retries, short timeouts, and no attempt that would end past the deadline."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import boto3
import pytest
from moto import mock_aws

from breakwater.aws import clients
from breakwater.aws.clients import Deadline, DeadlineExceededError


@dataclass
class Context:
    remaining_ms: int

    def get_remaining_time_in_millis(self) -> int:
        return self.remaining_ms


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(autouse=True)
def _credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(name, value)


def test_the_config_retries_in_standard_mode_with_short_timeouts() -> None:
    config: Any = clients.client_config()
    assert config.retries == {"mode": "standard", "max_attempts": clients.MAX_ATTEMPTS}
    assert (config.connect_timeout, config.read_timeout) == (
        clients.CONNECT_TIMEOUT_S,
        clients.READ_TIMEOUT_S,
    )
    slow: Any = clients.client_config(read_timeout=30.0)
    assert slow.read_timeout == 30.0


def test_the_deadline_is_the_remaining_time_less_the_margin_to_answer() -> None:
    clock = Clock()
    deadline = Deadline(clock)
    assert deadline.remaining_s() is None  # no invocation: no deadline
    with deadline.during(Context(remaining_ms=4_000), margin_s=0.5):
        clock.now += 1.0
        assert deadline.remaining_s() == pytest.approx(2.5)
        deadline.check(2.5, "PutItem")
        with pytest.raises(DeadlineExceededError, match="PutItem"):
            deadline.check(2.6, "PutItem")
    assert deadline.remaining_s() is None  # the invocation is over
    with deadline.during(object()):  # a context that does not tell its remaining time
        assert deadline.remaining_s() is None


def test_a_bounded_handler_has_the_deadline_while_it_runs_only() -> None:
    deadline = Deadline(Clock())

    @deadline.bounded
    def handler(event: Any, context: Any) -> float | None:
        return deadline.remaining_s()

    assert handler({}, Context(remaining_ms=3_000)) == pytest.approx(2.5)
    assert deadline.remaining_s() is None


def _queue(client: Any) -> str:
    return str(client.create_queue(QueueName="q")["QueueUrl"])


def test_a_call_with_time_for_an_attempt_is_made() -> None:
    deadline = Deadline()
    with mock_aws():
        sqs = clients.client("sqs", deadline=deadline)
        url = _queue(sqs)
        with deadline.during(Context(remaining_ms=10_000)):
            sqs.send_message(QueueUrl=url, MessageBody="x")
        assert (
            boto3.client("sqs").get_queue_attributes(
                QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages"]
            )["Attributes"]["ApproximateNumberOfMessages"]
            == "1"
        )


def test_a_call_without_time_for_an_attempt_is_not_sent() -> None:
    deadline = Deadline()
    with mock_aws():
        sqs = clients.client("sqs", deadline=deadline)
        url = _queue(sqs)
        # less than a connect and a read
        with (
            deadline.during(Context(remaining_ms=2_000)),
            pytest.raises(DeadlineExceededError, match="SendMessage"),
        ):
            sqs.send_message(QueueUrl=url, MessageBody="x")
        assert (
            boto3.client("sqs").get_queue_attributes(
                QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages"]
            )["Attributes"]["ApproximateNumberOfMessages"]
            == "0"
        )

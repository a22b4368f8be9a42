"""The replay's send routes as ingest does: the tenant's candidates, the shortest by a cached depth.

Plain Python on the driver with moto's SQS: no SparkSession, and the clock is a fake one.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from moto import mock_aws

from breakwater.routing import shard_for
from glue_jobs.replay_save import DEPTH_REFRESH_SECONDS, Pacer, PartitionSender, SendOptions
from tests.spark.helpers import T0, envelope


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def sqs() -> Iterator[Any]:
    with mock_aws():
        yield boto3.client("sqs", region_name="us-east-1")


def _row(tenant: str, n: int) -> dict[str, Any]:
    row = json.loads(envelope(tenant, T0 + n).to_json())
    row["payload"] = json.dumps(row["payload"])  # as Spark reads it: JSON text
    return row


def _queued(sqs: Any, url: str) -> int:
    attributes = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages"])
    return int(attributes["Attributes"]["ApproximateNumberOfMessages"])


def test_sends_to_the_shorter_candidate_by_a_depth_cached_for_the_refresh_interval(sqs: Any) -> None:
    urls = tuple(sqs.create_queue(QueueName=f"live-{i}")["QueueUrl"] for i in range(3))
    first, second = shard_for("acme", len(urls), 2)
    for n in range(5):
        sqs.send_message(QueueUrl=urls[first], MessageBody=f"earlier-{n}")
    clock = FakeClock()
    options = SendOptions(queue_urls=urls, shard_size=2, rate_per_task=1000, run_id="r", failures_path="")
    sender = PartitionSender(options, sqs, Pacer(1000, clock=clock, sleep=clock.sleep), clock=clock)

    sender.send_all(_row("acme", n) for n in range(3))
    assert (_queued(sqs, urls[first]), _queued(sqs, urls[second])) == (5, 3)

    for n in range(10):
        sqs.send_message(QueueUrl=urls[second], MessageBody=f"other-{n}")
    sender.send_all(_row("acme", n) for n in range(3, 4))  # the cached depths still say "second"
    assert (_queued(sqs, urls[first]), _queued(sqs, urls[second])) == (5, 14)

    clock.now += DEPTH_REFRESH_SECONDS
    sender.send_all(_row("acme", n) for n in range(4, 6))  # a fresh probe: now "first" is shorter
    assert (_queued(sqs, urls[first]), _queued(sqs, urls[second])) == (7, 14)
    assert sender.sent == 6 and not sender.failed_bodies

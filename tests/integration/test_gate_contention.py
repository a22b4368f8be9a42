"""Many worker containers at once on the embedded DynamoDB with AWS's limits enforced, one tenant's
items throttled: that tenant's messages are set aside, every other tenant's are processed in the same
batches, no batch fails and nothing is lost."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from botocore.config import Config

from breakwater.aws.worker_ports import build_worker_ports
from breakwater.concurrency import ConcurrencyLimits, lease_shard_count
from breakwater.envelope import Envelope
from breakwater.processor import WorkContext
from breakwater.settings import WorkerSettings
from breakwater.worker import Worker, WorkerOptions
from local.aws_limits import AwsLimits
from local.emulator import moto_patches
from local.emulator.moto_patches.limits import Enforcement, limits_enforced
from tests.integration import worker_fixtures
from tests.integration.worker_fixtures import (
    REGION,
    STATE_TABLE,
    FakeLambdaContext,
    WorkerWorld,
    make_envelope,
)

world = worker_fixtures.world  # the fixture
CALLERS = 50
QUIET = [f"quiet-{index}" for index in range(6)]
NOISY = "noisy"
# Wide enough that no quiet tenant meets its own limits with every container on it at once, even in
# the lease shards the containers hash to (a shard's share of a floor of 800 is a dozen leases; fifty
# containers over 63 shards): what is set aside here is set aside because of the throttle alone.
TIERS = {
    "wide": {
        "rate": 10_000,
        "burst": 20_000,
        "consumer_rate": 1_000_000,  # containers lease tokens in chunks: none runs dry
        "concurrency": 1_000,
        "concurrency_floor": 800,
    }
}
NOISY_SHARDS = lease_shard_count(ConcurrencyLimits(floor=800, ceiling=1_000))


class _Discard:
    """Metrics nobody reads here."""

    def __getattr__(self, _name: str) -> Any:
        return lambda *_args, **_kwargs: None


@pytest.fixture
def enforced(world: WorkerWorld) -> Iterator[Enforcement]:
    # The clock stands still: each item has one second of AWS's rates for the whole test, and the
    # noisy tenant's items, put deep in debt, never recover.
    with (
        moto_patches.installed(),  # the embedded AWS's arrangement: moto's item operations serialized
        limits_enforced(AwsLimits(), clock=lambda: 0.0, sleep=lambda _s: None) as enforcement,
    ):
        for sk in ("counters", "bucket#consumer", *(f"lease#{shard}" for shard in range(NOISY_SHARDS))):
            enforcement.dynamodb.charge((STATE_TABLE, f"tenant#{NOISY}", sk), 0.0, write_units=10**9)
        yield enforcement


def _batches(world: WorkerWorld, envelopes: list[Envelope]) -> list[dict[str, Any]]:
    """The messages as SQS hands them out, ten to a batch, every batch mixing tenants."""
    url = world.urls["live-0"]
    for envelope in envelopes:
        world.send("live-0", envelope)
    received: list[dict[str, Any]] = []
    while len(received) < len(envelopes):
        messages = world.receive(url, visibility=600)
        assert messages, "the queue handed out fewer messages than were sent"
        received.extend(messages)
    return [world.event(url, received[start : start + 10]) for start in range(0, len(received), 10)]


def test_a_throttled_tenant_costs_no_other_tenant_a_message_under_contention(
    world: WorkerWorld, enforced: Enforcement
) -> None:
    tenants = [*QUIET, NOISY]
    envelopes = [make_envelope(tenants[index % len(tenants)]) for index in range(CALLERS * 10)]
    batches = _batches(world, envelopes)
    assert len(batches) == CALLERS

    processed: list[str] = []
    lock = threading.Lock()

    def process(envelope: Envelope, work: WorkContext) -> dict[str, Any]:
        with lock:
            processed.append(envelope.id)
        return {"id": envelope.id}

    # each container leases at most 1 % of a bucket: fifty of them never drain it between them
    settings = WorkerSettings.from_env(
        world.environment(tiers=json.dumps(TIERS), default_tier="wide", lease_max_fraction="0.01")
    )
    # one attempt per call: what the worker does with a throttle is the point, not botocore's waits
    dynamodb = boto3.client(
        "dynamodb", region_name=REGION, config=Config(retries={"mode": "standard", "max_attempts": 1})
    )
    workers = [
        Worker(
            WorkerOptions.from_settings(settings),
            build_worker_ports(settings, process, dynamodb=dynamodb, sqs=world.sqs, container_id=f"c{index}"),
            metrics=_Discard(),
        )
        for index in range(CALLERS)
    ]
    start = threading.Barrier(CALLERS)
    responses: list[Any] = [None] * CALLERS

    def call(index: int) -> None:
        start.wait()
        try:
            responses[index] = workers[index].handle(batches[index], FakeLambdaContext())  # type: ignore[arg-type]
        except Exception as exc:  # a function error: the whole batch would come back
            responses[index] = exc

    threads = [threading.Thread(target=call, args=(index,)) for index in range(CALLERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)

    assert [response for response in responses if response != {"batchItemFailures": []}] == []
    quiet = sorted(envelope.id for envelope in envelopes if envelope.tenant != NOISY)
    noisy = sorted(envelope.id for envelope in envelopes if envelope.tenant == NOISY)
    assert sorted(processed) == quiet  # every quiet message once, in the batches that carried it
    set_aside = [body for role in ("spillover", "surge", "backlog") for body in world.bodies(role)]
    assert sorted(body.id for body in set_aside) == noisy  # nothing of the noisy tenant lost
    throttled = {item: stats.throttled for item, stats in enforced.dynamodb.stats.items() if stats.throttled}
    assert throttled, "the noisy tenant's items were never asked: the test proves nothing"
    assert {pk for _table, pk, _sk in throttled} == {f"tenant#{NOISY}"}, throttled

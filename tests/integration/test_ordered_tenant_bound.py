"""The tenant's backlog bound over all its ordering keys, on moto: admitted at ingest, released by the
FIFO worker a batch at a time, so a tenant opening many keys holds no more of the FIFO queue, and gets
no more of its worker, than a tenant with one key."""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import boto3
import pytest
from moto import mock_aws

from breakwater.aws.group_backlogs import DynamoGroupBacklogs, tenant_backlogs
from breakwater.envelope import Envelope
from breakwater.ordered import BacklogWindow, GroupBacklog
from breakwater.ordered_ingest import GROUP_FULL_RETRY_AFTER_SECONDS, RecentRefusals
from tests.integration.conftest import create_table
from tests.integration.handlers import load_handler
from tests.integration.streaming_fixtures import (
    REGION,
    FakeLambdaContext,
    FifoMapping,
    api_event,
    create_fifo_queue,
    fifo_worker_environment,
)

STATE_TABLE = "breakwater-state"
WRITE_AHEAD_TABLE = "breakwater-write-ahead"
GROUP_LIMIT = 4
WINDOW_SECONDS = 4 * 86_400 + 60


def _ingest_environment(queue_url: str, **extra: str) -> dict[str, str]:
    return {
        "FIFO_QUEUE_URLS": queue_url,
        "MAX_PAYLOAD_BYTES": "1024",
        "MAX_TTL_SECONDS": "3600",
        "STATE_TABLE_NAME": STATE_TABLE,
        "MAX_GROUP_BACKLOG": str(GROUP_LIMIT),
        "GROUP_BACKLOG_WINDOW_SECONDS": str(WINDOW_SECONDS),
        **extra,
    }


@pytest.fixture
def world(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, ModuleType, ModuleType, list[Envelope]]]:
    """POST /v1/ordered with the default tenant bound (the group bound) and the FIFO worker."""
    with mock_aws():
        queue_url, _ = create_fifo_queue("breakwater-ordered-0")
        create_table(STATE_TABLE, ttl_attribute="ttl")
        create_table(WRITE_AHEAD_TABLE)
        ingest = load_handler(monkeypatch, "ordered_ingest.handler", _ingest_environment(queue_url))
        worker = load_handler(
            monkeypatch,
            "fifo_worker.handler",
            fifo_worker_environment(GROUP_BACKLOG_WINDOW_SECONDS=str(WINDOW_SECONDS)),
        )
        processed: list[Envelope] = []
        monkeypatch.setattr(worker, "SIDE_EFFECT", processed.append)
        yield queue_url, ingest, worker, processed


def _post(ingest: ModuleType, tenant: str, key: str, seq: int) -> dict[str, Any]:
    body = {"type": "t", "payload": {"seq": seq}, "ordering_key": key}
    response: dict[str, Any] = ingest.handler(
        api_event("/v1/ordered", body, tenant=tenant), FakeLambdaContext()
    )
    return response


def _wait_retry_after(ingest: ModuleType) -> None:
    """The client waits the Retry-After it was given: the container's memory of the refusal lapses."""
    ingest.SERVICE.refusals = RecentRefusals(lambda: time.time() + GROUP_FULL_RETRY_AFTER_SECONDS)


def _tenant_count(tenant: str) -> GroupBacklog | None:
    client = boto3.client("dynamodb", region_name=REGION)
    return tenant_backlogs(client, STATE_TABLE, BacklogWindow(WINDOW_SECONDS * 1000)).read(tenant)


def _group_count(group: str) -> int:
    client = boto3.client("dynamodb", region_name=REGION)
    stored = DynamoGroupBacklogs(client, STATE_TABLE, BacklogWindow(WINDOW_SECONDS * 1000)).read(group)
    return stored.backlog if stored else 0


def test_a_tenant_past_its_bound_over_all_its_keys_is_refused_with_the_tenant_named(
    world: tuple[str, ModuleType, ModuleType, list[Envelope]],
) -> None:
    _, ingest, _, _ = world
    # One message on each of many keys: no group is near its bound, the tenant is.
    statuses = [_post(ingest, "acme", f"key-{n}", 1)["statusCode"] for n in range(GROUP_LIMIT + 1)]
    assert statuses == [202] * GROUP_LIMIT + [429]
    refused = _post(ingest, "acme", "key-new", 1)
    assert refused["statusCode"] == 429 and refused["multiValueHeaders"]["Retry-After"] == ["5"]
    problem = json.loads(refused["body"])
    assert problem["code"] == "tenant_backlog_full" and problem["status"] == 429
    assert (problem["tenant"], problem["limit"], problem["backlog"]) == ("acme", GROUP_LIMIT, GROUP_LIMIT)
    assert "tenant 'acme'" in problem["detail"] and "tenant limit is 4" in problem["detail"]
    # The refused messages' group slots were given back; another tenant is admitted.
    assert _group_count("acme:key-new") == 0 and _group_count(f"acme:key-{GROUP_LIMIT}") == 0
    assert _post(ingest, "globex", "key-0", 1)["statusCode"] == 202


def test_a_client_hammering_a_full_tenant_costs_its_item_no_write_until_the_retry_after(
    world: tuple[str, ModuleType, ModuleType, list[Envelope]],
) -> None:
    _, ingest, _, _ = world
    for n in range(GROUP_LIMIT):
        assert _post(ingest, "acme", f"key-{n}", 1)["statusCode"] == 202
    writes: list[str] = []

    def count(params: dict[str, Any], **_: Any) -> None:
        writes.append(params["Key"]["pk"]["S"])

    ingest.SERVICE.backlogs._client.meta.events.register("provide-client-params.dynamodb.UpdateItem", count)
    ingest.SERVICE.tenant_bound.counters._client.meta.events.register(
        "provide-client-params.dynamodb.UpdateItem", count
    )
    assert [_post(ingest, "acme", f"key-{n}", 2)["statusCode"] for n in range(20)] == [429] * 20
    # The first refusal: the group's admission, the tenant's refusal, the group's slot given back.
    assert writes == ["group#acme:key-0", "ordered-tenant#acme", "group#acme:key-0"]
    _wait_retry_after(ingest)
    assert _post(ingest, "acme", "key-0", 3)["statusCode"] == 429
    assert writes[3:] == ["group#acme:key-0", "ordered-tenant#acme", "group#acme:key-0"]  # asked again


def test_many_keys_take_no_more_of_the_queue_or_the_worker_than_one_key(
    world: tuple[str, ModuleType, ModuleType, list[Envelope]],
) -> None:
    queue_url, ingest, worker, processed = world
    for seq in range(3 * GROUP_LIMIT):  # both tenants offer three times the bound
        _post(ingest, "one-key", "only", seq)
        _post(ingest, "many-keys", f"key-{seq}", seq)
    sqs = boto3.client("sqs", region_name=REGION)
    attributes = sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["ApproximateNumberOfMessages"])
    assert int(attributes["Attributes"]["ApproximateNumberOfMessages"]) == 2 * GROUP_LIMIT
    FifoMapping(queue_url, worker.handler).drain()
    _wait_retry_after(ingest)
    # The worker got as many of one tenant's messages as of the other's.
    assert Counter(envelope.tenant for envelope in processed) == {
        "one-key": GROUP_LIMIT,
        "many-keys": GROUP_LIMIT,
    }
    # Every release came back, a batch at a time: both tenants may queue their bound again.
    stored = _tenant_count("many-keys")
    assert stored is not None and (stored.backlog, stored.previous) == (0, 0)
    assert _post(ingest, "many-keys", "key-again", 1)["statusCode"] == 202


def test_a_batch_releases_each_tenant_in_one_write(
    world: tuple[str, ModuleType, ModuleType, list[Envelope]],
) -> None:
    queue_url, ingest, worker, _ = world
    for n in range(GROUP_LIMIT):
        assert _post(ingest, "acme", f"key-{n}", n)["statusCode"] == 202
    tenant_writes: list[str] = []

    def count(params: dict[str, Any], **_: Any) -> None:
        if params["Key"]["pk"]["S"].startswith("ordered-tenant#"):
            tenant_writes.append(params["Key"]["pk"]["S"])

    worker.WORKER.consumer.tenants._client.meta.events.register(
        "provide-client-params.dynamodb.UpdateItem", count
    )
    FifoMapping(queue_url, worker.handler, batch_size=10).drain()
    assert tenant_writes == ["ordered-tenant#acme"]  # four messages of four groups, one write
    stored = _tenant_count("acme")
    assert stored is not None and stored.backlog == 0


def test_release_many_is_exact_whatever_the_container_saw_last() -> None:
    """One write when the container's view of the item is right; a second, exact one when it is stale
    (another container released meanwhile, or the generation rolled over); never below zero."""
    with mock_aws():
        create_table(STATE_TABLE, ttl_attribute="ttl")
        client = boto3.client("dynamodb", region_name=REGION)
        counts = tenant_backlogs(client, STATE_TABLE, BacklogWindow(WINDOW_SECONDS * 1000))
        for now in range(5):
            assert counts.admit("acme", 10, 100, now).admitted
        assert counts.release_many("acme", 10, 2, 10) == 2
        assert counts.read("acme") == GroupBacklog(generation=10, backlog=3, previous=0)
        # Generation 11 begins: generation 10's three remaining move to "previous".
        assert counts.admit("acme", 11, 100, 20).admitted
        assert counts.read("acme") == GroupBacklog(generation=11, backlog=4, previous=3)
        assert (
            counts.release_many("acme", 11, 1, 21) == 1
        )  # the cached view was generation 10: refused, redone
        assert counts.release_many("acme", 10, 5, 22) == 3  # only three of generation 10 are left
        assert counts.read("acme") == GroupBacklog(generation=11, backlog=0, previous=0)
        assert counts.release_many("acme", 11, 1, 23) == 0  # a second release of the same message
        assert counts.release_many("nobody", 11, 2, 24) == 0  # never admitted: no item is created
        assert counts.read("nobody") is None

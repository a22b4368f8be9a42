"""Client retries end to end on moto: the claim store, ingest's answers to a retried key, and the
worker's processing keyed by (tenant, key)."""

from __future__ import annotations

import time
from typing import Any

import boto3
import pytest

from breakwater import processor
from breakwater.aws.front_door import build_ingest
from breakwater.aws.request_keys import DynamoClaimStore
from breakwater.processor import WorkContext
from breakwater.request_keys import Claim, ClaimState
from breakwater.settings import IngestSettings
from tests.integration import worker_fixtures
from tests.integration.apigateway import ApiGateway
from tests.integration.conftest import START, receive_all
from tests.integration.worker_fixtures import WorkerWorld, load, make_envelope

IDEMPOTENCY_TABLE = "breakwater-idempotency"
world = worker_fixtures.world  # the worker's fixture


def create_idempotency_table() -> str:
    client = boto3.client("dynamodb")
    client.create_table(
        TableName=IDEMPOTENCY_TABLE,
        AttributeDefinitions=[{"AttributeName": "id", "AttributeType": "S"}],
        KeySchema=[{"AttributeName": "id", "KeyType": "HASH"}],
        BillingMode="PAY_PER_REQUEST",
    )
    return IDEMPOTENCY_TABLE


def pending(message_id: str, until_ms: int, print_: str = "f1") -> Claim:
    return Claim(
        message_id=message_id, fingerprint=print_, state=ClaimState.PENDING, pending_until_ms=until_ms
    )


def test_the_store_holds_one_claim_per_tenant_and_key_until_it_expires(aws: None) -> None:
    store = DynamoClaimStore(boto3.client("dynamodb"), create_idempotency_table())
    now = int(time.time())
    later = now + 3600

    assert store.claim("acme", "k", pending("id-1", 1_000), later, now) is None
    held = store.claim("acme", "k", pending("id-2", 2_000), later, now)
    assert held == pending("id-1", 1_000)
    assert store.claim("globex", "k", pending("id-3", 1_000), later, now) is None  # another tenant's key

    assert not store.take_over("acme", "k", pending("id-1", 999), 5_000)  # not the claim it saw
    assert store.take_over("acme", "k", held, 5_000)
    store.accepted("acme", "k", "id-1", 4)
    again = store.claim("acme", "k", pending("id-4", 1_000), later, now)
    assert again is not None and (again.state, again.queue, again.pending_until_ms) == (
        ClaimState.ACCEPTED,
        4,
        5_000,
    )

    store.release("acme", "k", "id-1")  # accepted: a release does not undo it
    assert store.claim("acme", "k", pending("id-5", 1_000), later, now) is not None
    assert store.claim("initech", "k", pending("id-6", 1_000), now - 1, now) is None
    assert (
        store.claim("initech", "k", pending("id-7", 1_000), later, now) is None
    )  # the first one's window passed


@pytest.fixture
def keyed_api(
    api: ApiGateway, ingest_env: dict[str, str], clock: Any, monkeypatch: pytest.MonkeyPatch
) -> ApiGateway:
    monkeypatch.setenv("IDEMPOTENCY_TABLE_NAME", create_idempotency_table())
    api.ingest.SERVICE = build_ingest(IngestSettings.from_env(), clock)
    return api


@pytest.fixture
def key(tenant_table_adapter: Any) -> str:
    return str(tenant_table_adapter.create("acme", "standard", now=START))


def stored(live_queue_urls: list[str]) -> list[Any]:
    return [message for url in live_queue_urls for message in receive_all(url)]


def test_a_retried_key_is_answered_with_the_original_id_and_stored_once(
    keyed_api: ApiGateway, key: str, live_queue_urls: list[str]
) -> None:
    body = {"type": "order", "payload": {"n": 1}}
    first = keyed_api.request(key, body, headers={"Idempotency-Key": "order-1"})
    retry = keyed_api.request(key, body, headers={"idempotency-key": "order-1"})  # header names ignore case

    assert first.status == retry.status == 202
    assert retry.body == first.body
    assert retry.headers.get("Idempotent-Replayed") == "true" and "Idempotent-Replayed" not in first.headers
    (message,) = stored(live_queue_urls)
    assert '"dedup_key":"order-1"' in message["Body"]


def test_the_body_s_dedup_key_is_the_same_key(
    keyed_api: ApiGateway, key: str, live_queue_urls: list[str]
) -> None:
    body = {"type": "order", "payload": {"n": 1}, "dedup_key": "order-2"}
    first = keyed_api.request(key, body)
    retry = keyed_api.request(key, body, headers={"Idempotency-Key": "order-2"})
    assert first.body == retry.body and len(stored(live_queue_urls)) == 1


def test_a_reused_key_or_two_keys_that_differ_are_refused_naming_the_problem(
    keyed_api: ApiGateway, key: str, live_queue_urls: list[str]
) -> None:
    keyed_api.request(key, {"type": "order", "payload": {"n": 1}}, headers={"Idempotency-Key": "order-3"})

    reused = keyed_api.request(
        key, {"type": "order", "payload": {"n": 2}}, headers={"Idempotency-Key": "order-3"}
    )
    both = keyed_api.request(
        key, {"type": "order", "payload": {}, "dedup_key": "a"}, headers={"Idempotency-Key": "b"}
    )

    assert reused.status == 422 and reused.body["code"] == "idempotency_key_reused"
    assert "'order-3'" in reused.body["detail"]
    assert both.status == 400 and both.body["code"] == "invalid_idempotency_key"
    assert len(stored(live_queue_urls)) == 1


def test_two_copies_of_a_keyed_message_are_processed_once(
    world: WorkerWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []

    def count(envelope: Any, work: WorkContext) -> dict[str, Any]:
        calls.append(envelope.id)
        return {"ok": True}

    monkeypatch.setattr(processor, "process", count)
    first, copy = make_envelope("acme", dedup_key="order-9"), make_envelope("acme", dedup_key="order-9")
    other_tenant = make_envelope("globex", dedup_key="order-9")
    handler = load(monkeypatch, "worker.handler", world.environment())
    for envelope in (first, copy, other_tenant):
        world.send("live-0", envelope)

    response, received = world.deliver(handler, "live-0")
    world.send("live-0", copy)  # delivered again in a later batch
    later, _ = world.deliver(handler, "live-0")

    assert len(received) == 3 and response == later == {"batchItemFailures": []}
    assert sorted(calls) == sorted([first.id, other_tenant.id]) or sorted(calls) == sorted(
        [copy.id, other_tenant.id]
    )


def test_a_retry_of_an_accepted_request_is_answered_while_the_tenant_is_throttled(
    keyed_api: ApiGateway, key: str, live_queue_urls: list[str]
) -> None:
    body = {"type": "order", "payload": {"n": 1}}
    first = keyed_api.request(key, body, headers={"Idempotency-Key": "order-9"})
    for _ in range(1_000):  # spend the tenant's bucket: the clock stands still, nothing refills
        if keyed_api.request(key, {"type": "order", "payload": {}}).status == 429:
            break
    else:
        pytest.fail("the tenant was never throttled")

    retry = keyed_api.request(key, body, headers={"Idempotency-Key": "order-9"})
    fresh = keyed_api.request(key, body, headers={"Idempotency-Key": "order-10"})

    assert (first.status, retry.status, fresh.status) == (202, 202, 429)
    assert retry.body == first.body and retry.headers.get("Idempotent-Replayed") == "true"
    assert sum('"dedup_key":"order-9"' in message["Body"] for message in stored(live_queue_urls)) == 1

"""Authorizer + ingest end to end against moto: messages land where routing says, errors name the problem."""

from __future__ import annotations

import json

import boto3
import pytest

from breakwater.aws.front_door import build_ingest
from breakwater.envelope import Envelope, envelope_id_time_ms
from breakwater.routing import shard_for
from breakwater.settings import IngestSettings
from tests.integration.apigateway import ApiGateway
from tests.integration.conftest import LIVE_QUEUE_COUNT, SHARD_SIZE, START, FakeClock, receive_all


@pytest.fixture
def keys(tenant_table_adapter):
    return {
        "acme": tenant_table_adapter.create("acme", "standard", now=START),
        "globex": tenant_table_adapter.create("globex", "standard", now=START),
        "initech": tenant_table_adapter.create("initech", "premium", now=START),
    }


def all_messages(live_queue_urls):
    found = {}
    for index, url in enumerate(live_queue_urls):
        for message in receive_all(url):
            found[json.loads(message["Body"])["id"]] = (index, message)
    return found


def test_accepted_message_lands_in_a_candidate_queue_with_the_full_envelope(
    api: ApiGateway, keys, live_queue_urls
):
    response = api.request(
        keys["acme"],
        {
            "type": "order.created",
            "payload": {"n": 1},
            "dedup_key": "d-1",
            "ordering_key": "o-1",
            "ttl_seconds": 60,
        },
        headers={"X-Amzn-Trace-Id": "Root=1-5759e988-bd862e3fe1be46a994272793;Sampled=1"},
    )

    assert response.status == 202, response.body
    assert response.body["queue"] in shard_for("acme", LIVE_QUEUE_COUNT, SHARD_SIZE)
    stored = all_messages(live_queue_urls)
    index, message = stored[response.body["id"]]
    assert index == response.body["queue"]
    assert message["Attributes"]["MessageGroupId"] == "acme"
    envelope = Envelope.from_json(message["Body"])
    now_ms = int(START * 1000)
    assert envelope.model_dump(mode="json") == {
        "v": 1,
        "id": response.body["id"],
        "tenant": "acme",
        "type": "order.created",
        "payload": {"n": 1},
        "request_id": envelope.request_id,
        "trace_id": "1-5759e988-bd862e3fe1be46a994272793",
        "enqueued_at": now_ms,
        "expires_at": now_ms + 60_000,
        "dedup_key": "d-1",
        "ordering_key": "o-1",
        "attempt": 0,
        "failed_receives": None,
        "origin": "live",
        "replay_run": None,
    }
    assert envelope.request_id and envelope.request_id.startswith("req-")
    assert envelope_id_time_ms(envelope.id) == now_ms


def test_messages_of_a_tenant_spread_over_its_candidates_only(api: ApiGateway, keys, live_queue_urls, clock):
    for _ in range(40):
        assert api.request(keys["initech"], {"type": "t"}).status == 202
        clock.advance(0.05)
    queues = {index for index, _ in all_messages(live_queue_urls).values()}
    assert queues == set(shard_for("initech", LIVE_QUEUE_COUNT, SHARD_SIZE))


@pytest.mark.parametrize(
    ("raw", "code", "needle"),
    [
        ("{not json", "invalid_json", "not valid JSON"),
        ("[1, 2]", "invalid_json", "must be a JSON object, got array"),
        ("", "invalid_json", "empty"),
        ('{"payload": 1}', "invalid_field", "'type' is required"),
        ('{"type": 7}', "invalid_field", "'type' must be a string"),
        ('{"type": "t", "colour": "red"}', "unknown_field", "'colour'"),
        ('{"type": "t", "ttl_seconds": 0}', "invalid_field", "ttl_seconds"),
        ('{"type": "t", "ttl_seconds": 3601}', "invalid_field", "from 1 to 3600"),
        ('{"type": "t", "dedup_key": "' + "x" * 129 + '"}', "invalid_field", "'dedup_key'"),
        ('{"type": "t", "tenant": "globex"}', "tenant_in_body", "comes from your API key"),
    ],
)
def test_bad_requests_are_400_naming_the_problem(api: ApiGateway, keys, live_queue_urls, raw, code, needle):
    response = api.request(keys["acme"], None, raw=raw)

    assert response.status == 400
    assert response.error_code == code
    assert needle in response.error_message
    assert all_messages(live_queue_urls) == {}


def test_too_large_body_is_413(api: ApiGateway, keys):
    response = api.request(keys["acme"], {"type": "t", "payload": "x" * 2000})

    assert response.status == 413
    assert response.error_code == "payload_too_large"
    assert "limit is 1024 bytes" in response.error_message


@pytest.mark.parametrize(
    "header",
    [None, "Basic abc", "Bearer", "Bearer no-dot-here", "Bearer nobody.secret", "Bearer acme.wrong-secret"],
)
def test_missing_malformed_unknown_or_wrong_keys_are_401(api: ApiGateway, keys, header):
    headers = {"Authorization": header} if header else {}
    assert api.request(None, {"type": "t"}, headers=headers).status == 401


def test_disabled_tenant_is_403_and_enabled_again_later(api: ApiGateway, keys, tenant_table_adapter, clock):
    from breakwater.auth import TenantStatus

    tenant_table_adapter.set_status("globex", TenantStatus.DISABLED)
    clock.advance(61)  # past the authorizer's cache

    assert api.request(keys["globex"], {"type": "t"}).status == 403
    assert api.request(keys["acme"], {"type": "t"}).status == 202

    tenant_table_adapter.set_status("globex", TenantStatus.ACTIVE)
    clock.advance(61)
    assert api.request(keys["globex"], {"type": "t"}).status == 202


def test_authorizer_allows_the_whole_api_with_the_tenant_limits(
    api: ApiGateway, keys, tenant_table_adapter, clock
):
    tenant_table_adapter.set_limits("acme", {"rate": 7, "burst": 21})
    clock.advance(61)

    policy = api.authorize({"Authorization": f"Bearer {keys['acme']}"})

    statement = policy["policyDocument"]["Statement"][0]
    assert statement["Effect"] == "Allow"
    assert statement["Resource"] == ["arn:aws:execute-api:us-east-1:123456789012:abc123/prod/*/*"]
    assert policy["principalId"] == "acme"
    # The API takes the tenant's usage plan key from here (ApiKeySourceType AUTHORIZER): the edge throttle.
    assert policy["usageIdentifierKey"] == "breakwater-usage.abc123.acme"
    assert policy["context"] == {
        "tenant": "acme",
        "tier": "standard",
        "rate": 7.0,
        "burst": 21,
        "consumer_rate": 5.0,
        "concurrency": 2,
        "concurrency_floor": 1,
    }


def test_a_burst_from_one_tenant_is_throttled_while_another_is_unaffected(api: ApiGateway, keys, clock):
    noisy = [api.request(keys["acme"], {"type": "t"}) for _ in range(30)]
    quiet = [api.request(keys["globex"], {"type": "t"}) for _ in range(5)]

    accepted = [r for r in noisy if r.status == 202]
    throttled = [r for r in noisy if r.status == 429]
    assert len(accepted) == 10  # the burst of the standard tier, no more
    assert len(throttled) == 20
    assert all(r.status == 202 for r in quiet)
    assert throttled[0].error_code == "throttled"
    assert "over its rate limit" in throttled[0].error_message
    assert int(throttled[0].headers["Retry-After"]) >= 1

    clock.advance(1.0)  # refills 5 tokens at 5/s
    refilled = [api.request(keys["acme"], {"type": "t"}).status for _ in range(10)]
    assert refilled.count(202) == 5


def test_throttling_disabled_is_the_naive_baseline(api: ApiGateway, keys, ingest_handler, monkeypatch, clock):
    monkeypatch.setenv("THROTTLING_ENABLED", "false")
    monkeypatch.setattr(ingest_handler, "SERVICE", build_ingest(IngestSettings.from_env(), clock))

    assert all(api.request(keys["acme"], {"type": "t"}).status == 202 for _ in range(30))


def test_a_failed_send_is_503_retryable_and_never_202(api: ApiGateway, keys, live_queue_urls):
    for url in live_queue_urls:
        boto3.client("sqs").delete_queue(QueueUrl=url)

    response = api.request(keys["acme"], {"type": "t"})

    assert response.status == 503
    assert response.error_code == "enqueue_failed"
    assert response.headers["Retry-After"] == "1"


def test_a_failed_send_falls_back_to_the_other_candidate(api: ApiGateway, keys, live_queue_urls):
    first, second = shard_for("acme", LIVE_QUEUE_COUNT, SHARD_SIZE)
    boto3.client("sqs").delete_queue(QueueUrl=live_queue_urls[first])

    response = api.request(keys["acme"], {"type": "t"})

    assert response.status == 202
    assert response.body["queue"] == second


def test_unknown_route_is_a_json_404(api: ApiGateway, keys):
    response = api.request(keys["acme"], {"type": "t"}, method="GET", path="/v1/nothing")

    assert response.status == 404
    assert response.error_code == "not_found"


def test_key_rotation_overlap(api: ApiGateway, keys, tenant_table_adapter, clock: FakeClock):
    old = keys["acme"]
    assert api.request(old, {"type": "t"}).status == 202

    new = tenant_table_adapter.rotate("acme", overlap_seconds=3600, now=clock.now)
    clock.advance(6)  # a warm authorizer re-reads a record whose key does not match, after a few seconds

    assert api.request(new, {"type": "t"}).status == 202
    assert api.request(old, {"type": "t"}).status == 202  # still inside the overlap window

    clock.advance(3600)
    assert api.request(new, {"type": "t"}).status == 202
    assert api.request(old, {"type": "t"}).status == 401


def test_header_names_are_case_insensitive(api: ApiGateway, keys):
    response = api.request(
        None,
        {"type": "t"},
        headers={"authorization": f"Bearer {keys['acme']}", "x-amzn-trace-id": "Root=1-abc-def"},
    )

    assert response.status == 202


def test_a_throttled_tenant_costs_no_more_state_writes(api: ApiGateway, keys, ingest_handler):
    calls: list[str] = []
    client = ingest_handler.SERVICE.gate._client
    client.meta.events.register("before-call.dynamodb.UpdateItem", lambda **_: calls.append("UpdateItem"))

    statuses = [api.request(keys["acme"], {"type": "t"}).status for _ in range(40)]

    assert statuses.count(202) == 10
    assert len(calls) == 2  # two leases of five; the 30 throttled requests are refused locally


def test_accepted_and_throttled_counts_are_flushed_in_aggregate(api: ApiGateway, keys, ingest_handler, clock):
    """The controller's backlog estimate comes from these counters: one write per tenant per interval."""
    table = boto3.resource("dynamodb").Table(IngestSettings.from_env().state_table_name)

    def counters(tenant: str) -> dict:
        return table.get_item(Key={"pk": f"tenant#{tenant}", "sk": "counters"}).get("Item", {})

    statuses = [api.request(keys["acme"], {"type": "t"}).status for _ in range(12)]
    assert statuses.count(202) == 10
    assert counters("acme") == {}  # nothing written per request

    clock.advance(10.0)
    api.request(keys["globex"], {"type": "t"})  # any request past the interval flushes every tenant's tally

    acme = counters("acme")
    assert acme["accepted"] == 10
    assert acme["throttled"] == 2
    globex = counters("globex")
    assert globex["accepted"] == 1 and "throttled" not in globex
    assert globex["dirty_shard"]  # marked for the controller, which reads only changed tenants


def test_a_request_with_no_time_left_for_its_calls_gets_503_with_retry_after_and_nothing_is_stored(
    api: ApiGateway, keys, live_queue_urls
):
    answer = api.request(keys["acme"], {"type": "order", "payload": {}}, remaining_ms=1_000)

    assert answer.status == 503 and answer.headers["Retry-After"] == "1"
    assert "deadline" in json.dumps(answer.body)
    assert [message for url in live_queue_urls for message in receive_all(url)] == []

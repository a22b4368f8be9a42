"""Request validation names the problem; the service admits, routes and stores with fake ports."""

from __future__ import annotations

import json

import pytest

from breakwater.envelope import Envelope
from breakwater.errors import (
    BadRequestError,
    PayloadTooLargeError,
    ThrottledError,
    UnauthenticatedError,
    UnavailableError,
)
from breakwater.ingest import IngestService, Router, TenantContext
from breakwater.requests import (
    BODY_OVERHEAD_BYTES,
    EventIn,
    MessageRequest,
    OrderedMessageRequest,
    RequestLimits,
    parse_events,
    parse_message,
)
from breakwater.routing import shard_for


def parse(body, *, raw=None, limit=1024, max_ttl=3600, model=MessageRequest):
    data = raw if raw is not None else json.dumps(body).encode()
    return parse_message(model, data, RequestLimits(max_payload_bytes=limit, max_ttl_seconds=max_ttl))


def test_a_full_request_parses():
    request = parse({"type": "t", "payload": [1], "dedup_key": "d", "ordering_key": "o", "ttl_seconds": 5})
    assert request == MessageRequest(type="t", payload=[1], dedup_key="d", ordering_key="o", ttl_seconds=5)


@pytest.mark.parametrize(
    ("body", "raw", "message"),
    [
        (None, b"", "request body is empty"),
        (None, b"{", "request body is not valid JSON"),
        (None, b"\xff\xfe", "request body is not valid JSON"),
        ("text", None, "must be a JSON object, got string"),
        ({}, None, "field 'type' is required"),
        ({"type": ""}, None, "field 'type' must be 1 to 128 characters, got 0"),
        ({"type": "x" * 129}, None, "field 'type' must be 1 to 128 characters, got 129"),
        ({"type": ["t"]}, None, "field 'type' must be a string, got array"),
        ({"type": "t", "ordering_key": 5}, None, "field 'ordering_key' must be a string, got number"),
        (
            {"type": "t", "ttl_seconds": True},
            None,
            "field 'ttl_seconds' must be an integer from 1 to 3600, got true",
        ),
        ({"type": "t", "ttl_seconds": 1.5}, None, "got 1.5"),
        ({"type": "t", "another": 2}, None, "unknown field 'another'"),
        ({"type": "t", "ttl_seconds": 7200}, None, "must be an integer from 1 to 3600, got 7200"),
        ({"type": "t", "tenant": "other"}, None, "the tenant comes from your API key"),
    ],
)
def test_bad_requests_name_the_problem(body, raw, message):
    with pytest.raises(BadRequestError) as caught:
        parse(body, raw=raw)
    assert message in caught.value.message
    assert caught.value.status == 400
    assert caught.value.body()["detail"] == caught.value.message


def test_too_large_is_413_before_parsing():
    with pytest.raises(PayloadTooLargeError) as caught:
        parse(None, raw=b"{" * (1024 + BODY_OVERHEAD_BYTES + 1))
    assert caught.value.status == 413
    assert "no valid request is larger than" in caught.value.message


def test_the_payload_limit_means_the_payload_as_compact_json_on_every_route():
    """One meaning of the limit: ``payload`` as compact JSON, whatever whitespace the body has."""
    roomy = json.dumps({"type": "t", "payload": "x" * 1000}, indent=8).encode()
    assert parse(None, raw=roomy).payload == "x" * 1000
    with pytest.raises(PayloadTooLargeError, match="field 'payload' is 1027 bytes as compact JSON"):
        parse({"type": "t", "payload": "x" * 1025})
    with pytest.raises(PayloadTooLargeError, match="field 'payload' is 1027 bytes"):
        parse({"type": "t", "ordering_key": "k", "payload": "x" * 1025}, model=OrderedMessageRequest)
    limits = RequestLimits(max_payload_bytes=1024, max_events=3)
    with pytest.raises(PayloadTooLargeError, match=r"field 'events\[1\].payload' is 1027 bytes"):
        parse_events(
            json.dumps({"events": [{"type": "a"}, {"type": "b", "payload": "x" * 1025}]}).encode(), limits
        )


@pytest.mark.parametrize(
    ("model", "body", "message"),
    [
        (OrderedMessageRequest, {"type": "t"}, "field 'ordering_key' is required"),
        (OrderedMessageRequest, {"type": "t", "ordering_key": "a b"}, "printable ASCII without spaces"),
        (
            OrderedMessageRequest,
            {"type": "t", "ordering_key": "k" * 64},
            "must be 1 to 63 characters, got 64",
        ),
        (OrderedMessageRequest, {"type": "t", "ordering_key": "k", "x": 1}, "unknown field 'x'"),
    ],
)
def test_the_ordered_route_names_the_problem_the_same_way(model, body, message):
    with pytest.raises(BadRequestError) as caught:
        parse(body, model=model)
    assert message in caught.value.message


def test_events_are_one_object_or_a_batch_and_name_the_bad_event():
    limits = RequestLimits(max_payload_bytes=1024, max_events=2)
    assert parse_events(b'{"type": "click"}', limits) == [EventIn(type="click")]
    with pytest.raises(BadRequestError, match=r"field 'events\[1\].type' is required"):
        parse_events(b'{"events": [{"type": "a"}, {"value": 1}]}', limits)
    with pytest.raises(BadRequestError, match="at most 2 events per request, got 3"):
        parse_events(b'{"events": [{"type": "a"}, {"type": "a"}, {"type": "a"}]}', limits)
    with pytest.raises(BadRequestError, match="the tenant comes from your API key"):
        parse_events(b'{"type": "a", "tenant": "evil"}', limits)


def test_tenant_context_comes_from_strings_and_fails_closed():
    context = TenantContext.from_authorizer(
        {"tenant": "acme", "tier": "standard", "rate": "5.0", "burst": "10"}
    )
    assert (context.rate, context.burst) == (5.0, 10.0)
    with pytest.raises(UnauthenticatedError):
        TenantContext.from_authorizer({"principalId": "x"})
    with pytest.raises(UnauthenticatedError):
        TenantContext.from_authorizer(None)


class FakeQueues:
    def __init__(self, count, broken=()):
        self.sent: list[tuple[int, str, str]] = []
        self.probes = 0
        self.count = count
        self.broken = set(broken)

    def __len__(self):
        return self.count

    def depth(self, index):
        self.probes += 1
        return 0

    def send(self, index, body, group_id):
        if index in self.broken:
            raise RuntimeError(f"queue {index} is gone")
        self.sent.append((index, body, group_id))
        return "m"


class FakeGate:
    def __init__(self, allow):
        self.allow = allow

    def try_acquire(self, tenant, limits):
        return (True, 0.0) if self.allow else (False, 2.5)


CONTEXT = TenantContext(tenant="acme", tier="standard", rate=5, burst=10)


def service(queues, gate=None, now=1_000.0):
    return IngestService(
        router=Router(queues, 2, 5.0, lambda: now),
        gate=gate,
        clock=lambda: now,
        max_payload_bytes=1024,
        max_ttl_seconds=60,
    )


def test_accept_stamps_routes_and_sends_once():
    queues = FakeQueues(4)
    accepted = service(queues, FakeGate(True)).accept(
        b'{"type": "t", "ttl_seconds": 2}', CONTEXT, request_id="r", trace_id=None
    )

    index, body, group = queues.sent[0]
    assert index == accepted.queue in shard_for("acme", 4, 2)
    assert group == "acme"
    envelope = Envelope.from_json(body)
    assert (envelope.enqueued_at, envelope.expires_at, envelope.request_id) == (1_000_000, 1_002_000, "r")
    assert accepted.body() == {"id": envelope.id, "queue": index}


def test_depth_probes_happen_per_interval_not_per_request():
    queues = FakeQueues(4)
    ingest = service(queues)
    for _ in range(50):
        ingest.accept(b'{"type": "t"}', CONTEXT, request_id=None, trace_id=None)
    assert queues.probes == 2  # one per candidate queue; the clock did not move
    assert {index for index, _, _ in queues.sent} == set(shard_for("acme", 4, 2))  # local counts alternate


def test_throttled_requests_are_never_sent():
    queues = FakeQueues(4)
    with pytest.raises(ThrottledError) as caught:
        service(queues, FakeGate(False)).accept(b'{"type": "t"}', CONTEXT, request_id=None, trace_id=None)
    assert caught.value.headers == {"Retry-After": "3"}
    assert queues.sent == []


def test_a_failed_send_tries_the_other_candidate_then_is_503():
    first, second = shard_for("acme", 4, 2)
    queues = FakeQueues(4, broken={first})
    assert service(queues).accept(b'{"type": "t"}', CONTEXT, request_id=None, trace_id=None).queue == second

    with pytest.raises(UnavailableError) as caught:
        service(FakeQueues(4, broken={first, second})).accept(
            b'{"type": "t"}', CONTEXT, request_id=None, trace_id=None
        )
    assert caught.value.status == 503
    assert caught.value.headers["Retry-After"] == "1"

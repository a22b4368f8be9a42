"""The API handlers on their own, behind no gateway: every malformed body is a 4xx naming the problem.

API Gateway's request validator stands in front of them in AWS, but it checks a body only when its
Content-Type selects the route's model, and its JSON reader is not Python's: whatever it lets
through, the handlers must refuse themselves, with the JSON error body every refusal has, and must
store nothing. The same hostile bodies go to POST /v1/messages, /v1/ordered and /v1/events.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import boto3
import pytest
from moto import mock_aws

from breakwater.envelope import Envelope
from breakwater.requests import MAX_JSON_DEPTH
from tests.integration.conftest import TIERS, create_live_queues, create_state_table
from tests.integration.handlers import load_handler, stop_background_flush
from tests.integration.streaming_fixtures import (
    REGION,
    FakeLambdaContext,
    api_event,
    create_fifo_queue,
    create_stream,
)

MAX_PAYLOAD_BYTES = 1024
ROUTES = ("/v1/messages", "/v1/ordered", "/v1/events")
# The smallest valid body of each route, for the cases that wrap something hostile in a valid one.
VALID = {
    "/v1/messages": {"type": "t"},
    "/v1/ordered": {"type": "t", "ordering_key": "k"},
    "/v1/events": {"type": "t"},
}


@dataclass(frozen=True)
class Sent:
    status: int
    headers: dict[str, str]
    body: Any


@dataclass
class FrontDoor:
    handlers: dict[str, ModuleType]
    live_queue_urls: list[str]
    fifo_url: str
    stream_arn: str
    _ids: Iterator[int] = field(default_factory=lambda: iter(range(1_000_000)))

    def post(self, route: str, body: bytes | None, headers: dict[str, str] | None = None) -> Sent:
        """``body`` as the function receives it: base64 when it is not UTF-8, as API Gateway passes binary."""
        event = api_event(route, "", request_id=f"req-{next(self._ids)}")
        event["headers"] = {"Content-Type": "application/json"} if headers is None else headers
        if body is None:
            event["body"] = None
        else:
            try:
                event["body"] = body.decode("utf-8")
            except UnicodeDecodeError:
                event["body"], event["isBase64Encoded"] = base64.b64encode(body).decode(), True
        response = self.handlers[route].handler(event, FakeLambdaContext())
        headers_out = {
            **(response.get("headers") or {}),
            **{k: ",".join(v) for k, v in (response.get("multiValueHeaders") or {}).items()},
        }
        return Sent(int(response["statusCode"]), headers_out, json.loads(response["body"]))

    def stored(self, route: str) -> int:
        """How many messages or events the route's destination holds."""
        if route == "/v1/events":
            kinesis = boto3.client("kinesis", region_name=REGION)
            shard = kinesis.list_shards(StreamARN=self.stream_arn)["Shards"][0]["ShardId"]
            iterator = kinesis.get_shard_iterator(
                StreamARN=self.stream_arn, ShardId=shard, ShardIteratorType="TRIM_HORIZON"
            )["ShardIterator"]
            return len(kinesis.get_records(ShardIterator=iterator, StreamARN=self.stream_arn)["Records"])
        sqs = boto3.client("sqs", region_name=REGION)
        urls = self.live_queue_urls if route == "/v1/messages" else [self.fifo_url]
        return sum(
            int(
                sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages"])[
                    "Attributes"
                ]["ApproximateNumberOfMessages"]
            )
            for url in urls
        )


@pytest.fixture(scope="module")
def front_door() -> Iterator[FrontDoor]:
    """The three handlers on one moto, loaded once for the module (each case is one request)."""
    with mock_aws(), pytest.MonkeyPatch.context() as monkeypatch:
        state_table = create_state_table()
        live = create_live_queues()
        fifo_url, _ = create_fifo_queue("breakwater-ordered-0")
        stream_arn = create_stream("breakwater-events")
        common = {"MAX_PAYLOAD_BYTES": str(MAX_PAYLOAD_BYTES), "MAX_TTL_SECONDS": "3600"}
        ingest = load_handler(
            monkeypatch,
            "ingest.handler",
            {
                **common,
                "STATE_TABLE_NAME": state_table,
                "LIVE_QUEUE_URLS": ",".join(live),
                "SHARD_SIZE": "2",
                "THROTTLING_ENABLED": "false",
                "LEASE_SECONDS": "1.0",
                "LEASE_MAX_FRACTION": "0.5",
                "DEPTH_REFRESH_SECONDS": "5",
                "TIERS": json.dumps(TIERS),
                "DEFAULT_TIER": "standard",
            },
        )
        ordered = load_handler(monkeypatch, "ordered_ingest.handler", {**common, "FIFO_QUEUE_URLS": fifo_url})
        events = load_handler(
            monkeypatch,
            "events.handler",
            {
                "STREAM_ARN": stream_arn,
                "MAX_EVENT_BYTES": str(MAX_PAYLOAD_BYTES),
                "PARTITION_KEY_MODE": "tenant",
            },
        )
        handlers = {"/v1/messages": ingest, "/v1/ordered": ordered, "/v1/events": events}
        yield FrontDoor(handlers, live, fifo_url, stream_arn)
        stop_background_flush(ingest)  # before this moto ends: its counts stay out of later tests' tables


def nested(depth: int) -> str:
    """Arrays nested ``depth`` deep, as JSON text."""
    return "[" * depth + "]" * depth


def with_payload(route: str, payload_json: str) -> bytes:
    """The route's smallest valid body with ``payload`` written as the raw JSON text given."""
    valid = json.dumps(VALID[route])
    return f'{valid[:-1]}, "payload": {payload_json}}}'.encode()


@dataclass(frozen=True)
class Hostile:
    name: str
    body: Any  # bytes, or a function of the route giving them
    status: int
    code: str
    headers: dict[str, str] | None = None  # None: Content-Type application/json

    def raw(self, route: str) -> bytes | None:
        return self.body(route) if callable(self.body) else self.body


HOSTILE = [
    Hostile("no Content-Type", lambda r: json.dumps(VALID[r]).encode(), 415, "unsupported_media_type", {}),
    Hostile(
        "text/plain",
        lambda r: json.dumps(VALID[r]).encode(),
        415,
        "unsupported_media_type",
        {"Content-Type": "text/plain"},
    ),
    Hostile(
        "form encoded (curl -d)",
        b"type=t",
        415,
        "unsupported_media_type",
        {"content-type": "application/x-www-form-urlencoded"},
    ),
    Hostile(
        "JSON in another charset",
        lambda r: json.dumps(VALID[r]).encode("utf-16"),
        415,
        "unsupported_media_type",
        {"Content-Type": "application/json; charset=utf-16"},
    ),
    Hostile("no body", None, 400, "invalid_json"),
    Hostile("empty body", b"", 400, "invalid_json"),
    Hostile("whitespace", b"  \r\n ", 400, "invalid_json"),
    Hostile("truncated", b'{"type": "t"', 400, "invalid_json"),
    Hostile("trailing garbage", lambda r: json.dumps(VALID[r]).encode() + b" x", 400, "invalid_json"),
    Hostile("two documents", lambda r: json.dumps(VALID[r]).encode() * 2, 400, "invalid_json"),
    Hostile("invalid UTF-8", b'{"type": "\xff\xfe"}', 400, "invalid_json"),
    Hostile("overlong UTF-8", b'{"type": "\xc0\xaf"}', 400, "invalid_json"),
    Hostile("UTF-16 declared as JSON", lambda r: json.dumps(VALID[r]).encode("utf-16"), 400, "invalid_json"),
    Hostile(
        "byte order mark", lambda r: b"\xef\xbb\xbf" + json.dumps(VALID[r]).encode(), 400, "invalid_json"
    ),
    Hostile("NaN", lambda r: with_payload(r, "NaN"), 400, "invalid_json"),
    Hostile("Infinity", lambda r: with_payload(r, "[1, Infinity]"), 400, "invalid_json"),
    Hostile("-Infinity", lambda r: with_payload(r, '{"x": -Infinity}'), 400, "invalid_json"),
    Hostile("a number of 5000 digits", lambda r: with_payload(r, "1" * 5000), 400, "invalid_json"),
    Hostile("single quotes", b"{'type': 't'}", 400, "invalid_json"),
    Hostile("comment", b'{"type": "t" /* x */}', 400, "invalid_json"),
    Hostile("a JSON array", lambda r: json.dumps([VALID[r]]).encode(), 400, "invalid_json"),
    Hostile("a JSON string", b'"type"', 400, "invalid_json"),
    Hostile("a JSON number", b"42", 400, "invalid_json"),
    Hostile("JSON null", b"null", 400, "invalid_json"),
    Hostile("JSON true", b"true", 400, "invalid_json"),
    Hostile(
        "duplicate field",
        lambda r: json.dumps(VALID[r]).encode()[:-1] + b', "type": "u"}',
        400,
        "duplicate_field",
    ),
    Hostile(
        "tenant given twice",
        lambda r: json.dumps(VALID[r]).encode()[:-1] + b', "tenant": "a", "tenant": "b"}',
        400,
        "duplicate_field",
    ),
    Hostile(
        "duplicate field inside the payload",
        lambda r: with_payload(r, '{"a": 1, "a": 2}'),
        400,
        "duplicate_field",
    ),
    Hostile(
        "the tenant in the body",
        lambda r: json.dumps({**VALID[r], "tenant": "globex"}).encode(),
        400,
        "tenant_in_body",
    ),
    Hostile("nested one level too deep", lambda r: with_payload(r, nested(MAX_JSON_DEPTH)), 400, "too_deep"),
    Hostile("nested 2,000 deep", lambda r: with_payload(r, nested(2_000)), 400, "too_deep"),
    Hostile("an unclosed nest 4,000 deep", b"[" * 4_000, 400, "too_deep"),
    Hostile("half a surrogate pair", lambda r: with_payload(r, '"\\ud800"'), 400, "invalid_json"),
    Hostile(
        "half a surrogate pair as a key", lambda r: with_payload(r, '{"\\udfff": 1}'), 400, "invalid_json"
    ),
    Hostile("a field of the wrong type", b'{"type": {"t": 1}}', 400, "invalid_field"),
    Hostile(
        "an unknown field", lambda r: json.dumps({**VALID[r], "admin": True}).encode(), 400, "unknown_field"
    ),
    Hostile(
        "a body larger than any valid one",
        lambda r: with_payload(r, json.dumps("x" * 4 * 1024 * 1024)),
        413,
        "payload_too_large",
    ),
    Hostile(
        "a payload over the limit",
        lambda r: with_payload(r, json.dumps("x" * MAX_PAYLOAD_BYTES)),
        413,
        "payload_too_large",
    ),
]


def error_named(sent: Sent) -> tuple[str, str]:
    """The body every refusal has: a problem details object whose ``code`` and ``detail`` are non-empty."""
    body = sent.body
    assert isinstance(body, dict) and set(body) == {"type", "title", "status", "detail", "code"}, body
    code, detail = body["code"], body["detail"]
    assert isinstance(code, str) and code and isinstance(detail, str) and detail, body
    assert body["status"] == sent.status and body["type"].endswith("/" + code), body
    return code, detail


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("case", HOSTILE, ids=[case.name for case in HOSTILE])
def test_a_hostile_body_is_a_4xx_naming_the_problem_and_stores_nothing(
    front_door: FrontDoor, case: Hostile, route: str
) -> None:
    before = front_door.stored(route)
    sent = front_door.post(route, case.raw(route), case.headers)
    assert sent.status == case.status, sent.body
    assert error_named(sent)[0] == case.code
    assert sent.headers.get("Content-Type") == "application/problem+json"
    assert front_door.stored(route) == before


@pytest.mark.parametrize("route", ROUTES)
def test_a_payload_as_deep_as_the_limit_allows_is_accepted_and_reads_back(
    front_door: FrontDoor, route: str
) -> None:
    # The body is the first level: a payload one level shallower than the limit fills it.
    sent = front_door.post(route, with_payload(route, nested(MAX_JSON_DEPTH - 1)))
    assert sent.status == 202, sent.body
    if route == "/v1/messages":
        sqs = boto3.client("sqs", region_name=REGION)
        bodies = [
            message["Body"]
            for url in front_door.live_queue_urls
            for message in sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10).get("Messages", [])
        ]
        payloads = [Envelope.from_json(body).payload for body in bodies]
        assert json.loads(nested(MAX_JSON_DEPTH - 1)) in payloads  # the worker can read it


@pytest.mark.parametrize("route", ROUTES)
def test_json_with_a_utf8_charset_parameter_is_json(front_door: FrontDoor, route: str) -> None:
    for content_type in ("application/json; charset=utf-8", 'Application/JSON;charset="UTF-8"'):
        sent = front_door.post(route, json.dumps(VALID[route]).encode(), {"content-type": content_type})
        assert sent.status == 202, (content_type, sent.body)


@pytest.mark.parametrize("character", ["\ufffe", "\uffff"])
def test_characters_sqs_cannot_carry_are_refused_on_the_queue_routes_only(
    front_door: FrontDoor, character: str
) -> None:
    # Written raw or as an escape, it is the same character once read.
    for payload in (json.dumps(character, ensure_ascii=False), json.dumps(character)):
        for route in ("/v1/messages", "/v1/ordered"):
            sent = front_door.post(route, with_payload(route, payload))
            assert sent.status == 400 and error_named(sent)[0] == "unsupported_character", sent.body
            assert f"U+{ord(character):04X}" in error_named(sent)[1]
        # A Kinesis record is bytes: the events route carries it.
        assert front_door.post("/v1/events", with_payload("/v1/events", payload)).status == 202

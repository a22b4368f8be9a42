"""The front door under fire: the emulated API (``python -m local serve``'s, with the real authorizer and
handlers) fuzzed by Schemathesis from the published OpenAPI document, then sent what Schemathesis
does not generate, byte for byte.

Whatever arrives, the answer is a complete HTTP response: never a dropped connection, never a 5xx,
every 4xx a problem details object naming the problem (the handlers' and the gateway's alike), and
(for what the document describes) the status, headers and body the document gives. The runtime has
the ordered workload on, so all three routes are fuzzed; mappings and schedules are off: nothing
here needs a message processed.
"""

from __future__ import annotations

import http.client
import itertools
import json
import os
import socket
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import jsonschema
import pytest
import schemathesis
from hypothesis import HealthCheck, settings

from app import cdk_json_context, merge_context
from breakwater.request_keys import HEADER as IDEMPOTENCY_HEADER
from breakwater_cdk.config import CONTEXT_KEY, load_config
from breakwater_cdk.openapi import build_document
from local.emulator.runtime import LocalRuntime, RuntimeOptions
from local.scenarios.tenants import create_tenants

pytestmark = pytest.mark.slow

CONTEXT = {CONTEXT_KEY: {"ordered": {"enabled": True}}}
# Generated requests per route and generation mode; bench/fuzz.py raises it for the long run.
MAX_EXAMPLES = int(os.environ.get("BREAKWATER_FUZZ_MAX_EXAMPLES", "50"))
# Where the generated requests' answers are counted (by route and status), when set: bench/fuzz.py reads it.
ANSWERS_FILE = os.environ.get("BREAKWATER_FUZZ_ANSWERS")
ANSWERS: Counter[str] = Counter()
ANSWERS_LOCK = threading.Lock()
QUEUE_ROUTES = ("/v1/messages", "/v1/ordered")  # bodies go to SQS, which cannot carry U+FFFE/U+FFFF


@dataclass(frozen=True)
class Live:
    runtime: LocalRuntime
    host: str
    port: int
    stage: str
    keys: dict[str, str]  # tenant -> a key that works
    revoked_key: str  # the key a rotation without overlap replaced
    disabled_key: str  # the key of a disabled tenant

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/{self.stage}"

    def credential(self, name: str) -> str:
        """A working key by tenant, ``revoked``, ``disabled``, ``swapped`` (acme's secret under globex's
        name), or ``name`` itself."""
        if name == "swapped":
            return "globex." + self.keys["acme"].partition(".")[2]
        return {**self.keys, "revoked": self.revoked_key, "disabled": self.disabled_key}.get(name, name)


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    from breakwater.auth import TenantStatus
    from breakwater.aws.tenants import TenantTable

    options = RuntimeOptions(
        workdir=Path(tmp_path_factory.mktemp("fuzz-runtime")),
        max_containers=2,
        warm_containers=1,
        start_mappings=False,
        start_schedules=False,
    )
    runtime = LocalRuntime(context=CONTEXT, options=options).start()
    try:
        assert runtime.api is not None
        # The fuzzer's own tenant is premium: its rate leaves room for every generated request.
        keys = create_tenants(runtime, ["fuzzer"], tier="premium")
        keys |= create_tenants(runtime, ["acme", "globex", "revoked", "disabled"])
        table = TenantTable(
            runtime.output("TenantsTableName"), client=runtime.aws.client("dynamodb", counted=False)
        )
        revoked_key = keys.pop("revoked")
        table.rotate("revoked", overlap_seconds=0)  # the old key stops working at once
        disabled_key = keys.pop("disabled")
        table.set_status("disabled", TenantStatus.DISABLED)
        url = urlsplit(runtime.api.url)
        assert url.hostname is not None and url.port is not None
        yield Live(runtime, url.hostname, url.port, url.path.strip("/"), keys, revoked_key, disabled_key)
    finally:
        runtime.stop()
        if ANSWERS_FILE:
            Path(ANSWERS_FILE).write_text(
                json.dumps(dict(sorted(ANSWERS.items())), indent=2), encoding="utf-8"
            )


PROBLEM_SCHEMA = build_document(load_config(cdk_json_context()[CONTEXT_KEY]))["components"]["schemas"][
    "Problem"
]


def names_the_problem(body: Any, status: int) -> str:
    """The refusal's code: every error answer, a handler's or the gateway's, is one problem details
    object (the document's ``Problem``), its ``status`` the answer's and its ``detail`` not empty."""
    assert isinstance(body, dict), body
    jsonschema.validate(body, PROBLEM_SCHEMA)
    assert body["status"] == status, body
    assert body["type"].endswith("/" + body["code"]), body
    assert body["detail"].strip("[] "), body
    return str(body["code"])


# -- Schemathesis ----------------------------------------------------------------------------------


def holds_sqs_refused_characters(body: Any) -> bool:
    if isinstance(body, bytes):  # a negative case's raw body
        text = body.decode("utf-8", errors="replace")
    else:
        text = json.dumps(body, ensure_ascii=False, default=str)
    return any(character in text for character in ("\ufffe", "\uffff"))


@pytest.fixture(scope="module")
def api_schema(live: Live) -> Any:
    """The document the stack's own config gives (the generator's output, as ``make openapi`` writes it)."""
    config = load_config(merge_context(cdk_json_context(), CONTEXT)[CONTEXT_KEY])
    schema = schemathesis.openapi.from_dict(
        build_document(config),
        config=schemathesis.Config.from_dict(
            {
                # A body past a size limit is refused as too large, not as malformed.
                "checks": {
                    "negative_data_rejection": {
                        "expected-statuses": ["400", "401", "403", "413", "415", "422", "429"]
                    }
                },
            }
        ),
    )

    @schema.hook
    def filter_body(context: Any, body: Any) -> bool:
        # The JSON schema cannot say "no string anywhere holds U+FFFE or U+FFFF", which the queue routes
        # refuse (400, documented in their descriptions): generated bodies holding one are skipped there.
        return not (context.operation.path in QUEUE_ROUTES and holds_sqs_refused_characters(body))

    return schema


fuzzed = schemathesis.pytest.from_fixture("api_schema")
KEY_SUFFIXES = itertools.count()


def with_keys_of_its_own(case: Any) -> None:
    """An idempotency key (the header, or the body's ``dedup_key``) unique to this valid case.

    A key sent again with another request is refused (422) for what an earlier case sent, not for
    what this one is; and a header and a ``dedup_key`` that differ are refused (400), which the
    schema cannot say. Each valid case gets a key no other case had, the header's in both places.
    """
    header = (case.headers or {}).get(IDEMPOTENCY_HEADER)
    body_key = case.body.get("dedup_key") if isinstance(case.body, dict) else None
    suffix = f"~{next(KEY_SUFFIXES)}"
    if isinstance(header, str):
        key = header.strip()[:100] + suffix
        case.headers = {**case.headers, IDEMPOTENCY_HEADER: key}
        if isinstance(body_key, str):
            case.body = {**case.body, "dedup_key": key}
    elif isinstance(body_key, str):
        case.body = {**case.body, "dedup_key": body_key[:100] + suffix}


@fuzzed.parametrize()
@settings(
    max_examples=MAX_EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.filter_too_much,
        HealthCheck.function_scoped_fixture,
    ],
)
def test_every_generated_request_is_answered_as_the_document_says(case: Any, live: Live) -> None:
    if case.meta.generation.mode.is_positive:
        with_keys_of_its_own(case)
    # The tenant's key, given as the caller's own: Schemathesis then also checks that a request without
    # it, or with one it makes up, is refused.
    auth = {"Authorization": f"Bearer {live.keys['fuzzer']}"}
    response = case.call(base_url=live.base_url, headers=auth)
    with ANSWERS_LOCK:
        ANSWERS[f"{case.operation.path} {response.status_code}"] += 1
    assert response.status_code < 500, (response.status_code, response.text)
    if 400 <= response.status_code < 500:
        content_type = {name.lower(): values for name, values in response.headers.items()}["content-type"]
        assert content_type == ["application/problem+json"], response.headers
        names_the_problem(response.json(), response.status_code)
    case.validate_response(response, headers=auth)


# -- what Schemathesis does not send ---------------------------------------------------------------


@dataclass(frozen=True)
class Answer:
    status: int
    headers: http.client.HTTPMessage
    body: bytes


def exchange(live: Live, request: bytes, *, method: str = "POST", half_close: bool = False) -> Answer:
    """Send ``request`` as given, read one response; a connection closed without one fails the test."""
    with socket.create_connection((live.host, live.port), timeout=30) as sock:
        sock.sendall(request)
        if half_close:
            sock.shutdown(socket.SHUT_WR)
        response = http.client.HTTPResponse(sock, method=method)
        try:
            response.begin()
        except (http.client.RemoteDisconnected, ConnectionResetError) as exc:
            pytest.fail(f"the API closed the connection without an answer: {exc!r}")
        return Answer(response.status, response.msg, response.read())


def raw_request(
    live: Live,
    *,
    method: str = "POST",
    path: str = "/v1/messages",
    key: str | None = "acme",
    headers: list[str] | None = None,
    body: bytes | None = b'{"type": "hostile"}',
    content_type: str | None = "application/json",
    length: str | None = "auto",
    version: str = "HTTP/1.1",
) -> bytes:
    """One request's bytes: ``key`` a tenant of ``live.keys`` or a whole Authorization value."""
    lines = [f"{method} /{live.stage}{path} {version}", f"Host: {live.host}:{live.port}"]
    if key is not None:
        lines.append(f"Authorization: Bearer {live.credential(key)}")
    if content_type is not None:
        lines.append(f"Content-Type: {content_type}")
    if length == "auto":
        lines.append(f"Content-Length: {len(body or b'')}")
    elif length is not None:
        lines.append(f"Content-Length: {length}")
    lines.extend(headers or [])
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (body or b"")


def chunked(*chunks: bytes) -> bytes:
    return b"".join(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n" for chunk in chunks) + b"0\r\n\r\n"


@dataclass(frozen=True)
class Hostile:
    name: str
    request: Callable[[Live], bytes]
    status: int
    method: str = "POST"
    half_close: bool = False
    marks: tuple[Any, ...] = ()


def hostile(name: str, status: int, **request: Any) -> Hostile:
    half_close, marks = request.pop("half_close", False), request.pop("marks", ())
    return Hostile(
        name,
        lambda live: raw_request(live, **request),
        status,
        method=request.get("method", "POST"),
        half_close=half_close,
        marks=marks,
    )


def nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


HOSTILE = [
    # Content types: a body is JSON only when it says so.
    hostile("no Content-Type", 415, content_type=None),
    hostile("text/plain", 415, content_type="text/plain"),
    hostile("form encoded, as curl -d sends", 415, content_type="application/x-www-form-urlencoded"),
    hostile("multipart", 415, content_type="multipart/form-data; boundary=x"),
    hostile("JSON in Latin-1", 415, content_type="application/json; charset=iso-8859-1"),
    hostile("JSON for another route's model", 415, content_type="application/vnd.api+json"),
    # Bodies that are not JSON, or not the JSON a route takes.
    hostile("empty body", 400, body=b""),
    hostile("truncated", 400, body=b'{"type": "t"'),
    hostile("invalid UTF-8", 400, body=b'{"type": "\xff\xfe"}'),
    hostile("UTF-16", 400, body='{"type": "t"}'.encode("utf-16")),
    hostile("NaN", 400, body=b'{"type": "t", "payload": NaN}'),
    hostile("Infinity", 400, body=b'{"type": "t", "payload": [Infinity, -Infinity]}'),
    hostile("a number of 5000 digits", 400, body=b'{"type": "t", "payload": ' + b"9" * 5000 + b"}"),
    hostile("a JSON array", 400, body=b'[{"type": "t"}]'),
    hostile("a JSON string", 400, body=b'"t"'),
    hostile("a JSON number", 400, body=b"1"),
    hostile("JSON null", 400, body=b"null"),
    hostile("duplicate field", 400, body=b'{"type": "a", "type": "b"}'),
    hostile("duplicate field inside the payload", 400, body=b'{"type": "t", "payload": {"a": 1, "a": 2}}'),
    hostile("nested 100 deep", 400, body=b'{"type": "t", "payload": ' + nested(100) + b"}"),
    hostile("nested 100,000 deep", 400, body=b'{"type": "t", "payload": ' + nested(100_000) + b"}"),
    hostile("an unclosed nest 100,000 deep", 400, body=b"[" * 100_000),
    hostile("half a surrogate pair", 400, body=b'{"type": "t", "payload": "\\ud800"}'),
    hostile("U+FFFF, which SQS cannot carry", 400, body='{"type": "t", "payload": "\uffff"}'.encode()),
    hostile("the tenant in the body", 400, body=b'{"type": "t", "tenant": "globex"}'),
    hostile(
        "a body larger than any valid one", 413, body=b'{"type": "t", "payload": "' + b"x" * 200_000 + b'"}'
    ),
    hostile("a body over API Gateway's 10 MB, announced", 413, length=str(10 * 1024 * 1024 + 1), body=None),
    # Who is asking.
    hostile("no Authorization", 401, key=None),
    hostile("Basic credentials", 401, key=None, headers=["Authorization: Basic YWNtZTpzZWNyZXQ="]),
    hostile("a key without its secret", 401, key="acme."),
    hostile("a tenant's secret under another tenant's name", 401, key="swapped"),
    hostile("the revoked key", 401, key="revoked"),
    hostile("a disabled tenant's key", 403, key="disabled"),
    # Idempotency keys.
    hostile("an Idempotency-Key not ASCII", 400, headers=["Idempotency-Key: caf\xe9"]),
    hostile("an Idempotency-Key of 200 characters", 400, headers=[f"Idempotency-Key: {'k' * 200}"]),
    hostile(
        "an Idempotency-Key and another dedup_key",
        400,
        headers=["Idempotency-Key: one"],
        body=b'{"type": "t", "dedup_key": "two"}',
    ),
    hostile("an Idempotency-Key on /v1/events", 400, path="/v1/events", headers=["Idempotency-Key: k"]),
    hostile(
        "an Idempotency-Key SQS cannot take as a FIFO deduplication id",
        400,
        path="/v1/ordered",
        headers=["Idempotency-Key: with space"],
        body=b'{"type": "t", "ordering_key": "k"}',
    ),
    # Headers.
    hostile(
        "headers over API Gateway's 10 KB", 413, headers=[f"X-Padding-{i}: {'p' * 1000}" for i in range(11)]
    ),
    hostile("one header line of 70 KB", 400, headers=[f"X-Padding: {'p' * 70_000}"]),
    hostile("200 headers", 400, headers=[f"X-Header-{i}: {i}" for i in range(200)]),
    # Framing.
    hostile("Content-Length not a number", 400, length="ten"),
    hostile("Content-Length negative", 400, length="-1"),
    hostile("two different Content-Lengths", 400, headers=["Content-Length: 3"]),
    hostile(
        "Content-Length and Transfer-Encoding",
        400,
        headers=["Transfer-Encoding: chunked"],
        body=chunked(b'{"type": "t"}'),
    ),
    hostile("a transfer coding that is not chunked", 400, length=None, headers=["Transfer-Encoding: gzip"]),
    hostile(
        "a chunk size that is not hex",
        400,
        length=None,
        headers=["Transfer-Encoding: chunked"],
        body=b"zz\r\n{}\r\n0\r\n\r\n",
    ),
    hostile(
        "a chunk longer than its size",
        400,
        length=None,
        headers=["Transfer-Encoding: chunked"],
        body=b"2\r\n{}}\r\n0\r\n\r\n",
    ),
    hostile(
        "chunked, not JSON",
        400,
        length=None,
        headers=["Transfer-Encoding: chunked"],
        body=chunked(b'{"type":', b" nope}"),
    ),
    hostile("a body shorter than its Content-Length", 400, length="100", half_close=True),
    hostile("HTTP/2.0 in the request line", 400, version="HTTP/2.0"),
    # Methods the route does not have, and paths no route has (API Gateway answers 403 for both).
    *[hostile(f"{method} /v1/messages", 403, method=method) for method in ("GET", "PUT", "DELETE", "PATCH")],
    hostile("OPTIONS /v1/messages", 403, method="OPTIONS"),
    hostile("a method no one has heard of", 403, method="BREW"),
    hostile("traversal out of the stage", 403, path="/../../etc/passwd"),
    hostile("traversal back into the route", 403, path="/v1/../v1/messages"),
    hostile("encoded traversal", 403, path="/v1/%2e%2e/v1/messages"),
    hostile("a double slash", 403, path="//v1/messages"),
    hostile("a trailing segment", 403, path="/v1/messages/../../admin"),
    hostile("the route in capitals", 403, path="/v1/MESSAGES"),
]


@pytest.mark.parametrize("case", [pytest.param(case, id=case.name, marks=case.marks) for case in HOSTILE])
def test_a_hostile_request_is_answered_with_a_4xx_naming_the_problem(live: Live, case: Hostile) -> None:
    answer = exchange(live, case.request(live), method=case.method, half_close=case.half_close)
    assert answer.status == case.status, (answer.status, answer.body[:300])
    assert answer.headers.get_content_type() == "application/problem+json"
    names_the_problem(json.loads(answer.body), answer.status)


def test_a_handler_and_the_gateway_answer_one_problem_shape(live: Live) -> None:
    # 415: the ingest handler refuses a body not declared JSON; 401: the gateway's UNAUTHORIZED
    # response, rendered from the stack's template, refuses a request without a key.
    by_handler = exchange(live, raw_request(live, content_type="text/plain"))
    by_gateway = exchange(live, raw_request(live, key=None))
    assert (by_handler.status, by_gateway.status) == (415, 401)
    problems = [json.loads(by_handler.body), json.loads(by_gateway.body)]
    for answer, problem in zip((by_handler, by_gateway), problems, strict=True):
        assert answer.headers.get_content_type() == "application/problem+json"
        assert names_the_problem(problem, answer.status) == problem["code"]
    assert [problem["code"] for problem in problems] == ["unsupported_media_type", "unauthorized"]
    assert "request_id" in problems[1]  # the gateway's own member, beside the shared ones
    assert {"type", "title", "status", "detail", "code"} <= set(problems[0]) & set(problems[1])


def test_head_is_answered_with_headers_only_and_the_connection_stays_usable(live: Live) -> None:
    head = raw_request(live, method="HEAD", body=None)
    post = raw_request(live, body=b'{"type": "after a HEAD"}')
    with socket.create_connection((live.host, live.port), timeout=30) as sock:
        sock.sendall(head + post)  # pipelined on one connection: a body after HEAD would corrupt the next
        first = http.client.HTTPResponse(sock, method="HEAD")
        first.begin()
        assert first.status == 403 and first.read() == b""
        second = http.client.HTTPResponse(sock, method="POST")
        second.begin()
        assert second.status == 202, second.read()


def test_a_chunked_body_is_read_like_any_other(live: Live) -> None:
    request = raw_request(
        live, length=None, headers=["Transfer-Encoding: chunked"], body=chunked(b'{"type": ', b'"chunked"}')
    )
    answer = exchange(live, request)
    assert answer.status == 202, answer.body


def test_the_tenants_own_key_works_where_the_hostile_ones_did_not(live: Live) -> None:
    # The refusals above are about the requests, not the runtime: the same API takes a good one.
    assert exchange(live, raw_request(live)).status == 202
    assert exchange(live, raw_request(live, path="/v1/events")).status == 202
    ordered = raw_request(live, path="/v1/ordered", body=b'{"type": "t", "ordering_key": "k"}')
    assert exchange(live, ordered).status == 202

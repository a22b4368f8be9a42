"""The REST API's routes, emulated on a local HTTP server the way API Gateway runs them.

moto creates the REST API and its resources, but not the stage, the authorizer, the request
validator or the gateway responses; they are read from the template
(``local.emulator.discovery.api``) and applied here, in API Gateway's order: stage throttle (429
THROTTLED), REQUEST authorizer (identity header missing or ``Unauthorized`` -> 401 UNAUTHORIZED;
explicit Deny -> 403 ACCESS_DENIED; the policy cached per identity for
``AuthorizerResultTtlInSeconds``), the API key of a method that requires one (from the authorizer's
``usageIdentifierKey`` or the ``x-api-key`` header, per the API's ``ApiKeySourceType``: in no usage
plan of the stage -> 403 INVALID_API_KEY; over its plan's throttle -> 429 THROTTLED, before any
integration runs), request body model (400 BAD_REQUEST_BODY), then the Lambda proxy integration with
``requestContext.authorizer`` = the authorizer's context plus ``principalId``. Error answers come
from the template's gateway responses (``local.emulator.gateway_responses``). Usage plans and keys
are read from the embedded API Gateway (moto), where the stack and onboarding
(``breakwater.aws.usage_plans``) put them; quotas are not enforced.

The body is checked against the route's model only when the Content-Type selects it: the model's
``application/json``, or no Content-Type at all (API Gateway then takes the body as JSON); a body of
another type reaches the function unchecked, as in API Gateway. Every request is answered, the way
API Gateway answers: a malformed request (its framing, its headers, a method or path no route has)
with the template's gateway response, never a dropped connection or an HTML page; a failed function
and a failure of the emulator itself with DEFAULT_5XX's, the latter naming it.
"""

from __future__ import annotations

import base64
import fnmatch
import json
import re
import threading
import time
import traceback
import uuid
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from local.emulator.api_throttles import StageThrottle, UsagePlanThrottles
from local.emulator.discovery import ApiSpec, AuthorizerSpec, RouteSpec
from local.emulator.embedded_aws import ACCOUNT, REGION
from local.emulator.functions import FunctionPool
from local.emulator.gateway_responses import (
    UNBILLED_RESPONSES,
    GatewayError,
    bad_request,
    render_gateway_response,
)

MAX_BODY_BYTES = 10 * 1024 * 1024
MAX_HEADER_BYTES = 10 * 1024  # API Gateway: the request line and the header values together
INTEGRATION_TIMEOUT_S = 29.0
# How long a body may take to arrive once its headers have: a client that stops sending mid-body is
# answered instead of holding a thread. Idle keep-alive connections are not timed.
BODY_TIMEOUT_S = 10.0
MAX_CHUNK_LINE = 1024
JSON_MEDIA_TYPE = "application/json"
_DIGITS = re.compile(r"[0-9]{1,19}")


def _no_json_constants(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def policy_allows(policy: dict[str, Any], method_arn: str) -> bool:
    """IAM evaluation of an authorizer's policy for ``execute-api:Invoke`` on ``method_arn``; Deny wins."""
    allowed = False
    statements = policy.get("policyDocument", {}).get("Statement", [])
    for statement in statements if isinstance(statements, list) else [statements]:
        resources = statement.get("Resource", [])
        resources = resources if isinstance(resources, list) else [resources]
        actions = statement.get("Action", [])
        actions = actions if isinstance(actions, list) else [actions]
        if not any(fnmatch.fnmatchcase("execute-api:Invoke", a) or a == "*" for a in actions):
            continue
        if not any(fnmatch.fnmatchcase(method_arn, resource) for resource in resources):
            continue
        if statement.get("Effect") == "Deny":
            return False
        if statement.get("Effect") == "Allow":
            allowed = True
    return allowed


class LocalApi:
    """One REST API stage on ``http://127.0.0.1:<port>/<stage>/``."""

    def __init__(
        self, spec: ApiSpec, pools: dict[str, FunctionPool], port: int = 0, apigateway: Any | None = None
    ) -> None:
        """``apigateway``: a client of the embedded API Gateway, where the usage plans and keys are."""
        self.spec = spec
        self._pools = pools
        self._throttle = StageThrottle(spec.throttle_rate, spec.throttle_burst)
        self._usage = (
            UsagePlanThrottles(apigateway, spec.rest_api_id, spec.stage) if apigateway is not None else None
        )
        self._auth_cache: dict[tuple[str, tuple[str, ...]], tuple[float, dict[str, Any]]] = {}
        self._cache_lock = threading.Lock()
        self.status_counts: dict[int, int] = {}
        self.billed_requests = 0  # what API Gateway bills: UNBILLED_RESPONSES aside
        self._status_lock = threading.Lock()
        api = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                return None

            def __getattr__(self, name: str) -> Any:
                # Any method token is routed (a method no route has is API Gateway's 403), never a 501.
                if name.startswith("do_"):
                    return self._serve
                raise AttributeError(name)

            def _serve(self) -> None:
                try:
                    body = self._read_body()
                except GatewayError as error:
                    self.close_connection = True  # what is left of the body cannot be told from a request
                    answer = api.error_answer(error)
                else:
                    answer = api.handle(self.command, self.path, dict(self.headers.items()), body)
                self._answer(*answer)

            def _read_body(self) -> bytes:
                """The body as framed by Content-Length or chunked transfer coding; a 4xx if it is not."""
                line = len(self.requestline) + sum(len(value) for value in self.headers.values())
                if line > MAX_HEADER_BYTES:
                    raise GatewayError(
                        "REQUEST_TOO_LARGE", f"HTTP header is larger than {MAX_HEADER_BYTES} bytes."
                    )
                lengths = self.headers.get_all("Content-Length") or []
                codings = self.headers.get_all("Transfer-Encoding") or []
                if lengths and codings:
                    raise bad_request("a request may not have both Content-Length and Transfer-Encoding")
                self.connection.settimeout(BODY_TIMEOUT_S)
                try:
                    if codings:
                        if [coding.strip().lower() for coding in codings] != ["chunked"]:
                            raise bad_request(f"Transfer-Encoding {', '.join(codings)!r} is not supported")
                        return self._read_chunked()
                    if not lengths:
                        return b""
                    if len(set(lengths)) > 1 or not _DIGITS.fullmatch(lengths[0].strip()):
                        raise bad_request(f"invalid Content-Length {', '.join(lengths)!r}")
                    length = int(lengths[0])
                    if length > MAX_BODY_BYTES:
                        raise GatewayError("REQUEST_TOO_LARGE")
                    return self._read_exactly(length)
                except TimeoutError:
                    raise bad_request(
                        f"the request body did not arrive within {BODY_TIMEOUT_S:g} s"
                    ) from None
                finally:
                    self.connection.settimeout(None)

            def _read_exactly(self, length: int) -> bytes:
                data = self.rfile.read(length)
                if len(data) < length:
                    raise bad_request(f"the request body ended after {len(data)} of its {length} bytes")
                return data

            def _read_chunked(self) -> bytes:
                chunks: list[bytes] = []
                total = 0
                while True:
                    size_line = self.rfile.readline(MAX_CHUNK_LINE + 1)
                    size_text = size_line.split(b";", 1)[0].strip()
                    if not size_line.endswith(b"\n") or not re.fullmatch(rb"[0-9A-Fa-f]{1,8}", size_text):
                        raise bad_request(f"invalid chunk size line {size_line[:40]!r}")
                    size = int(size_text, 16)
                    if size == 0:
                        break
                    total += size
                    if total > MAX_BODY_BYTES:
                        raise GatewayError("REQUEST_TOO_LARGE")
                    chunks.append(self._read_exactly(size))
                    if self.rfile.readline(MAX_CHUNK_LINE + 1).strip():
                        raise bad_request("a chunk is longer than its size line says")
                for _ in range(100):  # trailer fields, up to the empty line
                    trailer = self.rfile.readline(MAX_CHUNK_LINE + 1)
                    if not trailer.strip():
                        return b"".join(chunks)
                raise bad_request("too many trailer fields after the last chunk")

            def _answer(self, status: int, headers: dict[str, str], payload: bytes) -> None:
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(payload)))
                if self.close_connection:
                    self.send_header("Connection", "close")
                self.end_headers()
                if self.command != "HEAD":  # a HEAD answer has the headers of the GET, never a body
                    self.wfile.write(payload)

            def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
                """A request http.server cannot parse (request line, headers): a JSON 4xx, not HTML."""
                self.close_connection = True
                # A request line http.server could not read leaves it in HTTP/0.9, whose answers have no
                # status line: every client sent HTTP/1.x framing and expects one.
                self.request_version = self.protocol_version
                text = message or self.responses.get(code, ("Bad Request",))[0]
                # A client's malformed request is a 4xx, the HTTP version it asked for included.
                self._answer(*api.error_answer(bad_request(text, code if code < 500 else 400)))

        self._server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="local-api", daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}/{self.spec.stage}/"

    def start(self) -> LocalApi:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    # -- one request ------------------------------------------------------------------------------

    def handle(
        self, method: str, raw_path: str, headers: dict[str, str], body: bytes
    ) -> tuple[int, dict[str, str], bytes]:
        request_id = str(uuid.uuid4())
        started = time.time()
        billed = True
        try:
            status, out_headers, payload = self._handle(method, raw_path, headers, body, request_id, started)
        except GatewayError as error:
            status, out_headers, payload = render_gateway_response(
                self.spec.gateway_responses, error, request_id
            )
            billed = error.response_type not in UNBILLED_RESPONSES
        except Exception as exc:  # the emulator's own failure: answered and shown, never a dropped connection
            traceback.print_exc()
            failure = GatewayError(
                "INTERNAL_ERROR", f"local API emulator failed: {type(exc).__name__}: {exc}"
            )
            status, out_headers, payload = render_gateway_response(
                self.spec.gateway_responses, failure, request_id
            )
        if billed:
            with self._status_lock:
                self.billed_requests += 1
        return self._counted(status, out_headers, payload, request_id)

    def error_answer(self, error: GatewayError) -> tuple[int, dict[str, str], bytes]:
        """The gateway's answer to a request it could not read far enough to route."""
        request_id = str(uuid.uuid4())
        return self._counted(*self._gateway_response(error, request_id), request_id)

    def _gateway_response(self, error: GatewayError, request_id: str) -> tuple[int, dict[str, str], bytes]:
        return render_gateway_response(self.spec.gateway_responses, error, request_id)

    def _counted(
        self, status: int, out_headers: dict[str, str], payload: bytes, request_id: str
    ) -> tuple[int, dict[str, str], bytes]:
        with self._status_lock:
            self.status_counts[status] = self.status_counts.get(status, 0) + 1
        out_headers.setdefault("x-amzn-RequestId", request_id)
        return status, out_headers, payload

    def _route(self, method: str, path: str) -> RouteSpec:
        for route in self.spec.routes:
            if route.method in (method, "ANY") and route.path == path:
                return route
        raise GatewayError("MISSING_AUTHENTICATION_TOKEN")

    def _handle(
        self,
        method: str,
        raw_path: str,
        headers: dict[str, str],
        body: bytes,
        request_id: str,
        started: float,
    ) -> tuple[int, dict[str, str], bytes]:
        split = urlsplit(raw_path)
        prefix = f"/{self.spec.stage}"
        if not (split.path == prefix or split.path.startswith(prefix + "/")):
            raise GatewayError("MISSING_AUTHENTICATION_TOKEN")
        path = split.path[len(prefix) :] or "/"
        route = self._route(method, path)
        if not self._throttle.admit():
            raise GatewayError("THROTTLED")
        if len(body) > MAX_BODY_BYTES:
            raise GatewayError("REQUEST_TOO_LARGE")
        query = parse_qs(split.query, keep_blank_values=True)
        method_arn = (
            f"arn:aws:execute-api:{REGION}:{ACCOUNT}:{self.spec.rest_api_id}/{self.spec.stage}/{method}{path}"
        )
        request_context = {
            "accountId": ACCOUNT,
            "apiId": self.spec.rest_api_id,
            "domainName": headers.get("Host", "127.0.0.1"),
            "domainPrefix": "127",
            "extendedRequestId": request_id,
            "httpMethod": method,
            "identity": {"sourceIp": "127.0.0.1", "userAgent": headers.get("User-Agent")},
            "path": f"{prefix}{path}",
            "protocol": "HTTP/1.1",
            "requestId": request_id,
            "requestTime": datetime.fromtimestamp(started, UTC).strftime("%d/%b/%Y:%H:%M:%S +0000"),
            "requestTimeEpoch": int(started * 1000),
            "resourceId": route.path,
            "resourcePath": route.path,
            "stage": self.spec.stage,
        }
        common = {
            "resource": route.path,
            "path": path,
            "httpMethod": method,
            "headers": headers,
            "multiValueHeaders": {name: [value] for name, value in headers.items()},
            "queryStringParameters": {k: v[-1] for k, v in query.items()} or None,
            "multiValueQueryStringParameters": query or None,
            "pathParameters": None,
            "stageVariables": None,
        }
        usage_key: str | None = None
        if route.authorizer is not None:
            request_context["authorizer"], usage_key = self._authorize(
                route.authorizer, common, request_context, method_arn
            )
        if route.api_key_required:
            if self.spec.api_key_source != "AUTHORIZER":
                usage_key = {k.lower(): v for k, v in headers.items()}.get("x-api-key")
            admitted = self._usage.admit(usage_key) if usage_key and self._usage is not None else None
            if admitted is None:
                raise GatewayError("INVALID_API_KEY")
            if not admitted:
                raise GatewayError("THROTTLED")
        if route.request_schema is not None and _selects_json_model(headers):
            self._validate(route.request_schema, body)
        event = {
            **common,
            "requestContext": request_context,
            "body": body.decode("utf-8", errors="replace") if body else None,
            "isBase64Encoded": False,
        }
        invocation = self._pools[route.function_logical_id].invoke(event)
        if (
            not invocation.ok
            or not isinstance(invocation.result, dict)
            or "statusCode" not in invocation.result
        ):
            if invocation.error and invocation.error.get("errorType") == "Sandbox.Timedout":
                raise GatewayError("INTEGRATION_TIMEOUT", "Endpoint request timed out")
            # A function error or a malformed proxy answer: API Gateway's 502, or DEFAULT_5XX's status.
            raise GatewayError("DEFAULT_5XX", "Internal server error", status=502)
        result = invocation.result
        out_headers = {str(k): str(v) for k, v in (result.get("headers") or {}).items()}
        for name, values in (result.get("multiValueHeaders") or {}).items():
            out_headers[str(name)] = ",".join(str(v) for v in values)
        raw = result.get("body") or ""
        payload = base64.b64decode(raw) if result.get("isBase64Encoded") else str(raw).encode()
        return int(result["statusCode"]), out_headers, payload

    def _authorize(
        self, spec: AuthorizerSpec, common: dict[str, Any], request_context: dict[str, Any], method_arn: str
    ) -> tuple[dict[str, Any], str | None]:
        """The context for the integration, and the API key the authorizer named (``usageIdentifierKey``)."""
        lowered = {k.lower(): v for k, v in common["headers"].items()}
        identity = tuple(lowered.get(name.lower(), "") for name in spec.identity_headers)
        if not all(identity):
            raise GatewayError("UNAUTHORIZED")
        key = (spec.function_logical_id, identity)
        now = time.monotonic()
        with self._cache_lock:
            cached = self._auth_cache.get(key)
        if cached is not None and cached[0] > now:
            policy = cached[1]
        else:
            event = {
                **common,
                "type": "REQUEST",
                "methodArn": method_arn,
                "requestContext": {k: v for k, v in request_context.items() if k != "authorizer"},
            }
            invocation = self._pools[spec.function_logical_id].invoke(event)
            if not invocation.ok:
                if (invocation.error or {}).get("errorMessage") == "Unauthorized":
                    raise GatewayError("UNAUTHORIZED")
                raise GatewayError("AUTHORIZER_FAILURE")
            if not isinstance(invocation.result, dict) or "policyDocument" not in invocation.result:
                raise GatewayError("AUTHORIZER_CONFIGURATION_ERROR")
            policy = invocation.result
            if spec.ttl_seconds > 0:
                with self._cache_lock:
                    self._auth_cache[key] = (now + spec.ttl_seconds, policy)
        if not policy_allows(policy, method_arn):
            raise GatewayError("ACCESS_DENIED")
        context = {k: v for k, v in (policy.get("context") or {}).items()}
        context["principalId"] = policy.get("principalId")
        usage_key = policy.get("usageIdentifierKey")
        return context, str(usage_key) if usage_key else None

    def _validate(self, schema: dict[str, Any], body: bytes) -> None:
        import jsonschema  # type: ignore[import-untyped]

        try:
            document = json.loads(body or b"null", parse_constant=_no_json_constants)
        except (ValueError, RecursionError):  # not UTF-8, not JSON (NaN neither), nested past the stack
            raise GatewayError("BAD_REQUEST_BODY", validation="[Invalid JSON in request body]") from None
        try:
            found = list(jsonschema.Draft4Validator(schema).iter_errors(document))
        except RecursionError:
            raise GatewayError("BAD_REQUEST_BODY", validation="[JSON nested too deeply]") from None
        errors = sorted(found, key=lambda e: list(e.path))
        if errors:
            raise GatewayError(
                "BAD_REQUEST_BODY", validation="[" + ", ".join(e.message for e in errors) + "]"
            )


def _selects_json_model(headers: dict[str, str]) -> bool:
    """Whether the request's Content-Type selects the route's ``application/json`` model (none does too)."""
    declared = next((value for name, value in headers.items() if name.lower() == "content-type"), None)
    return declared is None or declared.split(";")[0].strip().lower() == JSON_MEDIA_TYPE

"""The REST API's routes, emulated on a local HTTP server the way API Gateway runs them.

moto creates the REST API and its resources, but not the stage, the authorizer, the request
validator or the gateway responses; they are read from the template (``local.emulator.discovery.api``)
and applied here, in API Gateway's order: stage throttle (429 THROTTLED), REQUEST authorizer
(identity header missing or ``Unauthorized`` -> 401 UNAUTHORIZED; explicit Deny -> 403
ACCESS_DENIED; the policy cached per identity for ``AuthorizerResultTtlInSeconds``), the API key
of a method that requires one (from the authorizer's ``usageIdentifierKey`` or the ``x-api-key``
header, per the API's ``ApiKeySourceType``: in no usage plan of the stage -> 403 INVALID_API_KEY;
over its plan's throttle -> 429 THROTTLED, before any integration runs), request body model
(400 BAD_REQUEST_BODY), then the Lambda proxy integration with ``requestContext.authorizer`` =
the authorizer's context plus ``principalId``. Error bodies come from the template's gateway
responses. Usage plans and keys are read from the embedded API Gateway (moto), where the stack
and onboarding (``breakwater.aws.usage_plans``) put them; quotas are not enforced.

The body is checked against the route's model only when the Content-Type selects it: the model's
``application/json``, or no Content-Type at all (API Gateway then takes the body as JSON); a body of
another type reaches the function unchecked, as in API Gateway. Every request is answered, the way
API Gateway answers: a malformed request (its framing, its headers, a method or path no route has)
with a JSON error from the gateway responses, never a dropped connection or an HTML page; a failure
of the emulator itself with a JSON 500 naming it.
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

from local.emulator.discovery import ApiSpec, AuthorizerSpec, RouteSpec
from local.emulator.embedded_aws import ACCOUNT, REGION
from local.emulator.functions import FunctionPool

DEFAULT_STATUS = {
    "UNAUTHORIZED": 401,
    "ACCESS_DENIED": 403,
    "MISSING_AUTHENTICATION_TOKEN": 403,
    "THROTTLED": 429,
    "INVALID_API_KEY": 403,
    "BAD_REQUEST_BODY": 400,
    "REQUEST_TOO_LARGE": 413,
    "AUTHORIZER_FAILURE": 500,
    "AUTHORIZER_CONFIGURATION_ERROR": 500,
    "INTEGRATION_FAILURE": 504,
    "INTEGRATION_TIMEOUT": 504,
}
# API Gateway bills every request it receives except those it refuses for their authorization or API
# key, or throttles (a 429 from the integration is billed: the integration ran).
UNBILLED_RESPONSES = frozenset(
    {"UNAUTHORIZED", "ACCESS_DENIED", "INVALID_API_KEY", "MISSING_AUTHENTICATION_TOKEN", "THROTTLED"}
)
DEFAULT_MESSAGE = {
    "UNAUTHORIZED": "Unauthorized",
    "ACCESS_DENIED": "User is not authorized to access this resource with an explicit deny",
    "MISSING_AUTHENTICATION_TOKEN": "Missing Authentication Token",
    "THROTTLED": "Too Many Requests",
    "INVALID_API_KEY": "Forbidden",
    "BAD_REQUEST_BODY": "Invalid request body",
    "REQUEST_TOO_LARGE": "Request Too Long",
    "AUTHORIZER_FAILURE": "Internal server error",
    "AUTHORIZER_CONFIGURATION_ERROR": "Internal server error",
    "INTEGRATION_FAILURE": "Internal server error",
}
MAX_BODY_BYTES = 10 * 1024 * 1024
MAX_HEADER_BYTES = 10 * 1024  # API Gateway: the request line and the header values together
INTEGRATION_TIMEOUT_S = 29.0
# How long a body may take to arrive once its headers have: a client that stops sending mid-body is
# answered instead of holding a thread. Idle keep-alive connections are not timed.
BODY_TIMEOUT_S = 10.0
MAX_CHUNK_LINE = 1024
JSON_MEDIA_TYPE = "application/json"
_DIGITS = re.compile(r"[0-9]{1,19}")


class _StageThrottle:
    """The stage's token bucket (ThrottlingRateLimit / ThrottlingBurstLimit of ``/*``)."""

    def __init__(self, rate: float | None, burst: int | None) -> None:
        self.rate, self.burst = rate, float(burst or 0)
        self.tokens, self.updated = self.burst, time.monotonic()
        self._lock = threading.Lock()

    def admit(self) -> bool:
        if not self.rate:
            return True
        with self._lock:
            now = time.monotonic()
            self.tokens = min(self.burst, self.tokens + (now - self.updated) * self.rate)
            self.updated = now
            if self.tokens >= 1:
                self.tokens -= 1
                return True
            return False


class _UsagePlanThrottles:
    """The usage plans of one stage: which plan a key is in, and a token bucket per key (its throttle).

    Plans and keys are read from the embedded API Gateway, one read at a time: again every
    ``refresh_seconds`` (by whichever request finds them stale, while the others go on with the last
    read), and when a request's key is not in the last read. Such a request waits for a read that
    began after it arrived, so a key enrolled before its first request is always found; a key that
    is still unknown causes at most one read a second. A changed plan applies within
    ``refresh_seconds`` (API Gateway, too, applies plan changes after a delay).
    """

    def __init__(self, client: Any, rest_api_id: str, stage: str, refresh_seconds: float = 5.0) -> None:
        self._client = client
        self.rest_api_id, self.stage = rest_api_id, stage
        self.refresh_seconds = refresh_seconds
        self._plan_of_key: dict[str, tuple[str, float | None, int | None]] = {}  # value -> plan, rate, burst
        self._buckets: dict[tuple[str, str, float | None, int | None], _StageThrottle] = {}
        self._read_started = float("-inf")  # when the last successful read began
        self._missed: dict[str, float] = {}  # unknown key -> when it last caused a read
        self._lock = threading.Lock()  # the maps above
        self._read_lock = threading.Lock()  # one read at a time

    def admit(self, key_value: str) -> bool | None:
        """True: within its plan's throttle; False: throttled; None: the key is in no plan of the stage."""
        arrived = time.monotonic()
        with self._lock:
            plan = self._plan_of_key.get(key_value)
            stale = arrived - self._read_started >= self.refresh_seconds
        if plan is None:
            plan = self._after_a_read(key_value, arrived)
        elif stale and self._read_lock.acquire(blocking=False):
            try:
                self._read_into()
            finally:
                self._read_lock.release()
        if plan is None:
            return None
        with self._lock:
            bucket = self._buckets.get((key_value, *plan))
            if bucket is None:
                bucket = self._buckets[(key_value, *plan)] = _StageThrottle(plan[1], plan[2])
        return bucket.admit()

    def _after_a_read(self, key_value: str, arrived: float) -> tuple[str, float | None, int | None] | None:
        """The key's plan as of a read that began after ``arrived`` (an unknown key reads once a second)."""
        with self._read_lock:
            with self._lock:
                if self._read_started >= arrived:
                    return self._plan_of_key.get(key_value)
                if arrived - self._missed.get(key_value, float("-inf")) < 1.0:
                    return None
                if len(self._missed) >= 10_000:
                    self._missed.clear()
                self._missed[key_value] = arrived
            self._read_into()
        with self._lock:
            return self._plan_of_key.get(key_value)

    def _read_into(self) -> None:
        """One read of the plans and keys (the caller holds the read lock); a failed read changes nothing."""
        started = time.monotonic()
        try:
            read = self._read()
        except Exception:  # the emulator briefly unreachable: keep the plans read last
            return
        with self._lock:
            self._plan_of_key, self._read_started = read, started

    def _read(self) -> dict[str, tuple[str, float | None, int | None]]:
        keys: dict[str, dict[str, Any]] = {}
        for page in self._client.get_paginator("get_api_keys").paginate(includeValues=True):
            keys.update({key["id"]: key for key in page.get("items", [])})
        plan_of_key: dict[str, tuple[str, float | None, int | None]] = {}
        for page in self._client.get_paginator("get_usage_plans").paginate():
            for plan in page.get("items", []):
                stages = plan.get("apiStages") or []
                if not any(
                    s.get("apiId") == self.rest_api_id and s.get("stage") == self.stage for s in stages
                ):
                    continue
                throttle = plan.get("throttle") or {}
                rate, burst = throttle.get("rateLimit"), throttle.get("burstLimit")
                limits = (
                    str(plan["id"]),
                    float(rate) if rate is not None else None,
                    int(burst) if burst is not None else None,
                )
                paginator = self._client.get_paginator("get_usage_plan_keys")
                for keys_page in paginator.paginate(usagePlanId=plan["id"]):
                    for plan_key in keys_page.get("items", []):
                        key = keys.get(plan_key["id"])
                        if key is not None and key.get("enabled", True) and key.get("value"):
                            plan_of_key[str(key["value"])] = limits
        return plan_of_key


class _GatewayError(Exception):
    """An answer of the gateway itself; ``status`` overrides the response type's (protocol errors)."""

    def __init__(
        self,
        response_type: str,
        message: str | None = None,
        validation: str = "",
        *,
        status: int | None = None,
    ) -> None:
        super().__init__(response_type)
        self.response_type = response_type
        self.message = message or DEFAULT_MESSAGE.get(response_type, "Error")
        self.validation = validation
        self.status = status


def _bad_request(message: str, status: int = 400) -> _GatewayError:
    """A request API Gateway cannot read (its framing or its headers): DEFAULT_4XX's body."""
    return _GatewayError("DEFAULT_4XX", message, status=status)


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
        self._throttle = _StageThrottle(spec.throttle_rate, spec.throttle_burst)
        self._usage = (
            _UsagePlanThrottles(apigateway, spec.rest_api_id, spec.stage) if apigateway is not None else None
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
                except _GatewayError as error:
                    self.close_connection = True  # what is left of the body cannot be told from a request
                    answer = api.error_answer(error)
                else:
                    answer = api.handle(self.command, self.path, dict(self.headers.items()), body)
                self._answer(*answer)

            def _read_body(self) -> bytes:
                """The body as framed by Content-Length or chunked transfer coding; a 4xx if it is not."""
                line = len(self.requestline) + sum(len(value) for value in self.headers.values())
                if line > MAX_HEADER_BYTES:
                    raise _GatewayError(
                        "REQUEST_TOO_LARGE", f"HTTP header is larger than {MAX_HEADER_BYTES} bytes."
                    )
                lengths = self.headers.get_all("Content-Length") or []
                codings = self.headers.get_all("Transfer-Encoding") or []
                if lengths and codings:
                    raise _bad_request("a request may not have both Content-Length and Transfer-Encoding")
                self.connection.settimeout(BODY_TIMEOUT_S)
                try:
                    if codings:
                        if [coding.strip().lower() for coding in codings] != ["chunked"]:
                            raise _bad_request(f"Transfer-Encoding {', '.join(codings)!r} is not supported")
                        return self._read_chunked()
                    if not lengths:
                        return b""
                    if len(set(lengths)) > 1 or not _DIGITS.fullmatch(lengths[0].strip()):
                        raise _bad_request(f"invalid Content-Length {', '.join(lengths)!r}")
                    length = int(lengths[0])
                    if length > MAX_BODY_BYTES:
                        raise _GatewayError("REQUEST_TOO_LARGE")
                    return self._read_exactly(length)
                except TimeoutError:
                    raise _bad_request(
                        f"the request body did not arrive within {BODY_TIMEOUT_S:g} s"
                    ) from None
                finally:
                    self.connection.settimeout(None)

            def _read_exactly(self, length: int) -> bytes:
                data = self.rfile.read(length)
                if len(data) < length:
                    raise _bad_request(f"the request body ended after {len(data)} of its {length} bytes")
                return data

            def _read_chunked(self) -> bytes:
                chunks: list[bytes] = []
                total = 0
                while True:
                    size_line = self.rfile.readline(MAX_CHUNK_LINE + 1)
                    size_text = size_line.split(b";", 1)[0].strip()
                    if not size_line.endswith(b"\n") or not re.fullmatch(rb"[0-9A-Fa-f]{1,8}", size_text):
                        raise _bad_request(f"invalid chunk size line {size_line[:40]!r}")
                    size = int(size_text, 16)
                    if size == 0:
                        break
                    total += size
                    if total > MAX_BODY_BYTES:
                        raise _GatewayError("REQUEST_TOO_LARGE")
                    chunks.append(self._read_exactly(size))
                    if self.rfile.readline(MAX_CHUNK_LINE + 1).strip():
                        raise _bad_request("a chunk is longer than its size line says")
                for _ in range(100):  # trailer fields, up to the empty line
                    trailer = self.rfile.readline(MAX_CHUNK_LINE + 1)
                    if not trailer.strip():
                        return b"".join(chunks)
                raise _bad_request("too many trailer fields after the last chunk")

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
                self._answer(*api.error_answer(_bad_request(text, code if code < 500 else 400)))

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
        except _GatewayError as error:
            status, out_headers, payload = self._gateway_response(error, request_id)
            billed = error.response_type not in UNBILLED_RESPONSES
        except Exception as exc:  # the emulator's own failure: answered and shown, never a dropped connection
            traceback.print_exc()
            failure = _GatewayError(
                "INTERNAL_ERROR", f"local API emulator failed: {type(exc).__name__}: {exc}"
            )
            status, out_headers, payload = self._gateway_response(failure, request_id)
        if billed:
            with self._status_lock:
                self.billed_requests += 1
        return self._counted(status, out_headers, payload, request_id)

    def error_answer(self, error: _GatewayError) -> tuple[int, dict[str, str], bytes]:
        """The gateway's answer to a request it could not read far enough to route."""
        request_id = str(uuid.uuid4())
        return self._counted(*self._gateway_response(error, request_id), request_id)

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
        raise _GatewayError("MISSING_AUTHENTICATION_TOKEN")

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
            raise _GatewayError("MISSING_AUTHENTICATION_TOKEN")
        path = split.path[len(prefix) :] or "/"
        route = self._route(method, path)
        if not self._throttle.admit():
            raise _GatewayError("THROTTLED")
        if len(body) > MAX_BODY_BYTES:
            raise _GatewayError("REQUEST_TOO_LARGE")
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
                raise _GatewayError("INVALID_API_KEY")
            if not admitted:
                raise _GatewayError("THROTTLED")
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
                raise _GatewayError("INTEGRATION_TIMEOUT", "Endpoint request timed out")
            return 502, {"Content-Type": "application/json"}, b'{"message": "Internal server error"}'
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
            raise _GatewayError("UNAUTHORIZED")
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
                    raise _GatewayError("UNAUTHORIZED")
                raise _GatewayError("AUTHORIZER_FAILURE")
            if not isinstance(invocation.result, dict) or "policyDocument" not in invocation.result:
                raise _GatewayError("AUTHORIZER_CONFIGURATION_ERROR")
            policy = invocation.result
            if spec.ttl_seconds > 0:
                with self._cache_lock:
                    self._auth_cache[key] = (now + spec.ttl_seconds, policy)
        if not policy_allows(policy, method_arn):
            raise _GatewayError("ACCESS_DENIED")
        context = {k: v for k, v in (policy.get("context") or {}).items()}
        context["principalId"] = policy.get("principalId")
        usage_key = policy.get("usageIdentifierKey")
        return context, str(usage_key) if usage_key else None

    def _validate(self, schema: dict[str, Any], body: bytes) -> None:
        import jsonschema  # type: ignore[import-untyped]

        try:
            document = json.loads(body or b"null", parse_constant=_no_json_constants)
        except (ValueError, RecursionError):  # not UTF-8, not JSON (NaN neither), nested past the stack
            raise _GatewayError("BAD_REQUEST_BODY", validation="[Invalid JSON in request body]") from None
        try:
            found = list(jsonschema.Draft4Validator(schema).iter_errors(document))
        except RecursionError:
            raise _GatewayError("BAD_REQUEST_BODY", validation="[JSON nested too deeply]") from None
        errors = sorted(found, key=lambda e: list(e.path))
        if errors:
            raise _GatewayError(
                "BAD_REQUEST_BODY", validation="[" + ", ".join(e.message for e in errors) + "]"
            )

    def _gateway_response(self, error: _GatewayError, request_id: str) -> tuple[int, dict[str, str], bytes]:
        responses = self.spec.gateway_responses
        default_status = error.status or DEFAULT_STATUS.get(error.response_type, 500)
        family = "DEFAULT_5XX" if default_status >= 500 else "DEFAULT_4XX"
        configured = responses.get(error.response_type) or responses.get(family) or {}
        status = error.status or configured.get("status") or default_status
        template = configured.get("template")
        if template:
            body = (
                template.replace("$context.error.messageString", json.dumps(error.message))
                .replace("$context.error.message", error.message)
                # Escaped as a JSON string's content (API Gateway escapes its quotes): the validator's
                # messages quote what the client sent, backslashes and control characters included.
                .replace("$context.error.validationErrorString", json.dumps(error.validation)[1:-1])
                .replace("$context.error.responseType", error.response_type)
                .replace("$context.requestId", request_id)
            )
        else:
            body = json.dumps({"message": error.message})
        headers = {"Content-Type": "application/json", "x-amzn-ErrorType": error.response_type}
        for name, value in (configured.get("headers") or {}).items():
            if name.startswith("gatewayresponse.header."):
                headers[name.removeprefix("gatewayresponse.header.")] = str(value).strip("'")
        return int(status), headers, body.encode()


def _selects_json_model(headers: dict[str, str]) -> bool:
    """Whether the request's Content-Type selects the route's ``application/json`` model (none does too)."""
    declared = next((value for name, value in headers.items() if name.lower() == "content-type"), None)
    return declared is None or declared.split(";")[0].strip().lower() == JSON_MEDIA_TYPE

"""A small stand-in for API Gateway: the REQUEST authorizer in front of the ingest integration.

It builds the events API Gateway sends (authorizer context values stringified, as REST APIs do),
turns ``Exception("Unauthorized")`` into 401 and an explicit Deny into 403, like the real thing.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

API_ARN = "arn:aws:execute-api:us-east-1:123456789012:abc123/prod"


@dataclass
class FakeLambdaContext:
    function_name: str = "breakwater-test"
    memory_limit_in_mb: int = 256
    invoked_function_arn: str = "arn:aws:lambda:us-east-1:123456789012:function:breakwater-test"
    aws_request_id: str = "00000000-0000-0000-0000-000000000000"
    remaining_ms: int = 10_000  # the front door's timeout: a fresh invocation

    def get_remaining_time_in_millis(self) -> int:
        return self.remaining_ms


@dataclass
class HttpResponse:
    status: int
    headers: dict[str, str]
    body: Any

    @property
    def error_code(self) -> str | None:
        """The problem's ``code`` (every error answer is a problem details object)."""
        return self.body.get("code") if isinstance(self.body, dict) else None

    @property
    def error_message(self) -> str:
        """The problem's ``detail``: what was wrong with this request."""
        return str(self.body.get("detail", "")) if isinstance(self.body, dict) else ""


@dataclass
class ApiGateway:
    authorizer: ModuleType
    ingest: ModuleType
    _ids: itertools.count[int] = field(default_factory=itertools.count)

    def authorize(self, headers: dict[str, str], method: str = "POST", path: str = "/v1/messages") -> Any:
        request_id = f"req-{next(self._ids)}"
        event = {
            "type": "REQUEST",
            "methodArn": f"{API_ARN}/{method}{path}",
            "resource": path,
            "path": path,
            "httpMethod": method,
            "headers": headers,
            "queryStringParameters": {},
            "pathParameters": {},
            "stageVariables": {},
            "requestContext": {"requestId": request_id, "stage": "prod", "httpMethod": method, "path": path},
        }
        return self.authorizer.handler(event, FakeLambdaContext())

    def request(
        self,
        key: str | None,
        body: Any,
        *,
        raw: str | None = None,
        method: str = "POST",
        path: str = "/v1/messages",
        headers: dict[str, str] | None = None,
        remaining_ms: int = FakeLambdaContext.remaining_ms,
    ) -> HttpResponse:
        all_headers = dict(headers or {})
        if key is not None:
            all_headers["Authorization"] = f"Bearer {key}"
        try:
            policy = self.authorize(all_headers, method, path)
        except Exception as exc:
            if str(exc) == "Unauthorized":
                return HttpResponse(401, {}, {"message": "Unauthorized"})
            raise
        statement = policy["policyDocument"]["Statement"][0]
        if statement["Effect"] != "Allow":
            return HttpResponse(403, {}, {"message": "User is not authorized to access this resource"})
        context = {name: str(value) for name, value in policy.get("context", {}).items()}
        request_id = f"req-{next(self._ids)}"
        event = {
            "resource": path,
            "path": path,
            "httpMethod": method,
            "headers": {"Content-Type": "application/json", **all_headers},
            "multiValueHeaders": {},
            "queryStringParameters": None,
            "multiValueQueryStringParameters": None,
            "pathParameters": None,
            "stageVariables": None,
            "requestContext": {
                "requestId": request_id,
                "stage": "prod",
                "httpMethod": method,
                "path": f"/prod{path}",
                "resourcePath": path,
                "authorizer": {**context, "principalId": policy["principalId"], "integrationLatency": 3},
                "identity": {"sourceIp": "203.0.113.1"},
            },
            "body": raw if raw is not None else json.dumps(body),
            "isBase64Encoded": False,
        }
        response = self.ingest.handler(event, FakeLambdaContext(remaining_ms=remaining_ms))
        text = response.get("body")
        # REST API integrations answer with multiValueHeaders; API Gateway joins them into headers.
        multi = {name: ",".join(values) for name, values in (response.get("multiValueHeaders") or {}).items()}
        return HttpResponse(
            status=int(response["statusCode"]),
            headers={**(response.get("headers") or {}), **multi},
            body=json.loads(text) if text else None,
        )

"""What the API handlers share: the request's body and trace id, the tenant, and JSON answers.

Handlers stay a route each: they read the event through these helpers, call one service, and turn
its result or its :class:`~breakwater.errors.ApiError` into a response here.
"""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Mapping
from typing import Any, Protocol, TypeVar

from aws_lambda_powertools.event_handler import Response
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.data_classes import APIGatewayProxyEvent

from breakwater.errors import PROBLEM_MEDIA_TYPE, ApiError, RouteNotFoundError
from breakwater.ingest import TenantContext
from breakwater.observability import logger, metrics
from breakwater.request_keys import HEADER
from breakwater.requests import JSON_MEDIA_TYPE


def request_body(event: APIGatewayProxyEvent) -> bytes | None:
    """The request's body as bytes (decoded where API Gateway base64-encoded it); None if it has none."""
    if event.body is None:
        return None
    if event.is_base64_encoded:
        return base64.b64decode(event.body)
    return event.body.encode()


def trace_id(event: APIGatewayProxyEvent) -> str | None:
    """The X-Ray root trace id of the request (the header API Gateway adds, else Lambda's)."""
    header = (event.headers or {}).get("X-Amzn-Trace-Id") or os.environ.get("_X_AMZN_TRACE_ID")
    if not header:
        return None
    for part in header.split(";"):
        if part.startswith("Root="):
            return part[len("Root=") :]
    return header


def tenant_of(event: APIGatewayProxyEvent) -> TenantContext:
    """The authenticated tenant (a 401 if the authorizer put none), also added to every log line."""
    context = event.request_context
    tenant = TenantContext.from_authorizer(context.authorizer.get_context())
    logger.append_keys(tenant=tenant.tenant, request_id=context.request_id)
    return tenant


Answer = TypeVar("Answer", covariant=True)


class FrontDoorService(Protocol[Answer]):
    """A route's service (``IngestService``, ``OrderedIngestService``, ``EventsService``)."""

    def accept(
        self,
        raw_body: bytes | None,
        tenant: TenantContext,
        *,
        request_id: str | None,
        trace_id: str | None,
        idempotency_key: str | None = None,
    ) -> Answer: ...


def idempotency_key(event: APIGatewayProxyEvent) -> str | None:
    """The ``Idempotency-Key`` header (any case), or None."""
    return event.headers.get(HEADER)


def accept(service: FrontDoorService[Answer], event: APIGatewayProxyEvent) -> Answer:
    """Hand the request to the route's service: its body, its tenant, its request and trace ids, and
    the client's idempotency key."""
    return service.accept(
        request_body(event),
        tenant_of(event),
        request_id=event.request_context.request_id,
        trace_id=trace_id(event),
        idempotency_key=idempotency_key(event),
    )


def json_response(
    status: int, body: Mapping[str, Any], headers: Mapping[str, str] | None = None
) -> Response[str]:
    """A JSON answer; a 4xx or 5xx is a problem details object (``breakwater.errors.problem``)."""
    return Response(
        status_code=status,
        content_type=PROBLEM_MEDIA_TYPE if status >= 400 else JSON_MEDIA_TYPE,
        body=json.dumps(body, separators=(",", ":")),
        headers=dict(headers or {}),
    )


def error_response(error: ApiError) -> Response[str]:
    """The problem details and headers; counted as ``Throttled`` or ``Rejected``, logged with its code.

    A refusal's line carries ``status`` and ``code`` as fields beside the ``tenant`` key
    :func:`tenant_of` appended: the per-tenant refusal views (breakwater_cdk/insights.py) rank
    tenants by them.
    """
    if error.status == 429:
        metrics.add_metric(name="Throttled", unit=MetricUnit.Count, value=1)
        logger.info(
            "throttled",
            extra={
                "status": error.status,
                "code": error.code,
                "retry_after": error.headers.get("Retry-After"),
                "error": error.message,
            },
        )
    elif error.status >= 500:
        logger.error("not stored", extra={"status": error.status, "error": error.message})
    else:
        metrics.add_metric(name="Rejected", unit=MetricUnit.Count, value=1)
        logger.info("rejected", extra={"status": error.status, "code": error.code, "error": error.message})
    return json_response(error.status, error.body(), error.headers)


def not_found(event: APIGatewayProxyEvent, routes: str) -> Response[str]:
    error = RouteNotFoundError(f"no route for {event.http_method} {event.path}; use {routes}")
    return json_response(error.status, error.body())

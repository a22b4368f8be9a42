"""POST /v1/messages: validate, admit fairly, route by shuffle sharding, store; 202 with the message id."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from typing import Any

from aws_lambda_powertools.event_handler import APIGatewayRestResolver, Response
from aws_lambda_powertools.event_handler.exceptions import NotFoundError
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext

from breakwater.aws.buckets import LeasedTokenBucket
from breakwater.aws.counters import TenantCounters
from breakwater.aws.queues import EnqueueError, LiveQueues
from breakwater.errors import ApiError, RouteNotFoundError
from breakwater.ingest import IngestService, Router, TenantContext
from breakwater.observability import logger, metrics, tracer
from breakwater.request import request_body
from breakwater.settings import IngestSettings

app = APIGatewayRestResolver()


def build_service(settings: IngestSettings, clock: Callable[[], float] = time.time) -> IngestService:
    """Wires the adapters to the policy; tests and the bench pass their own clock."""
    queues = LiveQueues(settings.live_queue_urls, fair_queues=settings.fair_queues)
    gate = (
        LeasedTokenBucket(
            settings.state_table_name, "ingest", clock, settings.lease_seconds, settings.lease_max_fraction
        )
        if settings.throttling_enabled
        else None
    )
    return IngestService(
        router=Router(
            queues, settings.shard_size, settings.depth_refresh_seconds, clock, send_errors=(EnqueueError,)
        ),
        gate=gate,
        clock=clock,
        max_payload_bytes=settings.max_payload_bytes,
        max_ttl_seconds=settings.max_ttl_seconds,
        counters=TenantCounters(settings.state_table_name),
        counter_flush_seconds=settings.counter_flush_seconds,
    )


SETTINGS = IngestSettings.from_env()
SERVICE = build_service(SETTINGS)


def _trace_id() -> str | None:
    header = app.current_event.headers.get("X-Amzn-Trace-Id") or os.environ.get("_X_AMZN_TRACE_ID")
    if not header:
        return None
    for part in header.split(";"):
        if part.startswith("Root="):
            return part[len("Root=") :]
    return header


@app.post("/v1/messages")
@tracer.capture_method
def post_message() -> Response[str]:
    context = app.current_event.request_context
    tenant = TenantContext.from_authorizer(context.authorizer.get_context())
    logger.append_keys(tenant=tenant.tenant, request_id=context.request_id)
    body = request_body(app.current_event)
    accepted = SERVICE.accept(body, tenant, request_id=context.request_id, trace_id=_trace_id())
    logger.append_keys(envelope_id=accepted.envelope.id, trace_id=accepted.envelope.trace_id)
    logger.info("accepted", extra={"queue": accepted.queue})
    metrics.add_metric(name="Accepted", unit=MetricUnit.Count, value=1)
    return Response(status_code=202, content_type="application/json", body=_json(accepted.body()))


def _json(body: dict[str, Any]) -> str:
    return json.dumps(body, separators=(",", ":"))


@app.exception_handler(ApiError)
def api_error(error: ApiError) -> Response[str]:
    if error.status == 429:
        metrics.add_metric(name="Throttled", unit=MetricUnit.Count, value=1)
        logger.info("throttled", extra={"retry_after": error.headers.get("Retry-After")})
    elif error.status >= 500:
        logger.error("enqueue failed", extra={"error": error.message})
    else:
        metrics.add_metric(name="Rejected", unit=MetricUnit.Count, value=1)
        logger.info("rejected", extra={"status": error.status, "code": error.code, "error": error.message})
    return Response(
        status_code=error.status,
        content_type="application/json",
        body=error.body_json(),
        headers=error.headers,
    )


@app.not_found
def not_found(_: NotFoundError) -> Response[str]:
    event = app.current_event
    error = RouteNotFoundError(f"no route for {event.http_method} {event.path}; use POST /v1/messages")
    return Response(status_code=404, content_type="application/json", body=error.body_json())


@logger.inject_lambda_context(clear_state=True)
@metrics.log_metrics
@tracer.capture_lambda_handler
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    return app.resolve(event, context)

"""POST /v1/ordered: a message that must be processed in order within its ``ordering_key``.

Goes to the FIFO queue set with ``MessageGroupId`` = ``tenant:ordering_key`` and
``MessageDeduplicationId`` = the client's ``dedup_key`` (else the envelope id). A route of its own
rather than a branch of ``POST /v1/messages``: the guarantees differ (docs/decisions.md, D-ordered).
"""

from __future__ import annotations

import json
import time
from typing import Any

import boto3
from aws_lambda_powertools.event_handler import APIGatewayRestResolver, Response
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext
from botocore.exceptions import BotoCoreError, ClientError
from pydantic import ValidationError

from breakwater.aws.buckets import LeasedTokenBucket
from breakwater.aws.fifo_queues import send_ordered
from breakwater.envelope import Envelope, new_envelope_id, payload_size
from breakwater.errors import (
    ApiError,
    BadRequestError,
    PayloadTooLargeError,
    ThrottledError,
    UnavailableError,
)
from breakwater.ingest import TenantContext
from breakwater.observability import logger, metrics, tracer
from breakwater.ordered import OrderedMessageRequest
from breakwater.request import request_body
from breakwater.settings import OrderedIngestSettings

app = APIGatewayRestResolver()
SETTINGS = OrderedIngestSettings.from_env()
SQS = boto3.client("sqs")
GATE = (
    LeasedTokenBucket(
        SETTINGS.state_table_name, "ingest", time.time, SETTINGS.lease_seconds, SETTINGS.lease_max_fraction
    )
    if SETTINGS.state_table_name
    else None
)


def _request() -> OrderedMessageRequest:
    try:
        request = OrderedMessageRequest.model_validate_json(request_body(app.current_event) or b"null")
    except ValidationError as exc:
        details = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or '(body)'}: {e['msg']}" for e in exc.errors()
        )
        raise BadRequestError(details, code="invalid_body") from None
    if payload_size(request.payload) > SETTINGS.max_payload_bytes:
        raise PayloadTooLargeError(f"payload is larger than {SETTINGS.max_payload_bytes} bytes")
    if request.ttl_seconds is not None and request.ttl_seconds > SETTINGS.max_ttl_seconds:
        raise BadRequestError(f"ttl_seconds must be at most {SETTINGS.max_ttl_seconds}", code="invalid_body")
    return request


@app.post("/v1/ordered")
@tracer.capture_method
def post_ordered() -> Response[str]:
    context = app.current_event.request_context
    tenant = TenantContext.from_authorizer(context.authorizer.get_context())
    logger.append_keys(tenant=tenant.tenant, request_id=context.request_id)
    request = _request()
    if GATE is not None:
        admitted, retry_after = GATE.try_acquire(tenant.tenant, tenant.bucket_limits())
        if not admitted:
            raise ThrottledError("over the tenant's ingest rate", retry_after=retry_after)
    now_ms = int(time.time() * 1000)
    envelope = Envelope(
        id=new_envelope_id(now_ms),
        tenant=tenant.tenant,
        type=request.type,
        payload=request.payload,
        request_id=context.request_id,
        enqueued_at=now_ms,
        expires_at=now_ms + request.ttl_seconds * 1000 if request.ttl_seconds else None,
        dedup_key=request.dedup_key,
        ordering_key=request.ordering_key,
    )
    try:
        send_ordered(SQS, SETTINGS.fifo_queue_urls, envelope)
    except (ClientError, BotoCoreError) as exc:
        raise UnavailableError(f"the message was not stored: {exc}") from exc
    logger.info("accepted ordered", extra={"envelope_id": envelope.id, "ordering_key": envelope.ordering_key})
    metrics.add_metric(name="AcceptedOrdered", unit=MetricUnit.Count, value=1)
    body = {
        "id": envelope.id,
        "ordering_key": envelope.ordering_key,
        "dedup_id": envelope.dedup_key or envelope.id,
    }
    return Response(status_code=202, content_type="application/json", body=json.dumps(body))


@app.exception_handler(ApiError)
def api_error(error: ApiError) -> Response[str]:
    logger.info("rejected", extra={"status": error.status, "code": error.code, "error": error.message})
    metrics.add_metric(
        name="Throttled" if error.status == 429 else "Rejected", unit=MetricUnit.Count, value=1
    )
    return Response(
        status_code=error.status,
        content_type="application/json",
        body=error.body_json(),
        headers=error.headers,
    )


@logger.inject_lambda_context(clear_state=True)
@metrics.log_metrics
@tracer.capture_lambda_handler
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    return app.resolve(event, context)

"""POST /v1/events: one event or a batch (up to 500) into the Kinesis stream.

Each event is stamped (id, tenant, received_at) and written with PutRecords; records that fail are
retried as a subset. The answer never calls an unwritten event written: 202 when all are written,
207 with per-event results when some are not (the client resends those), 429 or 503 when none are.
"""

from __future__ import annotations

import json
import time
from typing import Any

import boto3
from aws_lambda_powertools.event_handler import APIGatewayRestResolver, Response
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext

from breakwater.aws.kinesis import PutOutcome, put_records
from breakwater.envelope import new_envelope_id, payload_size
from breakwater.events import EventsRequestError, PartitionKeyMode, StreamEvent, parse_events_body, to_record
from breakwater.observability import logger, metrics, tracer
from breakwater.request import request_body
from breakwater.settings import EventsSettings

app = APIGatewayRestResolver()
SETTINGS = EventsSettings.from_env()
KINESIS = boto3.client("kinesis")


def _error(status: int, code: str, message: str, headers: dict[str, str] | None = None) -> Response[str]:
    metrics.add_metric(name="EventsRejected", unit=MetricUnit.Count, value=1)
    logger.info("rejected", extra={"status": status, "code": code, "error": message})
    body = json.dumps({"error": {"code": code, "message": message}})
    return Response(status_code=status, content_type="application/json", body=body, headers=headers)


def _answer(events: list[StreamEvent], outcome: PutOutcome) -> Response[str]:
    results: list[dict[str, Any]] = []
    for index, event in enumerate(events):
        if index in outcome.written:
            results.append({"index": index, "id": event.id, "status": "written"})
        else:
            results.append(
                {"index": index, "id": event.id, "status": "failed", "error": outcome.failed[index]}
            )
    written, failed = len(outcome.written), len(outcome.failed)
    metrics.add_metric(name="EventsWritten", unit=MetricUnit.Count, value=written)
    metrics.add_metric(name="EventsFailed", unit=MetricUnit.Count, value=failed)
    body = json.dumps({"written": written, "failed": failed, "results": results}, separators=(",", ":"))
    if not failed:
        return Response(status_code=202, content_type="application/json", body=body)
    if written:
        return Response(status_code=207, content_type="application/json", body=body)
    status = 429 if outcome.throttled else 503
    return Response(
        status_code=status, content_type="application/json", body=body, headers={"Retry-After": "1"}
    )


@app.post("/v1/events")
@tracer.capture_method
def post_events() -> Response[str]:
    context = app.current_event.request_context
    tenant = context.authorizer.get_context().get("tenant")
    if not tenant:  # only reachable if the API was deployed without the authorizer: fail closed
        return _error(401, "unauthorized", "no authenticated tenant on this request")
    logger.append_keys(tenant=tenant, request_id=context.request_id)
    try:
        incoming = parse_events_body(request_body(app.current_event) or b"", SETTINGS.max_events_per_request)
    except EventsRequestError as exc:
        return _error(400, "invalid_body", str(exc))
    for index, event in enumerate(incoming):
        if payload_size(event.payload) > SETTINGS.max_event_bytes:
            return _error(
                413, "payload_too_large", f"events[{index}].payload exceeds {SETTINGS.max_event_bytes} bytes"
            )
    now_ms = int(time.time() * 1000)
    events = [
        StreamEvent(
            id=new_envelope_id(now_ms),
            tenant=tenant,
            type=event.type,
            key=event.key,
            value=event.value,
            payload=event.payload,
            occurred_at=event.occurred_at,
            received_at=now_ms,
            request_id=context.request_id,
        )
        for event in incoming
    ]
    mode = PartitionKeyMode(SETTINGS.partition_key_mode)
    outcome = put_records(
        KINESIS, SETTINGS.stream_arn, [to_record(e, mode) for e in events], max_attempts=SETTINGS.put_attempts
    )
    return _answer(events, outcome)


@logger.inject_lambda_context(clear_state=True)
@metrics.log_metrics
@tracer.capture_lambda_handler
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    return app.resolve(event, context)

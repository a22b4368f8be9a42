"""POST /v1/events: one event or a batch (up to 500) into the Kinesis stream, admitted per tenant.

202 when all are written, 207 with per-event results when some are not (the client resends those),
429 or 503 when none are.
"""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.event_handler import APIGatewayRestResolver, Response
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext

from breakwater.api import accept, error_response, json_response
from breakwater.aws.clients import DEADLINE
from breakwater.aws.front_door import build_events
from breakwater.errors import ApiError
from breakwater.observability import logger, metrics, tracer
from breakwater.requests import require_json
from breakwater.settings import EventsSettings

app = APIGatewayRestResolver()
SERVICE = build_events(EventsSettings.from_env())


@app.post("/v1/events")
@tracer.capture_method
def post_events() -> Response[str]:
    require_json(app.current_event.headers)
    answer = accept(SERVICE, app.current_event)
    metrics.add_metric(name="EventsWritten", unit=MetricUnit.Count, value=answer.body["written"])
    metrics.add_metric(name="EventsFailed", unit=MetricUnit.Count, value=answer.body["failed"])
    return json_response(answer.status, answer.body, answer.headers)


@app.exception_handler(ApiError)
def api_error(error: ApiError) -> Response[str]:
    metrics.add_metric(name="EventsRejected", unit=MetricUnit.Count, value=1)
    return error_response(error)


@logger.inject_lambda_context(clear_state=True)
@metrics.log_metrics
@tracer.capture_lambda_handler
@DEADLINE.bounded  # every AWS call of an invocation ends before its timeout
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    return app.resolve(event, context)

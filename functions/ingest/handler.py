"""POST /v1/messages: validate, admit fairly, route by shuffle sharding, store; 202 with the message id."""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.event_handler import APIGatewayRestResolver, Response
from aws_lambda_powertools.event_handler.exceptions import NotFoundError
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext

from breakwater.api import accept, error_response, json_response, not_found
from breakwater.aws.clients import DEADLINE
from breakwater.aws.front_door import build_ingest, flush_tallies_in_the_background
from breakwater.errors import ApiError
from breakwater.observability import logger, metrics, tracer
from breakwater.requests import require_json
from breakwater.settings import IngestSettings

app = APIGatewayRestResolver()
SERVICE = build_ingest(IngestSettings.from_env())
# set to stop the tally thread (a test that imports this module again stops the old copy's)
FLUSH_STOP = flush_tallies_in_the_background(SERVICE)


@app.post("/v1/messages")
@tracer.capture_method
def post_message() -> Response[str]:
    require_json(app.current_event.headers)
    accepted = accept(SERVICE, app.current_event)
    trace = accepted.envelope.trace_id if accepted.envelope is not None else None
    logger.append_keys(envelope_id=accepted.message_id, trace_id=trace)
    if accepted.replayed:  # a client's retry: the original answer, nothing stored again
        logger.info("accepted earlier", extra={"queue": accepted.queue})
        metrics.add_metric(name="Replayed", unit=MetricUnit.Count, value=1)
        return json_response(202, accepted.body(), {"Idempotent-Replayed": "true"})
    logger.info("accepted", extra={"queue": accepted.queue})
    metrics.add_metric(name="Accepted", unit=MetricUnit.Count, value=1)
    return json_response(202, accepted.body())


@app.exception_handler(ApiError)
def api_error(error: ApiError) -> Response[str]:
    return error_response(error)


@app.not_found
def route_not_found(_: NotFoundError) -> Response[str]:
    return not_found(app.current_event, "POST /v1/messages")


@logger.inject_lambda_context(clear_state=True)
@metrics.log_metrics
@tracer.capture_lambda_handler
@DEADLINE.bounded  # every AWS call of an invocation ends before its timeout
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    return app.resolve(event, context)

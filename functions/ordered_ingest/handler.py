"""POST /v1/ordered: a message that must be processed in order within its ``ordering_key``.

Goes to the FIFO queue set with ``MessageGroupId`` = ``tenant:ordering_key`` and
``MessageDeduplicationId`` = the client's ``dedup_key`` (else the envelope id). A route of its own
rather than a branch of ``POST /v1/messages``, because the guarantees differ.
"""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.event_handler import APIGatewayRestResolver, Response
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext

from breakwater.api import accept, error_response, json_response
from breakwater.aws.clients import DEADLINE
from breakwater.aws.front_door import build_ordered
from breakwater.errors import ApiError
from breakwater.observability import logger, metrics, tracer
from breakwater.requests import require_json
from breakwater.settings import OrderedIngestSettings

app = APIGatewayRestResolver()
SERVICE = build_ordered(OrderedIngestSettings.from_env())


@app.post("/v1/ordered")
@tracer.capture_method
def post_ordered() -> Response[str]:
    require_json(app.current_event.headers)
    accepted = accept(SERVICE, app.current_event)
    logger.info(
        "accepted ordered",
        extra={"envelope_id": accepted.envelope.id, "ordering_key": accepted.envelope.ordering_key},
    )
    metrics.add_metric(name="AcceptedOrdered", unit=MetricUnit.Count, value=1)
    return json_response(202, accepted.body())


@app.exception_handler(ApiError)
def api_error(error: ApiError) -> Response[str]:
    return error_response(error)


@logger.inject_lambda_context(clear_state=True)
@metrics.log_metrics
@tracer.capture_lambda_handler
@DEADLINE.bounded  # every AWS call of an invocation ends before its timeout
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    return app.resolve(event, context)

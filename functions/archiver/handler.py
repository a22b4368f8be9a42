"""Archiver: started by the controller when a sideline queue's oldest message or depth passes its budget.

Event: ``{"queue_url": "<one of SOURCE_QUEUE_URLS>", "max_messages": 10000}`` (both optional: without
``queue_url`` every source queue is drained in turn). Returns what was moved.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from aws_lambda_powertools.utilities.typing import LambdaContext

from breakwater.aws.archive import build_archiver
from breakwater.aws.clients import DEADLINE
from breakwater.observability import logger, metrics, tracer
from breakwater.settings import ArchiverSettings

settings = ArchiverSettings.from_env()
archiver = build_archiver(settings)


@logger.inject_lambda_context
@tracer.capture_lambda_handler
@metrics.log_metrics
@DEADLINE.bounded  # every AWS call of an invocation ends before its timeout
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    requested = event.get("queue_url")
    if requested is not None and requested not in settings.source_queue_urls:
        raise ValueError(f"queue_url {requested!r} is not one of the archiver's source queues")
    queue_urls = [requested] if requested else list(settings.source_queue_urls)
    budget = int(event.get("max_messages", settings.max_messages_per_run))
    margin_ms = settings.safety_margin_seconds * 1000

    def keep_going() -> bool:
        return context.get_remaining_time_in_millis() > margin_ms

    results = []
    for queue_url in queue_urls:
        result = archiver.archive(queue_url, max_messages=budget, keep_going=keep_going)
        budget -= result.received
        metrics.add_metric(name="Archived", unit="Count", value=result.archived)
        logger.info("sideline queue archived", extra=asdict(result) | {"objects": len(result.objects)})
        results.append(asdict(result))
        if budget <= 0:
            break
    return {"results": results}

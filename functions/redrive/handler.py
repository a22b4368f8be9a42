"""Redrive (operator: ``bin/redrive`` or invoke): move DLQ messages back to their source queue.

Event (all optional): ``{"dlq_url": ..., "max_messages": n}``; without ``dlq_url`` every pair of
``REDRIVE_PAIRS`` is redriven. Every message is moved by hand and marked redriven; ``"use_move_task":
true`` is refused before anything moves (a move task's messages would count as live work).
"""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext

from breakwater.aws.clients import DEADLINE
from breakwater.aws.redrive import MoveTaskRefusedError, build_redrive
from breakwater.observability import logger, metrics, tracer
from breakwater.settings import RedriveSettings

service = build_redrive(RedriveSettings.from_env())


@logger.inject_lambda_context
@tracer.capture_lambda_handler
@metrics.log_metrics
@DEADLINE.bounded  # every AWS call of an invocation ends before its timeout
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    if event.get("use_move_task"):
        raise MoveTaskRefusedError()
    results = []
    for dlq_url, source_url in service.pairs_for(event.get("dlq_url")).items():
        result = service.redrive(dlq_url, source_url, max_messages=event.get("max_messages"))
        logger.info("redrive", extra=result.as_dict())
        metrics.add_metric(name="Redriven", unit=MetricUnit.Count, value=result.moved)
        metrics.add_metric(name="RedriveFailed", unit=MetricUnit.Count, value=result.failed)
        results.append(result.as_dict())
    return {"results": results}

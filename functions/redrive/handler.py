"""Redrive (operator: ``bin/redrive`` or invoke): move DLQ messages back to their source queue.

Event (all optional): ``{"dlq_url": ..., "max_messages": n, "use_move_task": true}``; without
``dlq_url`` every pair of ``REDRIVE_PAIRS`` is redriven.
"""

from __future__ import annotations

from typing import Any

import boto3
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext

from breakwater.aws.redrive import RedriveMarkers, redrive
from breakwater.observability import logger, metrics, tracer
from breakwater.settings import RedriveSettings

settings = RedriveSettings.from_env()
sqs = boto3.client("sqs")
dynamodb = boto3.client("dynamodb") if settings.state_table_name else None


@logger.inject_lambda_context
@tracer.capture_lambda_handler
@metrics.log_metrics
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    wanted = event.get("dlq_url")
    if wanted is not None and wanted not in settings.redrive_pairs:
        raise ValueError(f"unknown DLQ {wanted!r}; known: {sorted(settings.redrive_pairs)}")
    pairs = {wanted: settings.redrive_pairs[wanted]} if wanted else settings.redrive_pairs
    results = []
    for dlq_url, source_url in pairs.items():
        markers = None
        if dynamodb is not None and settings.state_table_name:
            markers = RedriveMarkers(dynamodb, settings.state_table_name, dlq_url)
        result = redrive(
            sqs,
            dlq_url,
            source_url,
            markers=markers,
            max_messages=event.get("max_messages"),
            use_move_task=bool(event.get("use_move_task", True)),
        )
        logger.info("redrive", extra=result.as_dict())
        metrics.add_metric(name="Redriven", unit=MetricUnit.Count, value=result.moved)
        metrics.add_metric(name="RedriveFailed", unit=MetricUnit.Count, value=result.failed)
        results.append(result.as_dict())
    return {"results": results}

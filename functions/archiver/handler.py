"""Archiver: started by the controller when a sideline queue's oldest message or depth passes its budget.

Event: ``{"queue_url": "<one of SOURCE_QUEUE_URLS>", "max_messages": 10000}`` (both optional: without
``queue_url`` every source queue is drained in turn). Returns what was moved.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict
from typing import Any

import boto3
from aws_lambda_powertools.utilities.typing import LambdaContext

from breakwater.aws.archive import SidelineArchiver
from breakwater.aws.counters import add_counters
from breakwater.observability import logger, metrics, tracer
from breakwater.settings import ArchiverSettings

settings = ArchiverSettings.from_env()
dynamodb = boto3.client("dynamodb")


def count_archived(per_tenant: Mapping[str, int]) -> None:
    """The archived envelopes leave their tenants' backlog estimates (one ADD per tenant)."""
    for tenant, archived in per_tenant.items():
        add_counters(dynamodb, settings.state_table_name, tenant, {"archived": archived})


archiver = SidelineArchiver(
    sqs=boto3.client("sqs"),
    s3=boto3.client("s3"),
    count_archived=count_archived,
    bucket=settings.archive_bucket_name,
    prefix=settings.archive_prefix,
    max_messages_per_object=settings.max_messages_per_object,
    visibility_seconds=settings.receive_visibility_seconds,
    wait_for_delayed_seconds=settings.wait_for_delayed_seconds,
)


@logger.inject_lambda_context
@tracer.capture_lambda_handler
@metrics.log_metrics
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

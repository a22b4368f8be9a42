"""FIFO consumer: in order per message group, once per deduplication id (while its record is kept).

When a record fails, the rest of its group in the batch is returned unprocessed (order kept) while
other groups go on. Each record claims its write-ahead record before the side effect, so a duplicate
published after SQS's 5-minute window, or a redelivery after a lost delete, has no second effect;
every message that leaves the queue gives back its slot of its group's and its tenant's backlog
bounds (docs/ordering-and-streams.md). A dependency outage opens the circuit breaker: the groups it
meets are held in the queue, in order, until the next probe (:mod:`breakwater.fifo_batch`).
"""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext

from breakwater import processor as user_processor
from breakwater.aws.fifo_worker_ports import build_fifo_worker
from breakwater.envelope import Envelope
from breakwater.fifo_batch import BatchReport, FifoRecord
from breakwater.observability import logger, metrics, tracer
from breakwater.ordered import Outcome, SideEffect
from breakwater.settings import FifoWorkerSettings
from breakwater.worker.record import queue_url_from_arn

SETTINGS = FifoWorkerSettings.from_env()
if SETTINGS.processor_handler:  # the user's processor, bundled beside this handler
    user_processor.deploy(SETTINGS.processor_handler)
_OUTCOME_METRIC = {
    Outcome.PROCESSED: "Processed",
    Outcome.DUPLICATE: "Duplicates",
    Outcome.EXPIRED: "Dropped",
}


def run_user_processor(envelope: Envelope) -> list[dict[str, Any]]:
    """The side effect: the user's processor (the same one the standard workers call); the writes it
    handed to ``work.add_effect``, for the consumer to make with the message's completion."""
    work = user_processor.WorkContext()
    user_processor.process(envelope, work)
    return work.effects


# Tests may swap the side effect; it receives envelopes of one group in order, and may
# return DynamoDB transaction entries to be written with the message's completion.
SIDE_EFFECT: SideEffect = run_user_processor
# Looked up at call time, so a SIDE_EFFECT replaced after import is the one that runs.
WORKER = build_fifo_worker(SETTINGS, lambda envelope: SIDE_EFFECT(envelope))


def fifo_record(record: dict[str, Any]) -> FifoRecord:
    attributes = record.get("attributes") or {}
    return FifoRecord(
        message_id=record["messageId"],
        receipt_handle=record["receiptHandle"],
        queue_url=queue_url_from_arn(record["eventSourceARN"]),
        group_id=attributes.get("MessageGroupId"),
        receive_count=int(attributes.get("ApproximateReceiveCount", "1")),
        body=record["body"],
    )


def _emit(report: BatchReport) -> None:
    for outcome, count in report.outcomes.items():
        metrics.add_metric(name=_OUTCOME_METRIC[outcome], unit=MetricUnit.Count, value=count)
    if report.failed:
        metrics.add_metric(name="Failed", unit=MetricUnit.Count, value=report.failed)
    if report.outages:
        metrics.add_metric(name="DependencyUnavailable", unit=MetricUnit.Count, value=report.outages)
    if report.held:
        metrics.add_metric(name="HeldForOutage", unit=MetricUnit.Count, value=report.held)


@logger.inject_lambda_context(clear_state=True)
@metrics.log_metrics
@tracer.capture_lambda_handler
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    report = WORKER.handle([fifo_record(record) for record in event.get("Records", [])])
    _emit(report)
    return {"batchItemFailures": [{"itemIdentifier": message_id} for message_id in report.failures]}

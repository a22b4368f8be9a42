"""Kinesis consumer: one aggregate per key and batch, written by compare-and-swap; failures by sequence.

Aggregation needs the whole batch, so the writes run first; Powertools' BatchProcessor then reports
the records whose key could not be written (or that are not stream events) as batch item failures.
Lambda retries from the lowest of them; records after it that were already written are skipped by
the sequence-number condition, so the retry changes nothing twice.
"""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.batch import BatchProcessor, EventType, process_partial_response
from aws_lambda_powertools.utilities.batch.types import PartialItemFailureResponse
from aws_lambda_powertools.utilities.data_classes.kinesis_stream_event import KinesisStreamRecord
from aws_lambda_powertools.utilities.typing import LambdaContext

from breakwater.aws.aggregates import build_aggregate_store
from breakwater.observability import logger, metrics, tracer
from breakwater.sequencing import decode_lambda_records, write_aggregates
from breakwater.settings import StreamConsumerSettings

SETTINGS = StreamConsumerSettings.from_env()
STORE = build_aggregate_store(SETTINGS)
processor = BatchProcessor(event_type=EventType.KinesisDataStreams)


class RecordNotAppliedError(RuntimeError):
    """The record's aggregate was not written (or the record is not a stream event): Lambda retries it."""


@tracer.capture_method
def apply_batch(raw_records: list[dict[str, Any]]) -> set[str]:
    """Write the batch's aggregates; the sequence numbers that must be reported as failures."""
    decoded, not_events = decode_lambda_records(raw_records)
    for bad in not_events:
        logger.error("not a stream event", extra={"event_id": bad.event_id, "error": bad.error})
    report = write_aggregates(decoded, STORE, SETTINGS.max_cas_attempts)
    failed = report.failed_sequences | {bad.sequence_number for bad in not_events}
    for error in report.errors:
        logger.warning("aggregate write failed", extra={"error": error})
    metrics.add_metric(name="RecordsApplied", unit=MetricUnit.Count, value=report.applied_records)
    metrics.add_metric(name="RecordsSkipped", unit=MetricUnit.Count, value=report.skipped_records)
    metrics.add_metric(name="AggregateWrites", unit=MetricUnit.Count, value=report.writes)
    metrics.add_metric(name="RecordsFailed", unit=MetricUnit.Count, value=len(failed))
    return failed


@logger.inject_lambda_context(clear_state=True)
@metrics.log_metrics
@tracer.capture_lambda_handler
def handler(event: dict[str, Any], context: LambdaContext) -> PartialItemFailureResponse:
    failed = apply_batch(event.get("Records", []))

    def check(record: KinesisStreamRecord) -> None:
        if record.kinesis.sequence_number in failed:
            raise RecordNotAppliedError(record.event_id)

    return process_partial_response(event=event, record_handler=check, processor=processor, context=context)

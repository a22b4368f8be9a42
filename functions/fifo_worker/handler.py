"""FIFO consumer: in order per message group, once per deduplication id (while its record is kept).

``SqsFifoPartialProcessor(skip_group_on_error=True)``: when a record fails, the rest of its group in
the batch is returned unprocessed (order kept) while other groups go on. Each record claims its
write-ahead record before the side effect, so a duplicate published after SQS's 5-minute window,
or a redelivery after a lost delete, has no second effect; every message that leaves the queue
gives back its slot of its group's backlog bound (docs/ordering-and-streams.md).
"""

from __future__ import annotations

import time
from typing import Any

from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.batch import SqsFifoPartialProcessor, process_partial_response
from aws_lambda_powertools.utilities.batch.types import PartialItemFailureResponse
from aws_lambda_powertools.utilities.data_classes.sqs_event import SQSRecord
from aws_lambda_powertools.utilities.typing import LambdaContext

from breakwater import processor as user_processor
from breakwater.aws.fifo_worker_ports import build_fifo_consumer
from breakwater.envelope import Envelope
from breakwater.fifo_consumer import ordered_message
from breakwater.observability import logger, metrics, tracer
from breakwater.ordered import Outcome, SideEffect
from breakwater.settings import FifoWorkerSettings

SETTINGS = FifoWorkerSettings.from_env()
if SETTINGS.processor_handler:  # the user's processor, bundled beside this handler
    user_processor.deploy(SETTINGS.processor_handler)
processor = SqsFifoPartialProcessor(skip_group_on_error=True)
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
CONSUMER = build_fifo_consumer(SETTINGS, lambda envelope: SIDE_EFFECT(envelope))


def record_handler(record: SQSRecord) -> None:
    message = ordered_message(record)
    logger.append_keys(
        tenant=message.envelope.tenant, envelope_id=message.envelope.id, group_id=message.group_id
    )
    outcome = CONSUMER.consume(message, int(time.time() * 1000))
    metrics.add_metric(name=_OUTCOME_METRIC[outcome], unit=MetricUnit.Count, value=1)
    if outcome is not Outcome.PROCESSED:
        logger.info(outcome.value, extra={"dedup_id": message.dedup_id})


@logger.inject_lambda_context(clear_state=True)
@metrics.log_metrics
@tracer.capture_lambda_handler
def handler(event: dict[str, Any], context: LambdaContext) -> PartialItemFailureResponse:
    return process_partial_response(
        event=event, record_handler=record_handler, processor=processor, context=context
    )

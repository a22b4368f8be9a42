"""What a simulated configuration would cost in AWS: its calls counted as AWS bills them, priced.

The models and the in-memory ports count their calls in a :class:`Meter` (plain integers on the hot
paths); :func:`usage` turns the counts into the billed units of ``local/pricing/prices.json`` with
the billing rules of :mod:`local.pricing.usage` (SQS per 64 KB chunk, DynamoDB units per item and
twice in a transaction, Lambda GB-seconds rounded up to the millisecond at the function's memory),
and the report prices them per million delivered messages with
:func:`local.pricing.cost.cost_summary`, as every other report of the project does.

What a call carries is not modelled (a message is a few fields, an item a dict), so its size is
stated in :class:`Billing`, like the durations of the functions whose work the simulator does not
run in virtual time (ingest, the authorizer, the controller, the archiver).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from breakwater_cdk.config import BlueprintConfig
from local.pricing.cost import lambda_duration_unit
from local.pricing.usage import gb_seconds, read_units, sqs_chunks, write_units

RECEIVE_MAX = 10  # messages one SQS request carries at most (ReceiveMessage, SendMessageBatch)
# The controller's memory is the stack's constant (breakwater_cdk.control), not a setting; importing that
# module would load the CDK into every simulation, so the figure is repeated here and a test keeps
# the two equal.
CONTROLLER_MEMORY_MB = 1769


@dataclass(frozen=True)
class Billing:
    """Stated sizes and durations: what the simulator does not model but AWS bills by."""

    message_bytes: int = 1024  # one envelope as SQS stores it (body and attributes)
    item_bytes: int = 512  # a counters, bucket, lease, health or shard item: under 1 KB
    mark_bytes: int = 100  # one changed-tenant mark as the controller's Query returns it
    ingest_ms: float = 25.0  # an ingest invocation: validate, lease, SendMessage
    authorizer_ms: float = 10.0  # a REQUEST authorizer invocation (its answer is cached per key)
    controller_ms: float = 2000.0  # one scheduled controller run
    archiver_ms: float = 5000.0  # one archiver run


@dataclass
class Meter:
    """Billable calls, as counted by the models and the in-memory ports."""

    api_requests: int = 0  # requests that reached the integration (not throttled by API Gateway)
    # SQS requests by the messages each carried (0: none, e.g. a delete or a queue's attributes)
    sqs_requests: list[int] = field(default_factory=lambda: [0] * (RECEIVE_MAX + 1))
    sqs_idle_polls: int = 0  # empty long polls of idle pollers
    invocations: dict[str, int] = field(default_factory=dict)  # by function
    billed_ms: dict[str, int] = field(default_factory=dict)  # by function, each invocation rounded up
    dynamodb_writes: int = 0  # single-item writes (PutItem, UpdateItem, a BatchWriteItem's item)
    dynamodb_transact_items: int = 0  # items written in a TransactWriteItems
    dynamodb_item_reads: int = 0  # items read strongly consistently (GetItem, BatchGetItem)
    dynamodb_read_units: float = 0.0  # reads counted in units already (a Query's page)
    s3_puts: int = 0  # PUT-class requests (PutObject, ListObjectsV2)
    s3_gets: int = 0

    def invoke(self, function: str, count: int, billed_ms: int) -> None:
        self.invocations[function] = self.invocations.get(function, 0) + count
        self.billed_ms[function] = self.billed_ms.get(function, 0) + billed_ms

    def sqs(self, messages: int, requests: int = 1) -> None:
        """``requests`` SQS requests, each carrying ``messages`` messages (0: no message payload)."""
        self.sqs_requests[messages] += requests

    def sqs_batches(self, messages: int) -> None:
        """``messages`` sent or received in requests of up to ten."""
        full, rest = divmod(messages, RECEIVE_MAX)
        self.sqs_requests[RECEIVE_MAX] += full
        if rest:
            self.sqs_requests[rest] += 1

    def query(self, items: int, item_bytes: int) -> None:
        """One Query page (eventually consistent) of ``items`` items."""
        self.dynamodb_read_units += read_units(items * item_bytes)


def memory_mb(config: BlueprintConfig) -> dict[str, int]:
    """Each simulated function's configured memory, as the stack deploys it."""
    return {
        "ingest": config.ingest.memory_mb,
        "authorizer": config.ingest.memory_mb,
        "worker": config.worker.memory_mb,
        "controller": CONTROLLER_MEMORY_MB,
        "archiver": config.archive.archiver_memory_mb,
    }


def usage(meter: Meter, config: BlueprintConfig, billing: Billing) -> dict[str, float]:
    """The billed units of ``prices.json`` for what ``meter`` counted."""
    memory = memory_mb(config)
    sqs = sum(
        requests * sqs_chunks(messages * billing.message_bytes)
        for messages, requests in enumerate(meter.sqs_requests)
    )
    duration = sum(gb_seconds(ms, memory[function]) for function, ms in meter.billed_ms.items())
    counted = {
        "apigateway.rest_requests": float(meter.api_requests),
        "lambda.requests": float(sum(meter.invocations.values())),
        lambda_duration_unit(config.functions.architecture): duration,
        "sqs.standard_requests": float(sqs + meter.sqs_idle_polls),
        "dynamodb.write_request_units": float(
            meter.dynamodb_writes * write_units(billing.item_bytes)
            + meter.dynamodb_transact_items * write_units(billing.item_bytes, transactional=True)
        ),
        "dynamodb.read_request_units": meter.dynamodb_item_reads
        * read_units(billing.item_bytes, consistent=True)
        + meter.dynamodb_read_units,
        "s3.put_requests": float(meter.s3_puts),
        "s3.get_requests": float(meter.s3_gets),
    }
    return {unit: quantity for unit, quantity in counted.items() if quantity}


def stated_ms(ms: float) -> int:
    """A stated duration as Lambda bills it: whole milliseconds, rounded up."""
    return math.ceil(ms)

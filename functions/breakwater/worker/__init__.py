"""The SQS worker: the batch orchestration (``batch``), what a batch accumulates (``tally``), the
leases it gives back with its counters (``settlement``), its options and per-tenant limits
(``options``), the record it reads (``record``), the ports it talks to AWS through (``ports``) and
the metrics of a batch (``metrics``).

``breakwater.aws.worker_ports`` builds the real ports; tests and benchmarks can build others.
"""

from breakwater.sideline import is_replayed
from breakwater.worker.batch import LOG_KEYS, OutOfTimeError, Worker
from breakwater.worker.metrics import (
    FIRST_ATTEMPT_PROPERTY,
    REDRIVE,
    REPLAY,
    BatchMetrics,
    MetricRole,
    MetricsSink,
    metric_role,
)
from breakwater.worker.options import WorkerOptions, concurrency_limits, consumer_bucket_limits
from breakwater.worker.ports import LeaseGate, RateGate, WorkerPorts
from breakwater.worker.record import (
    EnvelopeSqsRecord,
    SqsMessageAttribute,
    SqsRecordAttributes,
    queue_url_from_arn,
)

__all__ = [
    "FIRST_ATTEMPT_PROPERTY",
    "LOG_KEYS",
    "REDRIVE",
    "REPLAY",
    "BatchMetrics",
    "EnvelopeSqsRecord",
    "LeaseGate",
    "MetricRole",
    "MetricsSink",
    "OutOfTimeError",
    "RateGate",
    "SqsMessageAttribute",
    "SqsRecordAttributes",
    "Worker",
    "WorkerOptions",
    "WorkerPorts",
    "concurrency_limits",
    "consumer_bucket_limits",
    "is_replayed",
    "metric_role",
    "queue_url_from_arn",
]

"""The queues: N live queues (the shuffle-sharded set) and, for the consumer side, the spillover,
backlog and surge queues. Every queue has its own DLQ, SQS-managed encryption (free, accepted by
cdk-nag) and a policy refusing plain HTTP.

Visibility timeout = worker.visibility_timeout_multiplier x worker timeout (AWS guidance for Lambda
consumers: 6x), so a message is never redelivered while a worker may still hold it.
"""

from __future__ import annotations

from dataclasses import dataclass

from aws_cdk import Duration
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from breakwater.backlog import DEAD_LETTER_SUFFIX
from breakwater_cdk.config import BlueprintConfig

# DLQs keep messages as long as SQS allows: a standard queue's message keeps its original enqueue
# time in the DLQ, so a shorter DLQ retention would silently drop failed messages.
_DLQ_RETENTION = Duration.days(14)


def dead_letter_queue(
    scope: Construct, construct_id: str, queue_name: str, *, fifo: bool | None = None
) -> sqs.Queue:
    """A queue for what its source gives up on: kept 14 days, SQS-managed encryption, TLS only."""
    return sqs.Queue(
        scope,
        construct_id,
        queue_name=queue_name,
        fifo=fifo,
        retention_period=_DLQ_RETENTION,
        encryption=sqs.QueueEncryption.SQS_MANAGED,
        enforce_ssl=True,
    )


@dataclass(frozen=True)
class QueueWithDlq:
    """A queue and its own DLQ; ``role`` is its name in docs/architecture.md (``live-0``, ``surge``)."""

    role: str
    queue: sqs.IQueue
    dlq: sqs.IQueue


class QueueSet(Construct):
    def __init__(self, scope: Construct, construct_id: str, *, config: BlueprintConfig) -> None:
        super().__init__(scope, construct_id)
        self._config = config
        self.live = [self._build_queue(f"live-{i}") for i in range(config.effective_queue_count)]
        # Sideline old and over-limit traffic so fresh messages are not stuck behind it (Builders' Library).
        self.spillover = self._build_queue("spillover")
        self.backlog = self._build_queue("backlog")
        # Deferred messages wait here (DelaySeconds per message) until their tenant has a free slot.
        self.surge = self._build_queue("surge")

    @property
    def sideline(self) -> list[QueueWithDlq]:
        return [self.spillover, self.backlog]

    @property
    def all(self) -> list[QueueWithDlq]:
        return [*self.live, *self.sideline, self.surge]

    def _build_queue(self, role: str) -> QueueWithDlq:
        construct_id = "".join(part.capitalize() for part in role.split("-"))
        name = f"{self._config.service_name}-{role}"
        # The worker finds a queue's DLQ by this name (it dead-letters some messages itself).
        dlq = dead_letter_queue(self, f"{construct_id}Dlq", f"{name}{DEAD_LETTER_SUFFIX}")
        queue = sqs.Queue(
            self,
            construct_id,
            queue_name=name,
            visibility_timeout=Duration.seconds(self._config.worker.visibility_timeout_seconds),
            retention_period=Duration.days(self._config.queue_set.retention_days),
            encryption=sqs.QueueEncryption.SQS_MANAGED,
            enforce_ssl=True,
            dead_letter_queue=sqs.DeadLetterQueue(
                queue=dlq, max_receive_count=self._config.queue_set.max_receive_count
            ),
        )
        return QueueWithDlq(role=role, queue=queue, dlq=dlq)

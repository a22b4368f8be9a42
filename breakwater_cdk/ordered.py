"""The ordered workload: a FIFO queue set in high-throughput mode, its worker, POST /v1/ordered's function.

High-throughput FIFO = deduplication per message group + throughput limit per group id, so groups
(``tenant:ordering_key``) scale out instead of sharing one queue-wide limit. Every queue has a FIFO
DLQ, SQS-managed encryption and a TLS-only policy. The worker's mapping reports batch item failures
(Powertools ``SqsFifoPartialProcessor`` with ``skip_group_on_error``), and claims a write-ahead
record per message in its own table before the side effect (docs/ordering-and-streams.md).

With the state table, each group's backlog is bounded (``ordered.max_group_backlog``): the ingest
admits a message into its group's counter before sending it, the worker releases it when done, so no
group can grow deep enough to fill a FIFO queue's scan window and hide the groups behind it.
"""

from __future__ import annotations

from aws_cdk import Duration
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_lambda_event_sources as sources
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from breakwater_cdk import environment
from breakwater_cdk.config import BlueprintConfig
from breakwater_cdk.consumers import poller_config
from breakwater_cdk.functions import BreakwaterFunction, FunctionFactory
from breakwater_cdk.queue_set import QueueWithDlq, dead_letter_queue
from breakwater_cdk.tables import BUCKET_ITEMS, build_table, grant_items

# The group backlog counters (breakwater.aws.group_backlogs): conditional UpdateItem calls only, which
# return the stored item when refused, so neither function needs to read the state table.
GROUP_BACKLOG_ITEMS = ("dynamodb:UpdateItem",)


class OrderedWorkload(Construct):
    """``queues`` (FIFO, each with its DLQ), ``write_ahead_table``, ``worker`` and ``ingest`` functions.

    ``state_table``: when given, POST /v1/ordered spends the tenant's ingest tokens (the same bucket
    as POST /v1/messages), so ordered traffic cannot bypass a tenant's rate, and a slot of the
    message group's backlog bound, which the worker gives back.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        config: BlueprintConfig,
        functions: FunctionFactory,
        state_table: dynamodb.ITable | None = None,
    ) -> None:
        super().__init__(scope, construct_id)
        self._config = config
        self._functions = functions
        self.queues = [self._build_queue(i) for i in range(config.ordered.queue_count)]
        self.write_ahead_table = self._build_write_ahead_table()
        self.worker = self._build_worker(state_table)
        self.ingest = self._build_ingest(state_table)

    def _build_queue(self, index: int) -> QueueWithDlq:
        ordered = self._config.ordered
        role = f"ordered-{index}"
        name = f"{self._config.service_name}-{role}"
        dlq = dead_letter_queue(self, f"Ordered{index}Dlq", f"{name}-dlq.fifo", fifo=True)
        queue = sqs.Queue(
            self,
            f"Ordered{index}",
            queue_name=f"{name}.fifo",
            fifo=True,
            content_based_deduplication=False,  # the dedup id is always explicit (dedup_key or envelope id)
            deduplication_scope=sqs.DeduplicationScope.MESSAGE_GROUP,
            fifo_throughput_limit=sqs.FifoThroughputLimit.PER_MESSAGE_GROUP_ID,
            visibility_timeout=Duration.seconds(ordered.visibility_timeout_seconds),
            retention_period=Duration.days(ordered.retention_days),
            encryption=sqs.QueueEncryption.SQS_MANAGED,
            enforce_ssl=True,
            dead_letter_queue=sqs.DeadLetterQueue(queue=dlq, max_receive_count=ordered.max_receive_count),
        )
        return QueueWithDlq(role=role, queue=queue, dlq=dlq)

    def _build_write_ahead_table(self) -> dynamodb.Table:
        return build_table(self, "WriteAhead", partition_key="pk", sort_key="sk", ttl_attribute="ttl")

    def _build_worker(self, state_table: dynamodb.ITable | None) -> BreakwaterFunction:
        ordered = self._config.ordered
        worker = self._functions.build(
            "FifoWorker",
            handler="fifo_worker/handler.handler",
            description="FIFO queues: in order per group, exactly once per dedup id (write-ahead record)",
            environment=environment.fifo_worker_environment(
                self._config, write_ahead=self.write_ahead_table, state=state_table
            ),
            memory_mb=ordered.memory_mb,
            timeout_seconds=ordered.timeout_seconds,
            runs_processor=True,
        )
        self.write_ahead_table.grant_read_write_data(worker.role)
        if state_table is not None:
            grant_items(state_table, worker.role, GROUP_BACKLOG_ITEMS)
        for pair in self.queues:
            worker.function.add_event_source(
                sources.SqsEventSource(
                    pair.queue,
                    batch_size=ordered.batch_size,
                    report_batch_item_failures=True,
                    max_concurrency=ordered.scaling_max_concurrency,
                    provisioned_poller_config=poller_config(ordered.provisioned_pollers),
                )
            )
        return worker

    def _build_ingest(self, state_table: dynamodb.ITable | None) -> BreakwaterFunction:
        ingest = self._functions.build(
            "OrderedIngest",
            handler="ordered_ingest/handler.handler",
            description="POST /v1/ordered: FIFO send, MessageGroupId = tenant:ordering_key",
            environment=environment.ordered_ingest_environment(
                self._config, fifo_queues=[pair.queue for pair in self.queues], state=state_table
            ),
            memory_mb=self._config.ingest.memory_mb,
            timeout_seconds=self._config.ingest.timeout_seconds,
        )
        for pair in self.queues:
            pair.queue.grant_send_messages(ingest.role)
        if state_table is not None:
            grant_items(state_table, ingest.role, tuple(dict.fromkeys((*BUCKET_ITEMS, *GROUP_BACKLOG_ITEMS))))
        return ingest

"""The consumer side: one worker handler deployed as two functions.

LiveWorker drains the live queues and the surge queue; SidelineWorker drains spillover and backlog.
Every mapping reports batch item failures, so one bad message is retried (and dead-lettered) alone.
The sideline mappings are created disabled: the controller enables them only while the live
queues are healthy, so draining old traffic never competes with fresh traffic during an incident.
"""

from __future__ import annotations

from aws_cdk import Duration
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_lambda_event_sources as sources
from constructs import Construct

from breakwater_cdk import environment
from breakwater_cdk.ceilings import WorkerMode
from breakwater_cdk.config import BlueprintConfig, ProvisionedPollersConfig
from breakwater_cdk.functions import BreakwaterFunction, FunctionFactory
from breakwater_cdk.queue_set import QueueSet, QueueWithDlq
from breakwater_cdk.tables import WORKER_STATE, Tables, grant_items

WORKER_HANDLER = "worker/handler.handler"


def poller_config(pollers: ProvisionedPollersConfig | None) -> lambda_.ProvisionedPollerConfig | None:
    """The mapping's provisioned mode, both bounds written out; None leaves it on demand."""
    if pollers is None:
        return None
    return lambda_.ProvisionedPollerConfig(
        minimum_pollers=pollers.minimum_pollers, maximum_pollers=pollers.maximum_pollers
    )


class Consumers(Construct):
    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        config: BlueprintConfig,
        functions: FunctionFactory,
        tables: Tables,
        queues: QueueSet,
    ) -> None:
        super().__init__(scope, construct_id)
        self._config = config
        self._functions = functions
        self._tables = tables
        self._queues = queues
        self.live_worker = self._build_worker("LiveWorker", "live")
        self.sideline_worker = self._build_worker("SidelineWorker", "sideline")
        self.live_mappings = [
            self._subscribe(self.live_worker, pair, enabled=True) for pair in [*queues.live, queues.surge]
        ]
        self.sideline_mappings = [
            self._subscribe(self.sideline_worker, pair, enabled=False) for pair in queues.sideline
        ]

    def _build_worker(self, construct_id: str, mode: WorkerMode) -> BreakwaterFunction:
        worker = self._functions.build(
            construct_id,
            handler=WORKER_HANDLER,
            description=f"SQS worker ({mode} mode): drop, sideline, spill, defer or process each message",
            environment=environment.worker_environment(
                self._config, mode=mode, tables=self._tables, queues=self._queues
            ),
            memory_mb=self._config.worker.memory_mb,
            timeout_seconds=self._config.worker.timeout_seconds,
            runs_processor=True,
        )
        grant_items(self._tables.state, worker.role, WORKER_STATE)
        self._tables.idempotency.grant_read_write_data(worker.role)
        self._tables.tenants.grant_read_data(worker.role)
        # Moves: SIDELINE -> backlog, SPILL -> spillover, DEFER -> surge (or the sideline queue itself).
        for pair in (self._queues.spillover, self._queues.backlog, self._queues.surge):
            pair.queue.grant_send_messages(worker.role)
        return worker

    def _subscribe(
        self, worker: BreakwaterFunction, pair: QueueWithDlq, *, enabled: bool
    ) -> sources.SqsEventSource:
        """Map ``pair.queue`` to ``worker``; grants receive, delete and visibility changes on it, and
        sends to its DLQ only."""
        settings = self._config.worker
        window = settings.batching_window_seconds
        source = sources.SqsEventSource(
            pair.queue,
            batch_size=settings.batch_size,
            max_batching_window=Duration.seconds(window) if window else None,
            max_concurrency=settings.scaling_max_concurrency,
            provisioned_poller_config=poller_config(settings.provisioned_pollers),
            report_batch_item_failures=True,
            enabled=enabled,
        )
        worker.function.add_event_source(source)
        # A message moved between failures is dead-lettered by the worker itself (SQS's count restarts).
        pair.dlq.grant_send_messages(worker.role)
        return source

"""``Breakwater``: the construct a CDK app instantiates; it composes one construct per concern, they build.

Two instances in one stack or one account never collide: every name AWS needs unique (queues, the
stream, the API and its usage plans, the dashboard, the Contributor Insights rules) and the metrics'
``service`` dimension carry the instance's name, the configured ``service_name`` and a hash of the
construct's path (:attr:`Breakwater.instance_name`).
"""

from __future__ import annotations

from aws_cdk import CfnOutput, CfnResource, Duration, Fn, Stack
from constructs import Construct

from breakwater_cdk import environment
from breakwater_cdk.archive import ArchiveAndReplay
from breakwater_cdk.async_failures import AsyncFailures
from breakwater_cdk.config import BlueprintConfig, ConfigError
from breakwater_cdk.consumers import Consumers
from breakwater_cdk.control import ControlPlane
from breakwater_cdk.encryption import StackKey
from breakwater_cdk.functions import BreakwaterFunction, FunctionFactory
from breakwater_cdk.ingress import Ingress
from breakwater_cdk.insights import TenantInsights
from breakwater_cdk.monitoring import Monitoring
from breakwater_cdk.nag import acknowledge_findings
from breakwater_cdk.ordered import OrderedWorkload
from breakwater_cdk.processor import Processor
from breakwater_cdk.queue_set import QueueSet
from breakwater_cdk.request_schemas import events_schema, ordered_message_schema
from breakwater_cdk.streaming import StreamingWorkload
from breakwater_cdk.tables import INGEST_KEYS, INGEST_STATE, Tables, grant_items

MAX_STACK_RESOURCES = 500  # CloudFormation's limit per stack


class Breakwater(Construct):
    """The whole system: API, queues, workers, controller, archive, alarms; optional workloads.

    ``config`` is the typed configuration (:class:`breakwater_cdk.config.BreakwaterConfig`, what
    cdk.json's ``breakwater`` object is validated into); ``processor`` the user's code the live,
    sideline and FIFO workers run (:class:`breakwater_cdk.processor.Processor`). ``output_prefix``
    prefixes the logical ids of the stack outputs (``ApiUrl``, ``TenantsTableName``...); it defaults
    to the construct's id, and an app with one instance may pass ``""`` for the plain names
    ``bin/tenants`` reads.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        config: BlueprintConfig,
        processor: Processor,
        output_prefix: str | None = None,
    ) -> None:
        super().__init__(scope, construct_id)
        self.instance_name = f"{config.service_name}-{self.node.addr[-8:]}"
        # Every physical name and the metrics' service dimension come from the instance's name.
        self.config = config.model_copy(update={"service_name": self.instance_name})
        config = self.config
        self._output_prefix = construct_id if output_prefix is None else output_prefix
        self.key = StackKey(self, "Encryption", config=config).key
        self.tables = Tables(self, "Tables")
        self.queues = QueueSet(self, "Queues", config=config)
        self.processor = processor
        self.functions = FunctionFactory(self, "Functions", config=config, key=self.key, processor=processor)
        self.authorizer = self._build_authorizer()
        self.ingest = self._build_ingest()
        self.ingress = Ingress(
            self,
            "Ingress",
            config=config,
            key=self.key,
            authorizer_function=self.authorizer.function,
            ingest_function=self.ingest.function,
        )
        self.consumers = Consumers(
            self, "Consumers", config=config, functions=self.functions, tables=self.tables, queues=self.queues
        )
        self.control = ControlPlane(
            self,
            "Control",
            config=config,
            functions=self.functions,
            tables=self.tables,
            queues=self.queues,
            sideline_mappings=self.consumers.sideline_mappings,
        )
        self.monitoring = self._build_monitoring()
        self.monitoring.watch_stage(self.ingress.api.deployment_stage)
        self.archive = ArchiveAndReplay(
            self,
            "Archive",
            config=config,
            functions=self.functions,
            key=self.key,
            live_queues=[pair.queue for pair in self.queues.live],
            sideline_queues=[pair.queue for pair in self.queues.sideline],
            state_table=self.tables.state,
        )
        # The controller parks a sideline queue past its budget: it may start the archiver, nothing more.
        self.archive.grant_start(self.control.controller.role)
        for name, value in self.archive.controller_environment().items():
            self.control.controller.function.add_environment(name, value)
        self.async_failures = self._build_async_failures()
        self.ordered = self._build_ordered() if config.ordered.enabled else None
        self.streaming = self._build_streaming() if config.streaming.enabled else None
        self.insights = self._build_insights()  # after the workloads: their front doors are read too
        self.monitoring.add_alarm_overview()  # last: every alarm above, the workloads' included
        self._build_outputs()
        acknowledge_findings(self)
        self._check_resource_count()

    @property
    def workers(self) -> list[BreakwaterFunction]:
        """The functions that run the processor (``.role`` holds its grants: acknowledge a cdk-nag
        finding of one of them there, e.g. ``acknowledge(worker.role, "AwsSolutions-IAM5[...]", why)``)."""
        workers = [self.consumers.live_worker, self.consumers.sideline_worker]
        return workers if self.ordered is None else [*workers, self.ordered.worker]

    def _build_monitoring(self) -> Monitoring:
        alarms = self.config.alarms
        monitoring = Monitoring(self, "Monitoring", config=self.config, key=self.key)
        monitoring.watch_queues(
            self.queues.live, oldest_age_seconds=alarms.oldest_message_age_seconds, title="Live queues"
        )
        monitoring.watch_queues(
            self.queues.sideline,
            oldest_age_seconds=alarms.sideline_oldest_message_age_seconds,
            title="Sideline queues",
        )
        # A deferred message waits up to max_defer_seconds by design before it may be received.
        monitoring.watch_queues(
            [self.queues.surge],
            oldest_age_seconds=alarms.oldest_message_age_seconds + self.config.sideline.max_defer_seconds,
            title="Surge queue",
        )
        monitoring.watch_age_of_first_attempt()
        monitoring.watch_age_of_attempt()
        monitoring.watch_polling_headroom(self.queues.live)
        # SQS publishes the quiet and noisy groups' metrics only for messages with a MessageGroupId.
        if self.config.queue_set.fair_queues:
            monitoring.watch_fair_queues(self.queues.live)
        monitoring.watch_throttling()
        return monitoring

    def _build_async_failures(self) -> AsyncFailures:
        failures = AsyncFailures(self, "AsyncFailures", config=self.config, monitoring=self.monitoring)
        failures.send_failures_of(
            self.control.controller,
            retry_attempts=0,
            max_event_age=Duration.minutes(1),
            why="A failed or late run is not retried: the next one is a minute away and reads fresh state.",
        )
        failures.send_failures_of(
            self.archive.archiver,
            retry_attempts=0,
            max_event_age=Duration.minutes(5),
            why="A failed run is not retried: the controller starts it again on its next run while the "
            "budget is still exceeded, and messages leave their queue only once archived.",
        )
        failures.send_failures_of(
            self.control.redrive,
            retry_attempts=0,
            max_event_age=Duration.hours(1),
            why="A failed redrive is for the operator to read and start again, not to repeat unseen.",
        )
        return failures

    def _build_insights(self) -> TenantInsights:
        front_door = [self.ingest]
        if self.ordered is not None:
            front_door.append(self.ordered.ingest)
        if self.streaming is not None:
            front_door.append(self.streaming.events)
        workers = [self.consumers.live_worker, self.consumers.sideline_worker]
        insights = TenantInsights(
            self,
            "TenantInsights",
            config=self.config,
            live_worker=self.consumers.live_worker.log_group,
            workers=[worker.log_group for worker in workers],
            front_door=[function.log_group for function in front_door],
        )
        self.monitoring.show_tenant_insights(insights)
        return insights

    def _build_ordered(self) -> OrderedWorkload:
        ordered = OrderedWorkload(
            self, "Ordered", config=self.config, functions=self.functions, state_table=self.tables.state
        )
        self.ingress.add_route(
            "ordered", ordered.ingest.function, "OrderedMessage", ordered_message_schema(self.config)
        )
        self.monitoring.watch_queues(
            ordered.queues,
            oldest_age_seconds=self.config.alarms.oldest_message_age_seconds,
            title="Ordered queues",
        )
        self.monitoring.watch_ordered()
        self._redrive_ordered(ordered)
        return ordered

    def _redrive_ordered(self, ordered: OrderedWorkload) -> None:
        """The redrive function moves the FIFO DLQs back too; the control plane is built before them."""
        redrive = self.control.redrive
        pairs = [(pair.dlq, pair.queue) for pair in ordered.queues]
        values = environment.redrive_environment(
            self, tables=self.tables, queues=self.queues, extra_pairs=pairs
        )
        redrive.function.add_environment("REDRIVE_PAIRS", values["REDRIVE_PAIRS"])
        for dlq, queue in pairs:
            dlq.grant_consume_messages(redrive.role)  # moved by hand, each message marked redriven
            queue.grant_send_messages(redrive.role)

    def _build_streaming(self) -> StreamingWorkload:
        streaming = StreamingWorkload(
            self,
            "Streaming",
            config=self.config,
            functions=self.functions,
            alarm_topic=self.monitoring.topic,
            state_table=self.tables.state,
        )
        self.ingress.add_route("events", streaming.events.function, "Events", events_schema(self.config))
        self.monitoring.watch_stream(streaming.stream, streaming.alarms)
        return streaming

    def _build_authorizer(self) -> BreakwaterFunction:
        authorizer = self.functions.build(
            "Authorizer",
            handler="authorizer/handler.handler",
            description="REQUEST authorizer: tenant and tier from the API key's hash",
            environment=environment.authorizer_environment(self.config, tenants=self.tables.tenants),
            memory_mb=self.config.ingest.memory_mb,
            timeout_seconds=self.config.ingest.timeout_seconds,
        )
        self.tables.tenants.grant_read_data(authorizer.role)
        return authorizer

    def _build_ingest(self) -> BreakwaterFunction:
        live = [pair.queue for pair in self.queues.live]
        ingest = self.functions.build(
            "Ingest",
            handler="ingest/handler.handler",
            description="POST /v1/messages: validate, throttle per tenant, route to a live queue",
            environment=environment.ingest_environment(
                self.config, state=self.tables.state, live_queues=live, keys=self.tables.idempotency
            ),
            memory_mb=self.config.ingest.memory_mb,
            timeout_seconds=self.config.ingest.timeout_seconds,
        )
        grant_items(self.tables.state, ingest.role, INGEST_STATE)
        grant_items(self.tables.idempotency, ingest.role, INGEST_KEYS)
        for queue in live:
            queue.grant_send_messages(ingest.role)  # includes GetQueueAttributes for the cached depth
        return ingest

    def _output(self, name: str, *, value: str, description: str | None = None) -> None:
        output = CfnOutput(self, name, value=value, description=description)
        output.override_logical_id(f"{self._output_prefix}{name}")

    def _build_outputs(self) -> None:
        routes = ", ".join(f"v1/{path}" for path in self.ingress.routes)
        self._output("ApiUrl", value=self.ingress.url, description=f"base URL; POST {routes}")
        self._output("TenantsTableName", value=self.tables.tenants.table_name)
        self._output(
            "EdgeUsagePlans",
            value=self.ingress.edge_plans_json(),
            description="the API, its stage and each tier's usage plan: bin/tenants enrols keys in them",
        )
        self._output("StateTableName", value=self.tables.state.table_name)
        self._output("IdempotencyTableName", value=self.tables.idempotency.table_name)
        self._output("AlarmTopicArn", value=self.monitoring.topic.topic_arn)
        self._output("ArchiveBucketName", value=self.archive.bucket.bucket_name)
        self._output("ReplayJobName", value=self.archive.job.job_name)
        for pair in self.queues.all:
            name = "".join(part.capitalize() for part in pair.role.split("-"))
            self._output(f"{name}QueueUrl", value=pair.queue.queue_url)
            self._output(f"{name}DlqUrl", value=pair.dlq.queue_url)
        for function in self.functions.built:
            self._output(f"{function.name}FunctionName", value=function.function.function_name)
        self._output(
            "SidelineMappingUuids",
            value=Fn.join(",", [m.event_source_mapping_id for m in self.consumers.sideline_mappings]),
        )
        if self.ordered is not None:
            self._output("WriteAheadTableName", value=self.ordered.write_ahead_table.table_name)
            for index, pair in enumerate(self.ordered.queues):
                self._output(f"Ordered{index}QueueUrl", value=pair.queue.queue_url)
                self._output(f"Ordered{index}DlqUrl", value=pair.dlq.queue_url)
        if self.streaming is not None:
            self._output("EventStreamName", value=self.streaming.stream.stream_name)
            self._output("EventStreamArn", value=self.streaming.stream.stream_arn)
            self._output("AggregatesTableName", value=self.streaming.aggregates_table.table_name)
            self._output("StreamFailuresQueueUrl", value=self.streaming.failures.queue_url)
        self._output("AsyncFailuresQueueUrl", value=self.async_failures.queue.queue_url)

    def _check_resource_count(self) -> None:
        """A stack CloudFormation would refuse is a config error naming the keys that size it."""
        stack = Stack.of(self)
        count = sum(1 for node in stack.node.find_all() if isinstance(node, CfnResource))
        if count > MAX_STACK_RESOURCES:
            config = self.config
            raise ConfigError(
                f"the stack would have {count} resources; CloudFormation allows {MAX_STACK_RESOURCES} per "
                f"stack. Lower breakwater.queue_set.size ({config.queue_set.size}, each live queue adds "
                f"about 8) or breakwater.ordered.queue_count ({config.ordered.queue_count})"
            )

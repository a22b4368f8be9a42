"""The streaming workload: a Kinesis stream, POST /v1/events' function, the consumer and its aggregates table.

The consumer's mapping bisects a failing batch, retries a bounded number of times, drops records
older than ``max_record_age`` and sends what it gives up on to an SQS on-failure destination, so a
poison record delays its shard for minutes, not until the stream's retention runs out. Alarms watch
the iterator age (the stream's backlog) and read/write throughput exceeded.
"""

from __future__ import annotations

from aws_cdk import Duration, RemovalPolicy
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kinesis as kinesis
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_lambda_event_sources as sources
from aws_cdk import aws_sns as sns
from constructs import Construct

from breakwater_cdk import environment
from breakwater_cdk.config import BlueprintConfig
from breakwater_cdk.functions import BreakwaterFunction, FunctionFactory
from breakwater_cdk.monitoring import notifying_alarm
from breakwater_cdk.queue_set import dead_letter_queue
from breakwater_cdk.tables import BUCKET_ITEMS, build_table, grant_items

_MINUTE = Duration.minutes(1)
# The data-plane actions a Kinesis resource policy may name for a stream (no wildcard: the policy is
# checked against the actions Kinesis supports there).
_STREAM_ACTIONS = [
    "kinesis:DescribeStream",
    "kinesis:DescribeStreamSummary",
    "kinesis:GetRecords",
    "kinesis:GetShardIterator",
    "kinesis:ListShards",
    "kinesis:PutRecord",
    "kinesis:PutRecords",
]


class StreamingWorkload(Construct):
    """The stream, ``events`` (POST /v1/events), ``consumer``, ``aggregates_table``, ``failures``."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        config: BlueprintConfig,
        functions: FunctionFactory,
        alarm_topic: sns.ITopic,
        state_table: dynamodb.ITable | None = None,
    ) -> None:
        super().__init__(scope, construct_id)
        self._config = config
        self._state_table = state_table
        self._functions = functions
        self._topic = alarm_topic
        self.alarms: list[cloudwatch.Alarm] = []
        self.stream = self._build_stream()
        self.aggregates_table = self._build_aggregates_table()
        self.failures = dead_letter_queue(self, "ConsumerFailures", f"{config.service_name}-stream-failures")
        self.events = self._build_events()
        self.consumer = self._build_consumer()
        self._build_alarms()

    def _build_stream(self) -> kinesis.Stream:
        streaming = self._config.streaming
        provisioned = streaming.capacity_mode == "provisioned"
        stream = kinesis.Stream(
            self,
            "Stream",
            stream_name=f"{self._config.service_name}-events",
            stream_mode=kinesis.StreamMode.PROVISIONED if provisioned else kinesis.StreamMode.ON_DEMAND,
            shard_count=streaming.shard_count if provisioned else None,
            retention_period=Duration.hours(streaming.retention_hours),
            encryption=kinesis.StreamEncryption.MANAGED,
            removal_policy=RemovalPolicy.DESTROY,
        )
        # TLS only, as the queues, the tables and the topic (AWS::Kinesis::ResourcePolicy). The actions are
        # named one by one because Kinesis accepts only those it supports for a stream (_STREAM_ACTIONS).
        stream.add_to_resource_policy(
            iam.PolicyStatement(
                sid="DenyPlainHttp",
                effect=iam.Effect.DENY,
                principals=[iam.AnyPrincipal()],
                actions=_STREAM_ACTIONS,
                resources=[stream.stream_arn],
                conditions={"Bool": {"aws:SecureTransport": "false"}},
            )
        )
        return stream

    def _build_aggregates_table(self) -> dynamodb.Table:
        return build_table(self, "Aggregates", partition_key="pk", sort_key="sk")

    def _build_events(self) -> BreakwaterFunction:
        streaming = self._config.streaming
        # Where the tenants' event buckets live; the naive baseline admits every event.
        buckets = self._state_table if self._config.mode != "naive" else None
        events = self._functions.build(
            "Events",
            handler="events/handler.handler",
            description="POST /v1/events: one event or up to 500 into Kinesis, failed subset retried",
            environment=environment.events_environment(
                self._config, stream_arn=self.stream.stream_arn, state=buckets
            ),
            memory_mb=streaming.events_memory_mb,
            timeout_seconds=streaming.events_timeout_seconds,
        )
        self.stream.grant_write(events.role)
        if buckets is not None:
            grant_items(buckets, events.role, BUCKET_ITEMS)
        return events

    def _build_consumer(self) -> BreakwaterFunction:
        streaming = self._config.streaming
        consumer = self._functions.build(
            "StreamConsumer",
            handler="stream_consumer/handler.handler",
            description="Kinesis: one aggregate per key and batch, CAS on (shard, sequence number)",
            environment=environment.stream_consumer_environment(aggregates=self.aggregates_table),
            memory_mb=streaming.consumer_memory_mb,
            timeout_seconds=streaming.consumer_timeout_seconds,
        )
        self.aggregates_table.grant_read_write_data(consumer.role)
        consumer.function.add_event_source(
            sources.KinesisEventSource(
                self.stream,
                starting_position=lambda_.StartingPosition.TRIM_HORIZON,
                batch_size=streaming.batch_size,
                max_batching_window=Duration.seconds(streaming.batching_window_seconds),
                bisect_batch_on_error=True,
                retry_attempts=streaming.retry_attempts,
                max_record_age=Duration.seconds(streaming.max_record_age_seconds),
                parallelization_factor=streaming.parallelization_factor,
                report_batch_item_failures=True,
                on_failure=sources.SqsDlq(self.failures),
            )
        )
        return consumer

    def _alarm(
        self, construct_id: str, description: str, metric: cloudwatch.IMetric, threshold: float
    ) -> None:
        alarm = notifying_alarm(
            self,
            construct_id,
            topic=self._topic,
            description=description,
            metric=metric,
            threshold=threshold,
            comparison=cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
            evaluation_periods=1,
        )
        self.alarms.append(alarm)

    def _build_alarms(self) -> None:
        streaming = self._config.streaming
        five_minutes = Duration.minutes(5)
        self._alarm(
            "IteratorAge",
            f"stream consumer more than {streaming.iterator_age_alarm_ms} ms behind: a backlog is building",
            self.stream.metric_get_records_iterator_age_milliseconds(period=_MINUTE, statistic="Maximum"),
            streaming.iterator_age_alarm_ms,
        )
        self._alarm(
            "ReadThroughputExceeded",
            "reads throttled on the stream: consumers exceed the shards' read capacity",
            self.stream.metric_read_provisioned_throughput_exceeded(period=five_minutes, statistic="Sum"),
            streaming.throughput_exceeded_alarm,
        )
        self._alarm(
            "WriteThroughputExceeded",
            "writes throttled: POST /v1/events answers 207/429; add shards or use tenant_and_key",
            self.stream.metric_write_provisioned_throughput_exceeded(period=five_minutes, statistic="Sum"),
            streaming.throughput_exceeded_alarm,
        )
        self._alarm(
            "ConsumerGaveUp",
            "the stream consumer gave up on a batch (its shard and sequence range are in the failures queue)",
            self.failures.metric_approximate_number_of_messages_visible(period=_MINUTE, statistic="Maximum"),
            1,
        )

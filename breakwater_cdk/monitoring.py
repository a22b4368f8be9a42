"""Alarms, their topic and the dashboard.

The Builders' Library's rule: watch the age of the oldest message, not the depth; a growing age is
the first sign of a backlog that will not drain by itself. Any message in a DLQ is an incident.
"""

from __future__ import annotations

from aws_cdk import Duration
from aws_cdk import aws_apigateway as apigw
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_cloudwatch_actions as actions
from aws_cdk import aws_kinesis as kinesis
from aws_cdk import aws_kms as kms
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sns_subscriptions as subscriptions
from constructs import Construct

from breakwater_cdk.config import BlueprintConfig
from breakwater_cdk.insights import TenantInsights
from breakwater_cdk.queue_set import QueueWithDlq

_MINUTE = Duration.minutes(1)
STAGE_ALARM_SHARE = 0.8  # of the stage throttle: room to react before every tenant is refused
# What SQS publishes per queue (AWS/SQS, dimension QueueName) for messages with a MessageGroupId, which
# ingest and the worker's moves set to the tenant: a noisy group is a tenant SQS found holding a
# disproportionate share of the consumers; the quiet groups are every other tenant.
QUIET_GROUPS_OLDEST_AGE = "ApproximateAgeOfOldestMessageInQuietGroups"
NOISY_GROUPS = "ApproximateNumberOfNoisyGroups"


def notifying_alarm(
    scope: Construct,
    construct_id: str,
    *,
    topic: sns.ITopic,
    description: str,
    metric: cloudwatch.IMetric,
    threshold: float,
    comparison: cloudwatch.ComparisonOperator,
    evaluation_periods: int,
    datapoints_to_alarm: int | None = None,
) -> cloudwatch.Alarm:
    """An alarm that notifies ``topic`` when it fires and when it recovers; no data is not an incident."""
    alarm = cloudwatch.Alarm(
        scope,
        construct_id,
        alarm_description=description,
        metric=metric,
        threshold=threshold,
        comparison_operator=comparison,
        evaluation_periods=evaluation_periods,
        datapoints_to_alarm=datapoints_to_alarm,
        treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
    )
    alarm.add_alarm_action(actions.SnsAction(topic))
    alarm.add_ok_action(actions.SnsAction(topic))
    return alarm


class Monitoring(Construct):
    def __init__(
        self, scope: Construct, construct_id: str, *, config: BlueprintConfig, key: kms.IKey
    ) -> None:
        super().__init__(scope, construct_id)
        self._config = config
        self.topic = sns.Topic(
            self,
            "AlarmTopic",
            display_name=f"{config.service_name} alarms",
            master_key=key,
            enforce_ssl=True,
        )
        self.email_subscription = (
            self.topic.add_subscription(subscriptions.EmailSubscription(config.alarms.email))
            if config.alarms.email
            else None
        )
        self.alarms: list[cloudwatch.Alarm] = []
        self.dashboard = cloudwatch.Dashboard(
            self,
            "Dashboard",
            dashboard_name=f"{config.service_name}-backlogs",
            default_interval=Duration.hours(3),
        )

    def watch_queues(self, pairs: list[QueueWithDlq], *, oldest_age_seconds: int, title: str) -> None:
        """Age of the oldest message on each queue, and any visible message on each DLQ."""
        age_alarms = [self._oldest_age_alarm(pair, oldest_age_seconds) for pair in pairs]
        dlq_alarms = [self._dlq_alarm(pair) for pair in pairs]
        self.dashboard.add_widgets(
            cloudwatch.GraphWidget(
                title=f"{title}: age of oldest message (s)",
                left=[
                    pair.queue.metric_approximate_age_of_oldest_message(
                        period=_MINUTE, statistic="Maximum", label=pair.role
                    )
                    for pair in pairs
                ],
                left_annotations=[cloudwatch.HorizontalAnnotation(value=oldest_age_seconds, label="alarm")],
                width=12,
            ),
            cloudwatch.AlarmStatusWidget(title=f"{title}: alarms", alarms=age_alarms + dlq_alarms, width=12),
        )

    def watch_fair_queues(self, live: list[QueueWithDlq]) -> None:
        """SQS fair queues' own view of each live queue: the age of its oldest message outside the noisy
        tenants (alarmed), and how many tenants SQS counts as noisy.

        The queue's ``OldestAge`` alarm fires for any backlog, one tenant's flood included, and fair
        queues keep such a flood from delaying the other tenants; this one fires only when the quiet
        tenants wait too: the consumers are behind everyone, not just one tenant.
        """
        threshold = self._config.alarms.quiet_groups_threshold_seconds
        ages = [
            pair.queue.metric(QUIET_GROUPS_OLDEST_AGE, period=_MINUTE, statistic="Maximum") for pair in live
        ]
        for pair, age in zip(live, ages, strict=True):
            self.alarm(
                f"QuietGroupsAge-{pair.role}",
                description=(
                    f"{pair.role}: oldest message outside the noisy tenants older than {threshold}s for "
                    "3 minutes: quiet tenants wait too, so the consumers are behind everyone, not one tenant"
                ),
                metric=age,
                threshold=threshold,
                comparison=cloudwatch.ComparisonOperator.GREATER_THAN_THRESHOLD,
                evaluation_periods=3,
                datapoints_to_alarm=3,
            )
        self.dashboard.add_widgets(
            cloudwatch.GraphWidget(
                title="Live queues: age of oldest message outside noisy tenants (s)",
                left=[age.with_(label=pair.role) for pair, age in zip(live, ages, strict=True)],
                left_annotations=[cloudwatch.HorizontalAnnotation(value=threshold, label="alarm")],
                width=12,
            ),
            cloudwatch.GraphWidget(
                title="Live queues: noisy tenants (fair queues' noisy message groups)",
                left=[
                    pair.queue.metric(NOISY_GROUPS, period=_MINUTE, statistic="Maximum", label=pair.role)
                    for pair in live
                ],
                width=12,
            ),
        )

    def show_tenant_insights(self, insights: TenantInsights) -> None:
        """Per rule: its top contributor's value and its number of contributors over time, and beside
        it the same ranking with the tenants' names (a Logs Insights table over the rule's log groups)."""
        for rule in insights.rules:
            self.dashboard.add_widgets(
                cloudwatch.GraphWidget(
                    title=rule.title,
                    left=[self._insight_rule_metric(rule.name, "MaxContributorValue", rule.value)],
                    right=[self._insight_rule_metric(rule.name, "UniqueContributors", "tenants")],
                    width=12,
                ),
                cloudwatch.LogQueryWidget(
                    title=f"{rule.title}: top 10",
                    log_group_names=[group.log_group_name for group in rule.log_groups],
                    query_string=rule.top_tenants_query,
                    view=cloudwatch.LogQueryVisualizationType.TABLE,
                    width=12,
                ),
            )

    @staticmethod
    def _insight_rule_metric(rule_name: str, statistic: str, label: str) -> cloudwatch.MathExpression:
        return cloudwatch.MathExpression(
            expression=f"INSIGHT_RULE_METRIC('{rule_name}', '{statistic}')",
            using_metrics={},
            label=label,
            period=Duration.minutes(5),
        )

    def add_alarm_overview(self) -> None:
        """One status widget with every alarm: "is anything wrong?" at a glance."""
        overview = cloudwatch.AlarmStatusWidget(title="All alarms", alarms=self.alarms, width=24)
        self.dashboard.add_widgets(overview)

    def watch_age_of_first_attempt(self) -> None:
        """p99 of how long a live message waited for its first processing attempt (worker EMF)."""
        threshold = self._config.alarms.age_of_first_attempt_p99_ms
        self._watch_age_p99(
            "AgeOfFirstAttempt",
            threshold,
            description=f"p99 AgeOfFirstAttempt on live queues above the {threshold} ms SLO",
            title="AgeOfFirstAttempt p99 (ms) by queue role",
        )

    def watch_age_of_attempt(self) -> None:
        """p99 age of live messages on a later attempt (retries): a dependency failing or a stuck tenant."""
        threshold = self._config.alarms.age_of_attempt_p99_ms
        self._watch_age_p99(
            "AgeOfAttempt",
            threshold,
            description=(
                f"p99 AgeOfAttempt (retried live messages) above {threshold} ms: "
                "messages keep failing and coming back; look at the processor's errors and the DLQs"
            ),
            title="AgeOfAttempt p99 (ms) of retried messages by queue role",
        )

    def _watch_age_p99(self, metric_name: str, threshold: int, *, description: str, title: str) -> None:
        """An alarm on the live role's p99 of a worker age metric, and a graph of it by queue role."""
        alarm = self.alarm(
            f"{metric_name}P99",
            description=description,
            metric=self._service_metric(
                metric_name, statistic="p99", period=_MINUTE, dimensions={"QueueRole": "live"}
            ),
            threshold=threshold,
            comparison=cloudwatch.ComparisonOperator.GREATER_THAN_THRESHOLD,
            evaluation_periods=5,
            datapoints_to_alarm=3,
        )
        self.dashboard.add_widgets(
            cloudwatch.GraphWidget(
                title=title,
                left=[
                    self._service_metric(
                        metric_name, statistic="p99", period=_MINUTE, dimensions={"QueueRole": role}
                    ).with_(label=role)
                    for role in ("live", "surge", "spillover", "backlog", "replay", "redrive")
                ],
                left_annotations=[alarm.to_annotation()],
                width=12,
            )
        )

    def watch_polling_headroom(self, live: list[QueueWithDlq]) -> None:
        """Empty receives / all receives per live queue: near zero while messages flow means the pollers
        never find the queue empty, i.e. no headroom left before a backlog forms."""
        minimum = self._config.alarms.empty_receive_ratio_min
        per_call = min(10, self._config.worker.batch_size)  # one ReceiveMessage returns at most 10
        ratios = [self._empty_receive_ratio(pair, index, per_call) for index, pair in enumerate(live)]
        alarms = [
            self.alarm(
                f"PollingHeadroom-{pair.role}",
                description=(
                    f"{pair.role}: empty-receive ratio below {minimum} while messages flow: "
                    "the workers have no polling headroom (raise max concurrency or add queues)"
                ),
                metric=ratio,
                threshold=minimum,
                comparison=cloudwatch.ComparisonOperator.LESS_THAN_THRESHOLD,
                evaluation_periods=5,
                datapoints_to_alarm=5,
            )
            for pair, ratio in zip(live, ratios, strict=True)
        ]
        self.dashboard.add_widgets(
            cloudwatch.GraphWidget(
                title="Live queues: empty-receive ratio",
                left=ratios,
                left_annotations=[cloudwatch.HorizontalAnnotation(value=minimum, label="alarm")],
                width=12,
            ),
            cloudwatch.AlarmStatusWidget(title="Polling headroom", alarms=alarms, width=12),
        )

    def watch_throttling(self) -> None:
        """Requests the ingest token buckets refused (ingest EMF ``Throttled``)."""
        threshold = self._config.alarms.throttled_requests
        metric = self._service_metric("Throttled", statistic="Sum", period=Duration.minutes(5))
        alarm = self.alarm(
            "ThrottledRequests",
            description=f"more than {threshold} requests throttled in 5 minutes: a tenant is over its limits",
            metric=metric,
            threshold=threshold,
            comparison=cloudwatch.ComparisonOperator.GREATER_THAN_THRESHOLD,
            evaluation_periods=1,
        )
        self.dashboard.add_widgets(
            cloudwatch.GraphWidget(
                title="Ingest: accepted / throttled / rejected (per 5 min)",
                left=[
                    self._service_metric(name, statistic="Sum", period=Duration.minutes(5))
                    for name in ("Accepted", "Throttled", "Rejected")
                ],
                left_annotations=[alarm.to_annotation()],
                width=12,
            )
        )

    def watch_stage(self, stage: apigw.Stage) -> None:
        """The stage throttle is one cap for every tenant, and requests the authorizer refuses spend it
        too (an unauthenticated flood included): alarm while a minute's requests are past
        :data:`STAGE_ALARM_SHARE` of it, before API Gateway starts refusing everyone."""
        per_minute = self._config.api.throttle_rate * 60
        requests = stage.metric_count(period=_MINUTE, statistic="Sum")
        alarm = self.alarm(
            "StageNearThrottle",
            description=(
                f"the API stage took more than {STAGE_ALARM_SHARE:.0%} of its throttle "
                f"({self._config.api.throttle_rate:g}/s, shared by every tenant and every unauthenticated "
                "request) in 2 of 3 minutes: find who sends it (access logs), raise api.throttle_rate, or "
                "put a web ACL in front"
            ),
            metric=requests,
            threshold=STAGE_ALARM_SHARE * per_minute,
            comparison=cloudwatch.ComparisonOperator.GREATER_THAN_THRESHOLD,
            evaluation_periods=3,
            datapoints_to_alarm=2,
        )
        self.dashboard.add_widgets(
            cloudwatch.GraphWidget(
                title="API stage: requests per minute, against its throttle",
                left=[requests],
                left_annotations=[
                    alarm.to_annotation(),
                    cloudwatch.HorizontalAnnotation(value=per_minute, label="stage throttle"),
                ],
                width=12,
            )
        )

    def watch_ordered(self) -> None:
        """The ordered workload's EMF counts; its queues are watched with :meth:`watch_queues`."""
        # Only the FIFO worker emits Processed without a QueueRole dimension.
        self.dashboard.add_widgets(
            self._counts_graph(
                "Ordered: accepted / processed / duplicates / dropped (per 5 min)",
                ("AcceptedOrdered", "Processed", "Duplicates", "Dropped"),
            )
        )

    def watch_stream(self, stream: kinesis.IStream, alarms: list[cloudwatch.Alarm]) -> None:
        """The stream's backlog (iterator age), its producers' and consumer's EMF counts, and ``alarms``
        (built with the stream, on this topic), which join the overview."""
        self.alarms.extend(alarms)
        self.dashboard.add_widgets(
            cloudwatch.GraphWidget(
                title="Stream: iterator age (ms), the consumer's backlog",
                left=[
                    stream.metric_get_records_iterator_age_milliseconds(period=_MINUTE, statistic="Maximum")
                ],
                left_annotations=[
                    cloudwatch.HorizontalAnnotation(
                        value=self._config.streaming.iterator_age_alarm_ms, label="alarm"
                    )
                ],
                width=12,
            ),
            cloudwatch.AlarmStatusWidget(title="Stream: alarms", alarms=alarms, width=12),
            self._counts_graph(
                "Events: written / failed / rejected (per 5 min)",
                ("EventsWritten", "EventsFailed", "EventsRejected"),
            ),
            self._counts_graph(
                "Stream consumer: records and aggregate writes (per 5 min)",
                ("RecordsApplied", "RecordsSkipped", "RecordsFailed", "AggregateWrites"),
            ),
        )

    def _counts_graph(self, title: str, names: tuple[str, ...]) -> cloudwatch.GraphWidget:
        """Five-minute sums of the service's EMF counts ``names``, as one graph."""
        period = Duration.minutes(5)
        return cloudwatch.GraphWidget(
            title=title,
            left=[self._service_metric(name, statistic="Sum", period=period) for name in names],
            width=12,
        )

    def _service_metric(
        self, name: str, *, statistic: str, period: Duration, dimensions: dict[str, str] | None = None
    ) -> cloudwatch.Metric:
        # Powertools Metrics adds the dimension "service" (POWERTOOLS_SERVICE_NAME) to every EMF metric.
        return cloudwatch.Metric(
            namespace=self._config.metrics_namespace,
            metric_name=name,
            dimensions_map={"service": self._config.service_name, **(dimensions or {})},
            statistic=statistic,
            period=period,
        )

    @staticmethod
    def _empty_receive_ratio(pair: QueueWithDlq, index: int, per_call: int) -> cloudwatch.MathExpression:
        """Empty receive calls / all receive calls. SQS counts empty calls but messages, not calls, for
        the others: a call that found messages returned at most ``per_call`` of them, so received /
        per_call is the fewest such calls there can have been (the ratio errs towards headroom)."""
        empty, received = f"empty{index}", f"received{index}"  # ids must be unique within one graph
        return cloudwatch.MathExpression(
            # No message received is idleness, not a lack of headroom: report 1 then.
            expression=f"IF({received} > 0, {empty} / ({empty} + {received} / {per_call}), 1)",
            using_metrics={
                empty: pair.queue.metric_number_of_empty_receives(period=_MINUTE, statistic="Sum"),
                received: pair.queue.metric_number_of_messages_received(period=_MINUTE, statistic="Sum"),
            },
            label=pair.role,
            period=_MINUTE,
        )

    def alarm(
        self,
        construct_id: str,
        *,
        description: str,
        metric: cloudwatch.IMetric,
        threshold: float,
        comparison: cloudwatch.ComparisonOperator,
        evaluation_periods: int,
        datapoints_to_alarm: int | None = None,
    ) -> cloudwatch.Alarm:
        """An alarm that notifies the topic when it fires and when it recovers; no data is not an incident."""
        alarm = notifying_alarm(
            self,
            construct_id,
            topic=self.topic,
            description=description,
            metric=metric,
            threshold=threshold,
            comparison=comparison,
            evaluation_periods=evaluation_periods,
            datapoints_to_alarm=datapoints_to_alarm,
        )
        self.alarms.append(alarm)
        return alarm

    def _oldest_age_alarm(self, pair: QueueWithDlq, threshold_seconds: int) -> cloudwatch.Alarm:
        metric = pair.queue.metric_approximate_age_of_oldest_message(period=_MINUTE, statistic="Maximum")
        return self.alarm(
            f"OldestAge-{pair.role}",
            description=(
                f"{pair.role}: oldest message older than {threshold_seconds}s for 3 minutes: a backlog builds"
            ),
            metric=metric,
            threshold=threshold_seconds,
            comparison=cloudwatch.ComparisonOperator.GREATER_THAN_THRESHOLD,
            evaluation_periods=3,
            datapoints_to_alarm=3,
        )

    def _dlq_alarm(self, pair: QueueWithDlq) -> cloudwatch.Alarm:
        metric = pair.dlq.metric_approximate_number_of_messages_visible(period=_MINUTE, statistic="Maximum")
        return self.alarm(
            f"DlqVisible-{pair.role}",
            description=f"{pair.role}-dlq holds a message: inspect, fix, then redrive",
            metric=metric,
            threshold=1,
            comparison=cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
            evaluation_periods=1,
        )

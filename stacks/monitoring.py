"""Alarms, their topic and the dashboard.

The Builders' Library's rule: watch the age of the oldest message, not the depth; a growing age is
the first sign of a backlog that will not drain by itself. Any message in a DLQ is an incident.
"""

from __future__ import annotations

from aws_cdk import Duration
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_cloudwatch_actions as actions
from aws_cdk import aws_kms as kms
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sns_subscriptions as subscriptions
from constructs import Construct

from stacks.config import BlueprintConfig
from stacks.queue_set import QueueWithDlq

_MINUTE = Duration.minutes(1)


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
        if config.alarms.email:
            self.topic.add_subscription(subscriptions.EmailSubscription(config.alarms.email))
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
        alarm = cloudwatch.Alarm(
            self,
            construct_id,
            alarm_description=description,
            metric=metric,
            threshold=threshold,
            comparison_operator=comparison,
            evaluation_periods=evaluation_periods,
            datapoints_to_alarm=datapoints_to_alarm,
            treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
        )
        alarm.add_alarm_action(actions.SnsAction(self.topic))
        alarm.add_ok_action(actions.SnsAction(self.topic))
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

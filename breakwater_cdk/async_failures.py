"""Where the asynchronously invoked functions' failed events go: one encrypted queue, alarmed.

The controller (EventBridge's schedule), the archiver (started by the controller with
``InvocationType=Event``) and the redrive function (an operator may start it that way) are invoked
asynchronously: Lambda retries a failed event itself and then drops it, so without a destination a
control plane that keeps failing is silent. Their on-failure destination keeps each event Lambda gave
up on, with its error and the request, and an alarm fires on the first one.

Each function may send there and do nothing else with it: ``sqs:SendMessage``, all Lambda needs of an
SQS destination (CDK's own destination would add the queue's attributes and URL). The queue is the last
stop, so it has no DLQ of its own.
"""

from __future__ import annotations

import jsii
from aws_cdk import Duration
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from breakwater_cdk.config import BlueprintConfig
from breakwater_cdk.functions import BreakwaterFunction
from breakwater_cdk.monitoring import Monitoring
from breakwater_cdk.nag import acknowledge
from breakwater_cdk.queue_set import dead_letter_queue


@jsii.implements(lambda_.IDestination)
class SendOnlyDestination:
    """An SQS on-failure destination whose function may only send to the queue."""

    def __init__(self, queue: sqs.IQueue) -> None:
        self.queue = queue

    def bind(
        self, scope: Construct, fn: lambda_.IFunction, *, type: lambda_.DestinationType
    ) -> lambda_.DestinationConfig:
        fn.add_to_role_policy(
            iam.PolicyStatement(
                sid="SendAsyncFailures", actions=["sqs:SendMessage"], resources=[self.queue.queue_arn]
            )
        )
        return lambda_.DestinationConfig(destination=self.queue.queue_arn)


class AsyncFailures(Construct):
    """``.queue``: the on-failure destination of the functions given to :meth:`send_failures_of`."""

    def __init__(
        self, scope: Construct, construct_id: str, *, config: BlueprintConfig, monitoring: Monitoring
    ) -> None:
        super().__init__(scope, construct_id)
        self.queue = dead_letter_queue(self, "Queue", f"{config.service_name}-async-failures")
        reason = (
            "this is the on-failure destination of the asynchronously invoked functions (controller, "
            "archiver, redrive): the last stop of an event Lambda gave up on, holding its error and "
            "request; the AsyncFailures alarm fires on any visible message, and a DLQ of it would only "
            "move the problem"
        )
        acknowledge(self.queue, "AwsSolutions-SQS3", reason)
        acknowledge(self.queue, "Serverless-SQSRedrivePolicy", reason)
        self.alarm = monitoring.alarm(
            "AsyncFailures",
            description=(
                f"{config.service_name}-async-failures holds an event: the controller, the archiver or the "
                "redrive function failed an asynchronous invocation (the message has its error and request)"
            ),
            metric=self.queue.metric_approximate_number_of_messages_visible(
                period=Duration.minutes(1), statistic="Maximum"
            ),
            threshold=1,
            comparison=cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
            evaluation_periods=1,
        )
        self.functions: list[BreakwaterFunction] = []

    def send_failures_of(
        self, function: BreakwaterFunction, *, retry_attempts: int, max_event_age: Duration, why: str
    ) -> None:
        """``function``'s asynchronous events that fail ``retry_attempts`` + 1 times, or wait longer than
        ``max_event_age``, go to the queue; ``why`` explains those two choices."""
        function.function.configure_async_invoke(
            on_failure=SendOnlyDestination(self.queue),
            retry_attempts=retry_attempts,
            max_event_age=max_event_age,
        )
        acknowledge(
            function.function,
            "Serverless-LambdaDLQ",
            "its asynchronous failures go to an on-failure destination (the async-failures queue, alarmed), "
            f"which records the error beside the event; a dead-letter queue would only repeat it. {why}",
        )
        self.functions.append(function)

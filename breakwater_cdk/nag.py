"""cdk-nag: the AWS Solutions and Serverless packs over the whole app, and the few findings this
blueprint acknowledges, each on the narrowest construct with its reason.

cdk-nag 3 runs as a CDK validation plugin: an unacknowledged error fails the synth (in-process it
raises, under the CLI ``cdk synth`` exits non-zero), so ``make synth`` / ``make test`` gate on it.
An acknowledgement id is ``<pack>::<rule>[<finding>]``, e.g. ``AwsSolutions::AwsSolutions-IAM5[Resource::*]``;
CDK then lists the finding as acknowledged, with its reason, in ``validation-report.json``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from aws_cdk import Acknowledgment, App, Validations
from cdk_nag import AwsSolutionsChecks, ServerlessChecks
from constructs import IConstruct

if TYPE_CHECKING:  # the constructs import acknowledge() from here
    from breakwater_cdk.construct import Breakwater
    from breakwater_cdk.functions import BreakwaterFunction

# Why each function has no asynchronous-invocation DLQ (Serverless-LambdaDLQ); those invoked
# asynchronously have an on-failure destination instead (breakwater_cdk/async_failures.py).
_NO_ASYNC_DLQ = {
    "Authorizer": "invoked synchronously by API Gateway: a failure is a 5xx to the client, not a lost event",
    "Ingest": "invoked synchronously by API Gateway: a failure is a 5xx the client retries, not a lost event",
    "LiveWorker": "invoked by SQS event source mappings, never asynchronously: a failed message is retried "
    "by SQS and lands in its queue's own DLQ (alarmed)",
    "SidelineWorker": "invoked by SQS event source mappings, never asynchronously: a failed message is "
    "retried by SQS and lands in its queue's own DLQ (alarmed)",
    "OrderedIngest": "invoked synchronously by API Gateway (POST /v1/ordered): a failure is a 5xx the client "
    "retries with the same dedup_key, not a lost event",
    "Events": "invoked synchronously by API Gateway (POST /v1/events): the answer says per event what was "
    "written, so a failure is a 5xx or a 207 the client resends, never a lost event",
    "FifoWorker": "invoked by SQS FIFO event source mappings, never asynchronously: a failed message is "
    "retried in order within its group and lands in its queue's own FIFO DLQ (alarmed)",
    "StreamConsumer": "invoked by the Kinesis event source mapping, never asynchronously: a batch it gives "
    "up on (bisected, retried, or past the maximum record age) goes to the mapping's on-failure queue, which "
    "alarms",
}

_SQS_MAPPING_DESTINATION = (
    "SQS mappings take no on-failure destination (Kinesis, DynamoDB and Kafka do): a message that keeps "
    "failing goes to its queue's own DLQ after maxReceiveCount, which alarms"
)

_RUNTIME_PINNED = (
    "the runtime is chosen by functions.runtime in cdk.json: it must match a "
    "published Powertools layer, pinned by functions.powertools_layer_version; upgrade the two together"
)


def apply_nag_packs(app: App) -> None:
    Validations.of(app).add_plugins(AwsSolutionsChecks(app), ServerlessChecks(app))


def acknowledge(construct: IConstruct, rule: str, reason: str) -> None:
    """Acknowledge ``rule`` (``AwsSolutions-IAM5[...]`` or ``Serverless-LambdaDLQ``) on ``construct`` only."""
    pack = rule.split("-", 1)[0]
    Validations.of(construct).acknowledge(Acknowledgment(id=f"{pack}::{rule}", reason=reason))


def acknowledge_findings(breakwater: Breakwater) -> None:
    for function in breakwater.functions.built:
        _acknowledge_function(breakwater, function)
    for pair in breakwater.queues.all:
        acknowledge(
            pair.dlq,
            "Serverless-SQSRedrivePolicy",
            f"this is the dead-letter queue of {pair.role}: a DLQ of a DLQ would only move the problem; "
            "an alarm fires on any visible message and bin/redrive moves them back after a fix",
        )
    _acknowledge_ingress(breakwater)
    _acknowledge_consumers(breakwater)
    _acknowledge_ordered(breakwater)
    _acknowledge_streaming(breakwater)
    if breakwater.monitoring.email_subscription is not None:
        acknowledge(
            breakwater.monitoring.email_subscription,
            "Serverless-SNSRedrivePolicy",
            "the optional alarm e-mail: SNS retries delivery, and an alarm that fails to notify stays in "
            "ALARM on the dashboard; a DLQ would need its own alarm, notifying through this same topic",
        )


def _acknowledge_function(breakwater: Breakwater, function: BreakwaterFunction) -> None:
    acknowledge(function.function, "AwsSolutions-L1", _RUNTIME_PINNED)
    acknowledge(function.function, "Serverless-LambdaLatestVersion", _RUNTIME_PINNED)
    if function.name in _NO_ASYNC_DLQ:
        acknowledge(function.function, "Serverless-LambdaDLQ", _NO_ASYNC_DLQ[function.name])
    if breakwater.config.functions.tracing:
        policy = function.role.node.find_child("DefaultPolicy")
        acknowledge(
            policy,
            "AwsSolutions-IAM5[Resource::*]",
            "X-Ray active tracing: xray:PutTraceSegments and xray:PutTelemetryRecords support no "
            "resource-level permissions (CDK adds exactly these two actions on '*'); every other statement "
            "names its resources",
        )


def _acknowledge_sqs_mappings(worker: BreakwaterFunction) -> None:
    for child in worker.function.node.children:
        if child.node.id.startswith("SqsEventSource:"):
            acknowledge(child, "Serverless-LambdaEventSourceMappingDestination", _SQS_MAPPING_DESTINATION)


def _acknowledge_consumers(breakwater: Breakwater) -> None:
    for worker in (breakwater.consumers.live_worker, breakwater.consumers.sideline_worker):
        _acknowledge_sqs_mappings(worker)
    acknowledge(
        breakwater.control.schedule,
        "Serverless-EventBusDLQ",
        "the schedule's event carries nothing: a controller run that could not be delivered is superseded "
        "by the next one a minute later, so a DLQ would only collect empty, stale ticks",
    )


def _acknowledge_ingress(breakwater: Breakwater) -> None:
    api = breakwater.ingress.api
    acknowledge(
        api.node.find_child("CloudWatchRole"),
        "AwsSolutions-IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/service-role/AmazonAPIGatewayPushToCloudWatchLogs]",
        "API Gateway's account-level logging role (needed for access logs) is the documented use of this AWS "
        "managed policy; API Gateway, not our code, assumes it",
    )
    for method in breakwater.ingress.routes.values():
        acknowledge(
            method,
            "AwsSolutions-COG4",
            "machine-to-machine API authenticated by per-tenant API keys: the REQUEST authorizer checks the "
            "key's SHA-256 against the tenants table; no end users for a Cognito pool",
        )
    acknowledge(
        api.deployment_stage,
        "AwsSolutions-APIG3",
        "no WAF by default (a fixed monthly cost per web ACL): abuse is bounded by the authorizer, the "
        "per-tenant token bucket and stage throttling; a fork facing the open internet should add a web ACL",
    )


def _acknowledge_ordered(breakwater: Breakwater) -> None:
    if breakwater.ordered is None:
        return
    _acknowledge_sqs_mappings(breakwater.ordered.worker)
    for pair in breakwater.ordered.queues:
        acknowledge(
            pair.dlq,
            "Serverless-SQSRedrivePolicy",
            f"this is the FIFO dead-letter queue of {pair.role}: a DLQ of a DLQ would only move the problem; "
            "an alarm fires on any visible message",
        )


def _acknowledge_streaming(breakwater: Breakwater) -> None:
    if breakwater.streaming is None:
        return
    failures = breakwater.streaming.failures
    reason = (
        "this is the Kinesis mapping's on-failure destination, the stream's dead-letter queue: it holds the "
        "shard and sequence range of a batch the consumer gave up on (the records stay on the stream for its "
        "retention); the ConsumerGaveUp alarm fires on any visible message, and a DLQ of it would only move "
        "the problem"
    )
    acknowledge(failures, "AwsSolutions-SQS3", reason)
    acknowledge(failures, "Serverless-SQSRedrivePolicy", reason)

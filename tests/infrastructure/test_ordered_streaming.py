"""Template assertions for OrderedWorkload and StreamingWorkload, synthesized in a tiny stack of their own."""

from __future__ import annotations

from typing import Any

import pytest
from aws_cdk import App, Stack
from aws_cdk import aws_kms as kms
from aws_cdk import aws_sns as sns
from aws_cdk.assertions import Match, Template

from stacks.config import BlueprintConfig
from stacks.functions import FunctionFactory
from stacks.ordered import OrderedWorkload
from stacks.streaming import StreamingWorkload

TIERS = {"standard": {"rate": 5, "burst": 10, "consumer_rate": 5, "concurrency": 2, "concurrency_floor": 1}}


def _config(**sections: Any) -> BlueprintConfig:
    return BlueprintConfig.model_validate({"tiers": TIERS, "default_tier": "standard", **sections})


def _stack(name: str, config: BlueprintConfig) -> Template:
    stack = Stack(App(), name)
    key = kms.Key(stack, "Key", enable_key_rotation=True)
    functions = FunctionFactory(stack, "Functions", config=config, key=key)
    topic = sns.Topic(stack, "Alarms", master_key=key)
    OrderedWorkload(stack, "Ordered", config=config, functions=functions)
    StreamingWorkload(stack, "Streaming", config=config, functions=functions, alarm_topic=topic)
    return Template.from_stack(stack)


@pytest.fixture(scope="module")
def templates() -> tuple[Template, Template]:
    provisioned = _config(
        ordered={"enabled": True, "queue_count": 2},
        streaming={"capacity_mode": "provisioned", "shard_count": 2, "parallelization_factor": 4},
    )
    on_demand = _config(streaming={"capacity_mode": "on_demand"})
    return _stack("Provisioned", provisioned), _stack("OnDemand", on_demand)


def _fifo_queues(template: Template) -> dict[str, Any]:
    return {
        k: v
        for k, v in template.find_resources("AWS::SQS::Queue").items()
        if v["Properties"].get("FifoQueue")
    }


def test_fifo_queues_are_high_throughput_with_fifo_dlqs_and_encrypted(
    templates: tuple[Template, Template],
) -> None:
    template = templates[0]
    queues = _fifo_queues(template)
    live = {k: v for k, v in queues.items() if "RedrivePolicy" in v["Properties"]}
    assert len(live) == 2 and len(queues) == 4  # two queues, each with its FIFO DLQ
    dlq_ids = set(queues) - set(live)
    for queue in live.values():
        props = queue["Properties"]
        assert props["DeduplicationScope"] == "messageGroup"
        assert props["FifoThroughputLimit"] == "perMessageGroupId"
        assert props["ContentBasedDeduplication"] is False
        assert props["SqsManagedSseEnabled"] is True
        assert props["QueueName"].endswith(".fifo")
        assert props["RedrivePolicy"]["deadLetterTargetArn"]["Fn::GetAtt"][0] in dlq_ids
        assert props["VisibilityTimeout"] == 360
    for dlq_id in dlq_ids:
        assert queues[dlq_id]["Properties"]["SqsManagedSseEnabled"] is True


def test_every_queue_refuses_plain_http(templates: tuple[Template, Template]) -> None:
    template = templates[0]
    queue_ids = set(template.find_resources("AWS::SQS::Queue"))
    protected: set[str] = set()
    for policy in template.find_resources("AWS::SQS::QueuePolicy").values():
        statements = policy["Properties"]["PolicyDocument"]["Statement"]
        if any(
            s["Effect"] == "Deny"
            and s.get("Condition", {}).get("Bool", {}).get("aws:SecureTransport") == "false"
            for s in statements
        ):
            protected.update(q["Ref"] for q in policy["Properties"]["Queues"])
    assert protected == queue_ids  # FIFO queues, FIFO DLQs and the stream's failure destination


def test_fifo_worker_mapping_reports_batch_item_failures(templates: tuple[Template, Template]) -> None:
    template = templates[0]
    mappings = [
        m
        for m in template.find_resources("AWS::Lambda::EventSourceMapping").values()
        if "StartingPosition" not in m["Properties"]
    ]
    assert len(mappings) == 2
    for mapping in mappings:
        props = mapping["Properties"]
        assert props["FunctionResponseTypes"] == ["ReportBatchItemFailures"]
        assert props["BatchSize"] == 10
        assert "MaximumBatchingWindowInSeconds" not in props  # FIFO mappings take none


def test_write_ahead_and_aggregates_tables(templates: tuple[Template, Template]) -> None:
    template = templates[0]
    template.has_resource_properties(
        "AWS::DynamoDB::Table",
        {
            "KeySchema": [
                {"AttributeName": "pk", "KeyType": "HASH"},
                {"AttributeName": "sk", "KeyType": "RANGE"},
            ],
            "TimeToLiveSpecification": {"AttributeName": "ttl", "Enabled": True},
            "SSESpecification": {"SSEEnabled": True},
            "BillingMode": "PAY_PER_REQUEST",
        },
    )
    assert len(template.find_resources("AWS::DynamoDB::Table")) == 2


def test_worker_and_ingest_environments(templates: tuple[Template, Template]) -> None:
    template = templates[0]
    template.has_resource_properties(
        "AWS::Lambda::Function",
        {
            "Handler": "fifo_worker/handler.handler",
            "Environment": {
                "Variables": Match.object_like(
                    {"WRITE_AHEAD_LEASE_SECONDS": "90", "WRITE_AHEAD_RETENTION_SECONDS": str(14 * 86_400)}
                )
            },
        },
    )
    template.has_resource_properties(
        "AWS::Lambda::Function",
        {
            "Handler": "ordered_ingest/handler.handler",
            "Environment": {"Variables": Match.object_like({"FIFO_QUEUE_URLS": Match.any_value()})},
        },
    )
    template.has_resource_properties(
        "AWS::Lambda::Function",
        {
            "Handler": "events/handler.handler",
            "Environment": {"Variables": Match.object_like({"PARTITION_KEY_MODE": "tenant"})},
        },
    )


def test_stream_is_encrypted_and_sized_by_config(templates: tuple[Template, Template]) -> None:
    provisioned, on_demand = templates
    provisioned.has_resource_properties(
        "AWS::Kinesis::Stream",
        {
            "ShardCount": 2,
            "StreamModeDetails": {"StreamMode": "PROVISIONED"},
            "StreamEncryption": {"EncryptionType": "KMS", "KeyId": "alias/aws/kinesis"},
        },
    )
    stream = next(iter(on_demand.find_resources("AWS::Kinesis::Stream").values()))["Properties"]
    assert stream["StreamModeDetails"] == {"StreamMode": "ON_DEMAND"} and "ShardCount" not in stream
    assert stream["StreamEncryption"]["EncryptionType"] == "KMS"


def test_consumer_mapping_bisects_retries_and_has_an_encrypted_failure_destination(
    templates: tuple[Template, Template],
) -> None:
    template = templates[0]
    template.has_resource_properties(
        "AWS::Lambda::EventSourceMapping",
        {
            "StartingPosition": "TRIM_HORIZON",
            "BisectBatchOnFunctionError": True,
            "MaximumRetryAttempts": 3,
            "MaximumRecordAgeInSeconds": 3600,
            "ParallelizationFactor": 4,
            "BatchSize": 100,
            "FunctionResponseTypes": ["ReportBatchItemFailures"],
            "DestinationConfig": {"OnFailure": {"Destination": Match.any_value()}},
        },
    )
    template.has_resource_properties(
        "AWS::SQS::Queue", {"QueueName": "breakwater-stream-failures", "SqsManagedSseEnabled": True}
    )


def test_alarms_on_iterator_age_and_throughput_exceeded(templates: tuple[Template, Template]) -> None:
    template = templates[0]
    names = {
        a["Properties"].get("MetricName") for a in template.find_resources("AWS::CloudWatch::Alarm").values()
    }
    assert {
        "GetRecords.IteratorAgeMilliseconds",
        "ReadProvisionedThroughputExceeded",
        "WriteProvisionedThroughputExceeded",
        "ApproximateNumberOfMessagesVisible",
    } <= names
    for alarm in template.find_resources("AWS::CloudWatch::Alarm").values():
        assert alarm["Properties"]["AlarmActions"] and alarm["Properties"]["OKActions"]

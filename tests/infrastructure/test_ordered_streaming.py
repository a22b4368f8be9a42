"""Template assertions for OrderedWorkload and StreamingWorkload, synthesized in a tiny stack of their own."""

from __future__ import annotations

from typing import Any

import pytest
from aws_cdk import App, Stack
from aws_cdk import aws_kms as kms
from aws_cdk import aws_sns as sns
from aws_cdk.assertions import Match, Template

from app import PROCESSOR
from breakwater_cdk.config import BlueprintConfig, ConfigError, load_config
from breakwater_cdk.functions import FunctionFactory
from breakwater_cdk.ordered import OrderedWorkload
from breakwater_cdk.streaming import StreamingWorkload
from breakwater_cdk.tables import build_table

TIERS = {"standard": {"rate": 5, "burst": 10, "consumer_rate": 5, "concurrency": 2, "concurrency_floor": 1}}


def _config(**sections: Any) -> BlueprintConfig:
    return BlueprintConfig.model_validate({"tiers": TIERS, "default_tier": "standard", **sections})


def _stack(name: str, config: BlueprintConfig) -> Template:
    stack = Stack(App(), name)
    key = kms.Key(stack, "Key", enable_key_rotation=True)
    functions = FunctionFactory(stack, "Functions", config=config, key=key, processor=PROCESSOR)
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


# -- the group backlog bound ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def with_state() -> Template:
    """The ordered workload given the state table, as the stack builds it."""
    config = _config(ordered={"enabled": True, "max_group_backlog": 500})
    stack = Stack(App(), "WithState")
    key = kms.Key(stack, "Key", enable_key_rotation=True)
    functions = FunctionFactory(stack, "Functions", config=config, key=key, processor=PROCESSOR)
    state = build_table(stack, "State", partition_key="pk", sort_key="sk", ttl_attribute="ttl")
    OrderedWorkload(stack, "Ordered", config=config, functions=functions, state_table=state)
    return Template.from_stack(stack)


def _function_env(template: Template, handler: str) -> dict[str, Any]:
    (function,) = [
        f["Properties"]
        for f in template.find_resources("AWS::Lambda::Function").values()
        if f["Properties"]["Handler"] == handler
    ]
    variables: dict[str, Any] = function["Environment"]["Variables"]
    return variables


def _state_actions(template: Template, role_prefix: str) -> set[str]:
    """What the role's policies allow on the state table's ARN."""
    (state_id,) = [k for k in template.find_resources("AWS::DynamoDB::Table") if k.startswith("State")]
    actions: set[str] = set()
    for policy in template.find_resources("AWS::IAM::Policy").values():
        roles = [r["Ref"] for r in policy["Properties"]["Roles"]]
        if not any(r.startswith(role_prefix) for r in roles):
            continue
        for statement in policy["Properties"]["PolicyDocument"]["Statement"]:
            resources = (
                statement["Resource"] if isinstance(statement["Resource"], list) else [statement["Resource"]]
            )
            if {"Fn::GetAtt": [state_id, "Arn"]} in resources:
                listed = statement["Action"]
                actions |= set(listed if isinstance(listed, list) else [listed])
    return actions


def test_ingest_and_worker_share_the_group_bound_window(with_state: Template) -> None:
    window = str(4 * 86_400 + 60)  # the queues' retention (4 days by default) and a minute for the request
    ingest = _function_env(with_state, "ordered_ingest/handler.handler")
    worker = _function_env(with_state, "fifo_worker/handler.handler")
    assert ingest["MAX_GROUP_BACKLOG"] == "500"
    assert ingest["GROUP_BACKLOG_WINDOW_SECONDS"] == worker["GROUP_BACKLOG_WINDOW_SECONDS"] == window
    assert ingest["STATE_TABLE_NAME"] == worker["STATE_TABLE_NAME"]


def test_the_group_counters_are_written_with_update_item_only(with_state: Template) -> None:
    assert _state_actions(with_state, "FunctionsFifoWorker") == {"dynamodb:UpdateItem"}
    assert _state_actions(with_state, "FunctionsOrderedIngest") == {"dynamodb:UpdateItem"}


def test_without_the_state_table_there_is_no_group_bound(templates: tuple[Template, Template]) -> None:
    ingest = _function_env(templates[0], "ordered_ingest/handler.handler")
    worker = _function_env(templates[0], "fifo_worker/handler.handler")
    assert not {"MAX_GROUP_BACKLOG", "GROUP_BACKLOG_WINDOW_SECONDS", "STATE_TABLE_NAME"} & (
        set(ingest) | set(worker)
    )


@pytest.mark.parametrize("backlog", [12_001, 120_000, 500_000])
def test_a_group_bound_that_would_fill_the_scan_window_stops_the_synth(backlog: int) -> None:
    with pytest.raises(ConfigError) as error:
        load_config({"tiers": TIERS, "default_tier": "standard", "ordered": {"max_group_backlog": backlog}})
    message = str(error.value)
    assert "breakwater.ordered" in message and f"max_group_backlog ({backlog})" in message
    assert "120,000" in message and "at most 12000" in message


def test_the_largest_group_bound_leaves_ten_full_groups_in_the_window() -> None:
    config = load_config(
        {"tiers": TIERS, "default_tier": "standard", "ordered": {"max_group_backlog": 12_000}}
    )
    assert config.ordered.max_group_backlog * 10 <= 120_000
    assert _config().ordered.max_group_backlog == 1000

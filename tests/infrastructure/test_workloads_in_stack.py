"""The ordered and streaming workloads inside the full stack: routes behind the authorizer, mappings,
the stream's TLS-only policy, alarms on the dashboard, outputs. The constructs' own details are in
test_ordered_streaming.py; here is what the composition adds."""

from __future__ import annotations

import json
from typing import Any

import pytest

from breakwater.requests import MAX_ORDERING_KEY_LENGTH, SQS_ID_PATTERN
from breakwater.settings import (
    EventsSettings,
    FifoWorkerSettings,
    OrderedIngestSettings,
    StreamConsumerSettings,
)
from breakwater_cdk.functions import BreakwaterFunction
from tests.infrastructure.conftest import Synth
from tests.infrastructure.test_foundation import _as_list, _contract_names, _env, _role_actions

pytestmark = pytest.mark.slow


def _mappings_of(synth: Synth, function: BreakwaterFunction) -> list[dict[str, Any]]:
    ref = {"Ref": synth.logical_id(function.function)}
    return [
        m["Properties"]
        for m in synth.of_type("AWS::Lambda::EventSourceMapping").values()
        if m["Properties"]["FunctionName"] == ref
    ]


def _route(synth: Synth, path: str) -> dict[str, Any]:
    """The POST method of /v1/<path>, found through the template's resource tree."""
    (v1_id,) = [
        k
        for k, r in synth.of_type("AWS::ApiGateway::Resource").items()
        if r["Properties"]["PathPart"] == "v1"
    ]
    (resource_id,) = [
        k
        for k, r in synth.of_type("AWS::ApiGateway::Resource").items()
        if r["Properties"]["PathPart"] == path and r["Properties"]["ParentId"] == {"Ref": v1_id}
    ]
    (method,) = [
        m["Properties"]
        for m in synth.of_type("AWS::ApiGateway::Method").values()
        if m["Properties"]["ResourceId"] == {"Ref": resource_id}
    ]
    return method


def _assert_guarded_proxy_to(
    synth: Synth, method: dict[str, Any], function: BreakwaterFunction
) -> dict[str, Any]:
    """Behind the tenant authorizer, validated, proxied to ``function``; returns the body schema."""
    (authorizer_id,) = synth.of_type("AWS::ApiGateway::Authorizer")
    assert method["HttpMethod"] == "POST"
    assert method["AuthorizationType"] == "CUSTOM"
    assert method["AuthorizerId"] == {"Ref": authorizer_id}
    (validator_id,) = synth.of_type("AWS::ApiGateway::RequestValidator")
    assert method["RequestValidatorId"] == {"Ref": validator_id}
    integration = method["Integration"]
    assert integration["Type"] == "AWS_PROXY"
    assert {"Fn::GetAtt": [synth.logical_id(function.function), "Arn"]} in integration["Uri"]["Fn::Join"][1]
    model_id = method["RequestModels"]["application/json"]["Ref"]
    schema: dict[str, Any] = synth.resources[model_id]["Properties"]["Schema"]
    return schema


def _alarm_ids_on(synth: Synth, metric_names: set[str]) -> set[str]:
    return {
        k
        for k, a in synth.of_type("AWS::CloudWatch::Alarm").items()
        if a["Properties"].get("MetricName") in metric_names
    }


def _dashboard_body(synth: Synth) -> str:
    (dashboard,) = synth.of_type("AWS::CloudWatch::Dashboard").values()
    return json.dumps(dashboard["Properties"]["DashboardBody"])


# --- streaming (on in cdk.json) --------------------------------------------------------------------


def test_stream_is_encrypted_and_refuses_plain_http(synth: Synth) -> None:
    assert synth.breakwater.streaming is not None
    stream_id = synth.logical_id(synth.breakwater.streaming.stream)
    stream = synth.resources[stream_id]["Properties"]
    assert stream["StreamEncryption"] == {"EncryptionType": "KMS", "KeyId": "alias/aws/kinesis"}
    assert stream["RetentionPeriodHours"] == synth.config.streaming.retention_hours
    (policy,) = synth.of_type("AWS::Kinesis::ResourcePolicy").values()
    arn = {"Fn::GetAtt": [stream_id, "Arn"]}
    assert policy["Properties"]["ResourceArn"] == arn
    (statement,) = policy["Properties"]["ResourcePolicy"]["Statement"]
    assert statement["Effect"] == "Deny"
    assert statement["Principal"] == {"AWS": "*"}
    assert statement["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}
    assert statement["Resource"] == arn
    assert {"kinesis:PutRecords", "kinesis:GetRecords"} <= set(_as_list(statement["Action"]))


def test_consumer_mapping_bisects_retries_ages_out_and_has_a_failure_destination(synth: Synth) -> None:
    streaming = synth.breakwater.streaming
    assert streaming is not None
    config = synth.config.streaming
    (mapping,) = _mappings_of(synth, streaming.consumer)
    assert mapping["EventSourceArn"] == {"Fn::GetAtt": [synth.logical_id(streaming.stream), "Arn"]}
    assert mapping["BisectBatchOnFunctionError"] is True
    assert mapping["MaximumRetryAttempts"] == config.retry_attempts
    assert mapping["MaximumRecordAgeInSeconds"] == config.max_record_age_seconds
    assert mapping["ParallelizationFactor"] == config.parallelization_factor
    assert mapping["BatchSize"] == config.batch_size
    assert mapping["FunctionResponseTypes"] == ["ReportBatchItemFailures"]
    assert mapping["DestinationConfig"]["OnFailure"]["Destination"] == {
        "Fn::GetAtt": [synth.logical_id(streaming.failures), "Arn"]
    }
    failures = synth.resources[synth.logical_id(streaming.failures)]["Properties"]
    assert failures["SqsManagedSseEnabled"] is True


def test_events_route_is_behind_the_authorizer_and_validated(synth: Synth) -> None:
    assert synth.breakwater.streaming is not None
    schema = _assert_guarded_proxy_to(synth, _route(synth, "events"), synth.breakwater.streaming.events)
    event, batch = schema["oneOf"]
    assert event["required"] == ["type"] and event["additionalProperties"] is False
    assert set(event["properties"]) == {"type", "key", "value", "payload", "occurred_at"}
    events = batch["properties"]["events"]
    assert batch["required"] == ["events"] and batch["additionalProperties"] is False
    assert events["minItems"] == 1
    assert events["maxItems"] == synth.config.streaming.max_events_per_request
    assert events["items"] == event


def test_events_role_writes_the_stream_and_nothing_else(synth: Synth) -> None:
    assert synth.breakwater.streaming is not None
    actions = _role_actions(synth, synth.breakwater.streaming.events.role)
    assert {"kinesis:PutRecords", "kinesis:PutRecord"} <= actions
    assert not {a for a in actions if a.startswith("sqs:")}
    assert {a for a in actions if a.startswith("dynamodb:")} == {"dynamodb:UpdateItem"}  # its token buckets
    assert "kinesis:GetRecords" not in actions


def test_stream_alarms_are_on_the_dashboard_and_notify_the_topic(synth: Synth) -> None:
    alarms = _alarm_ids_on(
        synth,
        {
            "GetRecords.IteratorAgeMilliseconds",
            "ReadProvisionedThroughputExceeded",
            "WriteProvisionedThroughputExceeded",
        },
    )
    assert len(alarms) == 3
    body = _dashboard_body(synth)
    topic = {"Ref": synth.logical_id(synth.breakwater.monitoring.topic)}
    for alarm_id in alarms:
        assert alarm_id in body
        assert synth.resources[alarm_id]["Properties"]["AlarmActions"] == [topic]
    for metric in ("EventsWritten", "RecordsApplied", "AggregateWrites"):
        assert metric in body


def test_outputs_name_the_stream_its_failures_queue_and_the_aggregates_table(synth: Synth) -> None:
    outputs = synth.template.to_json()["Outputs"]
    assert {
        "EventStreamName",
        "EventStreamArn",
        "AggregatesTableName",
        "StreamFailuresQueueUrl",
        "EventsFunctionName",
        "StreamConsumerFunctionName",
    } <= set(outputs)


def test_the_stream_failures_queue_acknowledgements_are_scoped_to_it(synth: Synth) -> None:
    suppressed = [
        (v["ruleName"], c["constructPath"])
        for report in synth.report["pluginReports"]
        for v in report.get("suppressedViolations", [])
        for c in v["violatingConstructs"]
    ]
    for rule in ("AwsSolutions-SQS3", "Serverless-SQSRedrivePolicy"):
        paths = [path for name, path in suppressed if name == rule]
        assert "Breakwater-dev/Breakwater/Streaming/ConsumerFailures/Resource" in paths
    # the other queue without a DLQ is the last stop of the asynchronously invoked functions' failures
    last_stops = ("Streaming/ConsumerFailures/Resource", "AsyncFailures/Queue/Resource")
    assert not [
        path for name, path in suppressed if name == "AwsSolutions-SQS3" and not path.endswith(last_stops)
    ]


def test_ordered_workload_is_off_by_default(synth: Synth) -> None:
    assert synth.breakwater.ordered is None
    assert not [q for q in synth.of_type("AWS::SQS::Queue").values() if q["Properties"].get("FifoQueue")]
    assert "ordered" not in synth.breakwater.ingress.routes


@pytest.mark.parametrize(
    ("attribute", "settings_model"),
    [("events", EventsSettings), ("consumer", StreamConsumerSettings)],
)
def test_streaming_environment_matches_its_settings_model(
    synth: Synth, attribute: str, settings_model: Any
) -> None:
    env = _env(synth, getattr(synth.breakwater.streaming, attribute))
    fields = {name.upper() for name in settings_model.model_fields}
    required = {name.upper() for name, field in settings_model.model_fields.items() if field.is_required()}
    assert required <= _contract_names(env) <= fields


# --- ordered (context override) --------------------------------------------------------------------


def test_ordered_synth_is_nag_clean(ordered_synth: Synth) -> None:
    for report in ordered_synth.report["pluginReports"]:
        errors = [v["ruleName"] for v in report["violations"] if v["severity"] == "error"]
        assert errors == [], report["pluginName"]


def test_fifo_queues_are_high_throughput_with_fifo_dlqs(ordered_synth: Synth) -> None:
    ordered = ordered_synth.breakwater.ordered
    assert ordered is not None
    config = ordered_synth.config.ordered
    assert len(ordered.queues) == config.queue_count
    for pair in ordered.queues:
        props = ordered_synth.resources[ordered_synth.logical_id(pair.queue)]["Properties"]
        dlq = ordered_synth.resources[ordered_synth.logical_id(pair.dlq)]["Properties"]
        assert props["FifoQueue"] is True and dlq["FifoQueue"] is True
        assert props["DeduplicationScope"] == "messageGroup"
        assert props["FifoThroughputLimit"] == "perMessageGroupId"
        assert props["QueueName"] == f"{ordered_synth.config.service_name}-{pair.role}.fifo"
        assert dlq["QueueName"] == f"{ordered_synth.config.service_name}-{pair.role}-dlq.fifo"
        redrive = props["RedrivePolicy"]
        assert redrive["deadLetterTargetArn"] == {"Fn::GetAtt": [ordered_synth.logical_id(pair.dlq), "Arn"]}
        assert redrive["maxReceiveCount"] == config.max_receive_count


def test_fifo_worker_drains_every_fifo_queue_reporting_batch_item_failures(ordered_synth: Synth) -> None:
    ordered = ordered_synth.breakwater.ordered
    assert ordered is not None
    mappings = _mappings_of(ordered_synth, ordered.worker)
    assert {json.dumps(m["EventSourceArn"]) for m in mappings} == {
        json.dumps({"Fn::GetAtt": [ordered_synth.logical_id(pair.queue), "Arn"]}) for pair in ordered.queues
    }
    for mapping in mappings:
        assert mapping["FunctionResponseTypes"] == ["ReportBatchItemFailures"]
        assert mapping["BatchSize"] == ordered_synth.config.ordered.batch_size
        assert mapping["ScalingConfig"] == {
            "MaximumConcurrency": ordered_synth.config.ordered.max_concurrency
        }


def test_ordered_route_is_behind_the_authorizer_and_validated(ordered_synth: Synth) -> None:
    ordered = ordered_synth.breakwater.ordered
    assert ordered is not None
    schema = _assert_guarded_proxy_to(ordered_synth, _route(ordered_synth, "ordered"), ordered.ingest)
    assert set(schema["required"]) == {"type", "ordering_key"}
    assert schema["additionalProperties"] is False
    ordering_key = schema["properties"]["ordering_key"]
    assert ordering_key["maxLength"] == MAX_ORDERING_KEY_LENGTH  # tenant:key fits SQS's 128
    assert ordering_key["pattern"] == SQS_ID_PATTERN
    assert schema["properties"]["dedup_key"]["pattern"] == SQS_ID_PATTERN
    # Every route, the workloads' included, keeps the authorizer.
    (authorizer_id,) = ordered_synth.of_type("AWS::ApiGateway::Authorizer")
    for method in ordered_synth.of_type("AWS::ApiGateway::Method").values():
        assert method["Properties"]["AuthorizerId"] == {"Ref": authorizer_id}


def test_ordered_ingest_spends_the_tenants_ingest_tokens(ordered_synth: Synth) -> None:
    ordered = ordered_synth.breakwater.ordered
    assert ordered is not None
    env = _env(ordered_synth, ordered.ingest)
    assert env["STATE_TABLE_NAME"] == {"Ref": ordered_synth.logical_id(ordered_synth.breakwater.tables.state)}
    actions = _role_actions(ordered_synth, ordered.ingest.role)
    assert {"sqs:SendMessage", "dynamodb:UpdateItem"} <= actions
    assert not {"sqs:ReceiveMessage", "sqs:DeleteMessage"} & actions


def test_ordered_queues_alarm_on_age_and_dlq_and_show_on_the_dashboard(ordered_synth: Synth) -> None:
    ordered = ordered_synth.breakwater.ordered
    assert ordered is not None
    body = _dashboard_body(ordered_synth)
    for pair in ordered.queues:
        for resource in (pair.queue, pair.dlq):
            queue_id = ordered_synth.logical_id(resource)
            watching = [
                k
                for k, a in ordered_synth.of_type("AWS::CloudWatch::Alarm").items()
                if {"Name": "QueueName", "Value": {"Fn::GetAtt": [queue_id, "QueueName"]}}
                in a["Properties"].get("Dimensions", [])
            ]
            assert len(watching) == 1, pair.role
            assert watching[0] in body
    assert "AcceptedOrdered" in body


def test_outputs_name_the_fifo_queues_and_the_write_ahead_table(ordered_synth: Synth) -> None:
    outputs = ordered_synth.template.to_json()["Outputs"]
    count = ordered_synth.config.ordered.queue_count
    assert {"WriteAheadTableName", "OrderedIngestFunctionName", "FifoWorkerFunctionName"} <= set(outputs)
    assert {f"Ordered{i}QueueUrl" for i in range(count)} <= set(outputs)
    assert {f"Ordered{i}DlqUrl" for i in range(count)} <= set(outputs)


@pytest.mark.parametrize(
    ("attribute", "settings_model"),
    [("ingest", OrderedIngestSettings), ("worker", FifoWorkerSettings)],
)
def test_ordered_environment_matches_its_settings_model(
    ordered_synth: Synth, attribute: str, settings_model: Any
) -> None:
    env = _env(ordered_synth, getattr(ordered_synth.breakwater.ordered, attribute))
    fields = {name.upper() for name in settings_model.model_fields}
    required = {name.upper() for name, field in settings_model.model_fields.items() if field.is_required()}
    assert required <= _contract_names(env) <= fields

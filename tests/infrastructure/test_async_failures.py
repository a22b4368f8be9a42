"""Template assertions: every queue declares its encryption; the asynchronously invoked functions send
what Lambda gives up on to an encrypted, alarmed queue; the health report shards reach every reader;
the stage throttle, a cap every tenant shares, has its own alarm."""

from __future__ import annotations

import math
from typing import Any

import pytest

from breakwater_cdk import ceilings
from tests.infrastructure.conftest import Synth
from tests.infrastructure.test_foundation import _as_list, _env, _statements

pytestmark = pytest.mark.slow


def test_every_queue_declares_sqs_managed_or_kms_encryption(ordered_synth: Synth) -> None:
    """Standard and FIFO queues, their DLQs, the stream's and the async failures' queues alike."""
    queues = ordered_synth.of_type("AWS::SQS::Queue")
    assert any(queue["Properties"].get("FifoQueue") for queue in queues.values())
    names = [queue["Properties"]["QueueName"] for queue in queues.values()]
    for role in ("-async-failures", "-stream-failures", "-live-0-dlq", "-ordered-0-dlq.fifo"):
        assert any(name.endswith(role) for name in names), role
    for logical_id, queue in queues.items():
        props = queue["Properties"]
        assert props.get("SqsManagedSseEnabled") is True or "KmsMasterKeyId" in props, logical_id


def _failures_queue_id(synth: Synth) -> str:
    return synth.logical_id(synth.breakwater.async_failures.queue)


def _invoke_configs(synth: Synth) -> dict[str, dict[str, Any]]:
    """Each function's EventInvokeConfig properties, by the function's logical id."""
    configs = {}
    for config in synth.of_type("AWS::Lambda::EventInvokeConfig").values():
        props = config["Properties"]
        configs[props["FunctionName"]["Ref"]] = props
    return configs


def test_the_asynchronously_invoked_functions_send_failures_to_the_encrypted_queue(synth: Synth) -> None:
    breakwater = synth.breakwater
    functions = [breakwater.control.controller, breakwater.archive.archiver, breakwater.control.redrive]
    configs = _invoke_configs(synth)
    assert set(configs) == {synth.logical_id(function.function) for function in functions}
    queue_arn = {"Fn::GetAtt": [_failures_queue_id(synth), "Arn"]}
    for props in configs.values():
        assert props["DestinationConfig"] == {"OnFailure": {"Destination": queue_arn}}
        assert props["MaximumRetryAttempts"] == 0  # each is started again by its schedule or operator
        assert 60 <= props["MaximumEventAgeInSeconds"] <= 3600
    # the controller's run is worthless past the minute its schedule repeats in
    controller = configs[synth.logical_id(breakwater.control.controller.function)]
    assert controller["MaximumEventAgeInSeconds"] == 60
    queue = synth.resources[_failures_queue_id(synth)]["Properties"]
    assert queue["SqsManagedSseEnabled"] is True
    assert queue["MessageRetentionPeriod"] == 14 * 86_400


def test_only_those_functions_may_send_there_and_only_send(synth: Synth) -> None:
    queue_arn = {"Fn::GetAtt": [_failures_queue_id(synth), "Arn"]}
    breakwater = synth.breakwater
    senders = {
        synth.logical_id(function.role)
        for function in (
            breakwater.control.controller,
            breakwater.archive.archiver,
            breakwater.control.redrive,
        )
    }
    granted: set[str] = set()
    for policy in synth.of_type("AWS::IAM::Policy").values():
        for statement in _statements(policy):
            if queue_arn in _as_list(statement["Resource"]):
                assert statement["Effect"] == "Allow"
                assert _as_list(statement["Action"]) == ["sqs:SendMessage"]
                granted.update(role["Ref"] for role in policy["Properties"]["Roles"])
    assert granted == senders


def test_any_failed_asynchronous_event_alarms(synth: Synth) -> None:
    topic = synth.logical_id(synth.breakwater.monitoring.topic)
    alarms = [
        alarm["Properties"]
        for alarm in synth.of_type("AWS::CloudWatch::Alarm").values()
        if {"Name": "QueueName", "Value": {"Fn::GetAtt": [_failures_queue_id(synth), "QueueName"]}}
        in alarm["Properties"].get("Dimensions", [])
    ]
    assert len(alarms) == 1
    (alarm,) = alarms
    assert alarm["MetricName"] == "ApproximateNumberOfMessagesVisible"
    assert alarm["Threshold"] == 1
    assert alarm["ComparisonOperator"] == "GreaterThanOrEqualToThreshold"
    assert {"Ref": topic} in alarm["AlarmActions"]


def test_no_function_is_acknowledged_without_a_dlq_when_it_has_a_destination(synth: Synth) -> None:
    """cdk-nag's Serverless-LambdaAsyncFailureDestination holds for every EventInvokeConfig (no finding)."""
    plugins = {report["pluginName"]: report for report in synth.report["pluginReports"]}
    findings = [
        violation
        for violation in plugins["Serverless"]["violations"]
        if violation["ruleName"].endswith("LambdaAsyncFailureDestination")
    ]
    assert findings == []


def test_health_report_shards_reach_the_workers_and_the_controller(synth: Synth) -> None:
    breakwater = synth.breakwater
    live_containers = (synth.config.queue_set.size + 1) * synth.config.worker.mapping_concurrency
    expected = max(1, math.ceil(live_containers / 5 / 250))
    assert ceilings.health_report_shards(synth.config) == expected
    for function in (
        breakwater.consumers.live_worker,
        breakwater.consumers.sideline_worker,
        breakwater.control.controller,
    ):
        assert _env(synth, function)["HEALTH_REPORT_SHARDS"] == str(expected), function.name


def test_the_stage_throttle_every_tenant_shares_has_its_own_alarm(synth: Synth) -> None:
    stage = synth.logical_id(synth.breakwater.ingress.api.deployment_stage)
    alarms = [
        alarm["Properties"]
        for alarm in synth.of_type("AWS::CloudWatch::Alarm").values()
        if alarm["Properties"].get("MetricName") == "Count"
        and alarm["Properties"].get("Namespace") == "AWS/ApiGateway"
    ]
    assert len(alarms) == 1
    (alarm,) = alarms
    assert {"Name": "Stage", "Value": {"Ref": stage}} in alarm["Dimensions"]
    assert alarm["Statistic"] == "Sum" and alarm["Period"] == 60
    assert alarm["Threshold"] == pytest.approx(0.8 * synth.config.api.throttle_rate * 60)

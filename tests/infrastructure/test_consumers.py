"""Template assertions on the consumer side (issue 3): mappings with batch item failures, DLQs on
every queue, the controller's schedule and rights, redrive, the alarms and the dashboard."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from breakwater.settings import ControllerSettings, RedriveSettings, WorkerSettings
from tests.infrastructure.conftest import Synth
from tests.infrastructure.test_foundation import _as_list, _contract_names, _env, _role_actions, _statements

pytestmark = pytest.mark.slow


def _mappings(synth: Synth, worker: Any) -> dict[str, dict[str, Any]]:
    """Event source mappings of ``worker``, keyed by the logical id of their queue."""
    function_id = synth.logical_id(worker.function)
    return {
        m["Properties"]["EventSourceArn"]["Fn::GetAtt"][0]: m["Properties"]
        for m in synth.of_type("AWS::Lambda::EventSourceMapping").values()
        if m["Properties"]["FunctionName"] == {"Ref": function_id}
    }


def _statements_of(synth: Synth, role: Any) -> list[dict[str, Any]]:
    role_id = synth.logical_id(role)
    return [
        statement
        for policy in synth.of_type("AWS::IAM::Policy").values()
        if {"Ref": role_id} in policy["Properties"]["Roles"]
        for statement in _statements(policy)
    ]


def test_every_queue_has_its_own_dlq(synth: Synth) -> None:
    queues = synth.breakwater.queues
    roles = [pair.role for pair in queues.all]
    assert roles[-3:] == ["spillover", "backlog", "surge"]
    own = {synth.logical_id(q) for pair in queues.all for q in (pair.queue, pair.dlq)}
    assert len(own) == 2 * (synth.config.queue_set.size + 3)
    assert own <= set(synth.of_type("AWS::SQS::Queue"))  # the workloads' queues are checked on their own
    for pair in queues.all:
        redrive = synth.resources[synth.logical_id(pair.queue)]["Properties"]["RedrivePolicy"]
        assert redrive["deadLetterTargetArn"]["Fn::GetAtt"][0] == synth.logical_id(pair.dlq)
        assert redrive["maxReceiveCount"] == synth.config.queue_set.max_receive_count


def test_live_worker_drains_every_live_queue_and_surge_with_batch_item_failures(synth: Synth) -> None:
    worker = synth.config.worker
    mappings = _mappings(synth, synth.breakwater.consumers.live_worker)
    queues = synth.breakwater.queues
    assert set(mappings) == {synth.logical_id(p.queue) for p in [*queues.live, queues.surge]}
    for props in mappings.values():
        assert props["FunctionResponseTypes"] == ["ReportBatchItemFailures"]
        assert props["BatchSize"] == worker.batch_size
        assert props["ScalingConfig"] == {"MaximumConcurrency": worker.max_concurrency}
        assert props["Enabled"] is True


def test_sideline_worker_mappings_start_disabled_for_the_controller_to_enable(synth: Synth) -> None:
    mappings = _mappings(synth, synth.breakwater.consumers.sideline_worker)
    assert set(mappings) == {synth.logical_id(p.queue) for p in synth.breakwater.queues.sideline}
    for props in mappings.values():
        assert props["FunctionResponseTypes"] == ["ReportBatchItemFailures"]
        assert props["Enabled"] is False


@pytest.mark.parametrize(
    ("attribute", "settings_model"),
    [
        ("consumers.live_worker", WorkerSettings),
        ("consumers.sideline_worker", WorkerSettings),
        ("control.controller", ControllerSettings),
        ("control.redrive", RedriveSettings),
    ],
)
def test_function_environment_matches_its_settings_model(
    synth: Synth, attribute: str, settings_model: Any
) -> None:
    function: Any = synth.breakwater
    for part in attribute.split("."):
        function = getattr(function, part)
    env = _env(synth, function)
    fields = {name.upper() for name in settings_model.model_fields}
    required = {name.upper() for name, field in settings_model.model_fields.items() if field.is_required()}
    assert required <= _contract_names(env) <= fields


def test_workers_run_in_their_mode_with_the_worker_timeout(synth: Synth) -> None:
    for worker, mode in (
        (synth.breakwater.consumers.live_worker, "live"),
        (synth.breakwater.consumers.sideline_worker, "sideline"),
    ):
        props = synth.resources[synth.logical_id(worker.function)]["Properties"]
        assert props["Handler"] == "worker/handler.handler"
        assert props["Timeout"] == synth.config.worker.timeout_seconds
        assert props["MemorySize"] == synth.config.worker.memory_mb
        env = props["Environment"]["Variables"]
        assert env["WORKER_MODE"] == mode
        assert env["SIDELINING_ENABLED"] == "true"
        assert env["VISIBILITY_TIMEOUT_SECONDS"] == str(synth.config.worker.visibility_timeout_seconds)


def test_controller_runs_every_minute_and_knows_the_sideline_mappings(synth: Synth) -> None:
    controller_id = synth.logical_id(synth.breakwater.control.controller.function)
    (rule,) = synth.of_type("AWS::Events::Rule").values()
    assert rule["Properties"]["ScheduleExpression"] == "rate(1 minute)"
    (target,) = rule["Properties"]["Targets"]
    assert target["Arn"] == {"Fn::GetAtt": [controller_id, "Arn"]}
    env = _env(synth, synth.breakwater.control.controller)
    sideline_function = {"Ref": synth.logical_id(synth.breakwater.consumers.sideline_worker.function)}
    mapping_ids = [
        key
        for key, m in synth.of_type("AWS::Lambda::EventSourceMapping").items()
        if m["Properties"]["FunctionName"] == sideline_function
    ]
    assert env["SIDELINE_MAPPING_UUIDS"] == {"Fn::Join": [",", [{"Ref": key} for key in mapping_ids]]}
    assert env["HEALTHY_AGE_SECONDS"] == str(synth.config.alarms.oldest_message_age_seconds)


def test_only_the_controller_updates_mappings_and_only_the_sideline_ones(synth: Synth) -> None:
    controller = synth.breakwater.control.controller
    for function in synth.breakwater.functions.built:
        actions = _role_actions(synth, function.role)
        if function is controller:
            assert "lambda:UpdateEventSourceMapping" in actions
        else:
            assert not {a for a in actions if a.startswith("lambda:")}, function.name
    (statement,) = [
        s
        for s in _statements_of(synth, controller.role)
        if "lambda:UpdateEventSourceMapping" in _as_list(s["Action"])
    ]
    assert len(_as_list(statement["Resource"])) == len(synth.breakwater.consumers.sideline_mappings)
    assert "*" not in json.dumps(statement["Resource"])
    # No message of any queue: it may only send what Lambda gives up on to its on-failure destination.
    failures = {"Fn::GetAtt": [synth.logical_id(synth.breakwater.async_failures.queue), "Arn"]}
    controller_actions = {
        action
        for statement in _statements_of(synth, controller.role)
        if _as_list(statement["Resource"]) != [failures]
        for action in _as_list(statement["Action"])
    }
    assert not {"sqs:ReceiveMessage", "sqs:DeleteMessage", "sqs:SendMessage"} & controller_actions


def test_workers_cannot_touch_what_they_do_not_drain(synth: Synth) -> None:
    sideline = synth.breakwater.consumers.sideline_worker
    live_arns = [{"Fn::GetAtt": [synth.logical_id(p.queue), "Arn"]} for p in synth.breakwater.queues.live]
    for statement in _statements_of(synth, sideline.role):
        if "sqs:ReceiveMessage" in _as_list(statement["Action"]):
            assert not [arn for arn in _as_list(statement["Resource"]) if arn in live_arns]
    for worker in (synth.breakwater.consumers.live_worker, sideline):
        actions = _role_actions(synth, worker.role)
        assert {"sqs:SendMessage", "sqs:ChangeMessageVisibility", "sqs:DeleteMessage"} <= actions
        assert "dynamodb:PutItem" in actions  # idempotency records and leases


def test_redrive_moves_each_dlq_back_to_its_own_source(synth: Synth) -> None:
    redrive = synth.breakwater.control.redrive
    pairs = json.dumps(_env(synth, redrive)["REDRIVE_PAIRS"])
    for pair in synth.breakwater.queues.all:
        expected = json.dumps(
            [{"Ref": synth.logical_id(pair.dlq)}, '":"', {"Ref": synth.logical_id(pair.queue)}]
        )
        assert expected[1:-1] in pairs, pair.role
    # moved by hand, so each message carries the redrive's mark: no move task, whose copies could not
    # be told from live work
    actions = {action for s in _statements_of(synth, redrive.role) for action in _as_list(s["Action"])}
    assert not {"sqs:StartMessageMoveTask", "sqs:ListMessageMoveTasks"} & actions


def _alarm_props(synth: Synth) -> list[dict[str, Any]]:
    return [alarm["Properties"] for alarm in synth.of_type("AWS::CloudWatch::Alarm").values()]


def test_oldest_age_alarms_cover_the_sideline_queues(synth: Synth) -> None:
    thresholds = {
        props["Dimensions"][0]["Value"]["Fn::GetAtt"][0]: props["Threshold"]
        for props in _alarm_props(synth)
        if props.get("MetricName") == "ApproximateAgeOfOldestMessage"
    }
    for pair in synth.breakwater.queues.sideline:
        assert (
            thresholds[synth.logical_id(pair.queue)]
            == synth.config.alarms.sideline_oldest_message_age_seconds
        )
    assert synth.logical_id(synth.breakwater.queues.surge.queue) in thresholds


def test_p99_age_of_first_attempt_alarms_above_the_slo(synth: Synth) -> None:
    (props,) = [p for p in _alarm_props(synth) if p.get("MetricName") == "AgeOfFirstAttempt"]
    assert props["ExtendedStatistic"] == "p99"
    assert props["Namespace"] == synth.config.metrics_namespace
    assert props["Threshold"] == synth.config.alarms.age_of_first_attempt_p99_ms
    assert {"Name": "QueueRole", "Value": "live"} in props["Dimensions"]
    assert {"Name": "service", "Value": synth.config.service_name} in props["Dimensions"]


def test_empty_receive_ratio_alarms_when_polling_headroom_is_gone(synth: Synth) -> None:
    ratio_alarms = [
        p
        for p in _alarm_props(synth)
        if any("Expression" in m and "empty" in m["Expression"] for m in p.get("Metrics", []))
    ]
    assert len(ratio_alarms) == len(synth.breakwater.queues.live)
    for props in ratio_alarms:
        assert props["ComparisonOperator"] == "LessThanThreshold"
        assert props["Threshold"] == synth.config.alarms.empty_receive_ratio_min
        names = {m["MetricStat"]["Metric"]["MetricName"] for m in props["Metrics"] if "MetricStat" in m}
        assert names == {"NumberOfEmptyReceives", "NumberOfMessagesReceived"}


def test_throttled_requests_alarm(synth: Synth) -> None:
    (props,) = [p for p in _alarm_props(synth) if p.get("MetricName") == "Throttled"]
    assert props["Namespace"] == synth.config.metrics_namespace
    assert props["Statistic"] == "Sum"
    assert props["Threshold"] == synth.config.alarms.throttled_requests


def test_one_dashboard_shows_the_alarms(synth: Synth) -> None:
    (dashboard,) = synth.of_type("AWS::CloudWatch::Dashboard").values()
    body = json.dumps(dashboard["Properties"]["DashboardBody"])
    for metric in (
        "ApproximateAgeOfOldestMessage",
        "AgeOfFirstAttempt",
        "NumberOfEmptyReceives",
        "Throttled",
    ):
        assert metric in body
    alarm_ids = set(synth.of_type("AWS::CloudWatch::Alarm"))
    shown = {alarm_id for alarm_id in alarm_ids if alarm_id in body}
    assert shown == alarm_ids


def test_naive_workers_do_not_sideline(naive_synth: Synth) -> None:
    for worker in (
        naive_synth.breakwater.consumers.live_worker,
        naive_synth.breakwater.consumers.sideline_worker,
    ):
        assert _env(naive_synth, worker)["SIDELINING_ENABLED"] == "false"
    live = _mappings(naive_synth, naive_synth.breakwater.consumers.live_worker)
    assert len(live) == 2  # the single live queue and surge


def test_controller_reads_only_the_changed_tenants_index_and_every_queue_depth(synth: Synth) -> None:
    controller = synth.breakwater.control.controller
    state_id = synth.logical_id(synth.breakwater.tables.state)
    (table,) = [t for key, t in synth.of_type("AWS::DynamoDB::Table").items() if key == state_id]
    (index,) = table["Properties"]["GlobalSecondaryIndexes"]
    assert index["IndexName"] == _env(synth, controller)["DIRTY_INDEX_NAME"] == "dirty"
    assert [k["AttributeName"] for k in index["KeySchema"]] == ["dirty_shard", "pk"]
    assert index["Projection"] == {"ProjectionType": "KEYS_ONLY"}
    queries = [s for s in _statements_of(synth, controller.role) if "dynamodb:Query" in _as_list(s["Action"])]
    resources = json.dumps([s["Resource"] for s in queries])
    assert "/index/dirty" in resources and "/index/*" not in resources
    # The surge queue holds deferred messages: its depth is part of what the estimates must add up to.
    assert _env(synth, controller)["SURGE_QUEUE_URL"] == {
        "Ref": synth.logical_id(synth.breakwater.queues.surge.queue)
    }
    depth_readers = json.dumps(
        [
            s["Resource"]
            for s in _statements_of(synth, controller.role)
            if "sqs:GetQueueAttributes" in _as_list(s["Action"])
        ]
    )
    assert synth.logical_id(synth.breakwater.queues.surge.queue) in depth_readers
    # One invocation by default: no right to invoke itself (only the archiver).
    invokes = json.dumps(
        [
            s["Resource"]
            for s in _statements_of(synth, controller.role)
            if "lambda:InvokeFunction" in _as_list(s["Action"])
        ]
    )
    assert synth.logical_id(controller.function) not in invokes


def test_a_split_controller_may_invoke_itself_and_nothing_else_more(tmp_path: Any) -> None:
    from tests.infrastructure.conftest import synthesize

    base = json.loads((Path(__file__).resolve().parents[2] / "cdk.json").read_text())["context"]["breakwater"]
    split = synthesize(tmp_path, {"breakwater": base | {"backpressure": {"controller_invocations": 8}}})
    controller = split.breakwater.control.controller
    assert _env(split, controller)["CONTROLLER_INVOCATIONS"] == "8"
    invokes = json.dumps(
        [
            s["Resource"]
            for s in _statements_of(split, controller.role)
            if "lambda:InvokeFunction" in _as_list(s["Action"])
        ]
    )
    assert split.logical_id(controller.function) in invokes


PROVISIONED_WORKER = {"minimum_pollers": 200, "maximum_pollers": 2000}  # the SQS bounds CloudFormation takes
PROVISIONED_FIFO = {"minimum_pollers": 2, "maximum_pollers": 2}


@pytest.fixture(scope="module")
def provisioned_synth(tmp_path_factory: pytest.TempPathFactory) -> Synth:
    """Provisioned mode on the workers (cdk.json's max_concurrency removed) and on the FIFO worker."""
    from tests.infrastructure.conftest import synthesize

    return synthesize(
        tmp_path_factory.mktemp("cdk-provisioned"),
        {
            "breakwater": {
                "worker": {"max_concurrency": None, "provisioned_pollers": PROVISIONED_WORKER},
                "ordered": {"enabled": True, "provisioned_pollers": PROVISIONED_FIFO},
            }
        },
    )


def _sqs_mappings(synth: Synth) -> list[dict[str, Any]]:
    """Every mapping of an SQS queue (not the stream's), whatever function it feeds."""
    queues = set(synth.of_type("AWS::SQS::Queue"))
    return [
        m["Properties"]
        for m in synth.of_type("AWS::Lambda::EventSourceMapping").values()
        if m["Properties"]["EventSourceArn"].get("Fn::GetAtt", [None])[0] in queues
    ]


def test_mappings_scale_on_demand_up_to_max_concurrency_by_default(synth: Synth, naive_synth: Synth) -> None:
    for default in (synth, naive_synth):
        mappings = _sqs_mappings(default)
        assert mappings
        for props in mappings:
            assert "ProvisionedPollerConfig" not in props
            assert props["ScalingConfig"] == {"MaximumConcurrency": default.config.worker.max_concurrency}


def test_provisioned_mode_replaces_the_scaling_config_on_every_worker_mapping(
    provisioned_synth: Synth,
) -> None:
    consumers = provisioned_synth.breakwater.consumers
    expected = {"MinimumPollers": 200, "MaximumPollers": 2000}
    for worker in (consumers.live_worker, consumers.sideline_worker):
        mappings = _mappings(provisioned_synth, worker)
        assert mappings
        for props in mappings.values():
            assert props["ProvisionedPollerConfig"] == expected
            assert "ScalingConfig" not in props
            assert props["FunctionResponseTypes"] == ["ReportBatchItemFailures"]


def test_provisioned_mode_on_the_fifo_worker(provisioned_synth: Synth) -> None:
    ordered = provisioned_synth.breakwater.ordered
    assert ordered is not None
    mappings = _mappings(provisioned_synth, ordered.worker)
    assert set(mappings) == {provisioned_synth.logical_id(pair.queue) for pair in ordered.queues}
    for props in mappings.values():
        assert props["ProvisionedPollerConfig"] == {"MinimumPollers": 2, "MaximumPollers": 2}
        assert "ScalingConfig" not in props


def test_the_burst_pool_follows_what_the_maximum_pollers_run(provisioned_synth: Synth) -> None:
    worker = provisioned_synth.config.worker
    assert worker.burst_share is not None
    live = _env(provisioned_synth, provisioned_synth.breakwater.consumers.live_worker)
    mapped = provisioned_synth.config.queue_set.size + 1
    per_mapping = PROVISIONED_WORKER["maximum_pollers"] * 10  # Lambda: up to 10 invocations per poller
    assert int(live["CONCURRENCY_BURST_SLOTS"]) == int(worker.burst_share * mapped * per_mapping)


def test_the_health_reports_spread_over_as_many_items_as_the_maximum_pollers_need(
    provisioned_synth: Synth,
) -> None:
    """9 mappings x 20,000 invocations report 36,000 times a second: the most items the controller
    reads in one call (100), each below a partition's 1,000 write units."""
    breakwater = provisioned_synth.breakwater
    for function in (breakwater.consumers.live_worker, breakwater.control.controller):
        assert _env(provisioned_synth, function)["HEALTH_REPORT_SHARDS"] == "100", function.name


def test_naive_mode_takes_provisioned_pollers_too(tmp_path: Any) -> None:
    from tests.infrastructure.conftest import synthesize

    naive = synthesize(
        tmp_path,
        {
            "breakwater": {
                "mode": "naive",
                "worker": {
                    "max_concurrency": None,
                    "provisioned_pollers": {"minimum_pollers": 3, "maximum_pollers": 12},
                },
            }
        },
    )
    mappings = _sqs_mappings(naive)
    assert len(mappings) == 4  # the single live queue and surge, spillover and backlog
    for props in mappings:
        assert props["ProvisionedPollerConfig"] == {"MinimumPollers": 3, "MaximumPollers": 12}
        assert "ScalingConfig" not in props


def test_the_controller_caps_each_estimate_by_the_tenant_s_own_live_queues(synth: Synth) -> None:
    controller = synth.breakwater.control.controller
    environment = _env(synth, controller)
    live = len(synth.breakwater.queues.live)
    assert environment["SHARD_SIZE"] == str(min(synth.config.queue_set.shard_size, live))

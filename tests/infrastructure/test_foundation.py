"""Template assertions on what matters for the foundation (issue 2): queues and their DLQs,
encryption, TLS-only policies, alarms, the authorizer on every method, validation, least privilege."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from breakwater.settings import AuthorizerSettings, IngestSettings, TierLimits
from breakwater_cdk.config import TierConfig
from tests.infrastructure.conftest import Synth

pytestmark = pytest.mark.slow


def _statements(resource: dict[str, Any]) -> list[dict[str, Any]]:
    props = resource["Properties"]
    documents = [props["PolicyDocument"]] if "PolicyDocument" in props else []
    documents += [policy["PolicyDocument"] for policy in props.get("Policies", [])]
    return [statement for document in documents for statement in document["Statement"]]


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def _role_actions(synth: Synth, role: Any) -> set[str]:
    role_id = synth.logical_id(role)
    actions: set[str] = set()
    for policy in synth.of_type("AWS::IAM::Policy").values():
        if {"Ref": role_id} in policy["Properties"]["Roles"]:
            for statement in _statements(policy):
                actions.update(_as_list(statement["Action"]))
    return actions


def _env(synth: Synth, function: Any) -> dict[str, Any]:
    variables: dict[str, Any] = synth.resources[synth.logical_id(function.function)]["Properties"][
        "Environment"
    ]["Variables"]
    return variables


def _contract_names(env: dict[str, Any]) -> set[str]:
    return {name for name in env if not name.startswith("POWERTOOLS_")}


# --- cdk-nag ---------------------------------------------------------------------------------------


def test_cdk_nag_leaves_no_unacknowledged_error(synth: Synth) -> None:
    plugins = {report["pluginName"]: report for report in synth.report["pluginReports"]}
    assert {"AwsSolutions", "Serverless"} <= set(plugins)
    for name in ("AwsSolutions", "Serverless"):
        errors = [v["ruleName"] for v in plugins[name]["violations"] if v["severity"] == "error"]
        assert errors == [], f"{name}: unacknowledged errors {errors}"
        assert plugins[name]["conclusion"] == "success"


def test_every_acknowledgement_has_a_reason_and_is_not_stack_wide(synth: Synth) -> None:
    acknowledged = [
        v for report in synth.report["pluginReports"] for v in report.get("suppressedViolations", [])
    ]
    assert acknowledged, "expected the documented acknowledgements in the report"
    for violation in acknowledged:
        assert len(violation.get("reason", "")) > 40, violation["ruleName"]
    for node in (synth.breakwater, synth.stack, synth.stack.node.scope):
        kinds = {entry.type for entry in node.node.metadata}  # type: ignore[union-attr]
        assert "aws:cdk:acknowledged-rules" not in kinds


# --- queues ----------------------------------------------------------------------------------------


def test_every_live_queue_has_its_own_dlq_with_the_configured_receive_count(synth: Synth) -> None:
    live = synth.breakwater.queues.live
    assert len(live) == synth.config.queue_set.size
    dlq_ids = set()
    for pair in live:
        props = synth.resources[synth.logical_id(pair.queue)]["Properties"]
        redrive = props["RedrivePolicy"]
        assert redrive["maxReceiveCount"] == synth.config.queue_set.max_receive_count
        dlq_id = redrive["deadLetterTargetArn"]["Fn::GetAtt"][0]
        assert dlq_id == synth.logical_id(pair.dlq)
        dlq_ids.add(dlq_id)
        assert props["VisibilityTimeout"] == synth.config.worker.visibility_timeout_seconds
        assert props["MessageRetentionPeriod"] == synth.config.queue_set.retention_days * 86_400
    assert len(dlq_ids) == len(live)


def test_every_queue_is_encrypted_and_refuses_plain_http(synth: Synth) -> None:
    queues = synth.of_type("AWS::SQS::Queue")
    for logical_id, queue in queues.items():
        assert (
            queue["Properties"].get("SqsManagedSseEnabled") is True or "KmsMasterKeyId" in queue["Properties"]
        ), logical_id
    protected: set[str] = set()
    for policy in synth.of_type("AWS::SQS::QueuePolicy").values():
        for statement in _statements(policy):
            if statement["Effect"] == "Deny" and statement.get("Condition") == {
                "Bool": {"aws:SecureTransport": "false"}
            }:
                protected.update(queue["Ref"] for queue in policy["Properties"]["Queues"])
    assert protected == set(queues)


# --- tables, topic, logs ---------------------------------------------------------------------------


def test_tables_are_on_demand_encrypted_and_recoverable(synth: Synth) -> None:
    tables = synth.of_type("AWS::DynamoDB::Table")
    assert len(tables) == 3 + (synth.breakwater.streaming is not None) + (
        synth.breakwater.ordered is not None
    )
    for table in tables.values():
        props = table["Properties"]
        assert props["BillingMode"] == "PAY_PER_REQUEST"
        assert props["SSESpecification"]["SSEEnabled"] is True
        assert props["PointInTimeRecoverySpecification"]["PointInTimeRecoveryEnabled"] is True
    state = synth.resources[synth.logical_id(synth.breakwater.tables.state)]["Properties"]
    assert state["TimeToLiveSpecification"] == {"AttributeName": "ttl", "Enabled": True}
    assert [k["AttributeName"] for k in state["KeySchema"]] == ["pk", "sk"]
    tenants = synth.resources[synth.logical_id(synth.breakwater.tables.tenants)]
    assert tenants["DeletionPolicy"] == "Retain"
    assert tenants["Properties"]["KeySchema"] == [{"AttributeName": "tenant_id", "KeyType": "HASH"}]
    idempotency = synth.resources[synth.logical_id(synth.breakwater.tables.idempotency)]["Properties"]
    assert idempotency["TimeToLiveSpecification"]["AttributeName"] == "expiration"


def test_alarm_topic_is_encrypted_and_tls_only(synth: Synth) -> None:
    ((topic_id, topic),) = synth.of_type("AWS::SNS::Topic").items()
    assert "KmsMasterKeyId" in topic["Properties"]
    denies = [
        s
        for policy in synth.of_type("AWS::SNS::TopicPolicy").values()
        for s in _statements(policy)
        if s["Effect"] == "Deny" and s.get("Condition") == {"Bool": {"aws:SecureTransport": "false"}}
    ]
    assert denies
    (key,) = synth.of_type("AWS::KMS::Key").values()
    assert key["Properties"]["EnableKeyRotation"] is True
    del topic_id


def test_every_log_group_is_encrypted_and_retained(synth: Synth) -> None:
    groups = synth.of_type("AWS::Logs::LogGroup")
    assert len(groups) >= 4  # two functions, API access and execution logs
    for logical_id, group in groups.items():
        assert "KmsKeyId" in group["Properties"], logical_id
        assert group["Properties"]["RetentionInDays"] == synth.config.functions.log_retention_days, logical_id


# --- alarms ----------------------------------------------------------------------------------------


def _alarms_on(synth: Synth, metric_name: str) -> dict[str, dict[str, Any]]:
    return {
        key: alarm
        for key, alarm in synth.of_type("AWS::CloudWatch::Alarm").items()
        if alarm["Properties"].get("MetricName") == metric_name
    }


def _alarmed_queue_ids(alarms: dict[str, dict[str, Any]]) -> set[str]:
    ids = set()
    for alarm in alarms.values():
        (dimension,) = alarm["Properties"]["Dimensions"]
        ids.add(dimension["Value"]["Fn::GetAtt"][0])
    return ids


def test_oldest_message_age_alarm_on_every_live_queue(synth: Synth) -> None:
    alarms = _alarms_on(synth, "ApproximateAgeOfOldestMessage")
    live_ids = {synth.logical_id(pair.queue) for pair in synth.breakwater.queues.live}
    assert live_ids <= _alarmed_queue_ids(alarms)
    for alarm in alarms.values():
        if alarm["Properties"]["Dimensions"][0]["Value"]["Fn::GetAtt"][0] in live_ids:
            assert alarm["Properties"]["Threshold"] == synth.config.alarms.oldest_message_age_seconds


def test_any_visible_dlq_message_alarms(synth: Synth) -> None:
    alarms = _alarms_on(synth, "ApproximateNumberOfMessagesVisible")
    dlq_ids = {synth.logical_id(pair.dlq) for pair in synth.breakwater.queues.all}
    assert _alarmed_queue_ids(alarms) >= dlq_ids
    for alarm in alarms.values():
        props = alarm["Properties"]
        assert props["Threshold"] == 1
        assert props["ComparisonOperator"] == "GreaterThanOrEqualToThreshold"


def test_every_alarm_notifies_the_topic(synth: Synth) -> None:
    (topic_id,) = synth.of_type("AWS::SNS::Topic")
    for logical_id, alarm in synth.of_type("AWS::CloudWatch::Alarm").items():
        assert alarm["Properties"]["AlarmActions"] == [{"Ref": topic_id}], logical_id
    assert synth.of_type("AWS::CloudWatch::Dashboard")


# --- API -------------------------------------------------------------------------------------------


def test_authorizer_guards_every_method(synth: Synth) -> None:
    ((authorizer_id, authorizer),) = synth.of_type("AWS::ApiGateway::Authorizer").items()
    props = authorizer["Properties"]
    assert props["Type"] == "REQUEST"
    assert props["IdentitySource"] == "method.request.header.Authorization"
    assert props["AuthorizerResultTtlInSeconds"] == synth.config.api.authorizer_cache_seconds
    methods = synth.of_type("AWS::ApiGateway::Method")
    assert methods
    for logical_id, method in methods.items():
        assert method["Properties"]["AuthorizationType"] == "CUSTOM", logical_id
        assert method["Properties"]["AuthorizerId"] == {"Ref": authorizer_id}, logical_id


def test_each_tier_has_a_usage_plan_at_its_ceiling_and_every_method_needs_the_authorizers_key(
    synth: Synth,
) -> None:
    (api,) = synth.of_type("AWS::ApiGateway::RestApi").values()
    assert api["Properties"]["ApiKeySourceType"] == "AUTHORIZER"  # clients never send a key of their own
    for logical_id, method in synth.of_type("AWS::ApiGateway::Method").items():
        assert method["Properties"]["ApiKeyRequired"] is True, logical_id
    plans = {
        p["Properties"]["UsagePlanName"]: p["Properties"]
        for p in synth.of_type("AWS::ApiGateway::UsagePlan").values()
    }
    ceiling = synth.config.backpressure.max_multiplier
    assert set(plans) == {f"{synth.config.service_name}-tier-{tier}" for tier in synth.config.tiers}
    (stage_id,) = synth.of_type("AWS::ApiGateway::Stage")
    for tier, limits in synth.config.tiers.items():
        plan = plans[f"{synth.config.service_name}-tier-{tier}"]
        assert plan["Throttle"] == {"RateLimit": limits.rate * ceiling, "BurstLimit": limits.burst}
        (stage,) = plan["ApiStages"]
        assert stage["Stage"] == {"Ref": stage_id}
    # Onboarding reads the plans from this output (breakwater.aws.usage_plans.EdgePlans).
    output = synth.template.to_json()["Outputs"]["EdgeUsagePlans"]["Value"]
    rendered = json.dumps(output)
    for plan_id in synth.of_type("AWS::ApiGateway::UsagePlan"):
        assert plan_id in rendered
    assert "ceiling" in rendered


def test_post_messages_is_validated_against_the_schema(synth: Synth) -> None:
    method = synth.resources[synth.logical_id(synth.breakwater.ingress.post_message)]
    assert "RequestValidatorId" in method["Properties"]
    assert method["Properties"]["Integration"]["Type"] == "AWS_PROXY"
    (validator,) = synth.of_type("AWS::ApiGateway::RequestValidator").values()  # one, shared by every route
    assert validator["Properties"]["ValidateRequestBody"] is True
    model_id = method["Properties"]["RequestModels"]["application/json"]["Ref"]
    schema = synth.resources[model_id]["Properties"]["Schema"]
    assert synth.resources[model_id]["Properties"]["Name"] == "Message"
    assert schema["required"] == ["type"]
    assert schema["additionalProperties"] is False
    assert set(schema["properties"]) == {"type", "payload", "dedup_key", "ordering_key", "ttl_seconds"}
    assert schema["properties"]["ttl_seconds"]["maximum"] == synth.config.ingest.max_ttl_seconds
    assert schema["properties"]["ttl_seconds"]["minimum"] == 1


def test_gateway_errors_are_problem_details_naming_the_problem(synth: Synth) -> None:
    responses = {
        r["Properties"]["ResponseType"]: r["Properties"]
        for r in synth.of_type("AWS::ApiGateway::GatewayResponse").values()
    }
    expected = {
        "BAD_REQUEST_BODY": "400",
        "UNAUTHORIZED": "401",
        "ACCESS_DENIED": "403",
        "INVALID_API_KEY": "403",
        "MISSING_AUTHENTICATION_TOKEN": "403",  # no route has the method and path: API Gateway's status
        "THROTTLED": "429",
        "AUTHORIZER_FAILURE": "503",  # nothing stored, and a retry may pass: never API Gateway's 500
        "DEFAULT_4XX": "400",
        "DEFAULT_5XX": "500",
    }
    for response_type, status in expected.items():
        assert responses[response_type]["StatusCode"] == status
    for properties in responses.values():
        headers = properties["ResponseParameters"]
        assert headers["gatewayresponse.header.Content-Type"] == "'application/problem+json'"
        retry = properties["StatusCode"] in ("429", "503")
        assert ("gatewayresponse.header.Retry-After" in headers) == retry, properties["ResponseType"]
    for response_type in ("THROTTLED", "AUTHORIZER_FAILURE"):
        assert responses[response_type]["ResponseParameters"]["gatewayresponse.header.Retry-After"] == "'1'"
    assert "validationErrorString" in responses["BAD_REQUEST_BODY"]["ResponseTemplates"]["application/json"]


def test_stage_throttles_traces_and_writes_json_access_logs(synth: Synth) -> None:
    (stage,) = synth.of_type("AWS::ApiGateway::Stage").values()
    props = stage["Properties"]
    assert props["TracingEnabled"] is True
    (settings,) = props["MethodSettings"]
    assert settings["ThrottlingRateLimit"] == synth.config.api.throttle_rate
    assert settings["ThrottlingBurstLimit"] == synth.config.api.throttle_burst
    assert "requestId" in json.loads(props["AccessLogSetting"]["Format"])


# --- functions and IAM -----------------------------------------------------------------------------


def test_functions_use_the_configured_runtime_layer_and_handlers(synth: Synth) -> None:
    functions = synth.of_type("AWS::Lambda::Function")
    handlers = {f["Properties"]["Handler"] for f in functions.values()}
    assert {"authorizer/handler.handler", "ingest/handler.handler"} <= handlers
    for logical_id, function in functions.items():
        props = function["Properties"]
        assert props["Runtime"] == synth.config.functions.runtime, logical_id
        assert props["Architectures"] == [synth.config.functions.architecture], logical_id
        assert props["TracingConfig"] == {"Mode": "Active"}
        runtime = {"Ref": synth.logical_id(synth.breakwater.functions.runtime)}
        (powertools,) = [layer for layer in props["Layers"] if layer != runtime]
        assert runtime in props["Layers"], logical_id
        layer_arn = json.dumps(powertools)
        assert ":017000801446:layer:AWSLambdaPowertoolsPythonV3-python313-arm64:" in layer_arn
        env = props["Environment"]["Variables"]
        assert env["POWERTOOLS_SERVICE_NAME"] == synth.config.service_name
        assert env["POWERTOOLS_METRICS_NAMESPACE"] == synth.config.metrics_namespace
        assert "POWERTOOLS_LOG_LEVEL" in env


def test_the_runtime_library_is_one_versioned_layer_and_no_handler_asset_holds_it(synth: Synth) -> None:
    from breakwater import __version__

    (layer,) = synth.of_type("AWS::Lambda::LayerVersion").values()
    assert layer["Properties"]["Description"] == f"Breakwater runtime library {__version__}"
    assert layer["Properties"]["CompatibleRuntimes"] == [synth.config.functions.runtime]
    outdir = Path(synth.stack.node.root.outdir)  # type: ignore[attr-defined]

    def staged(code: dict[str, Any]) -> Path:
        return outdir / f"asset.{code['S3Key'].removesuffix('.zip')}"

    assert (staged(layer["Properties"]["Content"]) / "python" / "breakwater" / "processor.py").is_file()
    for function in synth.of_type("AWS::Lambda::Function").values():
        code = staged(function["Properties"]["Code"])
        assert code.is_dir() and not (code / "breakwater").exists(), code


@pytest.mark.parametrize(
    ("function_name", "settings_model"),
    [("authorizer", AuthorizerSettings), ("ingest", IngestSettings)],
)
def test_function_environment_matches_its_settings_model(
    synth: Synth, function_name: str, settings_model: Any
) -> None:
    env = _env(synth, getattr(synth.breakwater, function_name))
    fields = {name.upper() for name in settings_model.model_fields}
    required = {name.upper() for name, field in settings_model.model_fields.items() if field.is_required()}
    assert required <= _contract_names(env) <= fields
    assert json.loads(env["TIERS"]) == {name: tier.model_dump() for name, tier in synth.config.tiers.items()}


def test_ingest_environment_lists_every_live_queue(synth: Synth) -> None:
    env = _env(synth, synth.breakwater.ingest)
    joined = env["LIVE_QUEUE_URLS"]["Fn::Join"]
    assert joined[0] == ","
    assert joined[1] == [{"Ref": synth.logical_id(pair.queue)} for pair in synth.breakwater.queues.live]
    assert env["THROTTLING_ENABLED"] == "true"
    assert env["SHARD_SIZE"] == str(synth.config.queue_set.shard_size)


def test_no_policy_grants_a_wildcard_action(synth: Synth) -> None:
    for resource_type in ("AWS::IAM::Policy", "AWS::IAM::Role", "AWS::IAM::ManagedPolicy"):
        for logical_id, resource in synth.of_type(resource_type).items():
            for statement in _statements(resource):
                for action in _as_list(statement["Action"]):
                    assert action != "*" and not action.endswith(":*"), f"{logical_id}: {action}"


def test_function_roles_hold_only_their_grants(synth: Synth) -> None:
    authorizer = _role_actions(synth, synth.breakwater.authorizer.role)
    ingest = _role_actions(synth, synth.breakwater.ingest.role)
    assert "dynamodb:GetItem" in authorizer
    assert not {a for a in authorizer if a.startswith("sqs:")}
    assert not {"dynamodb:PutItem", "dynamodb:UpdateItem", "dynamodb:DeleteItem"} & authorizer
    assert {"sqs:SendMessage", "sqs:GetQueueAttributes", "dynamodb:UpdateItem"} <= ingest
    assert not {"sqs:DeleteMessage", "sqs:ReceiveMessage", "sqs:PurgeQueue"} & ingest
    for role in (synth.breakwater.authorizer.role, synth.breakwater.ingest.role):
        assert "ManagedPolicyArns" not in synth.resources[synth.logical_id(role)]["Properties"]


def test_outputs_name_the_api_the_queues_and_the_tables(synth: Synth) -> None:
    outputs = synth.template.to_json()["Outputs"]
    assert {"ApiUrl", "TenantsTableName", "StateTableName", "IdempotencyTableName"} <= set(outputs)
    assert {f"Live{i}QueueUrl" for i in range(synth.config.queue_set.size)} <= set(outputs)


# --- the naive baseline and the config contract ----------------------------------------------------


def test_naive_mode_builds_one_live_queue_without_throttling(naive_synth: Synth) -> None:
    assert len(naive_synth.breakwater.queues.live) == 1
    live_ids = {naive_synth.logical_id(pair.queue) for pair in naive_synth.breakwater.queues.live}
    assert {q for q in naive_synth.of_type("AWS::SQS::Queue") if "Live" in q} == live_ids | {
        naive_synth.logical_id(pair.dlq) for pair in naive_synth.breakwater.queues.live
    }
    env = _env(naive_synth, naive_synth.breakwater.ingest)
    assert env["THROTTLING_ENABLED"] == "false"
    assert env["SHARD_SIZE"] == "1"
    # Tenants are still enrolled in their tiers' plans (every method needs a key), which throttle nobody.
    plans = naive_synth.of_type("AWS::ApiGateway::UsagePlan").values()
    assert plans and all("Throttle" not in plan["Properties"] for plan in plans)


def test_tier_config_mirrors_the_handlers_tier_limits() -> None:
    assert set(TierConfig.model_fields) == set(TierLimits.model_fields)
    for name, field in TierConfig.model_fields.items():
        assert field.annotation == TierLimits.model_fields[name].annotation, name
        assert field.metadata == TierLimits.model_fields[name].metadata, name

"""The front door: a REST API whose every method sits behind the tenant authorizer.

Every ``POST /v1/<route>`` is validated against a JSON schema (``breakwater_cdk/request_schemas.py``)
before it costs a Lambda invocation; every error API Gateway produces itself is a problem details
object (``application/problem+json``) naming the problem, the handlers' shape; the stage throttles
as configured, traces and writes structured access logs to an encrypted, retained log group.

Every method requires an API key, which the authorizer supplies (``ApiKeySourceType.AUTHORIZER``;
clients never send one): the tenant's key, enrolled at onboarding in its tier's usage plan
(``breakwater.aws.usage_plans``). The plan throttles the tenant at the edge, at its tier's ceiling,
so a tenant's excess is refused before any Lambda runs: a refusal in ingest would be a billed
invocation, holding concurrency that tenants within their limits need.
"""

from __future__ import annotations

import json

from aws_cdk import Duration, Fn, RemovalPolicy, Stack
from aws_cdk import aws_apigateway as apigw
from aws_cdk import aws_kms as kms
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from constructs import Construct

from breakwater.errors import PROBLEM_MEDIA_TYPE, problem
from breakwater_cdk.config import BlueprintConfig
from breakwater_cdk.functions import RETENTION, encrypted_log_group
from breakwater_cdk.request_schemas import message_schema

STAGE_NAME = "prod"

_ACCESS_LOG_FIELDS = {
    "requestId": "$context.requestId",
    "requestTime": "$context.requestTime",
    "ip": "$context.identity.sourceIp",
    "httpMethod": "$context.httpMethod",
    "resourcePath": "$context.resourcePath",
    "status": "$context.status",
    "responseLength": "$context.responseLength",
    "latencyMs": "$context.responseLatency",
    "integrationLatencyMs": "$context.integrationLatency",
    "tenant": "$context.authorizer.principalId",
    "errorType": "$context.error.responseType",
    "error": "$context.error.message",
    "xrayTraceId": "$context.xrayTraceId",
}

# What the gateway answers itself, before a handler runs: (response type, status, code, detail). Every
# answer is a problem details object, the same shape as the handlers' (``breakwater.errors.problem``),
# so a client parses one shape whoever refused. Templates are simple substitution, not VTL:
# $context.error.messageString is already a quoted JSON string, and a fixed status keeps the body's
# ``status`` equal to the answer's.
_MESSAGE = "$context.error.messageString"
_GATEWAY_PROBLEMS = [
    # The body breaks the route's model: the validator's findings (quoted JSON string content).
    (apigw.ResponseType.BAD_REQUEST_BODY, 400, "invalid_body", '"$context.error.validationErrorString"'),
    (apigw.ResponseType.UNAUTHORIZED, 401, "unauthorized", _MESSAGE),
    (apigw.ResponseType.ACCESS_DENIED, 403, "forbidden", _MESSAGE),
    # The authorizer named a key that is in no usage plan of the stage: a tenant not (yet) enrolled.
    (apigw.ResponseType.INVALID_API_KEY, 403, "not_enrolled", _MESSAGE),
    # No route has this method and path. API Gateway cannot tell a wrong method from a wrong path, so
    # the status stays its own 403 (a 404 would be wrong for the one, a 405 for the other).
    (
        apigw.ResponseType.MISSING_AUTHENTICATION_TOKEN,
        403,
        "no_route",
        '"no route has this method and path"',
    ),
    (apigw.ResponseType.REQUEST_TOO_LARGE, 413, "payload_too_large", _MESSAGE),
    (apigw.ResponseType.THROTTLED, 429, "throttled", _MESSAGE),
    # The authorizer failed (its tenants read failed past its retries): nothing was stored, and a retry
    # may succeed, which is what a 503 tells a client; API Gateway's own answer would be a 500.
    (apigw.ResponseType.AUTHORIZER_FAILURE, 503, "unavailable", _MESSAGE),
    (apigw.ResponseType.INTEGRATION_TIMEOUT, 504, "timeout", _MESSAGE),
    # Any other refusal or failure of the gateway's, an unexpected handler failure included.
    (apigw.ResponseType.DEFAULT_4_XX, 400, "bad_request", _MESSAGE),
    (apigw.ResponseType.DEFAULT_5_XX, 500, "internal_error", _MESSAGE),
]
_DETAIL = "__detail__"


def problem_template(status: int, code: str, detail: str) -> str:
    """The gateway response body for ``code``: a problem details object, ``detail`` a template value."""
    fixed = json.dumps(problem(status, code, _DETAIL, request_id="$context.requestId"), separators=(",", ":"))
    return fixed.replace(json.dumps(_DETAIL), detail)


class Ingress(Construct):
    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        config: BlueprintConfig,
        key: kms.IKey,
        authorizer_function: lambda_.IFunction,
        ingest_function: lambda_.IFunction,
    ) -> None:
        super().__init__(scope, construct_id)
        self._config = config
        self.access_logs = encrypted_log_group(self, "AccessLogs", config=config, key=key)
        self.authorizer = apigw.RequestAuthorizer(
            self,
            "TenantAuthorizer",
            handler=authorizer_function,
            identity_sources=[apigw.IdentitySource.header("Authorization")],
            results_cache_ttl=Duration.seconds(config.api.authorizer_cache_seconds),
        )
        self.api = self._build_api()
        self._build_execution_log_group(key)
        self._build_gateway_responses()
        self._validator = self.api.add_request_validator(
            "BodyValidator", validate_request_body=True, validate_request_parameters=True
        )
        self.v1 = self.api.root.add_resource("v1")
        self.routes: dict[str, apigw.Method] = {}
        self.post_message = self.add_route("messages", ingest_function, "Message", message_schema(config))
        self.usage_plans = self._build_usage_plans()

    @property
    def url(self) -> str:
        return self.api.url

    def _build_api(self) -> apigw.RestApi:
        return apigw.RestApi(
            self,
            "Api",
            rest_api_name=f"{self._config.service_name}-api",
            description="Breakwater ingest API: tenant-authenticated, validated, throttled",
            endpoint_types=[apigw.EndpointType.REGIONAL],
            # The tenant's usage plan key comes from the authorizer, never from the client.
            api_key_source_type=apigw.ApiKeySourceType.AUTHORIZER,
            # Access logging needs the account-level CloudWatch role of API Gateway.
            cloud_watch_role=True,
            default_method_options=apigw.MethodOptions(
                authorizer=self.authorizer,
                authorization_type=apigw.AuthorizationType.CUSTOM,
                api_key_required=True,
            ),
            deploy_options=apigw.StageOptions(
                stage_name=STAGE_NAME,
                throttling_rate_limit=self._config.api.throttle_rate,
                throttling_burst_limit=self._config.api.throttle_burst,
                tracing_enabled=self._config.functions.tracing,
                logging_level=apigw.MethodLoggingLevel.ERROR,
                data_trace_enabled=False,
                metrics_enabled=True,
                access_log_destination=apigw.LogGroupLogDestination(self.access_logs),
                access_log_format=apigw.AccessLogFormat.custom(json.dumps(_ACCESS_LOG_FIELDS)),
            ),
        )

    def _build_usage_plans(self) -> dict[str, apigw.UsagePlan]:
        """One usage plan per tier, at the tier's ceiling: ``rate`` x ``max_multiplier``, and ``burst``.

        Organic growth can raise a tenant's admitted rate up to that ceiling, so the edge never
        refuses what ingest's fairness gate would admit; it refuses the excess above it before any
        Lambda runs. Tenants' keys are added at onboarding (``bin/tenants add``).
        """
        ceiling = self._config.backpressure.max_multiplier
        naive = self._config.mode == "naive"  # the baseline the demo compares throttles nobody
        plans: dict[str, apigw.UsagePlan] = {}
        for tier, limits in sorted(self._config.tiers.items()):
            plans[tier] = self.api.add_usage_plan(
                f"UsagePlan-{tier}",
                name=f"{self._config.service_name}-tier-{tier}",
                description=(
                    f"tier {tier}: unthrottled (naive mode)"
                    if naive
                    else f"tier {tier}: {limits.rate:g}/s x {ceiling:g} (ceiling), burst {limits.burst}"
                ),
                throttle=None
                if naive
                else apigw.ThrottleSettings(rate_limit=limits.rate * ceiling, burst_limit=limits.burst),
                api_stages=[apigw.UsagePlanPerApiStage(api=self.api, stage=self.api.deployment_stage)],
            )
        return plans

    def edge_plans_json(self) -> str:
        """The ``EdgeUsagePlans`` output: what onboarding needs to enrol a tenant (``EdgePlans``)."""
        return Stack.of(self).to_json_string(
            {
                "api": self.api.rest_api_id,
                "stage": self.api.deployment_stage.stage_name,
                "ceiling": self._config.backpressure.max_multiplier,
                "tiers": {tier: plan.usage_plan_id for tier, plan in self.usage_plans.items()},
            }
        )

    def _build_execution_log_group(self, key: kms.IKey) -> None:
        # API Gateway would create this group itself, unencrypted and kept forever; own it instead.
        group = logs.LogGroup(
            self,
            "ExecutionLogs",
            log_group_name=Fn.join(
                "", ["API-Gateway-Execution-Logs_", self.api.rest_api_id, f"/{STAGE_NAME}"]
            ),
            retention=RETENTION[self._config.functions.log_retention_days],
            encryption_key=key,
            removal_policy=RemovalPolicy.DESTROY,
        )
        self.api.deployment_stage.node.add_dependency(group)

    def _build_gateway_responses(self) -> None:
        for response_type, status, code, detail in _GATEWAY_PROBLEMS:
            headers = {"Content-Type": f"'{PROBLEM_MEDIA_TYPE}'"}
            if status in (429, 503):
                headers["Retry-After"] = "'1'"
            # The construct ids of the first gateway responses stay: a new logical id would replace the
            # resource, and deleting the old one resets its type to API Gateway's default answer.
            construct_id = (
                "InvalidBody" if code == "invalid_body" else f"Error{code.title().replace('_', '')}"
            )
            self.api.add_gateway_response(
                construct_id,
                type=response_type,
                status_code=str(status),
                response_headers=headers,
                templates={"application/json": problem_template(status, code, detail)},
            )

    def add_route(
        self, path: str, function: lambda_.IFunction, model_name: str, schema: apigw.JsonSchema
    ) -> apigw.Method:
        """``POST /v1/<path>`` to ``function`` (Lambda proxy), its body checked against ``schema``.

        The method inherits the API's default options, so the tenant authorizer guards it too.
        """
        model = self.api.add_model(
            f"{model_name}Model", content_type="application/json", model_name=model_name, schema=schema
        )
        method = self.v1.add_resource(path).add_method(
            "POST",
            apigw.LambdaIntegration(function, proxy=True, allow_test_invoke=False),
            request_validator=self._validator,
            request_models={"application/json": model},
        )
        self.routes[path] = method
        return method

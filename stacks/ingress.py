"""The front door: a REST API whose every method sits behind the tenant authorizer.

Every ``POST /v1/<route>`` is validated against a JSON schema (``stacks/request_schemas.py``)
before it costs a Lambda invocation; every error API Gateway produces itself is a JSON body naming
the problem; the stage throttles as configured, traces and writes structured access logs to an
encrypted, retained log group.
"""

from __future__ import annotations

import json

from aws_cdk import Duration, Fn, RemovalPolicy
from aws_cdk import aws_apigateway as apigw
from aws_cdk import aws_kms as kms
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from constructs import Construct

from stacks.config import BlueprintConfig
from stacks.functions import RETENTION, encrypted_log_group
from stacks.request_schemas import message_schema

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

# (response type, status, error code). Templates are simple substitution, not VTL:
# $context.error.messageString is already a quoted JSON string.
_GATEWAY_ERRORS = [
    (apigw.ResponseType.UNAUTHORIZED, "401", "unauthorized"),
    (apigw.ResponseType.ACCESS_DENIED, "403", "forbidden"),
    (apigw.ResponseType.REQUEST_TOO_LARGE, "413", "payload_too_large"),
    (apigw.ResponseType.THROTTLED, "429", "throttled"),
    (apigw.ResponseType.DEFAULT_4_XX, None, "bad_request"),
    (apigw.ResponseType.DEFAULT_5_XX, None, "internal_error"),
]


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
            # Access logging needs the account-level CloudWatch role of API Gateway.
            cloud_watch_role=True,
            default_method_options=apigw.MethodOptions(
                authorizer=self.authorizer, authorization_type=apigw.AuthorizationType.CUSTOM
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
        self.api.add_gateway_response(
            "InvalidBody",
            type=apigw.ResponseType.BAD_REQUEST_BODY,
            status_code="400",
            templates={
                "application/json": (
                    '{"error":"invalid_body","message":"$context.error.validationErrorString",'
                    '"request_id":"$context.requestId"}'
                )
            },
        )
        for response_type, status, code in _GATEWAY_ERRORS:
            headers = {"Retry-After": "'1'"} if status == "429" else None
            self.api.add_gateway_response(
                f"Error{code.title().replace('_', '')}",
                type=response_type,
                status_code=status,
                response_headers=headers,
                templates={
                    "application/json": (
                        f'{{"error":"{code}","message":$context.error.messageString,'
                        '"request_id":"$context.requestId"}'
                    )
                },
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
